/* wgr.cu - wg.cu's block GEMMs (the MoE's up + SwiGLU and down, routed and shared experts, FP4 /
 * FP8 weights; dense GEMMs on FP8 weights from 512 rows, groups side by side; `fast`
 * numerics) with the weights in registers: wgmma's A operand straight from the decode, so no
 * weight tile goes through shared memory (wg.cu stores each decoded step there, with a proxy
 * fence and a barrier per 64 k). Same numerics as wg.cu (weights decoded exactly to bf16,
 * activations rounded to bf16, fp32 sums in the tensor cores' order): not bitwise; the op tests
 * bound the difference. c->wg_rs, the default from step 26 (DSI_CUDA_WG_RS=0: wg.cu instead).
 *
 * The K order. A lane (g, t) of a warp supplies the A fragment's rows g and g + 8, slots 2t, 2t+1,
 * 2t+8, 2t+9 of every k16 slice. Within each group of 128 k (a step), lane t takes the 32
 * consecutive elements [32 t, 32 t + 32) of its two rows (one 16-byte load per row for FP4, two
 * for FP8, with one scale each: the FP4 scale block is exactly those 32), decodes them with
 * tc_decode_w, and slice i (0..7) of the step uses elements 32 t + 4 i + {0, 1} in slots 2t, 2t+1
 * and 32 t + 4 i + {2, 3} in slots 2t+8, 2t+9. The activations must sit in the same order: the
 * bf16 copies of x and h (launch_wg_bf16's permuted copy, wg_perm_col) are written permuted within
 * each 128-group, slot s of slice i holding element 32 ((s % 8) / 2) + 4 i + 2 (s / 8) + s % 2; a
 * dot product does not care in which order its terms meet, as long as both operands agree.
 *
 * A block of WR_T = 256 threads (2 warpgroups) computes WR_BM = 128 weight rows x BN activation
 * rows (64, 128, 192, 224 or 256; dense 64 or 128) over all of K, 128 k a step. The activation tile
 * of a step is BN rows of 256 bytes in two 128-byte swizzled sub-tiles (k 0-63, 64-127 of the
 * permuted order; slice i at sub-tile i / 4, byte (i % 4) 32), copied by cp.async wr_ah(BN) = 2
 * steps ahead into wr_st(BN) = 4 stages (224 and 256 rows: 1 ahead into 3 stages, which fit in
 * shared memory); the weights come WR_PF = 2 steps ahead into registers. A step issues its 8 slices
 * as two groups of 4 wgmma (slices 0-3 from the decoded quads 0-1, 4-7 from quads 2-3) and waits
 * after each for the group before (wait_group 1), so a group's A registers are free again when the
 * next step decodes into them. The first half is decoded before the step's barrier, the second
 * after the first half's group is issued (step 27: its decode runs beside that group). After the
 * barrier of step s both warpgroups have waited for every group of step s - 2, so stage (s + 2) %
 * 4 = (s - 2) % 4 can be refilled (3 stages: (s + 1) % 3 = (s - 2) % 3).
 *
 * TMA (c->wgr_tma, on from step 30, DSI_CUDA_WGR_TMA=0: off; the MoE's DYN tiles): the tiles
 * come by TMA from copies with a row per position (x: launch_wg_bf16_pos; h: as it is), thread 0
 * issuing a step's two boxes on the stage's mbarrier (k_wgr's TMA comment).
 *
 * MoE up: as wg.cu, the thread's row g is column c of W1 and row g + 8 the same column of W3 (c =
 * 64 blockIdx.x + 32 warpgroup + 8 warp + g), so its accumulators hold the gate and the up value
 * of the same (column, activation row). Down (and dense): rows g, g + 8 of the weight's 128-row
 * block. DYN: the tile's rows rounded up to 32 set the wgmma width (wg.cu's). */
#include "gemm.cuh"
#include "moe.cuh"
#include "tc.cuh"
#include "wg.cuh"

#include <algorithm>
#include <cmath>
#include <cuda.h>
#include <cudaTypedefs.h>

#define WR_BM 128
#define WR_BK 128 /* k per step: one group of the permuted K order */
#define WR_T  256
#define WR_PF 2 /* weight loads this many steps ahead */

