/* tc.cu - tensor-core GEMMs for the `fast` numerics profile (dsi_gemm_args.fast,
 * dsi_moe_args.fast): mma.sync m16n8k16 with bf16 operands and fp32 accumulation, for dense
 * GEMMs on FP8 / BF16 weights and the MoE expert GEMMs (up + SwiGLU, down) on FP4 / FP8 weights
 * when a call has enough activation rows.
 *
 * Numerics. Weights are dequantised to bf16 in shared memory: an e4m3 or e2m1 code times a
 * UE8M0 scale has at most 4 significant bits, so the bf16 value is exact. Activations are
 * rounded to bf16, which is exact for the rows `fast` numerics feeds here (FP8-quantised with
 * power-of-two scales, or bf16-rounded, as in `reference`). Products of two bf16 values are
 * exact in fp32; only the order of the fp32 sums differs from the CPU reference (the tensor
 * cores add in their own order). Not bitwise; the op tests bound the difference.
 *
 * Layout. A block of TC_T = 256 threads (8 warps: 4 along the weight rows x 2 along the
 * activation rows) computes TC_BM = 128 weight rows (the mma's M) x BN activation rows (the
 * mma's N) over all of K (or a piece of it: launch_tc_gemm's split along K for small dense
 * grids, step 23), TC_BK = 64 at a time: every thread loads its share of the next step's
 * weight bytes and activation floats into registers while the warps multiply the current
 * step's bf16 tiles (two shared-memory buffers, one barrier per step). For the up projection
 * the 128 rows are 64 columns of W1 and the same 64 of W3, placed so that a thread holds the
 * gate and the up value of the same (column, row) and applies SwiGLU in registers. */
#include "gemm.cuh"
#include "moe.cuh"
#include "tc.cuh"

#include <algorithm>

#define TC_BM 128
#define TC_BK 64
#define TC_LD (TC_BK + 8) /* bf16 per shared row: 144 bytes, ldmatrix without bank conflicts */
#define TC_T  256

static size_t tc_smem_bytes(int BN) { return (size_t)2 * (TC_BM + BN) * TC_LD * 2; }

/* Shared row of the m-fragment f (0, 1) of warp row wm (0..3). For the up projection, fragment
 * 0 holds W1 columns and fragment 1 the same W3 columns. */
template <int MODE> __device__ __forceinline__ int tc_arow(int wm, int f) {
    return MODE == TC_UP ? f * 64 + wm * 16 : wm * 32 + f * 16;
}

