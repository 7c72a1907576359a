/* wg.cuh - Hopper warpgroup MMA (wgmma, sm_90a) pieces shared by wg.cu (both operands in shared
 * memory) and wgr.cu (the weights in registers): the 128-byte swizzled K-major tile layout and its
 * descriptor, the fence / commit / wait instructions, and m64nNk16 bf16 -> fp32 for N = 32 .. 256
 * in steps of 32. WG_HAVE: compiled for sm_90a (elsewhere the kernels are empty). */
#ifndef DSI_CUDA_WG_CUH
#define DSI_CUDA_WG_CUH

#include "tc.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_HAVE 1
#endif

/* Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte swizzled tile. */
__device__ __forceinline__ uint32_t wg_sw(int r, int c) {
    return (uint32_t)r * 128u + ((uint32_t)(c ^ (r & 7)) << 4);
}

/* Shared-memory matrix descriptor of a K-major 128-byte swizzled tile at saddr (1 KB atoms:
 * stride byte offset 1024 between 8-row groups; the leading offset is unused in this mode). */
/* Its halves: the low word depends on the address, the high word is a constant. */
#define WG_DESC_HI ((uint32_t)(1024 >> 4) | (1u << 30))
__device__ __forceinline__ uint32_t wg_desc_lo(uint32_t saddr) {
    return ((saddr & 0x3ffffu) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t wg_desc_of(uint32_t lo) {
    return ((uint64_t)WG_DESC_HI << 32) | lo;
}
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return wg_desc_of(wg_desc_lo(saddr));
}

/* wgr.cu's K order within each group of 128 (its header): destination pair q of a row (slots
 * 2 m, 2 m + 1 of slice i = (q % 64) / 8, m = q % 8) holds elements 32 (m % 4) + 4 i + 2 (m / 4)
 * and the next of the group. The source column of the pair's first element. */
__device__ __forceinline__ int64_t wg_perm_col(int64_t q) {
    int qq = (int)(q & 63), i = qq >> 3, m = qq & 7;
    return (q >> 6) * 128 + 32 * (m & 3) + 4 * i + 2 * (m >> 2);
}

/* The inverse: the destination pair of a group's source pair p (elements 2 p, 2 p + 1; p < 64).
 * Lane L holding elements 4 L .. 4 L + 3 writes its pairs at wg_perm_dst(2 L) and that + 4. */
__host__ __device__ __forceinline__ int wg_perm_dst(int p) {
    return 8 * ((p >> 1) & 7) + (p >> 4) + 4 * (p & 1);
}

/* The x row of position r of the routed rows' copies (launch_wg_bf16_pos): r < nk, slot perm[r]'s
 * token (-1 for a position no slot holds: zeros); from nk, token r - nk (the shared expert's). */
__device__ __forceinline__ int64_t wg_pos_row(int64_t r,
                                              const int32_t *perm,
                                              int topk,
                                              int64_t nk) {
    if (r >= nk) return r - nk;
    int32_t slot = perm[r];
    return slot >= 0 && slot < nk ? slot / topk : -1;
}

#ifdef WG_HAVE
__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* v, opaque to the compiler, so that it keeps the value in a register instead of computing it
 * again where it is used (a shared address from the window's special register, in a loop). */
__device__ __forceinline__ uint32_t wg_held(uint32_t v) {
    uint32_t r;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(v));
    return r;
}
/* Shared memory written by ordinary stores, read next by wgmma (the async proxy). */
__device__ __forceinline__ void wg_fence_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* ---- TMA tile loads and their mbarriers (wgr.cu's activation tiles, c->wgr_tma) */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* the barriers' initialisation visible to the async proxy (then a block barrier) */
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* one arrival that also expects `bytes` of transactions in the current phase */
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* Wait for the phase of parity `par` to complete; false after `spins` unsuccessful tries (a
 * guard: a wrong byte count must not hang the device; the caller's results are then garbage,
 * which the op tests catch). */
__device__ __forceinline__ bool mbar_wait(uint32_t bar, uint32_t par, uint32_t spins) {
#pragma unroll 1
    for (uint32_t i = 0; i < spins; i++) {
        uint32_t ok;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(bar), "r"(par)
                     : "memory");
        if (ok) return true;
    }
    return false;
}
/* The 2-D box at (c0, c1) (elements, rows) of the tensor map *tm into shared memory at dst,
 * completing `bar`'s transactions. */
__device__ __forceinline__ void
tma_load_2d(uint32_t dst, const void *tm, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(tm), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* The accumulators are written by wgmma in the background: pin them around the waits. */
template <int NR> __device__ __forceinline__ void wg_pin(float (&d)[NR]) {
#pragma unroll
    for (int i = 0; i < NR; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* d += A (64 x 16, descriptor da) * B (N x 16, descriptor db)^T, fp32 accumulators: N / 2 of
 * them per thread, the first N / 2 of d (so a block of BN rows can run a narrower N on the same
 * registers: the fragment layout of column 8 j + 2 t + i % 2 is the same for every N). The
 * operand lists come from the macros below: WG_S<m> names registers 16 m .. 16 m + 15, WG_O16
 * binds 16 accumulators. */
#define WG_S0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_S1 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_S2 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define WG_S3 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_S4 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define WG_S5 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_S6                                                                                      \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "             \
    "%110, %111"
#define WG_S7                                                                                      \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "               \
    "%125, %126, %127"
#define WG_O4(b)  "+f"(d[(b)]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3])
#define WG_O16(b) WG_O4(b), WG_O4((b) + 4), WG_O4((b) + 8), WG_O4((b) + 12)
/* N (a string), the accumulator registers, then the numbers of the operands after them */
#define WG_MMA(NS, REGS, DA, DB, P, ...)                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n" NS "k16.f32.bf16.bf16 {" REGS "}, " DA        \
                 ", " DB ", p, 1, 1, 0, 0;\n}\n"                                                   \
                 : __VA_ARGS__                                                                     \
                 : "l"(da), "l"(db), "r"(1))

template <int N, int NR>
__device__ __forceinline__ void wg_mma_k16(float (&d)[NR], uint64_t da, uint64_t db) {
    static_assert(N % 32 == 0 && N >= 32 && N <= 256 && N / 2 <= NR, "wgmma width");
    if constexpr (N == 32)
        WG_MMA("32", WG_S0, "%16", "%17", "%18", WG_O16(0));
    else if constexpr (N == 64)
        WG_MMA("64", WG_S0 ", " WG_S1, "%32", "%33", "%34", WG_O16(0), WG_O16(16));
    else if constexpr (N == 96)
        WG_MMA("96", WG_S0 ", " WG_S1 ", " WG_S2, "%48", "%49", "%50", WG_O16(0), WG_O16(16),
               WG_O16(32));
    else if constexpr (N == 128)
        WG_MMA("128", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3, "%64", "%65", "%66", WG_O16(0),
               WG_O16(16), WG_O16(32), WG_O16(48));
    else if constexpr (N == 160)
        WG_MMA("160", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4, "%80", "%81", "%82",
               WG_O16(0), WG_O16(16), WG_O16(32), WG_O16(48), WG_O16(64));
    else if constexpr (N == 192)
        WG_MMA("192", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4 ", " WG_S5, "%96", "%97",
               "%98", WG_O16(0), WG_O16(16), WG_O16(32), WG_O16(48), WG_O16(64), WG_O16(80));
    else if constexpr (N == 224)
        WG_MMA("224", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4 ", " WG_S5 ", " WG_S6,
               "%112", "%113", "%114", WG_O16(0), WG_O16(16), WG_O16(32), WG_O16(48), WG_O16(64),
               WG_O16(80), WG_O16(96));
    else
        WG_MMA("256",
               WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4 ", " WG_S5 ", " WG_S6 ", " WG_S7,
               "%128", "%129", "%130", WG_O16(0), WG_O16(16), WG_O16(32), WG_O16(48), WG_O16(64),
               WG_O16(80), WG_O16(96), WG_O16(112));
}

/* The block GEMMs' rows (wg.cu, wgr.cu): tc_block_rows on the bf16 copy (dense: p.x16; MoE up:
 * p.m.x16; down: p.m.h16; *xs), and *nv, the activation rows computed: all BN, or (DYN) the
 * tile's rounded up to 32. false: no tile here (the whole block returns). */
template <int MODE, int BN, bool DYN>
__device__ __forceinline__ bool wg_block_rows(struct tc_p &p,
                                              const uint16_t **xrow,
                                              int64_t *opos,
                                              int *e,
                                              int64_t *K,
                                              int *nv,
                                              const uint16_t **xs) {
    int rows = BN;
    *xs = MODE == TC_DENSE ? p.x16 : MODE == TC_UP ? p.m.x16 : p.m.h16;
    int64_t lds = MODE == TC_DENSE ? p.ld16 : MODE == TC_UP ? p.m.D : p.m.I;
    if (!tc_block_rows<MODE, BN>(p, *xs, lds, p.gx, xrow, opos, e, K, &rows,
                                 MODE == TC_UP && p.m.x16_pos))
        return false;
    *nv = DYN ? min(BN, (rows + 31) & ~31) : BN;
    return true;
}

/* The weights-in-registers kernels' rows (wgr.cu, wgq.cu): thread (warpgroup wgi, warp w4, lane
 * group g) supplies A rows g (h = 0) and g + 8 (h = 1) of its warp: MoE up: column c = 64
 * blockIdx.x + 32 wgi + 8 w4 + g of W1 (h = 0) and of W3 (h = 1); down and dense: weight rows
 * 128 blockIdx.x + 64 wgi + 16 w4 + g + 8 h. A row past the weight has wrow[h] NULL. */
template <int MODE>
__device__ __forceinline__ void wr_rows(const struct tc_p &p,
                                        int e,
                                        int wgi,
                                        int w4,
                                        int g,
                                        const uint8_t *(&wrow)[2],
                                        const uint8_t *(&wsrow)[2],
                                        int (&sh1)[2],
                                        int (&sb1)[2]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int64_t r = -1;
        if (MODE == TC_UP) {
            int64_t col = (int64_t)blockIdx.x * 64 + wgi * 32 + w4 * 8 + g;
            if (col < p.m.I) r = col;
        } else {
            int64_t o = (int64_t)blockIdx.x * 128 + wgi * 64 + w4 * 16 + g + 8 * h;
            if (o < (MODE == TC_DENSE ? p.n_out : p.m.D)) r = MODE == TC_DENSE ? p.row0 + o : o;
        }
        tc_wsrc<MODE>(p, e, MODE == TC_UP ? h : 0, r, &wrow[h], &wsrow[h], &sh1[h], &sb1[h]);
    }
}

/* The activation copies of wgr.cu and wgq.cu: the thread's chunk (16 bytes at element ko of each
 * row) of rows xj + RS v, v < XC, whose swizzled offsets are row xj's (at B) + RS 128 v bytes
 * (RS a multiple of 8: the same swizzle); DYN: not rows from nv on (no wgmma reads them); a NULL
 * row: zeros (xs, any mapped address). */
template <int XC, int RS, bool DYN, typename T>
__device__ __forceinline__ void
wg_copy_rows(uint32_t B, const T *const *xrow, int xj, int nv, int64_t ko, const T *xs) {
    static_assert(RS % 8 == 0, "rows RS apart share the swizzle");
#pragma unroll
    for (int v = 0; v < XC; v++) {
        int j = xj + RS * v;
        if (DYN && j >= nv) continue;
        const T *src = xrow[j];
        cu_cp16(B + (uint32_t)(v * RS * 128), src ? src + ko : xs, src != nullptr);
    }
}

/* The block GEMMs' K loop (wg.cu, wgr.cu): step(s, u) for s < steps, unrolled by PF so that u = s
 * % PF, the slot of the weight registers loaded PF steps ahead, is a constant in each copy. */
template <int PF, typename F> __device__ __forceinline__ void wg_k_loop(int64_t steps, F step) {
    for (int64_t s = 0; s < steps; s += PF) {
#pragma unroll
        for (int u = 0; u < PF; u++)
            if (s + u < steps) step(s + u, u);
    }
}

/* The block GEMMs' end (wg.cu, wgr.cu, wgq.cu; every thread of the block calls it): every
 * wgmma waited for, then the outputs. A block of 2 warpgroups, 128 weight rows (warpgroup wgi:
 * rows 64 wgi.., warp w4: 16 w4..; MoE up: 64 columns of W1 and W3, rows g / g + 8 of a warp the
 * gate and the up value of one column) x BN activation rows (DYN: the first nv); acc[4 j + i] is
 * (A row 16 w4 + g + 8 (i / 2), activation row 8 j + 2 t + i % 2).
 *
 * MoE (step 32): each activation row's routing weight (up) or output row (down: perm[pos]) is
 * looked up once per block by thread j into shared memory, not per output: Nsight's source page
 * had each of a thread's 48 up outputs wait on two dependent global loads (perm, then the
 * weight) before its SwiGLU, ~20% of k_wgr's up projection at the 8k prefill. The outputs'
 * arithmetic is tc_put_up's / tc_put's (the same bits; the bf16 roundings by the hardware's
 * conversion, rbf_cvt: a NaN's payload aside, the same), but for the up projection's exp: exp_nb,
 * straight-line code (exp_ref's double exp has a range branch, which kept each output's chain of
 * ~120 instructions apart from the next), equal to exp_ref but for ~2^-28 of values (these
 * kernels run `fast` numerics only). opos is rewritten in place for down. */
#define WG_EG 4 /* wg_finish, MoE up: column blocks whose exps run side by side */

/* wg_finish's MoE up outputs (its comment); FEXP (moe_p.fexp, DSI_CUDA_WG_EXP=1; step 51):
 * the gate's exp in single precision (expf, a few ulp; the silu is rounded to bf16 after it), as
 * the attention's softmax does from step 46, instead of exp_nb's double-precision polynomial
 * (~15 DFMA and their constants' moves a value: with one block an SM, the SM's tensor cores wait
 * for the block's ~56 exps a thread). */
template <int BN, bool DYN, bool FEXP>
__device__ __forceinline__ void wg_finish_up(const struct tc_p &p,
                                             const int64_t *opos,
                                             const float *wrow_s,
                                             float (&acc)[BN / 2],
                                             int nv,
                                             int wgi,
                                             int w4,
                                             int g,
                                             int t4) {
    /* acc[4 j + i] and acc[4 j + i + 2] (i < 2) are the gate and the up value of
       activation row 8 j + 2 t + i: first the clamped gate and up values, in place, without
       branches; then by groups the exps (exp_nb, straight-line, or expf) side by side,
       the quotients, the products and the stores. */
    const bool rd = p.m.round;
    const float lim = p.m.limit;
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float gt = rbf_cvt(acc[4 * j + i] + 0.0f, rd),
                  u = rbf_cvt(acc[4 * j + i + 2] + 0.0f, rd);
            acc[4 * j + i] = fminf(gt, lim);
            acc[4 * j + i + 2] = fminf(fmaxf(u, -lim), lim);
        }
    int64_t col = (int64_t)blockIdx.x * 64 + wgi * 32 + w4 * 8 + g;
    bool cok = col < p.m.I;
    /* WG_EG column blocks (2 WG_EG outputs) at a time: their exps, each pinned in a register
       before the first quotient (else ptxas sinks each exp to its use, behind the previous
       quotient's branch, one chain after another; all 48 at once spilled) */
    constexpr int EG = BN >= 256 ? 2 : WG_EG < BN / 8 ? WG_EG : BN / 8; /* (256: spills) */
    static_assert((BN / 8) % EG == 0, "exp groups");
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += EG) {
        if (DYN && j0 * 8 >= nv) break; /* columns no wgmma wrote */
        float ev[EG][2];
#pragma unroll
        for (int j = 0; j < EG; j++)
#pragma unroll
            for (int i = 0; i < 2; i++)
                ev[j][i] = FEXP ? expf(-acc[4 * (j0 + j) + i]) : exp_nb(-acc[4 * (j0 + j) + i]);
#pragma unroll
        for (int j = 0; j < EG; j++)
#pragma unroll
            for (int i = 0; i < 2; i++)
                asm volatile("" : "+f"(ev[j][i]));
#pragma unroll
        for (int j = 0; j < EG; j++) {
            if (DYN && (j0 + j) * 8 >= nv) break;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int jr = (j0 + j) * 8 + 2 * t4 + i;
                int64_t pos = opos[jr];
                float silu = acc[4 * (j0 + j) + i] / (1.0f + ev[j][i]);
                float h = rbf_cvt(silu * acc[4 * (j0 + j) + i + 2] * wrow_s[jr], rd);
                if (pos >= 0 && cok) p.m.h[pos * p.m.I + col] = h;
            }
        }
    }
}