/* Activation stages of a block of BN rows, and how many steps ahead they are copied: a stage is
   refilled only after the wgmma that read it (at most stages - 2 ahead). */
__host__ __device__ constexpr int wr_st(int BN) { return BN > 192 ? 3 : 4; }
__host__ __device__ constexpr int wr_ah(int BN) { return wr_st(BN) - 2; }
static_assert(WR_BK == 128, "a step is one group of wg_perm_col's K order");

/* Dynamic shared memory: the stages (BN rows of 256 bytes each), plus 1 KB to align them. */
static size_t wr_smem_bytes(int BN) { return (size_t)wr_st(BN) * BN * 256 + 1024; }

#ifdef WG_HAVE
/* One group of 4 slices (A: their fragments; dl: the low word of the descriptor of the group's
 * sub-tile, slice ii at byte ii 32) of width 32 M, M = nsel down from BN / 32, fenced and
 * committed inside each branch (wg.cu's wg_mma_step says why). Slice ii's descriptor is dl + 2 ii
 * over the constant high word: the sub-tiles are 1 KB aligned, so the address field (bits 0-13,
 * the address / 16) takes the 2 ii without a carry (step 50: wg_desc per wgmma was ~5
 * uniform-datapath instructions each, ~80 a warp a step with the rest, of ~551; step 51: a 64-bit
 * sum of the whole descriptor still cost a carry and 3-4 moves a wgmma). */
template <int BN, int M = BN / 32>
__device__ __forceinline__ void
wr_mma_group(float (&d)[BN / 2], int nsel, const uint32_t (&a)[4][4], uint32_t dl) {
    if (nsel >= M || M == 1) {
        wg_fence();
#pragma unroll
        for (int ii = 0; ii < 4; ii++)
            wg_mma_rs_k16<32 * M>(d, a[ii], wg_desc_of(dl + 2u * ii));
        wg_commit();
    } else if constexpr (M > 1) {
        wr_mma_group<BN, M - 1>(d, nsel, a, dl);
    }
}
#endif

/* TMA (MoE, c->wgr_tma): the activation tiles by TMA from tm (the bf16 copy by position, a row
 * per position, 64 x BN boxes in the 128-byte swizzle, which is wg_sw's layout): thread 0 issues a
 * step's two boxes on the stage's mbarrier, and every thread waits for its phase instead of its
 * own cp.async copies. The tile's rows are consecutive positions from opos[0]; the rows past the
 * tile (DYN: its wgmma do not read them; else their outputs are dropped) are whatever follows,
 * zeros past the end. */
/* SB (c->wgr_sb, step 51; the MoE's TMA blocks, routed or shared, where cu_moe_table found
 * every scale byte of their weights within tc_decode_w's short path): the decodes without the
 * scale test and the large-scale path (~110 instructions a call inline at 224 rows: of the ~2000
 * of the K loop's code, ~900 never run, and 4 tests and branches a step). */
