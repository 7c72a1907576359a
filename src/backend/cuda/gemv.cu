/* gemv.cu - the GEMM for one or two activation rows (decode), same arithmetic as k_gemm.
 *
 * At decode the GEMM is bound by how many weight bytes are in flight. k_gemm gives every block
 * one tile (8 warps x 2 weight rows) for its pieces of K, with a block barrier around each
 * staged piece of x, so a block's loads are in flight only at its start and the GPU runs many
 * short waves. Here a block stages its whole share of x once (all its pieces, one barrier),
 * then each warp walks weight-row pairs persistently (grid-stride over pairs, pieces inner),
 * loading the raw bytes of the next (pair, piece) before decoding the current one, so every
 * warp always has a load in flight and the grid is about one wave. Split-K (blockIdx.z: a
 * range of pieces) when the pairs alone cannot fill the GPU, with k_gemm's ordered reduce.
 *
 * Order of the arithmetic: as k_gemm (lane L computes chunk 32p + L; the owner lane adds a
 * piece's 32 chunk values in order; pieces in order; split-K writes chunk values for the
 * ordered second pass): bitwise equal to the CPU backend. */
#include "common.cuh"
#include "gemm.cuh"

#include <algorithm>

#define GV_SMEM_MAX (100 * 1024) /* two blocks per SM */

/* Bytes of dynamic shared memory: the staged x (RX rows of pps pieces), the chunk values. */
static size_t gemv_smem_bytes(int rx, int64_t pps) {
    return (size_t)rx * (size_t)pps * 32 * XS_STRIDE * 4 + (size_t)CU_WARPS * rx * GEMM_RW * 33 * 4;
}

template <int WT>
__device__ __forceinline__ void gv_load(const struct cu_w &w,
                                        int64_t row0,
                                        int64_t n_out,
                                        int64_t nq,
                                        int64_t u,
                                        int64_t p,
                                        int lane,
                                        w_raw (&r)[GEMM_RW]) {
    int64_t q = p * 32 + lane;
#pragma unroll
    for (int k = 0; k < GEMM_RW; k++) {
        int64_t o = u * GEMM_RW + k;
        if (o >= n_out || q >= nq) continue;
        int64_t row = row0 + o;
        load_w_raw<WT>(w, w.data + row * w.row_bytes, w_scale_row(w, row), q, r[k]);
    }
}

template <int WT, int RX>
__global__ void __launch_bounds__(CU_THREADS, 2) k_gemv(struct cu_w w,
                                                        int64_t row0,
                                                        int64_t n_out,
                                                        const float *x,
                                                        int64_t n,
                                                        int64_t ldx,
                                                        float *y,
                                                        int64_t ldy,
                                                        bool round,
                                                        int pps,
                                                        float *cv,
                                                        int64_t gxs,
                                                        int64_t gys) {
    /* group blockIdx.y (grouped launches: no split-K): rows row0 + g n_out.., x + g gxs, y + g gys
     */
    row0 += (int64_t)blockIdx.y * n_out;
    x += (int64_t)blockIdx.y * gxs;
    y += (int64_t)blockIdx.y * gys;
    extern __shared__ float4 gsm[];
    float *xs = (float *)gsm;
    int64_t nq = w.K / 32, np = (nq + 31) / 32;
    int64_t p0 = (int64_t)blockIdx.z * pps, p1 = p0 + pps < np ? p0 + pps : np;
    int nqs = pps * 32; /* chunk slots per staged row */
    float(*cvs)[RX * GEMM_RW][33] = (float(*)[RX * GEMM_RW][33])(xs + RX * nqs * XS_STRIDE);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t units = (n_out + GEMM_RW - 1) / GEMM_RW, stride = (int64_t)gridDim.x * CU_WARPS;
    int64_t u = (int64_t)blockIdx.x * CU_WARPS + warp, p = p0;
    bool active = u < units && p0 < p1;
    /* the first weight bytes load while the previous kernel finishes (cu_pdl_enter) */
    w_raw raw[GEMM_RW], nxt[GEMM_RW];
    if (active) gv_load<WT>(w, row0, n_out, nq, u, p, lane, raw);
    cu_pdl_enter();
    /* stage x: chunk c of row rx (c < (p1 - p0) * 32) at xs[(rx * nqs + c) * XS_STRIDE] */
    int64_t n4 = (p1 - p0) * 32 * 8;
    for (int64_t i = threadIdx.x; i < RX * n4; i += CU_THREADS) {
        int rx = (int)(i / n4);
        int64_t f = i % n4, ch = f / 8, part = f % 8, k = (p0 * 32 + ch) * 32 + part * 4;
        float4 v = rx < n && k < w.K ? *(const float4 *)(x + rx * ldx + k)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(float4 *)(xs + (rx * nqs + ch) * XS_STRIDE + part * 4) = v;
    }
    __syncthreads();
    if (!active) return; /* no barrier below */
    float acc = 0.0f;
    for (;;) {
        bool wrap = p + 1 >= p1;
        int64_t un = wrap ? u + stride : u, pn = wrap ? p0 : p + 1;
        bool more = un < units;
        if (more) gv_load<WT>(w, row0, n_out, nq, un, pn, lane, nxt);
        int64_t q = p * 32 + lane;
        bool qv = q < nq;
#pragma unroll
        for (int r = 0; r < GEMM_RW; r++) {
            int64_t o = u * GEMM_RW + r;
            bool ov = o < n_out;
            float wf[32];
            decode_w_raw<WT>(raw[r], qv && ov ? q : -1, wf);
#pragma unroll
            for (int rx = 0; rx < RX; rx++) {
                float xf[32];
                load_x_staged(xs, rx * pps + (int)(p - p0), lane, xf);
                float c = chunk_dot(xf, wf);
                if (cv) {
                    if (qv && ov && rx < n) cv[(q * n + rx) * n_out + o] = c;
                } else {
                    cvs[warp][rx * GEMM_RW + r][lane] = c;
                }
            }
        }
        if (!cv) {
            __syncwarp();
            if (lane < RX * GEMM_RW) {
                int cnt = (int)(nq - p * 32 < 32 ? nq - p * 32 : 32);
                for (int L = 0; L < cnt; L++)
                    acc += cvs[warp][lane][L];
            }
            __syncwarp();
            if (wrap) { /* the pair's last piece: write and start the next pair */
                int rx = lane / GEMM_RW;
                int64_t o = u * GEMM_RW + lane % GEMM_RW;
                if (lane < RX * GEMM_RW && rx < n && o < n_out)
                    y[rx * ldy + o] = rbf(acc + 0.0f, round);
                acc = 0.0f;
            }
        }
        if (!more) break;
        u = un;
        p = pn;
#pragma unroll
        for (int r = 0; r < GEMM_RW; r++)
            raw[r] = nxt[r];
    }
}

