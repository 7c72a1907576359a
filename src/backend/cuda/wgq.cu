/* wgq.cu - the MoE's block GEMMs (up + SwiGLU and down, routed and shared experts, FP4 / FP8
 * weights; `fast` numerics) on Hopper's FP8 tensor cores (wgmma m64nNk32 e4m3, twice bf16's
 * rate): wgr.cu's structure (a block of 2 warpgroups, 128 weight rows in registers x BN
 * activation rows, 128 k a step) with both operands in FP8: the activations as act_quant's codes
 * (launch_wgq_codes), the weights as they are (FP8) or converted per step (FP4), and the scales
 * applied to each step's fp32 sums (DeepGEMM's promotion). c->wg_q8 (DSI_CUDA_WG_Q8=1; step 28).
 *
 * Numerics. The reference multiplies act_quant's e4m3 codes (one power-of-two scale per 128 k of
 * an activation row) by the weight's values and adds each 128-block's (FP8) or 32-block's (FP4)
 * partial sum times both scales in fp32. Here a step is one 128-block: its products are exact in
 * the tensor cores (e4m3 x e4m3), added in their order and precision (Hopper's FP8 adds
 * truncate, as lt.cu's do), and the step's sum times the activation row's scale times the weight
 * row's step scale is added to an fp32 accumulator. FP4: a row's 32-blocks have scales 2^(S_q -
 * 127); with B the largest over the row's whole K, code x 2^(S_q - B + 6) is an e4m3 value (at
 * most 6 x 2^6 = 384), exact while S_q >= B - 14 (below, the smallest codes fall under e4m3's
 * subnormals and round: the spec's FP4 -> FP8 conversion has the same limit, per 128 x 128 tile),
 * and the row's weight scale 2^(B - 6 - 127) is one for all steps: the promotion is then one
 * multiply-add per sum (the activation scale) and the weight scale multiplies the result once.
 * So the products are the reference's times powers of two; the order and the precision of the
 * sums differ (the `fast` profile's licence; the op tests bound the results).
 *
 * The K order. wgmma's 8-bit A fragment (wg.cuh): lane (g, t) supplies k 4t..4t+3 and
 * 16+4t..16+4t+3 of rows g and g + 8 of each k32 slice. Lane t loads the 32 consecutive k [32 t,
 * 32 t + 32) of its two rows per step (FP4: one 16-byte load and one scale; FP8: two loads), and
 * slice i (0..3) takes its elements 32 t + 8 i + 0..3 (a[0], a[1]) and + 4..7 (a[2], a[3]): word
 * i of the FP4 load converted to 8 bytes; bytes 8 i .. 8 i + 7 of the FP8 load as they are. So
 * byte c of each 128-group of the activation codes holds element wq_perm_byte(c) of the group.
 *
 * The pipeline. A step's activation tile is BN rows of 128 bytes (one 128-byte swizzled tile) and
 * BN scales, copied by cp.async wq_ah steps ahead into WQ_ST = 4 stages (3 ahead in step: after
 * the barrier of step s every thread is past step s - 1, whose stage is refilled; 2 staggered,
 * see k_wgq). Step s: the barrier; the copies; 4 wgmma into the partial sums (the first
 * overwriting them); while they run, the conversion of step s + 1's weights (loaded two steps
 * before) into the other of two fragment sets and the loads of step s + 3's into the registers
 * it frees; wait; the promotion (acc += part x activation scale, FP8 weights also x the step's
 * weight scale). BN 32, 64 or 128 (the partial sums double the accumulators: 128 registers at
 * 128). */
#include "gemm.cuh"
#include "moe.cuh"
#include "norm.cuh"
#include "tc.cuh"
#include "wg.cuh"
#include "wq.cuh"

#include <cuda_fp8.h>
#include <type_traits>

#define WQ_BM 128
#define WQ_T  256
#define WQ_ST 4
/* activation copies this many steps ahead: 3 (the stage of step s - 1 refilled after the
   barrier of step s), 2 when the second warpgroup's promotion of step s - 1 comes after that
   barrier (STG, wq_ah) */
__host__ __device__ constexpr int wq_ah(bool stg) { return stg ? WQ_ST - 2 : WQ_ST - 1; }

/* Dynamic shared memory: the stages' code tiles and scales, plus 1 KB to align the tiles. */
static size_t wq_smem_bytes(int BN) { return (size_t)WQ_ST * BN * (WQ_BK + 4) + 1024; }