template <int MODE, int WT, int BN>
__global__ void __launch_bounds__(TC_T, BN >= 128 ? 1 : 2) k_tc(struct tc_p p) {
    cu_pdl_enter();
    constexpr int NF = BN / 16;        /* n8 fragments per warp (a warp has BN / 2 rows) */
    constexpr int XV = BN * 16 / TC_T; /* float4 activation loads per thread per step */
    extern __shared__ uint4 tc_smem[];
    uint16_t *Ws = (uint16_t *)tc_smem;    /* [2][TC_BM][TC_LD] */
    uint16_t *Xs = Ws + 2 * TC_BM * TC_LD; /* [2][BN][TC_LD] */
    __shared__ const float *xrow[BN];
    __shared__ int64_t opos[BN]; /* MoE: h / out position of the row; -1: none */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int wm = warp & 3, wn = warp >> 2;

    /* ---- the block's rows */
    int e;
    int64_t K;
    const float *xs = MODE == TC_DENSE ? p.x : MODE == TC_UP ? p.m.x : p.m.h;
    int64_t lds = MODE == TC_DENSE ? p.ldx : MODE == TC_UP ? p.m.D : p.m.I;
    if (!tc_block_rows<MODE, BN>(p, xs, lds, p.gx, xrow, opos, &e, &K)) return;
    /* ---- this thread's weight row (loads): row tid / 2, K half tid % 2 of each step */
    int srow = tid >> 1, khalf = tid & 1;
    const uint8_t *wrow, *wsrow;
    int sh1, sb1;
    {
        int64_t r = -1;
        int mat = MODE == TC_UP && srow >= 64;
        if (MODE == TC_DENSE) {
            int64_t o = (int64_t)blockIdx.x * TC_BM + srow;
            if (o < p.n_out) r = p.row0 + o;
        } else if (MODE == TC_UP) {
            int64_t col = (int64_t)blockIdx.x * 64 + (srow & 63);
            if (col < p.m.I) r = col;
        } else {
            int64_t o = (int64_t)blockIdx.x * TC_BM + srow;
            if (o < p.m.D) r = o;
        }
        tc_wsrc<MODE>(p, e, mat, r, &wrow, &wsrow, &sh1, &sb1);
    }
    __syncthreads();

    /* ---- main loop */
    float acc[2][NF][4];
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int j = 0; j < NF; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[f][j][i] = 0.0f;
    /* Weight bytes are loaded PF steps ahead (wr[u] holds step s with s % PF == u: the loop is
     * unrolled by PF so the register arrays are indexed statically), activations one step. */
    constexpr int PF = BN <= 32 ? 4 : 2;
    struct tc_wraw wr[PF];
    float4 xr[XV];
    int64_t steps = K / TC_BK;
    int kb = 0;                            /* the first k of the block's piece of K (K < 2^31) */
    if (MODE == TC_DENSE && p.split > 1) { /* its piece's fp32 sums into cv (group g's columns) */
        int64_t g = blockIdx.z / p.split, pc = blockIdx.z - g * p.split, s0 = pc * p.sps;
        steps = steps - s0 < p.sps ? steps - s0 : p.sps;
        kb = (int)(s0 * TC_BK);
        int64_t cvw = p.n_out * (gridDim.z / p.split); /* the groups' columns */
        p.y = p.cv + pc * p.n * cvw + g * p.n_out;
        p.ldy = cvw;
        p.round = false;
    }
    auto load_x = [&](int64_t s) {
        int64_t k0 = kb + s * TC_BK;
#pragma unroll
        for (int v = 0; v < XV; v++) {
            int idx = tid + v * TC_T, j = idx >> 4, q = idx & 15;
            const float *src = xrow[j];
            xr[v] = src ? __ldg((const float4 *)(src + k0) + q) : make_float4(0, 0, 0, 0);
        }
    };
    auto step = [&](int64_t s, struct tc_wraw &w) {
        int buf = (int)(s & 1);
        uint16_t *W = Ws + buf * TC_BM * TC_LD, *X = Xs + buf * BN * TC_LD;
        {
            uint4 d[4];
            tc_decode_w<WT>(w, wrow != nullptr, d);
            uint4 *dst = (uint4 *)(W + srow * TC_LD + khalf * 32);
#pragma unroll
            for (int i = 0; i < 4; i++)
                dst[i] = d[i];
        }
#pragma unroll
        for (int v = 0; v < XV; v++) {
            int idx = tid + v * TC_T, j = idx >> 4, q = idx & 15;
            *(uint2 *)(X + j * TC_LD + q * 4) =
                make_uint2(bf16x2_rn(xr[v].x, xr[v].y), bf16x2_rn(xr[v].z, xr[v].w));
        }
        __syncthreads();
        if (s + PF < steps)
            tc_load_w<WT>(wrow, wsrow, sh1, sb1, kb + (s + PF) * TC_BK + khalf * 32, w);
        if (s + 1 < steps) load_x(s + 1);
#pragma unroll
        for (int kk = 0; kk < TC_BK / 16; kk++) {
            uint32_t a[2][4];
#pragma unroll
            for (int f = 0; f < 2; f++) {
                const uint16_t *ap =
                    W + (tc_arow<MODE>(wm, f) + (lane & 15)) * TC_LD + kk * 16 + (lane >> 4) * 8;
                ldsm_x4(smem_u32(ap), a[f]);
            }
            int tb = wn * (BN / 2);
            if (NF == 1) {
                uint32_t b0, b1;
                const uint16_t *bp =
                    X + (tb + (lane & 7)) * TC_LD + kk * 16 + ((lane >> 3) & 1) * 8;
                ldsm_x2(smem_u32(bp), b0, b1);
#pragma unroll
                for (int f = 0; f < 2; f++)
                    mma_bf16(acc[f][0], a[f], b0, b1);
            } else {
#pragma unroll
                for (int j = 0; j < NF; j += 2) {
                    uint32_t b[4];
                    const uint16_t *bp = X +
                                         (tb + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * TC_LD +
                                         kk * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4(smem_u32(bp), b);
#pragma unroll
                    for (int f = 0; f < 2; f++) {
                        mma_bf16(acc[f][j], a[f], b[0], b[1]);
                        mma_bf16(acc[f][j + 1], a[f], b[2], b[3]);
                    }
                }
            }
        }
    };
#pragma unroll
    for (int u = 0; u < PF; u++)
        if (u < steps)
            tc_load_w<WT>(wrow, wsrow, sh1, sb1, kb + (int64_t)u * TC_BK + khalf * 32, wr[u]);
    load_x(0);
    for (int64_t s = 0; s < steps; s += PF) {
#pragma unroll
        for (int u = 0; u < PF; u++)
            if (s + u < steps) step(s + u, wr[u]);
    }

    /* ---- epilogue: c[i] is (row g + 8 (i / 2), activation row 2 t + i % 2) of the fragment */
    int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < NF; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m = g + (i >> 1) * 8, jr = wn * (BN / 2) + j * 8 + 2 * t4 + (i & 1);
            int64_t ar = (int64_t)blockIdx.y * BN + jr;
            if (MODE == TC_UP)
                tc_put_up(p, opos, jr, (int64_t)blockIdx.x * 64 + wm * 16 + m, acc[0][j][i],
                          acc[1][j][i]);
            else
#pragma unroll
                for (int f = 0; f < 2; f++)
                    tc_put<MODE>(p, opos, jr, ar,
                                 (int64_t)blockIdx.x * TC_BM + tc_arow<MODE>(wm, f) + m,
                                 acc[f][j][i]);
        }
}