template <int MODE, int WT, int BN, bool DYN, bool TMA = false, bool SB = false>
__global__ void __launch_bounds__(WR_T, 1)
    k_wgr(struct tc_p p, const __grid_constant__ CUtensorMap tm) {
#ifdef WG_HAVE
    static_assert(wr_st(BN) - wr_ah(BN) == 2, "step's refilled stage: (s + WR_AH) % WR_ST");
    cu_pdl_enter();
    constexpr int XC = BN * 16 / WR_T; /* 16-byte activation chunks per thread and step */
    /* FP4's rare large-scale decode out of line (tc_decode_w) up to 192 rows: wider blocks then
       spill around the call */
    constexpr bool OUTL = BN <= 192;
    constexpr int WR_ST = wr_st(BN), WR_AH = wr_ah(BN);
    constexpr uint32_t STAGE = BN * 256u; /* bytes per stage */
    constexpr uint32_t SUB = BN * 128u;   /* bytes per sub-tile (64 k) */
    static_assert(SUB % 1024 == 0, "sub-tiles 1 KB aligned (wr_mma_group's descriptors)");
    extern __shared__ uint4 wr_smem[];
    /* (held, not recomputed: step 51's SASS rebuilt base and the barriers' addresses from the
       shared window's special register every step) */
    const uint32_t base = wg_held((smem_u32(wr_smem) + 1023u) & ~1023u);
    __shared__ const uint16_t *xrow[BN];
    __shared__ int64_t opos[BN];           /* h / out position of the row; -1: none */
    __shared__ alignas(8) uint64_t bar[4]; /* TMA: a stage's copies */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2, w4 = warp & 3;
    int g = lane >> 2, t4 = lane & 3;

    int e, nv;
    int64_t K;
    const uint16_t *xs;
    if (!wg_block_rows<MODE, BN, DYN>(p, xrow, opos, &e, &K, &nv, &xs)) return;
    static_assert(!TMA || MODE != TC_DENSE, "TMA: the MoE's copies by position");
    if (TMA && tid == 0) {
#pragma unroll
        for (int i = 0; i < WR_ST; i++)
            mbar_init(smem_u32(&bar[i]), 1);
        mbar_fence_init();
    }
    /* this thread's weight rows: A rows g (h = 0) and g + 8 (h = 1) of its warp */
    const uint8_t *wrow[2], *wsrow[2];
    int sh1[2], sb1[2];
    static_assert(WR_BM == 128, "wr_rows: 128 weight rows a block");
    wr_rows<MODE>(p, e, wgi, w4, g, wrow, wsrow, sh1, sb1);
    /* whether they exist: the MoE's always (wgr_ok: D and I multiples of 128, the grid exact),
       so its decodes take no zeroing path (step 50: ptxas set each call's 8 zeros before the
       test, 32 moves a warp a step) */
    const bool vr0 = MODE != TC_DENSE || wrow[0] != nullptr,
               vr1 = MODE != TC_DENSE || wrow[1] != nullptr;
    __syncthreads();

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        acc[i] = 0.0f;
    struct tc_wraw wr[WR_PF][2];
    /* (32-bit steps: each step's stage and phase, s % WR_ST and s / WR_ST, were 64-bit divisions
       by a constant on the uniform datapath, ~10 instructions each; K / WR_BK < 2^31) */
    const uint32_t steps = (uint32_t)(K / WR_BK);
    /* activations of step s into stage s % WR_ST: the thread copies chunk xc = tid % 16 (of
       sub-tile xc / 8) of rows xj + 16 v, xj = tid / 16, whose swizzled offsets are row xj's +
       2048 v (16 rows further, the same swizzle): one offset and one column for all its copies
       (step 27; the SASS had ~20 instructions a copy). One cp.async group per step, empty past
       the end. */
    const int xc = tid & 15, xj = tid >> 4;
    const uint32_t xoff = (uint32_t)(xc >> 3) * SUB + wg_sw(xj, xc & 7);
    static_assert(XC * 16 == BN, "rows xj + 16 v cover the tile");
    const int row0 = TMA ? (int)opos[0] : 0; /* TMA: the tile's first position */
    bool live = true;                        /* TMA: no wait has failed (mbar_wait) */
    /* the barriers' shared addresses, once (step 51: each smem_u32 of bar[i] in the loop was a
       special-register read and two address instructions) */
    const uint32_t bar0 = wg_held(smem_u32(&bar[0]));
    /* step s's tile into stage st = s % WR_ST */
    auto load_x = [&](uint32_t s, uint32_t st) {
        if (TMA) {
            if (tid == 0 && s < steps) {
                uint32_t B = base + st * STAGE;
                uint32_t mb = bar0 + 8u * st;
                mbar_expect(mb, STAGE);
                tma_load_2d(B, &tm, (int)(s * WR_BK), row0, mb);
                tma_load_2d(B + SUB, &tm, (int)(s * WR_BK + 64), row0, mb);
            }
            return;
        }
        if (s < steps) {
            wg_copy_rows<XC, 16, DYN>(base + st * STAGE + xoff, xrow, xj, nv, s * WR_BK + xc * 8,
                                      xs);
        }
        cu_cp_commit();
    };
    auto load_w = [&](uint32_t s, struct tc_wraw(&w)[2]) {
#pragma unroll
        for (int h = 0; h < 2; h++)
            tc_load_w<WT, true, MODE != TC_DENSE>(wrow[h], wsrow[h], sh1[h], sb1[h],
                                                  (int64_t)(s * WR_BK + t4 * 32), w[h]);
    };
    /* the A fragments of half hf (slices 4 hf .. 4 hf + 3) from rows g (r0) and g + 8 (r1)
       decoded: slice i's elements 4 i .. 4 i + 3 are in quad (i % 4) / 2 of the half */
    auto frag = [&](const uint4(&r0)[2], const uint4(&r1)[2], uint32_t(&a)[4][4]) {
#pragma unroll
        for (int ii = 0; ii < 4; ii++) {
            const uint4 &q0 = r0[ii >> 1], &q1 = r1[ii >> 1];
            bool lo = (ii & 1) == 0;
            a[ii][0] = lo ? q0.x : q0.z;
            a[ii][1] = lo ? q1.x : q1.z;
            a[ii][2] = lo ? q0.y : q0.w;
            a[ii][3] = lo ? q1.y : q1.w;
        }
    };
    /* Step s's stage s % WR_ST and phase (s / WR_ST) & 1, counted along the loop (step 51: the
       division by 3 and the addresses were ~15 uniform-datapath instructions a step). */
    uint32_t stg = 0, ph = 0;
    /* Step s: half 0 decoded before the barrier; half 1 (from a copy of the raw bits, as the
       next loads go to w) after half 0's wgmma are issued, so that its decode runs beside
       them; each half's registers are read by its wgmma until the wait after the next group. */
    auto step = [&](uint32_t s, struct tc_wraw(&w)[2]) {
        uint4 d0[2], d1[2], e0[2], e1[2];
        tc_decode_w<WT, 0, 2, OUTL, SB>(w[0], vr0, d0);
        tc_decode_w<WT, 0, 2, OUTL, SB>(w[1], vr1, d1);
        if (TMA) /* step s's tile (its phase: the stage's use s / WR_ST) */
            live = live && mbar_wait(bar0 + 8u * stg, ph, 1u << 16);
        else
            cu_cp_wait<WR_AH - 1>(); /* this thread's copies of step s (later ones in flight) */
        /* cp.async's tiles are the generic proxy's writes; TMA's are the async proxy's, as
           wgmma's reads, and its barrier's phase orders them (step 51: the fence was a
           MEMBAR.ALL.CTA a step) */
        if (!TMA) wg_fence_smem();
        __syncthreads();
        /* (s + WR_AH) % WR_ST, WR_AH = WR_ST - 2 */
        load_x(s + WR_AH, stg >= 2u ? stg - 2u : stg + (uint32_t)WR_AH);
        struct tc_wraw k0 = w[0], k1 = w[1];
        if (s + WR_PF < steps) load_w(s + WR_PF, w);
        uint32_t b0 = base + stg * STAGE;
        uint32_t a[4][4];
        frag(d0, d1, a);
        wr_mma_group<BN>(acc, nv >> 5, a, wg_desc_lo(b0));
        wg_wait<1>();
        tc_decode_w<WT, 2, 2, OUTL, SB>(k0, vr0, e0);
        tc_decode_w<WT, 2, 2, OUTL, SB>(k1, vr1, e1);
        frag(e0, e1, a);
        wr_mma_group<BN>(acc, nv >> 5, a, wg_desc_lo(b0 + SUB));
        wg_wait<1>();
        if (++stg == (uint32_t)WR_ST) {
            stg = 0;
            ph ^= 1u;
        }
    };
#pragma unroll
    for (int u = 0; u < WR_PF; u++)
        if ((uint32_t)u < steps) load_w((uint32_t)u, wr[u]);
#pragma unroll
    for (int u = 0; u < WR_AH; u++)
        load_x((uint32_t)u, (uint32_t)u);
    wg_k_loop<WR_PF>((int64_t)steps, [&](int64_t s, int u) { step((uint32_t)s, wr[u]); });
    wg_finish<MODE, BN, DYN>(p, opos, acc, nv, wgi, w4, lane);
#endif
}

