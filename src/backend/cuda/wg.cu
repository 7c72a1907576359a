/* wg.cu - the tensor-core block GEMMs of tc.cu on Hopper's warpgroup instructions (wgmma,
 * sm_90a): the MoE expert GEMMs (up + SwiGLU, down) on FP4 / FP8 weights and dense GEMMs on FP8
 * / BF16 weights, for calls with many activation rows (the prefill). Same numerics as tc.cu
 * (weights decoded exactly to bf16, activations rounded to bf16, fp32 accumulation in the tensor
 * cores' order): not bitwise; the op tests bound the difference.
 *
 * A block of WG_T = 256 threads (2 warpgroups) computes WG_BM = 128 weight rows x BN activation
 * rows (64, 128 or 192; DYN: 64, 128 or 256, the wgmma as wide as the tile's rows rounded up to
 * 32; dense: 64 or 128) over all of K, WG_BK = 64 at a time, in shared memory in
 * the 128-byte swizzled K-major layout that wgmma reads (a row of 64 bf16 is 128 bytes; its 16-byte
 * chunk c sits at chunk c ^ (row % 8); 8-row atoms of 1 KB). The activations come from a bf16 copy
 * of the rows (launch_wg_bf16: exact for the rows `fast` numerics feeds), copied straight into
 * shared memory by cp.async two steps ahead; every thread decodes its share of the weight tile
 * (row tid / 2, 32 k; loaded four steps ahead into registers) and stores it. Then warpgroup w
 * issues 4 wgmma m64nBNk16 on its 64 weight rows (A) and all BN activation rows (B),
 * asynchronously, and waits for its previous step's (wait_group 1). WG_ST = 4 stages, step s
 * in stage s % 4: after the barrier of step s the wgmma of step s - 2 is done in both
 * warpgroups, so the copies of step s + 2's activations into stage (s + 2) % 4 = (s - 2) % 4
 * start there, and step s + 1's weights (stored after it) go to a stage read at step s - 3. The
 * decode of step s + 1 overlaps the wgmma of step s.
 *
 * MoE up: the block's 128 weight rows are 64 columns of W1 and the same 64 of W3, placed so that
 * the accumulator of a thread holds the gate and the up value of the same (column, row): in a
 * warp's 16 rows, rows 0-7 are W1 columns and rows 8-15 the same W3 columns (the accumulator's
 * row g and g + 8). */
#include "gemm.cuh"
#include "moe.cuh"
#include "norm.cuh"
#include "tc.cuh"
#include "wg.cuh"

#include <algorithm>

#define WG_BM 128
#define WG_BK 64 /* bf16: one 128-byte swizzle row */
#define WG_T  256
#define WG_ST 4

/* Stage bytes and the dynamic shared memory (plus 1 KB to align the stages to the atoms). */
static size_t wg_smem_bytes(int BN) { return (size_t)WG_ST * (WG_BM + BN) * 128 + 1024; }

#ifdef WG_HAVE
/* One step's WG_BK / 16 wgmma of width 32 M, where M = nsel (1 .. BN / 32; uniform in the block:
 * the tile's rows rounded up to 32), from M = BN / 32 down, fenced and committed as one group
 * inside each branch: with the commit after the branches join, ptxas ends each branch's group
 * at its last wgmma and adds an empty one at the join (a dummy HGMMA with its own group end), so
 * that waiting for all but one group would wait for the step's own wgmma (SASS, step 25). */
template <int BN, int M = BN / 32>
__device__ __forceinline__ void
wg_mma_step(float (&d)[BN / 2], int nsel, uint32_t a0, uint32_t b0) {
    if (nsel >= M || M == 1) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++)
            wg_mma_k16<32 * M>(d, wg_desc(a0 + kk * 32), wg_desc(b0 + kk * 32));
        wg_commit();
    } else if constexpr (M > 1) {
        wg_mma_step<BN, M - 1>(d, nsel, a0, b0);
    }
}
#endif

/* DYN (MoE): the tile's rows rounded up to 32 (nv) set the wgmma width, the activation rows
 * staged and the epilogue's columns, so that a tile of few rows in a block of BN costs less. */