template <int MODE, int BN, bool DYN>
__device__ __forceinline__ void wg_finish(
    const struct tc_p &p, int64_t *opos, float (&acc)[BN / 2], int nv, int wgi, int w4, int lane) {
    wg_wait<0>();
    wg_pin(acc);
    int g = lane >> 2, t4 = lane & 3;
    __shared__ float wrow_s[MODE == TC_UP ? BN : 1]; /* up: the row's routing weight */
    if (MODE != TC_DENSE) {
        int tid = threadIdx.x;
        int64_t nk = p.m.n * p.m.topk;
        __syncthreads(); /* (opos was read before) */
        if (tid < BN) {
            int64_t pos = opos[tid];
            if (MODE == TC_UP)
                wrow_s[tid] = pos >= 0 && pos < nk ? p.m.weight[p.m.perm[pos]] : 1.0f;
            else
                opos[tid] = pos >= 0 && pos < nk ? (int64_t)p.m.perm[pos] : pos;
        }
        __syncthreads();
    }
    if constexpr (MODE == TC_UP) {
        if (p.m.fexp)
            wg_finish_up<BN, DYN, true>(p, opos, wrow_s, acc, nv, wgi, w4, g, t4);
        else
            wg_finish_up<BN, DYN, false>(p, opos, wrow_s, acc, nv, wgi, w4, g, t4);
    } else if (MODE == TC_DOWN && p.m.out16) {
        /* the routed rows' bf16 outputs (moe_p.out16: rounded, D even, rows < nk): lanes g and
           g ^ 1 hold the same two activation rows at outputs o and o ^ 1; each gives the other
           the row it does not store, so that a lane stores one 4-byte pair (even g: row jr0,
           odd g: row jr0 + 1) instead of two 2-byte values */
        bool odd = g & 1;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            if (DYN && j * 8 >= nv) break; /* columns no wgmma wrote */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float v0 = rbf_cvt(acc[4 * j + 2 * h] + 0.0f, true),
                      v1 = rbf_cvt(acc[4 * j + 2 * h + 1] + 0.0f, true);
                float r = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
                int jr = j * 8 + 2 * t4 + (odd ? 1 : 0);
                int64_t oe = (int64_t)blockIdx.x * 128 + wgi * 64 + w4 * 16 + (g & ~1) + h * 8,
                        orow = opos[jr];
                uint32_t lo = __float_as_uint(odd ? r : v0), hi = __float_as_uint(odd ? v1 : r);
                if (orow >= 0 && oe < p.m.D)
                    *(uint32_t *)(p.m.out16 + orow * p.m.D + oe) = (hi & 0xffff0000u) | (lo >> 16);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            if (DYN && j * 8 >= nv) break; /* columns no wgmma wrote */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int jr = j * 8 + 2 * t4 + (i & 1);
                int64_t ar = (int64_t)blockIdx.y * BN + jr;
                if (MODE == TC_DOWN) {
                    int64_t o = (int64_t)blockIdx.x * 128 + wgi * 64 + w4 * 16 + g + (i >> 1) * 8,
                            orow = opos[jr];
                    if (orow >= 0 && o < p.m.D)
                        p.m.out[orow * p.m.D + o] = rbf_cvt(acc[4 * j + i] + 0.0f, p.m.round);
                } else { /* dense: tc_put's, rounded by rbf_cvt */
                    int64_t o = (int64_t)blockIdx.x * 128 + wgi * 64 + w4 * 16 + g + (i >> 1) * 8;
                    if (ar < p.n && o < p.n_out)
                        p.y[ar * p.ldy + o] = rbf_cvt(acc[4 * j + i] + 0.0f, p.round);
                }
            }
        }
    }
}