#ifdef WG_HAVE
/* A step's 4 wgmma of width N into d, the first overwriting it; fenced and committed. */
template <int N, int NR>
__device__ __forceinline__ void
wq_mma_step(float (&d)[NR], const uint32_t (&a)[4][4], uint32_t b0) {
    static_assert(N / 2 <= NR, "wq_mma_step: the accumulators");
    wg_fence();
#pragma unroll
    for (int i = 0; i < 4; i++)
        wg_mma_q8_k32<N>(d, a[i], wg_desc(b0 + i * 32), (uint32_t)i);
    wg_commit();
}

/* f(std::integral_constant<int, M>) for M = nsel down from MX (at least 1): the K loop's copy
 * for wgmma of width 32 M (DYN). One copy per width, each with its first wgmma overwriting the
 * partial sums: step 31 replaced one loop choosing the width per step, whose wgmma all added
 * (ptxas serialised the scale-d-0 form across several widths, C7511) onto sums cleared after
 * each promotion, and whose promotion stopped at the live columns by a branch: ptxas re-zeroed
 * every earlier partial sum at each exit, ~500 moves a thread a step at BN 128. */
template <int MX, typename F> __device__ __forceinline__ void wq_width(int nsel, F f) {
    if constexpr (MX > 1) {
        if (nsel < MX) {
            wq_width<MX - 1>(nsel, f);
            return;
        }
    }
    f(std::integral_constant<int, MX>{});
}
#endif

/* MODE TC_UP (x8) or TC_DOWN (h8); DYN: each block's wgmma as wide as its tile's rows rounded up
 * to 32 (wg.cu's). STG (c->wgq_stg, DSI_CUDA_WGQ_STG=1; off from step 30: 6% slower): the
 * warpgroups staggered by half a step, so that each one's promotion runs beside the other's wgmma:
 * the second waits for and promotes step s - 1 after the barrier of step s, before issuing step s
 * (its wgmma run across the barrier; no more registers: the same partial sums, promoted later),
 * and the first issues right after the barrier and promotes at the end of its step; the stage
 * refilled after the barrier of step s is then that of step s - 2 (2 steps ahead). The outputs as
 * wgr.cu's (wg_finish). Blocks of 32 rows on FP4 weights (the decode's few rows per expert: more
 * weight loads in flight) fit two per SM (128 registers, no spills; the FP8 weights' raw registers
 * would spill there). */