template <int MODE, int WT, int BN, bool DYN>
__global__ void __launch_bounds__(WG_T, BN >= 128 ? 1 : 2) k_wg(struct tc_p p) {
#ifdef WG_HAVE
    cu_pdl_enter();
    constexpr int XC = BN * 8 / WG_T;              /* 16-byte activation chunks per thread */
    constexpr uint32_t STAGE = (WG_BM + BN) * 128; /* bytes per stage: A, then B */
    constexpr int PF = 4;                          /* weight loads this many steps ahead */
    extern __shared__ uint4 wg_smem[];
    uint32_t raw = smem_u32(wg_smem), base = (raw + 1023u) & ~1023u;
    char *gbase = (char *)wg_smem + (base - raw);
    __shared__ const uint16_t *xrow[BN];
    __shared__ int64_t opos[BN]; /* MoE: h / out position of the row; -1: none */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2, w4 = warp & 3;

    int e, nv;
    int64_t K;
    const uint16_t *xs;
    if (!wg_block_rows<MODE, BN, DYN>(p, xrow, opos, &e, &K, &nv, &xs)) return;
    /* this thread's weight row: A row srow, K half khalf of each step */
    int srow = tid >> 1, khalf = tid & 1;
    const uint8_t *wrow, *wsrow;
    int sh1, sb1;
    {
        int64_t r = -1;
        int mat = 0;
        if (MODE == TC_UP) { /* A row = 64 wg + 16 w4 + 8 mat + g: column 32 wg + 8 w4 + g */
            mat = (srow >> 3) & 1;
            int64_t col =
                (int64_t)blockIdx.x * 64 + (srow >> 6) * 32 + ((srow >> 4) & 3) * 8 + (srow & 7);
            if (col < p.m.I) r = col;
        } else {
            int64_t o = (int64_t)blockIdx.x * WG_BM + srow;
            if (o < (MODE == TC_DENSE ? p.n_out : p.m.D)) r = MODE == TC_DENSE ? p.row0 + o : o;
        }
        tc_wsrc<MODE>(p, e, mat, r, &wrow, &wsrow, &sh1, &sb1);
    }
    __syncthreads();

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        acc[i] = 0.0f;
    struct tc_wraw wr[PF];
    int64_t steps = K / WG_BK;
    /* activations of step s into stage s % WG_ST: chunk c of row j (one cp.async group) */
    auto load_x = [&](int64_t s) {
        if (s < steps) {
            uint32_t B = base + (uint32_t)(s % WG_ST) * STAGE + WG_BM * 128;
#pragma unroll
            for (int v = 0; v < XC; v++) {
                int idx = tid + v * WG_T, j = idx >> 3, c = idx & 7;
                const uint16_t *src = xrow[j];
                if (DYN && j >= nv) continue; /* rows no wgmma reads */
                cu_cp16(B + wg_sw(j, c), src ? src + s * WG_BK + c * 8 : xs, src != nullptr);
            }
        }
        cu_cp_commit(); /* one group per step, empty past the end */
    };
    auto step = [&](int64_t s, struct tc_wraw &w) {
        uint32_t st = (uint32_t)(s % WG_ST) * STAGE;
        {
            uint4 d[4];
            tc_decode_w<WT>(w, wrow != nullptr, d);
            char *A = gbase + st;
#pragma unroll
            for (int i = 0; i < 4; i++)
                *(uint4 *)(A + wg_sw(srow, khalf * 4 + i)) = d[i];
        }
        cu_cp_wait<1>(); /* this thread's activations of step s (s + 1's may be in flight) */
        wg_fence_smem();
        __syncthreads();
        load_x(s + 2); /* stage (s + 2) % 4: read by the wgmma of step s - 2, done (see above) */
        if (s + PF < steps) tc_load_w<WT>(wrow, wsrow, sh1, sb1, (s + PF) * WG_BK + khalf * 32, w);
        uint32_t a0 = base + st + (uint32_t)wgi * 64 * 128, b0 = base + st + WG_BM * 128;
        wg_mma_step<BN>(acc, nv >> 5, a0, b0);
        wg_wait<1>();
    };
#pragma unroll
    for (int u = 0; u < PF; u++)
        if (u < steps) tc_load_w<WT>(wrow, wsrow, sh1, sb1, (int64_t)u * WG_BK + khalf * 32, wr[u]);
    load_x(0);
    load_x(1);
    wg_k_loop<PF>(steps, [&](int64_t s, int u) { step(s, wr[u]); });
    wg_finish<MODE, BN, DYN>(p, opos, acc, nv, wgi, w4, lane);
#endif
}

