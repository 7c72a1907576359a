/* quant.cu - the [QAT] simulations: activation FP8 round trip (act_quant) and the indexer's
 * Hadamard + FP4 round trip, bit for bit as cpu/quant.c. */
#include "common.cuh"
#include "norm.cuh"

#define FP4_FLOOR 0x1.8p-124f /* 6 * 2^-126 */

/* One warp per (row, block): amax, UE8M0 scale, e4m3 round trip. */
__global__ void
k_act_quant(const float *x, float *y, int64_t n, int64_t nb, int block, int64_t ldx, int64_t ldy) {
    cu_pdl_enter();
    int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (wid >= n * nb) return;
    int64_t r = wid / nb, b = wid % nb;
    const float *xs = x + r * ldx + b * block;
    float *ys = y + r * ldy + b * block;
    float amax = 0.0f;
    for (int e = lane; e < block; e += 32)
        amax = fmaxf(amax, fabsf(xs[e]));
    amax = warp_max(amax);
    float s = ue8m0_scale(amax, 448.0f, 1e-4f), inv_s = 1.0f / s;
    float v[8];
    int m = 0;
    for (int e = lane; e < block && m < 8; e += 32)
        v[m++] = xs[e];
    __syncwarp(); /* all reads of an in-place row before any write */
    m = 0;
    for (int e = lane; e < block; e += 32) {
        float t = m < 8 ? v[m++] : xs[e];
        ys[e] = q8_value(t, s, inv_s);
    }
}

/* Blocks of 128 on 16-byte aligned rows: one warp per (row, block), a float4 per lane (one load,
 * one store; k_act_quant's lanes load 4 scalars twice). The same per-element operations
 * (q8_warp_block), so the same bits; in place safe (every lane has loaded before the maximum's
 * shuffles end). Step 25. */
__global__ void __launch_bounds__(CU_THREADS)
    k_act_quant128(const float *x, float *y, int64_t n, int nb, int64_t ldx, int64_t ldy) {
    cu_pdl_enter();
    int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (wid >= n * nb) return;
    int64_t r = wid / nb;
    int b = (int)(wid - r * nb);
    float4 v = *((const float4 *)(x + r * ldx + b * 128) + lane);
    q8_warp_block(v, (float4 *)(y + r * ldy + b * 128) + lane);
}

void launch_act_quant(struct cu_ctx *c,
                      const float *x,
                      float *y,
                      int64_t n,
                      int64_t dim,
                      int64_t ldx,
                      int64_t ldy,
                      int block) {
    if (n <= 0 || dim <= 0) return;
    if (block <= 0) block = 128;
    if (dim % block || block > 256) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "act_quant: dim %lld, block %d", (long long)dim, block);
        return;
    }
    int64_t nb = dim / block, warps = n * nb;
    if (block == 128 && ldx % 4 == 0 && ldy % 4 == 0 && (uintptr_t)x % 16 == 0 &&
        (uintptr_t)y % 16 == 0 && nb <= INT32_MAX)
        cu_launch(c, k_act_quant128, (unsigned)cu_div_up(warps, CU_WARPS), CU_THREADS, 0, x, y, n,
                  (int)nb, ldx, ldy);
    else
        cu_launch(c, k_act_quant, (unsigned)cu_div_up(warps, CU_WARPS), CU_THREADS, 0, x, y, n, nb,
                  block, ldx, ldy);
    cu_check(c, "act_quant");
}

extern "C" void cuda_act_quant(struct dsi_backend *be, const struct dsi_act_quant_args *a) {
    launch_act_quant(cu_ctx_of(be), a->x, a->y, a->n, a->dim, a->ldx, a->ldy, a->block);
}

/* One block per (row, group): bf16, Walsh-Hadamard (Sylvester order, as dsi_hadamard), scale,
 * bf16, FP4 round trip per 32. */
__global__ void k_hadamard_q4(float *x, int64_t n_groups, int dim, int64_t ldx) {
    cu_pdl_enter();
    extern __shared__ float hs[];
    int64_t r = blockIdx.x / n_groups, g = blockIdx.x % n_groups;
    float *xp = x + r * ldx + g * dim;
    for (int e = threadIdx.x; e < dim; e += blockDim.x)
        hs[e] = bf16_round(xp[e]);
    __syncthreads();
    for (int h = 1; h < dim; h *= 2) {
        for (int p = threadIdx.x; p < dim / 2; p += blockDim.x) {
            int i = (p / h) * 2 * h + (p % h);
            float a = hs[i], b = hs[i + h];
            hs[i] = a + b;
            hs[i + h] = a - b;
        }
        __syncthreads();
    }
    float s = 1.0f / sqrtf((float)dim);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int b = warp; b < dim / 32; b += nw) {
        float v = bf16_round(hs[b * 32 + lane] * s);
        float amax = warp_max(fabsf(v));
        float sc = ue8m0_scale(amax, 6.0f, FP4_FLOOR);
        float t = v / sc;
        t = t > 6.0f ? 6.0f : t < -6.0f ? -6.0f : t;
        xp[b * 32 + lane] = round_grid(t, 1, 0) * sc;
    }
}