/* The same with A (64 x 16) in registers: the fragment of mma.sync m16n8k16's A in each warp
 * (warp w of the warpgroup: rows 16 w .. 16 w + 15; lane (g, t): a[0] = row g, cols 2t, 2t+1;
 * a[1] = row g + 8, the same cols; a[2], a[3] = the same rows, cols 2t + 8, 2t + 9; bf16 pairs,
 * the lower col in the low half). The registers must keep their values until the wgmma that
 * reads them is complete (wgmma.wait_group). */
#define WG_MMA_RS(NS, REGS, AR, DB, P, ...)                                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n" NS "k16.f32.bf16.bf16 {" REGS "}, {" AR       \
                 "}, " DB ", p, 1, 1, 0;\n}\n"                                                     \
                 : __VA_ARGS__                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))

template <int N, int NR>
__device__ __forceinline__ void wg_mma_rs_k16(float (&d)[NR], const uint32_t (&a)[4], uint64_t db) {
    static_assert(N % 32 == 0 && N >= 32 && N <= 256 && N / 2 <= NR, "wgmma width");
    if constexpr (N == 32)
        WG_MMA_RS("32", WG_S0, "%16, %17, %18, %19", "%20", "%21", WG_O16(0));
    else if constexpr (N == 64)
        WG_MMA_RS("64", WG_S0 ", " WG_S1, "%32, %33, %34, %35", "%36", "%37", WG_O16(0),
                  WG_O16(16));
    else if constexpr (N == 96)
        WG_MMA_RS("96", WG_S0 ", " WG_S1 ", " WG_S2, "%48, %49, %50, %51", "%52", "%53", WG_O16(0),
                  WG_O16(16), WG_O16(32));
    else if constexpr (N == 128)
        WG_MMA_RS("128", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3, "%64, %65, %66, %67", "%68", "%69",
                  WG_O16(0), WG_O16(16), WG_O16(32), WG_O16(48));
    else if constexpr (N == 160)
        WG_MMA_RS("160", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4, "%80, %81, %82, %83",
                  "%84", "%85", WG_O16(0), WG_O16(16), WG_O16(32), WG_O16(48), WG_O16(64));
    else if constexpr (N == 192)
        WG_MMA_RS("192", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4 ", " WG_S5,
                  "%96, %97, %98, %99", "%100", "%101", WG_O16(0), WG_O16(16), WG_O16(32),
                  WG_O16(48), WG_O16(64), WG_O16(80));
    else if constexpr (N == 224)
        WG_MMA_RS("224", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4 ", " WG_S5 ", " WG_S6,
                  "%112, %113, %114, %115", "%116", "%117", WG_O16(0), WG_O16(16), WG_O16(32),
                  WG_O16(48), WG_O16(64), WG_O16(80), WG_O16(96));
    else
        WG_MMA_RS("256",
                  WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3 ", " WG_S4 ", " WG_S5 ", " WG_S6
                        ", " WG_S7,
                  "%128, %129, %130, %131", "%132", "%133", WG_O16(0), WG_O16(16), WG_O16(32),
                  WG_O16(48), WG_O16(64), WG_O16(80), WG_O16(96), WG_O16(112));
}