/* ---- launchers --------------------------------------------------------------------------- */

template <int MODE, int WT, int BN, bool DYN = false>
static bool wg_launch(struct cu_ctx *c, const struct tc_p *p, dim3 grid) {
    static bool smem_done = false;
    size_t sm = wg_smem_bytes(BN);
    if (!smem_limit(c, k_wg<MODE, WT, BN, DYN>, sm, &smem_done, "wgmma gemm")) return false;
    cu_launch(c, k_wg<MODE, WT, BN, DYN>, grid, WG_T, sm, *p);
    return cu_check(c, MODE == TC_DENSE ? "gemm (wgmma)" : "moe (wgmma)");
}

/* Blocks of 64 or 128 rows; the MoE's also 192, or with dyn (its tiles' widths) 64, 128, 256. */
template <int MODE, int WT>
static bool wg_launch_bn(struct cu_ctx *c, const struct tc_p *p, int bn, bool dyn, dim3 grid) {
    if constexpr (MODE == TC_DENSE)
        return bn <= 64 ? wg_launch<MODE, WT, 64>(c, p, grid)
                        : wg_launch<MODE, WT, 128>(c, p, grid);
    else if (dyn)
        return bn <= 64    ? wg_launch<MODE, WT, 64, true>(c, p, grid)
               : bn <= 128 ? wg_launch<MODE, WT, 128, true>(c, p, grid)
                           : wg_launch<MODE, WT, 256, true>(c, p, grid);
    else
        return bn <= 64    ? wg_launch<MODE, WT, 64>(c, p, grid)
               : bn <= 128 ? wg_launch<MODE, WT, 128>(c, p, grid)
                           : wg_launch<MODE, WT, 192>(c, p, grid);
}

/* The bf16 copy: one thread per destination pair (PERM: in wgr.cu's K order, wg_perm_col), rows
 * in grid.y (strided past 65535). */
/* (POS: y's row r from x's row perm[r] / topk below nk, r - nk from nk on; zeros for a
 * position no slot holds, whose perm entry k_moe_group left unwritten: slots dropped for an
 * expert id out of range) */
template <bool PERM, bool POS = false>
__global__ void k_wg_bf16(const float *x,
                          int64_t rows,
                          int64_t cols,
                          int64_t ldx,
                          uint16_t *y,
                          int64_t ldy,
                          const int32_t *perm = nullptr,
                          int topk = 1,
                          int64_t nk = 0) {
    cu_pdl_enter();
    int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q * 2 >= cols) return;
    int64_t src = PERM ? wg_perm_col(q) : q * 2;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        int64_t xr = POS ? wg_pos_row(r, perm, topk, nk) : r;
        float2 v = xr >= 0 ? *(const float2 *)(x + xr * ldx + src) : make_float2(0.0f, 0.0f);
        *(uint32_t *)(y + r * ldy + q * 2) = bf16x2_rn(v.x, v.y);
    }
}

/* The permuted copy (and POS: by position, as k_wg_bf16's) on whole 128-groups: a warp a row, a
 * float4 a lane per group (elements 4 L .. 4 L + 3 of lane L, k_wg_bf16_q8's pair placement),
 * WG_CP_U groups' loads in flight a lane (c->wg_cp, step 43: k_wg_bf16's thread a pair, with its
 * two dependent loads, ran the 8k prefill's copy by position at ~0.9 TB/s). The same pairs through
 * the same conversion: the same bytes. */
