/* norm_rope.cu - RMSNorm (weighted, unweighted, per group) and interleaved RoPE, with the CPU
 * backend's arithmetic (cpu/ops.c). */
#include "norm.cuh"

#include <algorithm>

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
    float inv = rms_inv(block_sum_d(ss, red), dim, eps, round, w.data != nullptr);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        ys[i] = rms_out(rbf(xs[i], round), inv, w, i, round);
}

/* What the q-head and KV norms do after the norm (rms_norm's rope_dim / q_dim, dsi_rms_norm_args):
 * RoPE on each group's last rope_dim values at pos[r], then act_quant in place of each row's
 * first q_dim values in blocks of 4 q_lanes values. */
struct norm_rq {
    const int32_t *pos;
    const float *freq; /* device copy */
    int rope_dim, q_dim, q_lanes;
};

/* rq on the float4 o at element e of a group of dim values (e % 4 == 0), held by a lane of a
 * warp whose 32 lanes hold consecutive float4 (a quantisation block is q_lanes of them,
 * aligned): its two pairs rotated where they are rope dims (rope_dim % 4 == 0: a float4 is
 * wholly in or out) by the row's (cos, sin) table cs (rope_cs's values at the row's position:
 * rope4's bits), then the block's amax by shuffles and q8_value (k_act_quant's numbers). The
 * whole warp calls it (the shuffles). */
__device__ __forceinline__ float4 norm_rq_apply(
    float4 o, int64_t e, int64_t dim, const struct norm_rq &rq, const float2 *cs, bool round) {
    int64_t rs = dim - rq.rope_dim;
    if (e >= rs) {
        int p0 = (int)(e - rs) / 2;
        float2 c0 = cs[p0], c1 = cs[p0 + 1];
        rope_rot(o.x, o.y, c0.x, c0.y, round);
        rope_rot(o.z, o.w, c1.x, c1.y, round);
    }
    if (rq.q_dim > 0) {
        float a = fmaxf(fmaxf(fmaxf(fmaxf(0.0f, fabsf(o.x)), fabsf(o.y)), fabsf(o.z)), fabsf(o.w));
        for (int off = rq.q_lanes / 2; off > 0; off >>= 1)
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
        if (e < rq.q_dim) {
            float s = ue8m0_scale(a, 448.0f, 1e-4f), inv_s = 1.0f / s;
            o = make_float4(q8_value(o.x, s, inv_s), q8_value(o.y, s, inv_s),
                            q8_value(o.z, s, inv_s), q8_value(o.w, s, inv_s));
        }
    }
    return o;
}

/* One warp per (row, group) for dims of 128 V (V <= 16: the per-head and LoRA norms, many short
 * groups): a lane holds its V float4 in registers (read once; y may alias x), the sum of squares
 * in double as k_rms_norm's. 8 warps per block. RQ: then norm_rq_apply (the q-head norm's RoPE,
 * the KV norm's RoPE and quantisation), with the (cos, sin) of the block's 8 rows computed by
 * all its threads, one pair each, while their loads are in flight (step 41: before, each
 * lane computed its own pairs' double-precision sines after the norm, on the row's chain). */
