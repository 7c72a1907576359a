/* wg.cu - the tensor-core block GEMMs of tc.cu on Hopper's warpgroup instructions (wgmma,
 * sm_90a): the MoE expert GEMMs (up + SwiGLU, down) on FP4 / FP8 weights and dense GEMMs on FP8
 * / BF16 weights, for calls with many activation rows (the prefill). Same numerics as tc.cu
 * (weights decoded exactly to bf16, activations rounded to bf16, fp32 accumulation in the tensor
 * cores' order): not bitwise; the op tests bound the difference.
 *
 * A block of WG_T = 256 threads (2 warpgroups) computes WG_BM = 128 weight rows x BN activation
 * rows (64, 128 or 192; dense: 64 or 128) over all of K, WG_BK = 64 at a time, in shared memory in
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
#include "tc.cuh"

#include <algorithm>

#define WG_BM 128
#define WG_BK 64 /* bf16: one 128-byte swizzle row */
#define WG_T  256
#define WG_ST 4

/* Stage bytes and the dynamic shared memory (plus 1 KB to align the stages to the atoms). */
static size_t wg_smem_bytes(int BN) { return (size_t)WG_ST * (WG_BM + BN) * 128 + 1024; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_HAVE 1
#endif

/* Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte swizzled tile. */
__device__ __forceinline__ uint32_t wg_sw(int r, int c) {
    return (uint32_t)r * 128u + ((uint32_t)(c ^ (r & 7)) << 4);
}

/* Shared-memory matrix descriptor of a K-major 128-byte swizzled tile at saddr (1 KB atoms:
 * stride byte offset 1024 between 8-row groups; the leading offset is unused in this mode). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
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
/* Shared memory written by ordinary stores, read next by wgmma (the async proxy). */
__device__ __forceinline__ void wg_fence_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

    int e, rows = BN;
    int64_t K;
    const uint16_t *xs = MODE == TC_DENSE ? p.x16 : MODE == TC_UP ? p.m.x16 : p.m.h16;
    int64_t lds = MODE == TC_DENSE ? p.ld16 : MODE == TC_UP ? p.m.D : p.m.I;
    if (!tc_block_rows<MODE, BN>(p, xs, lds, p.gx, xrow, opos, &e, &K, &rows)) return;
    /* the block's activation rows computed: all BN, or (DYN) the tile's rounded up to 32 */
    const int nv = DYN ? min(BN, (rows + 31) & ~31) : BN;
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
    for (int64_t s = 0; s < steps; s += PF) {
#pragma unroll
        for (int u = 0; u < PF; u++)
            if (s + u < steps) step(s + u, wr[u]);
    }
    wg_wait<0>();
    wg_pin(acc);

    /* epilogue: acc[4 j + i] is (A row 16 w4 + g + 8 (i / 2), activation row 8 j + 2 t + i % 2) */
    int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        if (DYN && j * 8 >= nv) break; /* columns no wgmma wrote */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int jr = j * 8 + 2 * t4 + (i & 1);
            int64_t ar = (int64_t)blockIdx.y * BN + jr;
            if (MODE == TC_UP) {
                if (i >= 2) continue; /* i and i + 2: the gate and the up value */
                tc_put_up(p, opos, jr, (int64_t)blockIdx.x * 64 + wgi * 32 + w4 * 8 + g,
                          acc[4 * j + i], acc[4 * j + i + 2]);
            } else {
                tc_put<MODE>(p, opos, jr, ar,
                             (int64_t)blockIdx.x * WG_BM + wgi * 64 + w4 * 16 + g + (i >> 1) * 8,
                             acc[4 * j + i]);
            }
        }
    }
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

/* The bf16 copy: one thread per pair, rows in grid.y (strided past 65535). */
__global__ void
k_wg_bf16(const float *x, int64_t rows, int64_t cols, int64_t ldx, uint16_t *y, int64_t ldy) {
    cu_pdl_enter();
    int64_t k = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (k >= cols) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float2 v = *(const float2 *)(x + r * ldx + k);
        *(uint32_t *)(y + r * ldy + k) = bf16x2_rn(v.x, v.y);
    }
}

void launch_wg_bf16(struct cu_ctx *c,
                    const float *x,
                    int64_t rows,
                    int64_t cols,
                    int64_t ldx,
                    uint16_t *y,
                    int64_t ldy) {
    if (rows <= 0) return;
    dim3 grid((unsigned)cu_div_up(cols / 2, 256), (unsigned)std::min<int64_t>(rows, 65535));
    cu_launch(c, k_wg_bf16, grid, 256, 0, x, rows, cols, ldx, y, ldy);
    cu_check(c, "bf16 copy");
}

/* Activation rows per block for a mean of `rows` per tile: 64, or 128 / 192 (dyn: 256) from 65
 * / 129 rows where c->wg_bn (DSI_CUDA_WG_BN) allows. */
int wg_pick_bn(const struct cu_ctx *c, double rows, bool dyn) {
    return rows > 128 && c->wg_bn >= 192  ? (dyn ? 256 : 192)
           : rows > 64 && c->wg_bn >= 128 ? 128
                                          : 64;
}

bool launch_wg_gemm(struct cu_ctx *c, const struct tc_p *p, int bn, dim3 grid) {
    /* the bf16 copy of the rows: the columns every group reads, [0, (groups - 1) gx + K) (the
       caller checked that this is within a row) */
    int64_t width = (int64_t)(grid.z - 1) * p->gx + p->w.K;
    uint16_t *x16 = (uint16_t *)cu_scratch(c, CU_SCR_GEMM, (size_t)(p->n * width) * 2);
    if (!x16) return false;
    struct tc_p q = *p;
    q.x16 = x16;
    q.ld16 = width;
    launch_wg_bf16(c, p->x, p->n, width, p->ldx, x16, width);
    return p->w.type == DSI_TYPE_F8_E4M3
               ? wg_launch_bn<TC_DENSE, DSI_TYPE_F8_E4M3>(c, &q, bn, false, grid)
               : wg_launch_bn<TC_DENSE, DSI_TYPE_BF16>(c, &q, bn, false, grid);
}

bool launch_wg_moe(
    struct cu_ctx *c, const struct moe_p *mp, bool up, int bn, bool dyn, unsigned tiles) {
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    int type = up ? mp->w1.type : mp->w2.type;
    dim3 grid((unsigned)(up ? cu_div_up(mp->I, 64) : cu_div_up(mp->D, WG_BM)), tiles);
    bool f4 = type == DSI_TYPE_FP4_E2M1;
    if (up)
        return f4 ? wg_launch_bn<TC_UP, DSI_TYPE_FP4_E2M1>(c, &p, bn, dyn, grid)
                  : wg_launch_bn<TC_UP, DSI_TYPE_F8_E4M3>(c, &p, bn, dyn, grid);
    return f4 ? wg_launch_bn<TC_DOWN, DSI_TYPE_FP4_E2M1>(c, &p, bn, dyn, grid)
              : wg_launch_bn<TC_DOWN, DSI_TYPE_F8_E4M3>(c, &p, bn, dyn, grid);
}