/* ---- launchers --------------------------------------------------------------------------- */

template <int MODE, int WT, int BN>
static bool tc_launch(struct cu_ctx *c, const struct tc_p *p, dim3 grid) {
    static bool smem_done = false;
    size_t sm = tc_smem_bytes(BN);
    if (!smem_limit(c, k_tc<MODE, WT, BN>, sm, &smem_done, "tensor-core gemm")) return false;
    cu_launch(c, k_tc<MODE, WT, BN>, grid, TC_T, sm, *p);
    return cu_check(c, MODE == TC_DENSE ? "gemm (tensor cores)" : "moe (tensor cores)");
}

template <int MODE, int WT>
static bool tc_launch_bn(struct cu_ctx *c, const struct tc_p *p, int bn, dim3 grid) {
    switch (bn) {
    case 16:
        return tc_launch<MODE, WT, 16>(c, p, grid);
    case 32:
        return tc_launch<MODE, WT, 32>(c, p, grid);
    case 64:
        return tc_launch<MODE, WT, 64>(c, p, grid);
    default:
        return tc_launch<MODE, WT, 128>(c, p, grid);
    }
}

/* Activation rows per block for an expert's `rows` rows, at most c->tc_bn_max. */
int tc_pick_bn(const struct cu_ctx *c, double rows) {
    int bn = rows > 64 ? 128 : rows > 32 ? 64 : rows > 16 ? 32 : 16;
    return bn < c->tc_bn_max ? bn : c->tc_bn_max;
}

static bool tc_w_ok(const struct cu_w *w, int64_t K) {
    if (!gemm_w_ok(w) || w->K != K || K % TC_BK) return false;
    return w->type == DSI_TYPE_F8_E4M3 || w->type == DSI_TYPE_FP4_E2M1 || w->type == DSI_TYPE_BF16;
}

/* launch_tc_gemm takes g (shapes, types, alignment) */
static bool tc_call_ok(const struct cu_ctx *c, const struct cu_gemm_call *g) {
    const struct cu_w *w = g->w;
    return g->n >= c->tc_dense_min && tc_w_ok(w, w->K) && w->type != DSI_TYPE_FP4_E2M1 &&
           gemm_fast_ok(w, g->x, g->ldx) && g->groups >= 1 && g->groups <= 65535 &&
           (g->groups == 1 || (g->gxs % 4 == 0 && (uintptr_t)g->x % 16 == 0));
}

/* launch_tc_gemm runs g (which it takes) on wg.cu / wgr.cu's wgmma tiles */
static bool tc_wg_ok(const struct cu_ctx *c, const struct cu_gemm_call *g) {
    return c->wg && g->n >= (g->groups > 1 ? c->wg_grouped_min : c->wg_dense_min) && g->n >= 128 &&
           (g->groups == 1 || (g->groups - 1) * g->gxs + g->w->K <= g->ldx);
}

bool tc_takes_kept_rows(const struct cu_ctx *c, const struct cu_gemm_call *g) {
    return tc_call_ok(c, g) && tc_wg_ok(c, g) && c->wg_rs &&
           wgr_dense_ok(g->w, g->groups > 1 ? g->groups : 1, g->gxs);
}