#define WG_CP_U     8
#define WG_TOK_MAXK 16 /* k_wg_bf16_tok: the most slots a token */
template <bool POS>
__global__ void __launch_bounds__(CU_THREADS) k_wg_bf16_v(const float *x,
                                                          int64_t rows,
                                                          int nb,
                                                          int64_t ldx,
                                                          uint16_t *y,
                                                          int64_t ldy,
                                                          const int32_t *perm,
                                                          int topk,
                                                          int64_t nk) {
    cu_pdl_enter();
    int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int64_t xr = POS ? wg_pos_row(r, perm, topk, nk) : r;
    uint32_t *yp = (uint32_t *)(y + r * ldy) + wg_perm_dst(2 * lane);
    const float4 *xp = (const float4 *)(x + (xr >= 0 ? xr : 0) * ldx) + lane;
    for (int b0 = 0; b0 < nb; b0 += WG_CP_U) {
        float4 v[WG_CP_U];
#pragma unroll
        for (int u = 0; u < WG_CP_U; u++)
            v[u] = xr >= 0 && b0 + u < nb ? __ldg(xp + (b0 + u) * 32) : make_float4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < WG_CP_U; u++) {
            if (b0 + u >= nb) break;
            uint32_t *d = yp + (b0 + u) * 64;
            d[0] = bf16x2_rn(v[u].x, v[u].y);
            d[4] = bf16x2_rn(v[u].z, v[u].w);
        }
    }
}

/* k_wg_bf16_v's launch where its shapes allow (c->wg_cp); false: not taken. */
template <bool POS>
static bool wg_bf16_v(struct cu_ctx *c,
                      const float *x,
                      int64_t rows,
                      int64_t cols,
                      int64_t ldx,
                      uint16_t *y,
                      int64_t ldy,
                      const int32_t *perm,
                      int topk,
                      int64_t nk) {
    if (!c->wg_cp || cols % 128 || ldx % 4 || ldy % 2 || (uintptr_t)x % 16 || (uintptr_t)y % 4 ||
        cols / 128 > INT32_MAX || cu_div_up(rows, CU_WARPS) > INT32_MAX)
        return false;
    cu_launch(c, k_wg_bf16_v<POS>, (unsigned)cu_div_up(rows, CU_WARPS), CU_THREADS, 0, x, rows,
              (int)(cols / 128), ldx, y, ldy, perm, topk, nk);
    return true;
}

/* The copy by position by token (launch_wg_bf16_pos with inv; c->wg_tok, step 47): a warp a row
 * t of x, read once (step 47's Nsight: the copy by position read each row of x again for each of
 * its topk + 1 positions, 940 MB from DRAM at the 8k prefill, x being larger than L2: 433 us a
 * call), its pairs converted as k_wg_bf16_v converts them (the same bytes) and stored at rows
 * inv[t topk + k] (k < topk, -1: none) and nk + t. */
__global__ void __launch_bounds__(CU_THREADS) k_wg_bf16_tok(const float *x,
                                                            int64_t n,
                                                            int nb,
                                                            uint16_t *y,
                                                            int64_t ldy,
                                                            const int32_t *inv,
                                                            int topk,
                                                            int64_t nk) {
    cu_pdl_enter();
    int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (t >= n) return;
    int64_t dst[WG_TOK_MAXK + 1];
    int nd = 0;
    for (int k = 0; k < topk; k++) {
        int32_t pos = inv[t * topk + k];
        if (pos >= 0 && pos < nk) dst[nd++] = pos;
    }
    dst[nd++] = nk + t;
    const float4 *xp = (const float4 *)(x + t * (int64_t)nb * 128) + lane;
    int od = wg_perm_dst(2 * lane);
    for (int b0 = 0; b0 < nb; b0 += WG_CP_U) {
        float4 v[WG_CP_U];
#pragma unroll
        for (int u = 0; u < WG_CP_U; u++)
            v[u] = b0 + u < nb ? __ldg(xp + (b0 + u) * 32) : make_float4(0, 0, 0, 0);
        uint32_t lo[WG_CP_U], hi[WG_CP_U];
#pragma unroll
        for (int u = 0; u < WG_CP_U; u++) {
            lo[u] = bf16x2_rn(v[u].x, v[u].y);
            hi[u] = bf16x2_rn(v[u].z, v[u].w);
        }
        for (int j = 0; j < nd; j++) {
            uint32_t *yp = (uint32_t *)(y + dst[j] * ldy) + od + b0 * 64;
#pragma unroll
            for (int u = 0; u < WG_CP_U; u++) {
                if (b0 + u >= nb) break;
                yp[u * 64] = lo[u];
                yp[u * 64 + 4] = hi[u];
            }
        }
    }
}

