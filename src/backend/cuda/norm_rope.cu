/* norm_rope.cu - RMSNorm (weighted, unweighted, per group) and interleaved RoPE, with the CPU
 * backend's arithmetic (cpu/ops.c). */
#include "common.cuh"

/* One block per (row, group). Two passes over x so that y may alias x. */
__global__ void k_rms_norm(const float *x,
                           float *y,
                           int64_t n_groups,
                           int64_t dim,
                           int64_t ldx,
                           int64_t ldy,
                           struct cu_vec w,
                           float eps,
                           bool round) {
    cu_pdl_enter();
    __shared__ double red[32];
    int64_t r = blockIdx.x / n_groups, g = blockIdx.x % n_groups;
    const float *xs = x + r * ldx + g * dim;
    float *ys = y + r * ldy + g * dim;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = rbf(xs[i], round);
        ss += (double)v * (double)v;
    }
    ss = block_sum_d(ss, red);
    float ms = (float)(ss / (double)dim);
    float inv;
    if (round && !w.data)
        inv = bf16_round(1.0f / sqrtf(bf16_round(ms) + eps));
    else
        inv = 1.0f / sqrtf(ms + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = rbf(xs[i], round) * inv;
        if (w.data) v = vec_get(w, i) * v;
        ys[i] = rbf(v, round);
    }
}

extern "C" void cuda_rms_norm(struct dsi_backend *be, const struct dsi_rms_norm_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0 || a->n_groups <= 0 || a->dim <= 0) return;
    int64_t blocks = a->n * a->n_groups;
    int threads = a->dim >= 2048 ? 256 : a->dim >= 512 ? 128 : 64;
    cu_launch(c, k_rms_norm, (unsigned)blocks, threads, 0, a->x, a->y, a->n_groups, a->dim, a->ldx,
              a->ldy, cu_vec_of(a->w), a->eps, a->round_bf16);
    cu_check(c, "rms_norm");
}

/* One thread per (row, head, pair). */
__global__ void k_rope(float *x,
                       int64_t n,
                       int64_t ldx,
                       int64_t n_heads,
                       int64_t head_stride,
                       int width,
                       int rope_dim,
                       const int32_t *pos,
                       const float *freq,
                       bool inverse,
                       bool round) {
    cu_pdl_enter();
    int half = rope_dim / 2;
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * n_heads * half) return;
    int i = (int)(t % half);
    int64_t h = (t / half) % n_heads, r = t / half / n_heads;
    float p = (float)pos[r];
    float *xp = x + r * ldx + h * head_stride + (width - rope_dim);
    float ang = p * freq[i];
    float c = cos_ref(ang), s = sin_ref(ang);
    if (inverse) s = -s;
    float x0 = xp[2 * i], x1 = xp[2 * i + 1];
    xp[2 * i] = rbf(x0 * c - x1 * s, round);
    xp[2 * i + 1] = rbf(x1 * c + x0 * s, round);
}

extern "C" void cuda_rope(struct dsi_backend *be, const struct dsi_rope_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    int half = a->rope_dim / 2;
    if (a->n <= 0 || a->n_heads <= 0 || half <= 0) return;
    const float *freq = cu_freq_dev(c, a->freq, half);
    if (!freq) return;
    int64_t t = a->n * a->n_heads * half;
    cu_launch(c, k_rope, (unsigned)cu_div_up(t, 256), 256, 0, a->x, a->n, a->ldx, a->n_heads,
              a->head_stride, a->width, a->rope_dim, a->pos, freq, a->inverse, a->round_bf16);
    cu_check(c, "rope");
}