template <int MODE, int WT, int BN, bool DYN, bool STG>
__global__ void __launch_bounds__(WQ_T, BN <= 32 && WT == DSI_TYPE_FP4_E2M1 ? 2 : 1)
    k_wgq(struct tc_p p) {
#ifdef WG_HAVE
    static_assert(MODE != TC_DENSE && (BN == 32 || BN == 64 || BN == 128),
                  "wgq.cu: the MoE, 32, 64 or 128 rows");
    cu_pdl_enter();
    constexpr int XC = BN * 8 / WQ_T;      /* 16-byte code chunks per thread and step */
    constexpr uint32_t STAGE = BN * WQ_BK; /* code bytes per stage */
    constexpr int WQ_AH = wq_ah(STG);
    static_assert(XC * 32 == BN, "rows xj + 32 v cover the tile");
    extern __shared__ uint4 wq_smem[];
    uint32_t raw = smem_u32(wq_smem), base = (raw + 1023u) & ~1023u;
    /* the stages' activation scales after the code tiles: [WQ_ST][BN] */
    const float *scs = (const float *)((const char *)wq_smem + (base - raw) + WQ_ST * STAGE);
    const uint32_t sc_base = base + WQ_ST * STAGE;
    __shared__ const uint8_t *xrow[BN];
    __shared__ const float *srow[BN]; /* the row's scales (NULL: none) */
    __shared__ int64_t opos[BN];      /* h / out position of the row; -1: none */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2, w4 = warp & 3;
    int g = lane >> 2, t4 = lane & 3;

    const uint8_t *xs = MODE == TC_UP ? p.m.x8 : p.m.h8;
    const float *ss = MODE == TC_UP ? p.m.x8s : p.m.h8s;
    int e, rows = BN;
    int64_t K;
    if (!wq_block_rows<MODE, BN>(p, xrow, srow, opos, &e, &K, &rows)) return;
    const int nv = DYN ? min(BN, (rows + 31) & ~31) : BN;
    const uint8_t *wrow[2], *wsrow[2];
    int sh1[2], sb1[2];
    static_assert(WQ_BM == 128, "wr_rows: 128 weight rows a block");
    wr_rows<MODE>(p, e, wgi, w4, g, wrow, wsrow, sh1, sb1);
    const bool valid[2] = {wrow[0] != nullptr, wrow[1] != nullptr};
    __syncthreads();

    float acc[BN / 2], part[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        acc[i] = part[i] = 0.0f;
    struct tc_wraw wr[2][2] = {}; /* raw weights of two steps: [slot][row] (zeros: a step past
                                     the end is converted for nothing) */
    uint32_t fr[2][4][4];         /* fragments of two steps */
    float ws[2][2];               /* FP8: their rows' step scales */
    uint32_t wb[2] = {0, 0};      /* FP4: the rows' bases for the whole K (wq_decode) */
    float wsr[2] = {0.0f, 0.0f};  /* FP4: the rows' weight scales, applied after the loop */
    int64_t steps = K / WQ_BK;
    /* activations of step s into stage s % WQ_ST: the thread copies chunk xc = tid % 8 of rows
       xj + 32 v (xj = tid / 8; offsets row xj's + 4096 v, the same swizzle), and thread j < BN
       row j's scale; one cp.async group per step, empty past the end */
    const int xc = tid & 7, xj = tid >> 3;
    const uint32_t xoff = wg_sw(xj, xc);
    auto load_x = [&](int64_t s) {
        if (s < steps) {
            uint32_t st = (uint32_t)(s % WQ_ST);
            wg_copy_rows<XC, 32, DYN>(base + st * STAGE + xoff, xrow, xj, nv, s * WQ_BK + xc * 16,
                                      xs);
            if (tid < (DYN ? nv : BN)) {
                const float *sr = srow[tid];
                cu_cp4(sc_base + (st * BN + (uint32_t)tid) * 4u, sr ? sr + s : ss, sr != nullptr);
            }
        }
        cu_cp_commit();
    };
    auto load_w = [&](int64_t s, struct tc_wraw(&w)[2]) {
#pragma unroll
        for (int h = 0; h < 2; h++)
            wq_load_w<WT>(wrow[h], wsrow[h], (uint32_t)s, t4, w[h]);
    };
    /* the promotion of step s (u = s % 2) for the first NJ x 8 activation rows (those the
       step's wgmma wrote): wait for its wgmma, then acc += part x the stage's activation scales
       (x the step's weight scales: FP8) */
    auto promote = [&](int64_t s, int u, auto nj_c) {
        constexpr int NJ = decltype(nj_c)::value;
        const float *sc = scs + (uint32_t)(s % WQ_ST) * BN;
        wg_wait<0>();
        wg_pin(part);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            float2 as = *(const float2 *)(sc + 8 * j + 2 * t4);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float a_s = (i & 1) ? as.y : as.x;
                if (WT == DSI_TYPE_FP4_E2M1) /* (the row's scale after the loop) */
                    acc[4 * j + i] = fmaf(part[4 * j + i], a_s, acc[4 * j + i]);
                else
                    acc[4 * j + i] = fmaf(part[4 * j + i] * a_s, ws[u][i >> 1], acc[4 * j + i]);
            }
        }
    };
    /* the K loop with wgmma of width 32 M; LATE (STG's warpgroup 1, a separate copy of the
       loop, so that ptxas sees each warpgroup's wgmma pipeline whole: with one loop and a
       runtime test it serialised every wgmma, C7513): step s promotes step s - 1 first */
    auto kloop = [&](auto late_c, auto m_c) {
        constexpr bool LATE = decltype(late_c)::value;
        constexpr int M = decltype(m_c)::value;
        constexpr std::integral_constant<int, 4 * M> nj{};
        /* step s, u = s % 2 (a constant in each copy of wg_k_loop's body) */
        auto step = [&](int64_t s, int u) {
            cu_cp_wait<WQ_AH - 1>(); /* this thread's copies of step s (later ones in flight) */
            wg_fence_smem();
            /* (the two warpgroups reach it from different copies of the loop: PTX's aligned
               barrier, __syncthreads', must be the same instruction for the whole block, the
               non-aligned one need not) */
            asm volatile("barrier.sync 0;\n" ::: "memory");
            load_x(s + WQ_AH);
            if (LATE && s > 0) promote(s - 1, 1 - u, nj);
            wq_mma_step<32 * M>(part, fr[u], base + (uint32_t)(s % WQ_ST) * STAGE);
            wq_decode<WT>(wr[1 - u], valid, wb, fr[1 - u], ws[1 - u]); /* step s + 1's */
            if (s + 3 < steps) load_w(s + 3, wr[1 - u]);
            if (!LATE) promote(s, u, nj);
        };
        wg_k_loop<2>(steps, [&](int64_t s, int u) { step(s, u); });
        if (LATE && steps > 0) { /* the last step's promotion (u a constant in each branch) */
            if ((steps - 1) & 1)
                promote(steps - 1, 1, nj);
            else
                promote(steps - 1, 0, nj);
        }
    };
    /* DYN: the copy of the loop for the block's width (uniform in the block); with STG the
       full width (copies per width there: C7515, the wgmma serialised), the columns past nv
       computing on stale stage bytes that no output reads */
    auto kloops = [&](auto late_c) {
        if constexpr (DYN && !STG)
            wq_width<BN / 32>(nv >> 5, [&](auto m_c) { kloop(late_c, m_c); });
        else
            kloop(late_c, std::integral_constant<int, BN / 32>{});
    };