template <int V, bool RQ>
__global__ void __launch_bounds__(256) k_rms_norm_warp(const float *x,
                                                       float *y,
                                                       int64_t rows, /* n * n_groups */
                                                       int64_t n_groups,
                                                       int64_t ldx,
                                                       int64_t ldy,
                                                       struct cu_vec w,
                                                       float eps,
                                                       bool round,
                                                       struct norm_rq rq) {
    cu_pdl_enter();
    __shared__ float2 cs_s[RQ ? 8 * 64 : 1]; /* RQ: warp w's row's pairs at 64 w.. */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t rg = (int64_t)blockIdx.x * 8 + warp;
    if (!RQ && rg >= rows) return;
    bool live = rg < rows;
    int64_t r = live ? rg / n_groups : 0, g = live ? rg - r * n_groups : 0;
    const float4 *xs = (const float4 *)(x + r * ldx + g * V * 128);
    float4 *ys = (float4 *)(y + r * ldy + g * V * 128);
    float4 v[V];
    double ss = 0.0;
#pragma unroll
    for (int i = 0; i < V; i++)
        v[i] = !RQ || live ? xs[i * 32 + lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (RQ) { /* (rope_dim / 2 <= 64: rms_norm_rq) */
        int half = rq.rope_dim / 2;
        for (int k = threadIdx.x; k < 8 * half; k += blockDim.x) {
            int w = k / half, i = k - w * half;
            int64_t rw = (int64_t)blockIdx.x * 8 + w;
            if (rw < rows)
                cs_s[w * 64 + i] = rope_cs<>((float)rq.pos[rw / n_groups], rq.freq[i], false);
        }
        __syncthreads();
        if (!live) return;
    }
#pragma unroll
    for (int i = 0; i < V; i++)
        v[i] = rms_in4(v[i], round, ss);
    float inv = rms_inv(warp_sum_d(ss), V * 128, eps, round, w.data != nullptr);
#pragma unroll
    for (int i = 0; i < V; i++) {
        int64_t e = (int64_t)(i * 32 + lane) * 4;
        float4 o = rms_out4(v[i], inv, w, e, round);
        if (RQ) o = norm_rq_apply(o, e, V * 128, rq, cs_s + warp * 64, round);
        ys[i * 32 + lane] = o;
    }
}

/* One block of 256 threads per (row, group) for dims of 1024 V (the hidden size's norms): a
 * thread holds its V float4 in registers, all loaded at once (k_rms_norm walks the row twice, a
 * load latency per element of a thread: ~16 us for one row of 4096), the sum of squares in
 * double as k_rms_norm's. y may alias x. */
template <int V>
__global__ void __launch_bounds__(256) k_rms_norm_blk(const float *x,
                                                      float *y,
                                                      int64_t n_groups,
                                                      int64_t ldx,
                                                      int64_t ldy,
                                                      struct cu_vec w,
                                                      float eps,
                                                      bool round,
                                                      float *yq) {
    cu_pdl_enter();
    __shared__ double red[32];
    int64_t r = blockIdx.x / n_groups, g = blockIdx.x - r * n_groups;
    const float4 *xs = (const float4 *)(x + r * ldx + g * V * 1024);
    float4 *ys = (float4 *)(y + r * ldy + g * V * 1024);
    int t = threadIdx.x;
    float4 v[V];
    double ss = 0.0;
#pragma unroll
    for (int i = 0; i < V; i++)
        v[i] = xs[i * 256 + t];
#pragma unroll
    for (int i = 0; i < V; i++)
        v[i] = rms_in4(v[i], round, ss);
    float inv = rms_inv(block_sum_d(ss, red), V * 1024, eps, round, w.data != nullptr);
    __shared__ float4 os[V][256]; /* the outputs again, for yq */
#pragma unroll
    for (int i = 0; i < V; i++) {
        float4 o = rms_out4(v[i], inv, w, (int64_t)(i * 256 + t) * 4, round);
        ys[i * 256 + t] = o;
        os[i][t] = o;
    }
    /* n_groups 1: warp w's float4 i are the row's 128-block 8 i + w. A loop (the thread's own
       values from shared memory, no barrier): unrolled, q8_warp_block's copies made the kernel
       33-58 KB, and a batch-1 norm (one block) waits for its instructions (step 18) */
    if (yq)
#pragma unroll 1
        for (int i = 0; i < V; i++)
            q8_warp_block(os[i][t], (float4 *)(yq + r * V * 1024) + i * 256 + t);
}

template <int V> static void rms_norm_blk(struct cu_ctx *c, const struct dsi_rms_norm_args *a) {
    cu_launch(c, k_rms_norm_blk<V>, (unsigned)(a->n * a->n_groups), 256, 0, a->x, a->y, a->n_groups,
              a->ldx, a->ldy, cu_vec_of(a->w), a->eps, a->round_bf16, a->yq);
}

template <int V>
static void rms_norm_warp(struct cu_ctx *c, const struct dsi_rms_norm_args *a, const norm_rq *rq) {
    int64_t rows = a->n * a->n_groups;
    unsigned blocks = (unsigned)cu_div_up(rows, 8);
    if (rq)
        cu_launch(c, k_rms_norm_warp<V, true>, blocks, 256, 0, a->x, a->y, rows, a->n_groups,
                  a->ldx, a->ldy, cu_vec_of(a->w), a->eps, a->round_bf16, *rq);
    else
        cu_launch(c, k_rms_norm_warp<V, false>, blocks, 256, 0, a->x, a->y, rows, a->n_groups,
                  a->ldx, a->ldy, cu_vec_of(a->w), a->eps, a->round_bf16, norm_rq{});
    /* the quantised copy in its own launch: one warp per row doing it too was slower at decode
       (the q norm at batch 1, step 17) */
    if (a->yq) launch_act_quant(c, a->y, a->yq, a->n, a->n_groups * a->dim, a->ldy, a->dim, 128);
}

/* The RoPE and quantisation after a norm (rope_dim > 0) in the norm's kernel where it is a warp
 * kernel (norm_rq_apply), else as the rope and act_quant launches; true: handled. */
static bool rms_norm_rq(struct dsi_backend *be, const struct dsi_rms_norm_args *a) {
    if (a->rope_dim <= 0) return false;
    struct cu_ctx *c = cu_ctx_of(be);
    int half = a->rope_dim / 2;
    bool vec = a->dim % 128 == 0 && a->ldx % 4 == 0 && a->ldy % 4 == 0 &&
               (uintptr_t)a->x % 16 == 0 && (uintptr_t)a->y % 16 == 0;
    bool qok = a->q_dim <= 0 || (a->n_groups == 1 && (a->q_block == 64 || a->q_block == 128) &&
                                 a->q_dim % a->q_block == 0 && a->q_dim <= a->dim);
    if (a->yq || a->rope_dim % 4 || a->rope_dim > a->dim || half > 64) {
        cu_fail(c, DSI_ERR_INVALID, "rms_norm: rope of %d dims after a norm of %lld%s", a->rope_dim,
                (long long)a->dim, a->yq ? " with a quantised copy" : "");
        return true;
    }
    const float *freq = cu_freq_dev(c, a->freq, half);
    if (!freq) return true;
    if (vec && qok && c->norm_rq &&
        (a->dim == 128 || a->dim == 512 || a->dim == 1024 || a->dim == 2048)) {
        norm_rq rq = {a->pos, freq, a->rope_dim, a->q_dim > 0 ? (int)a->q_dim : 0, a->q_block / 4};
        if (a->dim == 128) rms_norm_warp<1>(c, a, &rq);
        if (a->dim == 512) rms_norm_warp<4>(c, a, &rq);
        if (a->dim == 1024) rms_norm_warp<8>(c, a, &rq);
        if (a->dim == 2048) rms_norm_warp<16>(c, a, &rq);
        cu_check(c, "rms_norm");
        return true;
    }
    /* the norm, then the ops themselves */
    struct dsi_rms_norm_args b = *a;
    b.rope_dim = 0;
    cuda_rms_norm(be, &b);
    struct dsi_rope_args ra = dsi_rms_norm_rope(a);
    cuda_rope(be, &ra);
    if (a->q_dim > 0) launch_act_quant(c, a->y, a->y, a->n, a->q_dim, a->ldy, a->ldy, a->q_block);
    return true;
}

extern "C" void cuda_rms_norm(struct dsi_backend *be, const struct dsi_rms_norm_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0 || a->n_groups <= 0 || a->dim <= 0) return;
    if (rms_norm_rq(be, a)) return;
    if (a->yq && (a->n_groups != 1 || a->dim % 128)) {
        cu_fail(c, DSI_ERR_INVALID, "rms_norm: quantised copy of %lld groups of %lld",
                (long long)a->n_groups, (long long)a->dim);
        return;
    }
    if (a->yq && !c->norm_q) { /* DSI_CUDA_NORM_Q=0: the norm, then act_quant's own launch */
        struct dsi_rms_norm_args b = *a;
        b.yq = NULL;
        cuda_rms_norm(be, &b);
        launch_act_quant(c, a->y, a->yq, a->n, a->dim, a->ldy, a->dim, 128);
        return;
    }
    bool vec = a->dim % 128 == 0 && a->ldx % 4 == 0 && a->ldy % 4 == 0 &&
               (uintptr_t)a->x % 16 == 0 && (uintptr_t)a->y % 16 == 0 && (uintptr_t)a->yq % 16 == 0;
    if (vec && (a->dim == 128 || a->dim == 512 || a->dim == 1024 || a->dim == 2048)) {
        if (a->dim == 1024 && a->yq && c->norm_blk1) { /* the q norm: a block, yq inside */
            rms_norm_blk<1>(c, a);
            cu_check(c, "rms_norm");
            return;
        }
        if (a->dim == 128) rms_norm_warp<1>(c, a, nullptr);
        if (a->dim == 512) rms_norm_warp<4>(c, a, nullptr);
        if (a->dim == 1024) rms_norm_warp<8>(c, a, nullptr);
        if (a->dim == 2048) rms_norm_warp<16>(c, a, nullptr);
        cu_check(c, "rms_norm");
        return;
    }
    if (vec && (a->dim == 4096 || a->dim == 8192)) {
        if (a->dim == 4096) rms_norm_blk<4>(c, a);
        if (a->dim == 8192) rms_norm_blk<8>(c, a);
        cu_check(c, "rms_norm");
        return;
    }
    int64_t blocks = a->n * a->n_groups;
    int threads = a->dim >= 2048 ? 256 : a->dim >= 512 ? 128 : 64;
    cu_launch(c, k_rms_norm, (unsigned)blocks, threads, 0, a->x, a->y, a->n_groups, a->dim, a->ldx,
              a->ldy, cu_vec_of(a->w), a->eps, a->round_bf16);
    if (a->yq) launch_act_quant(c, a->y, a->yq, a->n, a->dim, a->ldy, a->dim, 128);
    cu_check(c, "rms_norm");
}