bool launch_tc_gemm(struct cu_ctx *c, const struct cu_gemm_call *g) {
    const struct cu_w *w = g->w;
    int64_t n = g->n;
    if (!tc_call_ok(c, g)) return false;
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.w = *w;
    p.row0 = g->row0;
    p.n_out = g->n_out;
    p.x = g->x;
    p.n = n;
    p.ldx = g->ldx;
    p.y = g->y;
    p.ldy = g->ldy;
    p.round = g->round;
    p.gx = g->gxs;
    p.gy = g->gys;
    int bn = n >= 512 ? 128 : n >= 128 ? 64 : 32;
    /* wg.cu: the same tiles (128 weight rows x 128) on wgmma from c->wg_dense_min rows
       (DSI_CUDA_WG_DENSE_MIN, default 512; at 256 rows wg.cu measured slower with its bf16 copy,
       step 16), grouped calls from c->wg_grouped_min (DSI_CUDA_WG_GROUPED_MIN, default 128: step
       36), groups side by side in a row */
    bool wg = tc_wg_ok(c, g);
    if (wg) bn = 128;
    dim3 grid((unsigned)cu_div_up(g->n_out, TC_BM), (unsigned)cu_div_up(n, bn),
              (unsigned)g->groups);
    if (wg) {
        int pw = cu_prof_begin(c, "gemm.wg");
        /* (wgr.cu's kernels with the weights in registers where c->wg_rs and the shapes allow;
           from c->ltb_min rows the calls on cuBLASLt's bf16 matmul, ltb.cu) */
        bool ok = launch_ltb_gemm(c, &p, grid) || (c->wg_rs && launch_wgr_gemm(c, &p, bn, grid)) ||
                  launch_wg_gemm(c, &p, bn, grid);
        cu_prof_end(c, pw);
        return ok || c->sticky;
    }
    /* A grid under 2 blocks per SM (decode batches of 64-511 rows on narrow weights: the
       compressors', the indexer's, the router's; each block a chain of K / TC_BK dependent
       steps) is split along K: pieces of sps steps, their fp32 sums added in piece order by
       launch_gemm_reduce (deterministic; `fast` numerics: another order of the sums). Grouped
       calls too where the groups' outputs sit side by side (gys = n_out: the output projection,
       8 groups of 128 weight-row blocks: 64-256 blocks of 64 steps; step 25), the reduce then
       over the groups' columns at once; their pieces at most as many as keep the grid within
       one wave of 2 blocks per SM (at batch 256 its 256 blocks are not split: two waves of half
       the steps would take as long). */
    int64_t blocks = (int64_t)grid.x * grid.y * g->groups, steps = w->K / TC_BK,
            target = 2 * (int64_t)c->n_sms, cvw = g->n_out * g->groups;
    bool side = g->groups == 1 || (g->gys == g->n_out && c->tc_split_grouped);
    if (c->tc_split && side && blocks < target && steps > 1 && (int64_t)g->groups * 32 <= 65535) {
        int64_t want = g->groups == 1 ? cu_div_up(target, blocks) : target / blocks;
        p.split = (int)cu_split_even(std::min<int64_t>(want, 32), steps, &p.sps);
        if (p.split > 1) {
            p.cv = (float *)cu_scratch(c, CU_SCR_GEMM, (size_t)(p.split * n * cvw) * 4);
            if (!p.cv) return true; /* (the sticky error is set) */
            grid.z = (unsigned)(p.split * g->groups);
        }
    }
    /* (the grouped output projection apart in the profile: the largest tc.cu call at decode) */
    int pp = cu_prof_begin(c, g->groups > 1 ? "gemm.tc_grouped" : "gemm.tc");
    bool ok = w->type == DSI_TYPE_F8_E4M3
                  ? tc_launch_bn<TC_DENSE, DSI_TYPE_F8_E4M3>(c, &p, bn, grid)
                  : tc_launch_bn<TC_DENSE, DSI_TYPE_BF16>(c, &p, bn, grid);
    cu_prof_end(c, pp);
    if (ok && p.split > 1) launch_gemm_reduce(c, p.cv, p.split, n, cvw, g->y, g->ldy, g->round);
    return ok || c->sticky;
}

bool tc_moe_ok(const struct cu_w *w1,
               const struct cu_w *w3,
               const struct cu_w *w2,
               int64_t D,
               int64_t I,
               const float *x) {
    return tc_w_ok(w1, D) && tc_w_ok(w3, D) && tc_w_ok(w2, I) && w1->type == w3->type &&
           w1->type != DSI_TYPE_BF16 && w2->type != DSI_TYPE_BF16 && (uintptr_t)x % 16 == 0 &&
           D % 4 == 0 && I % 4 == 0;
}

bool launch_tc_moe(struct cu_ctx *c, const struct moe_p *mp, bool up, int bn, unsigned tiles) {
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    int type = up ? mp->w1.type : mp->w2.type;
    dim3 grid((unsigned)(up ? cu_div_up(mp->I, 64) : cu_div_up(mp->D, TC_BM)), tiles);
    if (up)
        return type == DSI_TYPE_FP4_E2M1 ? tc_launch_bn<TC_UP, DSI_TYPE_FP4_E2M1>(c, &p, bn, grid)
                                         : tc_launch_bn<TC_UP, DSI_TYPE_F8_E4M3>(c, &p, bn, grid);
    return type == DSI_TYPE_FP4_E2M1 ? tc_launch_bn<TC_DOWN, DSI_TYPE_FP4_E2M1>(c, &p, bn, grid)
                                     : tc_launch_bn<TC_DOWN, DSI_TYPE_F8_E4M3>(c, &p, bn, grid);
}
