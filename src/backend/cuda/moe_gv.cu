/* moe_gv.cu - the expert GEMMs for tiles of one or two rows (decode), same arithmetic as
 * k_moe_up / k_moe_down (moe.cu). As k_gemv (gemv.cu) does for the dense GEMM: a block stages
 * its tile's whole x (or h) rows once, then each warp walks output columns persistently
 * (grid-stride over the block's column range, pieces inner) and loads the raw weight bytes of
 * the next (column, piece) before decoding the current one, so loads stay in flight and the
 * grid is about one wave instead of many short blocks with a barrier per piece.
 *
 * Up: a warp's unit is one column c of the intermediate: W1 row c and W3 row c, then the clamped
 * SwiGLU times the routing weight into h. Down: a unit is GEMM_RW rows of W2 into out. Chunk
 * values and their in-order sums as in gemm.cu: bitwise equal to the CPU backend. */
#include "gemm.cuh"
#include "moe.cuh"

#include <algorithm>

#define MOE_GV_SMEM_MAX (100 * 1024)

static size_t gv_smem(int rx, int64_t K) {
    return (size_t)rx * (size_t)cu_div_up(K / 32, 32) * 32 * XS_STRIDE * 4 +
           (size_t)CU_WARPS * rx * GEMM_RW * 33 * 4;
}

/* All threads: xs <- the whole rows x + xoff[rx] (K floats, zero padded to whole pieces) in
 * the staged layout of gemm.cuh (chunk c of row rx at xs[(rx * nqs + c) * XS_STRIDE]). */