#pragma unroll
    for (int u = 0; u < 2; u++)
        if (u < steps) load_w(u, wr[u]);
#pragma unroll
    for (int u = 0; u < WQ_AH; u++)
        load_x(u);
    /* FP4: the rows' bases and weight scales (their loads behind the first steps' weights and
       copies) */
    if (WT == DSI_TYPE_FP4_E2M1) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            wb[h] = wq_row_base(wsrow[h], K / 32, t4, valid[h]);
            wsr[h] = valid[h] ? wq_pow2((int)wb[h] - 133) : 0.0f;
        }
    }
    wq_decode<WT>(wr[0], valid, wb, fr[0], ws[0]);
    if (2 < steps) load_w(2, wr[0]);
    if (STG && wgi == 1) /* (warpgroup-uniform) */
        kloops(std::integral_constant<bool, true>{});
    else
        kloops(std::integral_constant<bool, false>{});
    if (WT == DSI_TYPE_FP4_E2M1) {
        wg_wait<0>(); /* (none in flight: each step waited for its own) */
#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            acc[i] *= wsr[(i >> 1) & 1];
    }
    wg_finish<MODE, BN, DYN>(p, opos, acc, nv, wgi, w4, lane);
#endif
}

/* ---- the activation codes ---------------------------------------------------------------- */

/* One warp per (row, 128-block), a float4 per lane (elements 4 L .. 4 L + 3 of lane L): act_quant's
 * values and scale (q8_warp_quant), the codes (the values over the scale: e4m3 values, so the
 * conversion is exact) as one word at byte 4 (8 ((L / 2) % 4) + 4 (L % 2) + L / 8) of the group
 * (wq_perm_byte's inverse for these four), the scale by lane 0; xw: the values, rows from
 * keep_from. */
__global__ void __launch_bounds__(CU_THREADS) k_wgq_codes(const float *x,
                                                          int64_t rows,
                                                          int nb,
                                                          int64_t ldx,
                                                          uint8_t *q,
                                                          float *qs,
                                                          float *xw,
                                                          int64_t keep_from) {
    cu_pdl_enter();
    int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (wid >= rows * nb) return; /* (whole warps) */
    int64_t r = wid / nb;
    int b = (int)(wid - r * nb);
    float s;
    float4 y = q8_warp_quant(((const float4 *)(x + r * ldx + b * 128))[lane], &s);
    if (xw && r >= keep_from) ((float4 *)(xw + r * ldx + b * 128))[lane] = y;
    float inv = 1.0f / s;
    uint32_t code = (uint32_t)__nv_cvt_float_to_fp8(y.x * inv, __NV_SATFINITE, __NV_E4M3) |
                    (uint32_t)__nv_cvt_float_to_fp8(y.y * inv, __NV_SATFINITE, __NV_E4M3) << 8 |
                    (uint32_t)__nv_cvt_float_to_fp8(y.z * inv, __NV_SATFINITE, __NV_E4M3) << 16 |
                    (uint32_t)__nv_cvt_float_to_fp8(y.w * inv, __NV_SATFINITE, __NV_E4M3) << 24;
    int word = 8 * ((lane >> 1) & 3) + 4 * (lane & 1) + (lane >> 3);
    ((uint32_t *)(q + (r * nb + b) * 128))[word] = code;
    if (lane == 0) qs[r * nb + b] = s;
}