void launch_wg_bf16_pos(struct cu_ctx *c,
                        const float *x,
                        int64_t n,
                        int64_t nk,
                        const int32_t *perm,
                        const int32_t *inv,
                        int topk,
                        int64_t cols,
                        uint16_t *y) {
    int64_t rows = nk + n;
    if (rows <= 0) return;
    if (inv && c->wg_tok && topk <= WG_TOK_MAXK && cols % 128 == 0 && cols / 128 <= INT32_MAX &&
        (uintptr_t)x % 16 == 0 && (uintptr_t)y % 4 == 0 && cu_div_up(n, CU_WARPS) <= INT32_MAX) {
        cu_launch(c, k_wg_bf16_tok, (unsigned)cu_div_up(n, CU_WARPS), CU_THREADS, 0, x, n,
                  (int)(cols / 128), y, cols, inv, topk, nk);
        cu_check(c, "bf16 copy by position (by token)");
        return;
    }
    if (wg_bf16_v<true>(c, x, rows, cols, cols, y, cols, perm, topk, nk)) {
        cu_check(c, "bf16 copy by position");
        return;
    }
    dim3 grid((unsigned)cu_div_up(cols / 2, 256), (unsigned)std::min<int64_t>(rows, 65535));
    cu_launch(c, k_wg_bf16<true, true>, grid, 256, 0, x, rows, cols, cols, y, cols, perm, topk, nk);
    cu_check(c, "bf16 copy by position");
}

void launch_wg_bf16(struct cu_ctx *c,
                    const float *x,
                    int64_t rows,
                    int64_t cols,
                    int64_t ldx,
                    uint16_t *y,
                    int64_t ldy,
                    bool permuted) {
    if (rows <= 0) return;
    dim3 grid((unsigned)cu_div_up(cols / 2, 256), (unsigned)std::min<int64_t>(rows, 65535));
    const int32_t *none = nullptr;
    if (permuted && wg_bf16_v<false>(c, x, rows, cols, ldx, y, ldy, none, 1, (int64_t)0)) {
        cu_check(c, "bf16 copy");
        return;
    }
    if (permuted)
        cu_launch(c, k_wg_bf16<true>, grid, 256, 0, x, rows, cols, ldx, y, ldy, none, 1,
                  (int64_t)0);
    else
        cu_launch(c, k_wg_bf16<false>, grid, 256, 0, x, rows, cols, ldx, y, ldy, none, 1,
                  (int64_t)0);
    cu_check(c, "bf16 copy");
}

/* act_quant (blocks of 128) and the permuted bf16 copy in one pass (launch_wg_bf16_q8): one warp
 * per (row, block), a float4 per lane (k_act_quant128's numbers, q8_warp_quant); lane L holds
 * elements 4 L .. 4 L + 3 of the group, whose pairs wgr.cu's K order puts at pairs 8 (L % 8) + L
 * / 8 and that + 4 (the inverse of wg_perm_col). */
__global__ void __launch_bounds__(CU_THREADS) k_wg_bf16_q8(
    float *x, int64_t rows, int nb, int64_t ldx, uint16_t *y, int64_t ldy, int64_t keep_from) {
    cu_pdl_enter();
    int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (wid >= rows * nb) return;
    int64_t r = wid / nb;
    int b = (int)(wid - r * nb);
    float4 *xp = (float4 *)(x + r * ldx + b * 128) + lane;
    float4 q = q8_warp_quant(*xp);
    if (r >= keep_from) *xp = q;
    uint32_t *yp = (uint32_t *)(y + r * ldy + b * 128);
    int q0 = wg_perm_dst(2 * lane);
    yp[q0] = bf16x2_rn(q.x, q.y);
    yp[q0 + 4] = bf16x2_rn(q.z, q.w);
}