/* One thread per (row, pair) and every G-th head from head g (G: enough threads for small n;
 * at the prefill 1): the angle's cos and sin (in double, the reference's) once per thread
 * instead of once per element, and no 64-bit divisions per element (k_rope before step 25: a
 * thread per (row, head, pair), three of them). Lanes take consecutive pairs of a row. A thread's
 * heads go in rounds of ROPE_RB: the round's loads first, then its rotations and stores (step
 * 26: one head after another made each head a round trip, the stores standing between the loads
 * of consecutive heads; 9.7 us at batch 256 against 7.6 for the kernel before). The same
 * operations per element. */
#define ROPE_RB 8
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
                       bool round,
                       int G) {
    cu_pdl_enter();
    int half = rope_dim / 2;
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, rows = n * half;
    if (t >= rows * G) return;
    int64_t g = t / rows, rem = t - g * rows, r = rem / half;
    int i = (int)(rem - r * half);
    float ang = (float)pos[r] * freq[i];
    float c = cos_ref(ang), s = sin_ref(ang);
    if (inverse) s = -s;
    float *xp = x + r * ldx + g * head_stride + (width - rope_dim) + 2 * i;
    int64_t step = G * head_stride;
    for (int64_t h0 = g; h0 < n_heads; h0 += ROPE_RB * G, xp += ROPE_RB * step) {
        float v0[ROPE_RB], v1[ROPE_RB];
#pragma unroll
        for (int j = 0; j < ROPE_RB; j++)
            if (h0 + j * G < n_heads) {
                v0[j] = xp[j * step];
                v1[j] = xp[j * step + 1];
            }
#pragma unroll
        for (int j = 0; j < ROPE_RB; j++)
            if (h0 + j * G < n_heads) {
                rope_rot(v0[j], v1[j], c, s, round);
                xp[j * step] = v0[j];
                xp[j * step + 1] = v1[j];
            }
    }
}

extern "C" void cuda_rope(struct dsi_backend *be, const struct dsi_rope_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    int half = a->rope_dim / 2;
    if (a->n <= 0 || a->n_heads <= 0 || half <= 0) return;
    const float *freq = cu_freq_dev(c, a->freq, half);
    if (!freq) return;
    /* head groups: about 131072 threads in all (batch 1: a head each, as before; batch 256: 4
       heads a thread, loaded together) */
    int64_t rows = a->n * half;
    int G = (int)std::min<int64_t>(a->n_heads, std::max<int64_t>(1, cu_div_up(131072, rows)));
    cu_launch(c, k_rope, (unsigned)cu_div_up(rows * G, 256), 256, 0, a->x, a->n, a->ldx, a->n_heads,
              a->head_stride, a->width, a->rope_dim, a->pos, freq, a->inverse, a->round_bf16, G);
    cu_check(c, "rope");
}