/* ---- launchers --------------------------------------------------------------------------- */

/* A kernel parameter for the kernels without TMA. */
static const CUtensorMap wr_no_map = {};

/* k_wgr<MODE, WT, BN, D, T, SB>'s launch (its dynamic shared memory raised once per
 * instance; tm: T's tensor map) */
template <int MODE, int WT, int BN, bool D, bool T = false, bool SB = false>
static bool wr_launch1(struct cu_ctx *c, const struct tc_p *p, dim3 grid, const CUtensorMap *tm) {
    static bool smem_done = false;
    size_t sm = wr_smem_bytes(BN);
    if (!smem_limit(c, k_wgr<MODE, WT, BN, D, T, SB>, sm, &smem_done,
                    "wgmma, weights in registers"))
        return false;
    cu_launch(c, k_wgr<MODE, WT, BN, D, T, SB>, grid, WR_T, sm, *p, *tm);
    return cu_check(c, MODE == TC_DENSE ? "gemm (wgmma, weights in registers)"
                                        : "moe (wgmma, weights in registers)");
}

/* dyn: the MoE's DYN kernels (dense: never); tm: their TMA map (the MoE with dyn), or NULL */
template <int MODE, int WT, int BN>
static bool
wr_launch(struct cu_ctx *c, const struct tc_p *p, bool dyn, dim3 grid, const CUtensorMap *tm) {
    if constexpr (MODE != TC_DENSE) {
        if (dyn && tm) {
            if (c->wgr_sb && p->m.sb_max <= tc_sb_short(WT))
                return wr_launch1<MODE, WT, BN, true, true, true>(c, p, grid, tm);
            return wr_launch1<MODE, WT, BN, true, true>(c, p, grid, tm);
        }
        if (dyn) return wr_launch1<MODE, WT, BN, true>(c, p, grid, &wr_no_map);
    }
    return wr_launch1<MODE, WT, BN, false>(c, p, grid, &wr_no_map);
}