bool launch_wg_bf16_q8(struct cu_ctx *c,
                       float *x,
                       int64_t rows,
                       int64_t cols,
                       int64_t ldx,
                       uint16_t *y,
                       int64_t ldy,
                       int64_t keep_from) {
    int64_t nb = cols / 128;
    if (cols % 128 || ldx % 4 || ldy % 2 || (uintptr_t)x % 16 || (uintptr_t)y % 4 || nb > INT32_MAX)
        return false;
    if (rows <= 0) return true;
    cu_launch(c, k_wg_bf16_q8, (unsigned)cu_div_up(rows * nb, CU_WARPS), CU_THREADS, 0, x, rows,
              (int)nb, ldx, y, ldy, keep_from);
    return cu_check(c, "act_quant + bf16 copy");
}

/* Activation rows per block for a mean of `rows` per tile: 64, or 128 / 192 (dyn: 256) from 65
 * / 129 rows where c->wg_bn (DSI_CUDA_WG_BN) allows. */
int wg_pick_bn(const struct cu_ctx *c, double rows, bool dyn) {
    return rows > 128 && c->wg_bn >= 192  ? (dyn ? 256 : 192)
           : rows > 64 && c->wg_bn >= 128 ? 128
                                          : 64;
}

bool wg_dense_copy(
    struct cu_ctx *c, const struct tc_p *p, dim3 grid, bool permuted, struct tc_p *q) {
    /* the columns every group reads, [0, (groups - 1) gx + K) (the caller checked that this is
       within a row) */
    int64_t width = (int64_t)(grid.z - 1) * p->gx + p->w.K;
    uint16_t *x16 = (uint16_t *)cu_scratch(c, CU_SCR_GEMM, (size_t)(p->n * width) * 2);
    if (!x16) return false;
    *q = *p;
    q->x16 = x16;
    q->ld16 = width;
    /* the attention's bf16 rows of x, written into this slot just before (c->o16) */
    if (permuted && c->o16.take && p->x == c->o16.src && p->n == c->o16.n && width == c->o16.cols &&
        p->ldx == width && x16 == c->o16.buf) {
        c->o16.took = true;
        return true;
    }
    /* (a pair's second call: the first's copy) */
    struct cu_xc_key k = {permuted ? XC_BF16P : XC_BF16, p->x, p->n, width, p->ldx, x16};
    if (cu_xc_take(c, &k)) return true;
    launch_wg_bf16(c, p->x, p->n, width, p->ldx, x16, width, permuted);
    cu_xc_made(c, &k);
    return true;
}

bool launch_wg_gemm(struct cu_ctx *c, const struct tc_p *p, int bn, dim3 grid) {
    struct tc_p q;
    if (!wg_dense_copy(c, p, grid, false, &q)) return false;
    return p->w.type == DSI_TYPE_F8_E4M3
               ? wg_launch_bn<TC_DENSE, DSI_TYPE_F8_E4M3>(c, &q, bn, false, grid)
               : wg_launch_bn<TC_DENSE, DSI_TYPE_BF16>(c, &q, bn, false, grid);
}

bool launch_wg_moe(
    struct cu_ctx *c, const struct moe_p *mp, bool up, int bn, bool rs, bool dyn, unsigned tiles) {
    if (mp->x8) return launch_wgq_moe(c, mp, up, bn, dyn, tiles); /* FP8 codes: wgq.cu */
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    int type = up ? mp->w1.type : mp->w2.type;
    dim3 grid((unsigned)(up ? cu_div_up(mp->I, 64) : cu_div_up(mp->D, WG_BM)), tiles);
    bool f4 = type == DSI_TYPE_FP4_E2M1;
    if (rs) return wr_launch_moe(c, &p, up, f4, bn, dyn, grid); /* the weights in registers */
    if (up)
        return f4 ? wg_launch_bn<TC_UP, DSI_TYPE_FP4_E2M1>(c, &p, bn, dyn, grid)
                  : wg_launch_bn<TC_UP, DSI_TYPE_F8_E4M3>(c, &p, bn, dyn, grid);
    return f4 ? wg_launch_bn<TC_DOWN, DSI_TYPE_FP4_E2M1>(c, &p, bn, dyn, grid)
              : wg_launch_bn<TC_DOWN, DSI_TYPE_F8_E4M3>(c, &p, bn, dyn, grid);
}