template <int RX>
__device__ __forceinline__ void
stage_rows(float *xs, const float *x, const int64_t *xoff, int64_t K, int nqs) {
    int64_t n4 = (int64_t)nqs * 8;
    for (int64_t i = threadIdx.x; i < RX * n4; i += CU_THREADS) {
        int rx = (int)(i / n4);
        int64_t f = i % n4, ch = f / 8, part = f % 8, k = ch * 32 + part * 4;
        int64_t o = xoff[rx];
        float4 v =
            o >= 0 && k < K ? *(const float4 *)(x + o + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(float4 *)(xs + (rx * nqs + ch) * XS_STRIDE + part * 4) = v;
    }
}

template <int WT>
__device__ __forceinline__ void gv_rows(const struct cu_w (&W)[GEMM_RW],
                                        const int64_t (&row)[GEMM_RW],
                                        int64_t nq,
                                        int64_t p,
                                        int lane,
                                        w_raw (&r)[GEMM_RW]) {
    int64_t q = p * 32 + lane;
#pragma unroll
    for (int k = 0; k < GEMM_RW; k++)
        if (row[k] >= 0 && q < nq)
            load_w_raw<WT>(W[k], W[k].data + row[k] * W[k].row_bytes, w_scale_row(W[k], row[k]), q,
                           r[k]);
}

/* The shared walk: units u = first, first + stride, ... < units; rows_of(u) gives the GEMM_RW
 * weight rows of a unit (-1: none), done(u, acc) receives each owner lane's sum (lanes
 * < RX * GEMM_RW: x row lane / GEMM_RW, weight row lane % GEMM_RW; other lanes get 0). */
template <int WT, int RX, typename Rows, typename Done>
__device__ __forceinline__ void gv_walk(const struct cu_w (&W)[GEMM_RW],
                                        const float *xs,
                                        float (*cvs)[33],
                                        int64_t K,
                                        int64_t first,
                                        int64_t units,
                                        int64_t stride,
                                        Rows rows_of,
                                        Done done) {
    int lane = threadIdx.x & 31;
    int64_t nq = K / 32, np = (nq + 31) / 32;
    int nqs = (int)np * 32;
    int64_t u = first, p = 0;
    if (u >= units) return;
    int64_t row[GEMM_RW], nrow[GEMM_RW];
    rows_of(u, row);
    w_raw raw[GEMM_RW], nxt[GEMM_RW];
    gv_rows<WT>(W, row, nq, p, lane, raw);
    float acc = 0.0f;
    for (;;) {
        bool wrap = p + 1 >= np;
        int64_t un = wrap ? u + stride : u, pn = wrap ? 0 : p + 1;
        bool more = un < units;
        if (more) {
            if (wrap)
                rows_of(un, nrow);
            else
#pragma unroll
                for (int k = 0; k < GEMM_RW; k++)
                    nrow[k] = row[k];
            gv_rows<WT>(W, nrow, nq, pn, lane, nxt);
        }
        int64_t q = p * 32 + lane;
        bool qv = q < nq;
#pragma unroll
        for (int r = 0; r < GEMM_RW; r++) {
            float wf[32];
            decode_w_raw<WT>(raw[r], qv && row[r] >= 0 ? q : -1, wf);
#pragma unroll
            for (int rx = 0; rx < RX; rx++) {
                float xf[32];
                load_x_staged(xs, rx * (nqs / 32) + (int)p, lane, xf);
                cvs[rx * GEMM_RW + r][lane] = chunk_dot(xf, wf);
            }
        }
        __syncwarp();
        if (lane < RX * GEMM_RW) {
            int cnt = (int)(nq - p * 32 < 32 ? nq - p * 32 : 32);
            for (int L = 0; L < cnt; L++)
                acc += cvs[lane][L];
        }
        __syncwarp();
        if (wrap) {
            done(u, acc);
            acc = 0.0f;
        }
        if (!more) break;
        u = un;
        p = pn;
#pragma unroll
        for (int k = 0; k < GEMM_RW; k++) {
            row[k] = nrow[k];
            raw[k] = nxt[k];
        }
    }
}

/* The tile's x rows (offsets into p.x), as k_moe_up. */
template <int RX>
__device__ __forceinline__ void
up_xoff(const struct moe_p &p, int64_t pos0, int rows, int64_t *xoff) {
    int64_t nk = p.n * p.topk;
    if (threadIdx.x < RX) {
        int64_t pos = pos0 + threadIdx.x;
        xoff[threadIdx.x] = (int)threadIdx.x >= rows ? -1
                            : pos < nk               ? (int64_t)(p.perm[pos] / p.topk) * p.D
                                                     : (pos - nk) * p.D;
    }
}

template <int WT, int RX>
__global__ void __launch_bounds__(CU_THREADS, 2) k_moe_up_gv(struct moe_p p) {
    cu_pdl_enter();
    extern __shared__ float4 gsm[];
    float *xs = (float *)gsm;
    int e, rows;
    int64_t pos0;
    if (!moe_tile(p, RX, &e, &pos0, &rows)) return; /* the same for the whole block */
    int nqs = (int)((p.D / 32 + 31) / 32) * 32;
    float(*cvs)[RX * GEMM_RW][33] = (float(*)[RX * GEMM_RW][33])(xs + RX * nqs * XS_STRIDE);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t nk = p.n * p.topk;
    struct cu_w W[GEMM_RW] = {p.w1, p.w3};
    if (e >= 0) {
        W[0].data = p.tab[e].p[0];
        W[0].scale = p.tab[e].p[1];
        W[1].data = p.tab[e].p[2];
        W[1].scale = p.tab[e].p[3];
    }
    __shared__ int64_t xoff[RX];
    up_xoff<RX>(p, pos0, rows, xoff);
    __syncthreads();
    stage_rows<RX>(xs, p.x, xoff, p.D, nqs);
    __syncthreads();
    /* unit = column c: W1 row c (r = 0, gate) and W3 row c (r = 1, up) */
    auto rows_of = [&](int64_t c, int64_t(&row)[GEMM_RW]) {
        row[0] = c;
        row[1] = c;
    };
    auto done = [&](int64_t c, float acc) {
        float v = acc + 0.0f; /* lane 2 rx: g, lane 2 rx + 1: u */
        float u = __shfl_down_sync(0xffffffffu, v, 1);
        int rx = lane / 2;
        if (lane >= RX * 2 || (lane & 1) || rx >= rows) return;
        float g = rbf(v, p.round);
        u = rbf(u, p.round);
        int64_t pos = pos0 + rx;
        float wi = pos < nk ? p.weight[p.perm[pos]] : 1.0f;
        float gv = fminf(g, p.limit), uv = fminf(fmaxf(u, -p.limit), p.limit);
        float silu = gv / (1.0f + exp_ref(-gv));
        p.h[pos * p.I + c] = rbf(silu * uv * wi, p.round);
    };
    gv_walk<WT, RX>(W, xs, cvs[warp], p.D, (int64_t)blockIdx.x * CU_WARPS + warp, p.I,
                    (int64_t)gridDim.x * CU_WARPS, rows_of, done);
}

template <int WT, int RX>
__global__ void __launch_bounds__(CU_THREADS, 2) k_moe_down_gv(struct moe_p p) {
    cu_pdl_enter();
    extern __shared__ float4 gsm[];
    float *xs = (float *)gsm;
    int e, rows;
    int64_t pos0;
    if (!moe_tile(p, RX, &e, &pos0, &rows)) return;
    int nqs = (int)((p.I / 32 + 31) / 32) * 32;
    float(*cvs)[RX * GEMM_RW][33] = (float(*)[RX * GEMM_RW][33])(xs + RX * nqs * XS_STRIDE);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t nk = p.n * p.topk;
    struct cu_w W[GEMM_RW] = {p.w2, p.w2};
    if (e >= 0) {
        W[0].data = W[1].data = p.tab[e].p[4];
        W[0].scale = W[1].scale = p.tab[e].p[5];
    }
    __shared__ int64_t xoff[RX];
    if (threadIdx.x < RX)
        xoff[threadIdx.x] = (int)threadIdx.x < rows ? (pos0 + threadIdx.x) * p.I : -1;
    __syncthreads();
    stage_rows<RX>(xs, p.h, xoff, p.I, nqs);
    __syncthreads();
    int64_t D = p.D;
    auto rows_of = [&](int64_t u, int64_t(&row)[GEMM_RW]) {
#pragma unroll
        for (int k = 0; k < GEMM_RW; k++)
            row[k] = u * GEMM_RW + k < D ? u * GEMM_RW + k : -1;
    };
    auto done = [&](int64_t u, float acc) {
        int rx = lane / GEMM_RW, r = lane % GEMM_RW;
        int64_t o = u * GEMM_RW + r;
        if (lane >= RX * GEMM_RW || rx >= rows || o >= D) return;
        int64_t pos = pos0 + rx;
        int64_t orow = pos < nk ? p.perm[pos] : pos;
        p.out[orow * D + o] = rbf(acc + 0.0f, p.round);
    };
    gv_walk<WT, RX>(W, xs, cvs[warp], p.I, (int64_t)blockIdx.x * CU_WARPS + warp,
                    (D + GEMM_RW - 1) / GEMM_RW, (int64_t)gridDim.x * CU_WARPS, rows_of, done);
}

/* Column blocks: about one wave over all tiles (two blocks per SM), at most what the units
 * need. */
static unsigned gv_blocks(struct cu_ctx *c, int64_t units, unsigned tiles) {
    int64_t want = std::max<int64_t>(1, 2 * (int64_t)c->n_sms / (int64_t)tiles);
    return (unsigned)std::min(cu_div_up(units, CU_WARPS), want);
}

/* Measured (docs/cuda.md, step 4): with more tiles than about a quarter of the SMs, the tiled
 * kernels (several blocks per tile, each a slice of the columns) are faster. */
static bool gv_wanted(struct cu_ctx *c, int rx, unsigned tiles) {
    return rx <= 2 && c->gemv && (int)tiles <= c->n_sms / 4;
}

template <int WT>
static bool up_t(struct cu_ctx *c, const struct moe_p *p, int rx, unsigned tiles) {
    size_t smem = gv_smem(rx, p->D);
    if (smem > MOE_GV_SMEM_MAX) return false;
    static bool lim[2];
    dim3 grid(gv_blocks(c, p->I, tiles), tiles);
    if (rx == 1) {
        if (!smem_limit(c, k_moe_up_gv<WT, 1>, MOE_GV_SMEM_MAX, &lim[0], "moe up")) return true;
        cu_launch(c, k_moe_up_gv<WT, 1>, grid, CU_THREADS, smem, *p);
    } else {
        if (!smem_limit(c, k_moe_up_gv<WT, 2>, MOE_GV_SMEM_MAX, &lim[1], "moe up")) return true;
        cu_launch(c, k_moe_up_gv<WT, 2>, grid, CU_THREADS, smem, *p);
    }
    return true;
}

template <int WT>
static bool down_t(struct cu_ctx *c, const struct moe_p *p, int rx, unsigned tiles) {
    size_t smem = gv_smem(rx, p->I);
    if (smem > MOE_GV_SMEM_MAX) return false;
    static bool lim[2];
    dim3 grid(gv_blocks(c, cu_div_up(p->D, GEMM_RW), tiles), tiles);
    if (rx == 1) {
        if (!smem_limit(c, k_moe_down_gv<WT, 1>, MOE_GV_SMEM_MAX, &lim[0], "moe down")) return true;
        cu_launch(c, k_moe_down_gv<WT, 1>, grid, CU_THREADS, smem, *p);
    } else {
        if (!smem_limit(c, k_moe_down_gv<WT, 2>, MOE_GV_SMEM_MAX, &lim[1], "moe down")) return true;
        cu_launch(c, k_moe_down_gv<WT, 2>, grid, CU_THREADS, smem, *p);
    }
    return true;
}

bool launch_moe_up_gv(struct cu_ctx *c, const struct moe_p *p, int type, int rx, unsigned tiles) {
    if (!gv_wanted(c, rx, tiles)) return false;
    switch (type) {
    case DSI_TYPE_BF16:
        return up_t<DSI_TYPE_BF16>(c, p, rx, tiles);
    case DSI_TYPE_F16:
        return up_t<DSI_TYPE_F16>(c, p, rx, tiles);
    case DSI_TYPE_F8_E4M3:
        return up_t<DSI_TYPE_F8_E4M3>(c, p, rx, tiles);
    case DSI_TYPE_FP4_E2M1:
        return up_t<DSI_TYPE_FP4_E2M1>(c, p, rx, tiles);
    default:
        return false;
    }
}

bool launch_moe_down_gv(struct cu_ctx *c, const struct moe_p *p, int type, int rx, unsigned tiles) {
    if (!gv_wanted(c, rx, tiles)) return false;
    switch (type) {
    case DSI_TYPE_BF16:
        return down_t<DSI_TYPE_BF16>(c, p, rx, tiles);
    case DSI_TYPE_F16:
        return down_t<DSI_TYPE_F16>(c, p, rx, tiles);
    case DSI_TYPE_F8_E4M3:
        return down_t<DSI_TYPE_F8_E4M3>(c, p, rx, tiles);
    case DSI_TYPE_FP4_E2M1:
        return down_t<DSI_TYPE_FP4_E2M1>(c, p, rx, tiles);
    default:
        return false;
    }
}