/* The block width of wr_launch_bn's kernels for bn (dense: 64 or 128). */
static int wr_bn(int bn) {
    return bn <= 64 ? 64 : bn <= 128 ? 128 : bn <= 192 ? 192 : bn <= 224 ? 224 : 256;
}

template <int MODE, int WT>
static bool wr_launch_bn(
    struct cu_ctx *c, const struct tc_p *p, int bn, bool dyn, dim3 grid, const CUtensorMap *tm) {
    if constexpr (MODE == TC_DENSE)
        return bn <= 64 ? wr_launch<MODE, WT, 64>(c, p, false, grid, nullptr)
                        : wr_launch<MODE, WT, 128>(c, p, false, grid, nullptr);
    else
        switch (wr_bn(bn)) {
        case 64:
            return wr_launch<MODE, WT, 64>(c, p, dyn, grid, tm);
        case 128:
            return wr_launch<MODE, WT, 128>(c, p, dyn, grid, tm);
        case 192:
            return wr_launch<MODE, WT, 192>(c, p, dyn, grid, tm);
        case 224:
            return wr_launch<MODE, WT, 224>(c, p, dyn, grid, tm);
        default:
            return wr_launch<MODE, WT, 256>(c, p, dyn, grid, tm);
        }
}

/* The TMA map of rows x K bf16 values at x (row stride K), boxes of 64 x BN in the 128-byte
 * swizzle; false: not made (no entry point, alignment, the driver's refusal). */
static bool wr_tmap(
    const struct cu_ctx *c, CUtensorMap *m, const uint16_t *x, int64_t rows, int64_t K, int BN) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)c->tmap_encode;
    if (!enc || !x || rows <= 0 || rows > INT32_MAX || K % 64 || (uintptr_t)x % 16) return false;
    cuuint64_t dim[2] = {(cuuint64_t)K, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)K * 2};
    cuuint32_t box[2] = {64, (cuuint32_t)BN}, es[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)x, dim, stride, box, es,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool wgr_ok(int64_t D, int64_t I) { return D % WR_BK == 0 && I % WR_BK == 0; }

/* The weight's scale blocks along K are a power of two (k_wgr's scale columns by a shift). */
bool wgr_w_ok(const struct cu_w *w) { return !w->scale || w->sh1 >= 0; }