/* The same with one warp per (row, group) for dims of 32 V (V = 4, 8, 16, 32; 16-byte aligned
 * rows): lane l holds elements V l .. V l + V - 1 in registers; the butterflies of h < V inside
 * the lane, those of h = V m with the lane l ^ m by shuffles (the lower element of a pair takes
 * a + b, the upper a - b, a and b as the block kernel's), then each 32-block's FP4 round trip
 * with its absolute maximum over the 32 / V lanes that hold it. The same operations per element
 * as k_hadamard_q4, so the same bits. Its block of 128 threads per (row, group), with a barrier
 * per stage and a 64-bit division per block, took 517 us for the 8k prefill's 524288 groups of
 * 128 (step 24's profile; ~140 us of bytes); step 25. 8 groups per block of 256 threads. */
template <int V>
__global__ void __launch_bounds__(256) k_hadamard_q4_warp(float *x,
                                                          int64_t rows, /* n * n_groups */
                                                          int64_t n_groups,
                                                          int64_t ldx) {
    cu_pdl_enter();
    int64_t rg = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (rg >= rows) return;
    int lane = threadIdx.x & 31;
    int64_t r = rg / n_groups, g = rg - r * n_groups;
    float4 *xp = (float4 *)(x + r * ldx + g * (32 * V) + lane * V);
    float v[V];
#pragma unroll
    for (int i = 0; i < V / 4; i++) {
        float4 f = xp[i];
        v[4 * i] = bf16_round(f.x);
        v[4 * i + 1] = bf16_round(f.y);
        v[4 * i + 2] = bf16_round(f.z);
        v[4 * i + 3] = bf16_round(f.w);
    }
#pragma unroll
    for (int h = 1; h < V; h *= 2)
#pragma unroll
        for (int i = 0; i < V; i++)
            if (!(i & h)) {
                float a = v[i], b = v[i + h];
                v[i] = a + b;
                v[i + h] = a - b;
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2)
#pragma unroll
        for (int i = 0; i < V; i++) {
            float o = __shfl_xor_sync(0xffffffffu, v[i], m);
            v[i] = (lane & m) ? o - v[i] : v[i] + o;
        }
    float s = 1.0f / sqrtf((float)(32 * V)), amax = 0.0f;
#pragma unroll
    for (int i = 0; i < V; i++) {
        v[i] = bf16_round(v[i] * s);
        amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int m = 1; m < 32 / V; m *= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    float sc = ue8m0_scale(amax, 6.0f, FP4_FLOOR);
#pragma unroll
    for (int i = 0; i < V; i++) {
        float t = v[i] / sc;
        t = t > 6.0f ? 6.0f : t < -6.0f ? -6.0f : t;
        v[i] = round_grid(t, 1, 0) * sc;
    }
#pragma unroll
    for (int i = 0; i < V / 4; i++)
        xp[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

template <int V> static void hadamard_warp(struct cu_ctx *c, const struct dsi_hadamard_q4_args *a) {
    int64_t rows = a->n * a->n_groups;
    cu_launch(c, k_hadamard_q4_warp<V>, (unsigned)cu_div_up(rows, 8), 256, 0, a->x, rows,
              a->n_groups, a->ldx);
}

extern "C" void cuda_hadamard_q4(struct dsi_backend *be, const struct dsi_hadamard_q4_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0 || a->n_groups <= 0) return;
    int dim = (int)a->dim;
    if (dim < 32 || dim > 8192 || (dim & (dim - 1))) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "hadamard_q4: dim %d (want a power of two, 32..8192)", dim);
        return;
    }
    bool vec = a->ldx % 4 == 0 && (uintptr_t)a->x % 16 == 0;
    if (vec && dim >= 128 && dim <= 1024) {
        if (dim == 128) hadamard_warp<4>(c, a);
        if (dim == 256) hadamard_warp<8>(c, a);
        if (dim == 512) hadamard_warp<16>(c, a);
        if (dim == 1024) hadamard_warp<32>(c, a);
    } else {
        int64_t blocks = a->n * a->n_groups;
        cu_launch(c, k_hadamard_q4, (unsigned)blocks, 128, (size_t)dim * 4, a->x, a->n_groups, dim,
                  a->ldx);
    }
    cu_check(c, "hadamard_q4");
}