/* FP8: d (+)= A (64 x 32 e4m3, in registers) * B (N x 32 e4m3, descriptor db)^T (wgq.cu), N =
 * 32 .. 128. A's fragment (CUTLASS's register layout for 8-bit A, as mma.sync m16n8k32's): lane
 * (g, t) of warp w: a[0] = row 16 w + g, k 4 t .. 4 t + 3 (the lowest k in the low byte); a[1] =
 * row g + 8, the same k; a[2], a[3] = the same rows, k 16 + 4 t .. 16 + 4 t + 3. sd: 0 overwrites
 * d (the first slice of a step's partial sums), else adds. No transposes for 8-bit types. */
#define WG_MMA_Q8(NS, REGS, AR, DB, P, ...)                                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n" NS "k32.f32.e4m3.e4m3 {" REGS "}, {" AR       \
                 "}, " DB ", p, 1, 1;\n}\n"                                                        \
                 : __VA_ARGS__                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(sd))

template <int N, int NR>
__device__ __forceinline__ void
wg_mma_q8_k32(float (&d)[NR], const uint32_t (&a)[4], uint64_t db, uint32_t sd) {
    static_assert(N % 32 == 0 && N >= 32 && N <= 128 && N / 2 <= NR, "wgmma width");
    if constexpr (N == 32)
        WG_MMA_Q8("32", WG_S0, "%16, %17, %18, %19", "%20", "%21", WG_O16(0));
    else if constexpr (N == 64)
        WG_MMA_Q8("64", WG_S0 ", " WG_S1, "%32, %33, %34, %35", "%36", "%37", WG_O16(0),
                  WG_O16(16));
    else if constexpr (N == 96)
        WG_MMA_Q8("96", WG_S0 ", " WG_S1 ", " WG_S2, "%48, %49, %50, %51", "%52", "%53", WG_O16(0),
                  WG_O16(16), WG_O16(32));
    else
        WG_MMA_Q8("128", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3, "%64, %65, %66, %67", "%68", "%69",
                  WG_O16(0), WG_O16(16), WG_O16(32), WG_O16(48));
}