bool wgr_dense_ok(const struct cu_w *w, int groups, int64_t gx) {
    /* the permuted copy: the groups' K ranges start at multiples of 128, so each is in whole
       permutation groups */
    return w->type == DSI_TYPE_F8_E4M3 && w->K % WR_BK == 0 && (groups <= 1 || gx % WR_BK == 0) &&
           wgr_w_ok(w);
}

bool launch_wgr_gemm(struct cu_ctx *c, const struct tc_p *p, int bn, dim3 grid) {
    if (!wgr_dense_ok(&p->w, (int)grid.z, p->gx)) return false;
    struct tc_p q;
    if (!wg_dense_copy(c, p, grid, true, &q)) return true; /* (the sticky error is set) */
    return wr_launch_bn<TC_DENSE, DSI_TYPE_F8_E4M3>(c, &q, bn, false, grid, nullptr);
}

/* 64 or 128 rows, or from 129 rows a mean c->wg_bn (DSI_CUDA_WG_BN: 192, 224 or 256) */
int wgr_pick_bn(const struct cu_ctx *c, double rows) {
    int top = c->wg_bn >= 256 ? 256 : c->wg_bn >= 224 ? 224 : 192;
    return rows > 128 && c->wg_bn >= 192 ? top : rows > 64 && c->wg_bn >= 128 ? 128 : 64;
}

/* The routed tiles' blocks for `mean` rows an expert: (c->wg_bn_fit, step 48, the default from
 * step 49; DSI_CUDA_WG_BN_FIT=0: wgr_pick_bn's) the narrowest of 64, 128, 192 and 224 rows (up to
 * c->wg_bn) that holds the mean plus two standard deviations of a Poisson count, so that few
 * experts take a second tile of a few rows (which decodes the expert's weights again for them: step
 * 48's blocks of 192 at ~192 rows an expert cost 7% of the 8k prefill against 224): at 60 rows 128
 * instead of 64, at 120 192 instead of 128; at the DYN kernels' widths a wider block computes
 * no more for a tile of fewer rows. */
int wgr_pick_bn_routed(const struct cu_ctx *c, double mean) {
    if (!c->wg_bn_fit) return wgr_pick_bn(c, mean);
    double need = mean + 2.0 * sqrt(mean > 0 ? mean : 0.0);
    const int widths[4] = {64, 128, 192, 224};
    int pick = 64;
    for (int w : widths) {
        if (w > c->wg_bn && w > 64) break;
        pick = w;
        if (w >= need) break;
    }
    return pick;
}

bool wr_launch_moe(
    struct cu_ctx *c, const struct tc_p *p, bool up, bool f4, int bn, bool dyn, dim3 grid) {
    static_assert(WR_BM == 128, "launch_wg_moe's grid: 128 weight rows a block");
    /* (k_wgr's MoE rows all exist: vr0, vr1; wgr_ok gives this for the callers) */
    if (p->m.I % 64 || p->m.D % WR_BM) return false;
    /* TMA (c->wgr_tma, DYN tiles): the copies by position, x16's where p->m.x16_pos, h16's */
    CUtensorMap map;
    const CUtensorMap *tm = nullptr;
    if (c->wgr_tma && dyn && (!up || p->m.x16_pos) &&
        wr_tmap(c, &map, up ? p->m.x16 : p->m.h16, p->m.n * p->m.topk + p->m.n,
                up ? p->m.D : p->m.I, wr_bn(bn)))
        tm = &map;
    if (up)
        return f4 ? wr_launch_bn<TC_UP, DSI_TYPE_FP4_E2M1>(c, p, bn, dyn, grid, tm)
                  : wr_launch_bn<TC_UP, DSI_TYPE_F8_E4M3>(c, p, bn, dyn, grid, tm);
    return f4 ? wr_launch_bn<TC_DOWN, DSI_TYPE_FP4_E2M1>(c, p, bn, dyn, grid, tm)
              : wr_launch_bn<TC_DOWN, DSI_TYPE_F8_E4M3>(c, p, bn, dyn, grid, tm);
}