/* Launch for n <= 2 rows of x and non-F32 weights; false: the caller uses k_gemm. */
template <int WT> static bool launch_gemv_t(struct cu_ctx *c, const struct cu_gemm_call *g) {
    const struct cu_w *w = g->w;
    int64_t n = g->n, n_out = g->n_out, ldy = g->ldy;
    int groups = g->groups;
    float *y = g->y;
    int rx = n == 1 ? 1 : 2;
    int64_t nq = w->K / 32, np = cu_div_up(nq, 32), units = cu_div_up(n_out, GEMM_RW);
    int64_t slots = 2 * (int64_t)c->n_sms * CU_WARPS; /* resident warps, two blocks per SM */
    int64_t split = units * groups >= slots ? 1 : std::min(np, cu_div_up(slots, units * groups));
    int64_t pps_max = (GV_SMEM_MAX - (int64_t)gemv_smem_bytes(rx, 0)) / (rx * 32 * XS_STRIDE * 4);
    if (pps_max < 1) return false;
    split = std::max(split, cu_div_up(np, pps_max));
    int64_t pps = cu_div_up(np, split);
    split = cu_div_up(np, pps);
    if (groups > 1 && split > 1) return false; /* the caller runs the groups one by one */
    float *cv = NULL;
    if (split > 1) {
        if (nq * n * n_out * 4 > ((int64_t)64 << 20)) return false;
        cv = (float *)cu_scratch(c, CU_SCR_GEMM, (size_t)(nq * n * n_out) * 4);
        if (!cv) return true; /* sticky error set */
    }
    int64_t gx =
        std::min(cu_div_up(units, CU_WARPS), std::max<int64_t>(1, 2 * c->n_sms / split / groups));
    size_t smem = gemv_smem_bytes(rx, pps);
    static bool lim[2];
    if (rx == 1 && !smem_limit(c, k_gemv<WT, 1>, GV_SMEM_MAX, &lim[0], "gemv")) return true;
    if (rx == 2 && !smem_limit(c, k_gemv<WT, 2>, GV_SMEM_MAX, &lim[1], "gemv")) return true;
    dim3 grid((unsigned)gx, (unsigned)groups, (unsigned)split);
    int pm = cu_prof_begin(c, cv ? "gemm.gemv_splitk" : "gemm.gemv");
    if (rx == 1)
        cu_launch(c, k_gemv<WT, 1>, grid, CU_THREADS, smem, *w, g->row0, n_out, g->x, n, g->ldx, y,
                  ldy, g->round, (int)pps, cv, g->gxs, g->gys);
    else
        cu_launch(c, k_gemv<WT, 2>, grid, CU_THREADS, smem, *w, g->row0, n_out, g->x, n, g->ldx, y,
                  ldy, g->round, (int)pps, cv, g->gxs, g->gys);
    cu_prof_end(c, pm);
    if (!cu_check(c, "gemv")) return true;
    if (cv) launch_gemm_reduce(c, cv, nq, n, n_out, y, ldy, g->round);
    return true;
}

bool launch_gemv(struct cu_ctx *c, const struct cu_gemm_call *g) {
    if (g->n < 1 || g->n > 2 || !c->gemv || g->groups < 1 || g->groups > 65535) return false;
#define GV_T(T) launch_gemv_t<T>(c, g)
    switch (g->w->type) {
    case DSI_TYPE_BF16:
        return GV_T(DSI_TYPE_BF16);
    case DSI_TYPE_F16:
        return GV_T(DSI_TYPE_F16);
    case DSI_TYPE_F8_E4M3:
        return GV_T(DSI_TYPE_F8_E4M3);
    case DSI_TYPE_FP4_E2M1:
        return GV_T(DSI_TYPE_FP4_E2M1);
    default:
        return false;
    }
#undef GV_T
}