bool launch_wgq_codes(struct cu_ctx *c,
                      const float *x,
                      int64_t rows,
                      int64_t cols,
                      int64_t ldx,
                      uint8_t *q,
                      float *qs,
                      float *xw,
                      int64_t keep_from) {
    int64_t nb = cols / 128;
    if (cols % 128 || ldx % 4 || (uintptr_t)x % 16 || (uintptr_t)q % 4 || (uintptr_t)xw % 16 ||
        nb > INT32_MAX)
        return false;
    if (rows <= 0) return true;
    cu_launch(c, k_wgq_codes, (unsigned)cu_div_up(rows * nb, CU_WARPS), CU_THREADS, 0, x, rows,
              (int)nb, ldx, q, qs, xw, keep_from);
    return cu_check(c, "act_quant codes");
}

/* ---- launchers --------------------------------------------------------------------------- */

template <int MODE, int WT, int BN, bool DYN, bool STG>
static bool wq_launch1(struct cu_ctx *c, const struct tc_p *p, dim3 grid) {
    static bool smem_done = false;
    size_t sm = wq_smem_bytes(BN);
    if (!smem_limit(c, k_wgq<MODE, WT, BN, DYN, STG>, sm, &smem_done, "wgmma FP8")) return false;
    cu_launch(c, k_wgq<MODE, WT, BN, DYN, STG>, grid, WQ_T, sm, *p);
    return cu_check(c, "moe (wgmma FP8)");
}

template <int MODE, int WT, int BN, bool DYN>
static bool wq_launch(struct cu_ctx *c, const struct tc_p *p, dim3 grid) {
    return c->wgq_stg ? wq_launch1<MODE, WT, BN, DYN, true>(c, p, grid)
                      : wq_launch1<MODE, WT, BN, DYN, false>(c, p, grid);
}

template <int MODE, int WT>
static bool wq_launch_bn(struct cu_ctx *c, const struct tc_p *p, int bn, bool dyn, dim3 grid) {
    if (dyn)
        return bn <= 32   ? wq_launch<MODE, WT, 32, true>(c, p, grid)
               : bn <= 64 ? wq_launch<MODE, WT, 64, true>(c, p, grid)
                          : wq_launch<MODE, WT, 128, true>(c, p, grid);
    return bn <= 32   ? wq_launch<MODE, WT, 32, false>(c, p, grid)
           : bn <= 64 ? wq_launch<MODE, WT, 64, false>(c, p, grid)
                      : wq_launch<MODE, WT, 128, false>(c, p, grid);
}

bool wgq_ok(int64_t D, int64_t I) { return D % WQ_BK == 0 && I % WQ_BK == 0; }

int wgq_pick_bn(const struct cu_ctx *c, double rows) {
    return rows > 64 && c->wg_bn >= 128 ? 128 : rows > 32 && c->wg_bn >= 64 ? 64 : 32;
}

bool launch_wgq_moe(
    struct cu_ctx *c, const struct moe_p *mp, bool up, int bn, bool dyn, unsigned tiles) {
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    int type = up ? mp->w1.type : mp->w2.type;
    dim3 grid((unsigned)(up ? cu_div_up(mp->I, 64) : cu_div_up(mp->D, WQ_BM)), tiles);
    if (up)
        return type == DSI_TYPE_FP4_E2M1
                   ? wq_launch_bn<TC_UP, DSI_TYPE_FP4_E2M1>(c, &p, bn, dyn, grid)
                   : wq_launch_bn<TC_UP, DSI_TYPE_F8_E4M3>(c, &p, bn, dyn, grid);
    return type == DSI_TYPE_FP4_E2M1
               ? wq_launch_bn<TC_DOWN, DSI_TYPE_FP4_E2M1>(c, &p, bn, dyn, grid)
               : wq_launch_bn<TC_DOWN, DSI_TYPE_F8_E4M3>(c, &p, bn, dyn, grid);
}