/* FP8 with both operands in shared memory (wgp.cu): d (+)= A (64 x 32 e4m3, descriptor da) * B
 * (N x 32 e4m3, descriptor db)^T, both K-major 128-byte swizzled tiles, N = 64 or 128; sd: 0
 * overwrites d (a step's first slice), else adds. */
#define WG_MMA_Q8SS(NS, REGS, DA, DB, P, ...)                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n" NS "k32.f32.e4m3.e4m3 {" REGS "}, " DA        \
                 ", " DB ", p, 1, 1;\n}\n"                                                         \
                 : __VA_ARGS__                                                                     \
                 : "l"(da), "l"(db), "r"(sd))

template <int N, int NR>
__device__ __forceinline__ void
wg_mma_q8ss_k32(float (&d)[NR], uint64_t da, uint64_t db, uint32_t sd) {
    static_assert((N == 64 || N == 128) && N / 2 <= NR, "wgmma width");
    if constexpr (N == 64)
        WG_MMA_Q8SS("64", WG_S0 ", " WG_S1, "%32", "%33", "%34", WG_O16(0), WG_O16(16));
    else
        WG_MMA_Q8SS("128", WG_S0 ", " WG_S1 ", " WG_S2 ", " WG_S3, "%64", "%65", "%66", WG_O16(0),
                    WG_O16(16), WG_O16(32), WG_O16(48));
}

/* One arrival on the mbarrier at bar (release: this thread's earlier writes are visible to a
 * thread that waits for the phase). */
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
#endif

#endif
