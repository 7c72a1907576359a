/* wgd.cu - the decode's routed experts (FP4 weights, up to 8 rows per expert; `fast` numerics)
 * on Hopper's FP8 tensor cores without a block barrier in the K loop: c->wgd (DSI_CUDA_WGD=1,
 * step 31; off until measured). gvf.cu decodes each FP4 weight to bf16 for mma.sync (~2.5
 * instructions a weight) and ran the routed experts at ~2.2 TB/s at a decode batch of 256;
 * wgq.cu's conversion to e4m3 costs ~1.1, but its blocks stage the activations a step at a time
 * behind a block barrier and wait for each step's wgmma before the next (step 30: +27-30% at the
 * decode from 1 row per expert, DSI_CUDA_WGQ_MIN=1).
 *
 * Here a block is one warpgroup (128 threads) and one tile of the expert grouping (at most
 * WD_N = 8 activation rows of one expert). It copies its rows' act_quant codes and scales for the
 * whole K into shared memory once (K bytes a row: 4 KB for V4-Flash's up projection), in wgq.cu's
 * K order and 128-byte swizzled tiles (one 1 KB atom of 8 rows per step of 128 k), then walks
 * WD_TPB weight tiles of 64 rows (up: 32 intermediate columns, the W1 and the W3 row of each, as
 * wgq.cu pairs them; down: 64 rows of W2) as one stream of steps: the raw FP4 loads WD_PF steps
 * ahead in registers (across the tiles' boundaries), each step's 32 codes a lane converted to e4m3
 * (wq.cuh), 4 wgmma m64n8k32 into one of two partial-sum sets, and the step before promoted once
 * its group is done (wait_group 1): no barrier after the copy.
 *
 * Numerics: wgq.cu's (products exact, the tensor cores' adds within a step), with the FP4
 * scales taken per step: B, the largest of the row's four 32-block scale bytes in the step, so a
 * code times 2^(S_q - B + 6) is an e4m3 value, exact while S_q >= B - 14 (as wgq.cu's per-row B,
 * never less exact), and the step's sums times the activation row's scale times 2^(B - 133) are
 * added to fp32 accumulators (wgq.cu's FP8-weight promotion). The outputs as wgq.cu's: the
 * clamped SwiGLU times the routing weight into h (up), or the expert's rows of out (down).
 *
 * Launched by moe.cu (launch_wgd_moe) for the routed experts only; the shared expert stays on
 * its own kernels. */
#include "gemm.cuh"
#include "moe.cuh"
#include "tc.cuh"
#include "wg.cuh"
#include "wq.cuh"

#include <type_traits>

#define WD_T   128 /* one warpgroup */
#define WD_N   8   /* activation rows of a tile (wgmma's N) */
#define WD_BM  64  /* weight rows a weight tile */
#define WD_PF  4   /* raw weight steps in flight */
#define WD_TPB 4   /* weight tiles a block walks (its activations copied once) */

/* Dynamic shared memory for K: the code atoms (1 KB a step), the scales ([step][WD_N] floats),
 * 1 KB to align the atoms. */
static size_t wd_smem_bytes(int64_t K) {
    return (size_t)(K / WQ_BK) * (WD_N * WQ_BK + WD_N * 4) + 1024;
}

#ifdef WG_HAVE
/* d (4 fp32: m64n8) = or += A (64 x 32 e4m3 codes, registers, wq.cuh's fragment) x B (8 x 32,
 * descriptor db)^T; sd 0 overwrites d. */
__device__ __forceinline__ void
wd_mma(float (&d)[4], const uint32_t (&a)[4], uint64_t db, uint32_t sd) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(sd));
}
#endif

/* The thread's weight rows (its rows g and g + 8: up, the W1 and the W3 row of column col; down,
 * W2 rows o and o + 8) in weight tile 0 of the matrix (w[h], their scale rows sw[h]; past the
 * matrix too: only addresses), their indices r0[h], and the bytes between tiles (dw, ds: FP4
 * rows are linear, data and scales). Row h of tile t is valid while r0[h] + t dr < lim. */
template <int MODE> struct wd_rows {
    const uint8_t *w[2], *sw[2];
    int64_t r0[2], dw, ds, lim;
    static constexpr int dr = MODE == TC_UP ? WD_BM / 2 : WD_BM;
    __device__ __forceinline__ wd_rows(const struct tc_p &p, int e, int w4, int g) {
        const struct cu_w &W = MODE == TC_UP ? p.m.w1 : p.m.w2;
        lim = MODE == TC_UP ? p.m.I : p.m.D;
        dw = dr * W.row_bytes;
        ds = dr * W.srs;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int sh1, sb1;
            r0[h] = MODE == TC_UP ? w4 * 8 + g : w4 * 16 + g + 8 * h;
            tc_wsrc<MODE>(p, e, MODE == TC_UP ? h : 0, r0[h], &w[h], &sw[h], &sh1, &sb1);
        }
    }
};

/* MODE TC_UP (x8 -> h) or TC_DOWN (h8 -> out); grid (weight tiles / WD_TPB, tiles). */
template <int MODE> __global__ void __launch_bounds__(WD_T) k_wgd(struct tc_p p) {
#ifdef WG_HAVE
    cu_pdl_enter();
    extern __shared__ uint4 wd_smem[];
    uint32_t raw = smem_u32(wd_smem), base = (raw + 1023u) & ~1023u;
    __shared__ const uint8_t *xrow[WD_N];
    __shared__ int64_t opos[WD_N];
    int tid = threadIdx.x, w4 = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const uint8_t *xs = MODE == TC_UP ? p.m.x8 : p.m.h8;
    const float *ss = MODE == TC_UP ? p.m.x8s : p.m.h8s;
    int64_t lds = MODE == TC_UP ? p.m.D : p.m.I;
    int e, rows = WD_N;
    int64_t K;
    if (!tc_block_rows<MODE, WD_N>(p, xs, lds, 0, xrow, opos, &e, &K, &rows)) return;
    __syncthreads();
    const int steps = (int)(K / WQ_BK);
    float *scs = (float *)((char *)wd_smem + (base - raw) + (size_t)steps * (WD_N * WQ_BK));
    /* the tile's codes for the whole K (rows past the tile: zeros), and their scales */
    for (int q = tid; q < steps * WD_N * 8; q += WD_T) {
        int s = q >> 6, j = (q >> 3) & 7, ch = q & 7;
        const uint8_t *src = xrow[j];
        cu_cp16(base + (uint32_t)s * (WD_N * WQ_BK) + wg_sw(j, ch),
                src ? src + (int64_t)s * WQ_BK + ch * 16 : xs, src != nullptr);
    }
    cu_cp_commit();
    for (int q = tid; q < steps * WD_N; q += WD_T) {
        int s = q / WD_N, j = q % WD_N;
        const uint8_t *src = xrow[j];
        scs[q] = src ? ss[(src - xs) / lds * (lds / WQ_BK) + s] : 0.0f;
    }
    /* the weight stream: step q of the block is step q % steps of its weight tile q / steps */
    const int64_t tile0 = (int64_t)blockIdx.x * WD_TPB;
    const int64_t ntiles =
        MODE == TC_UP ? (p.m.I + WD_BM / 2 - 1) / (WD_BM / 2) : (p.m.D + WD_BM - 1) / WD_BM;
    const int nt = (int)min((int64_t)WD_TPB, ntiles - tile0);
    /* the streams walk (tile it, step s) pairs with counters, not divisions (step 31's first
       form divided per step: 350 instructions a step, issue-bound at 1.6 TB/s); row h of the
       block's tile it is valid while it < vt[h] */
    const wd_rows<MODE> wrs(p, e, w4, g);
    int vt[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int64_t left = wrs.lim - wrs.r0[h] - tile0 * wrs.dr; /* rows left from tile 0's */
        vt[h] = left <= 0 ? 0 : (int)min((int64_t)nt, (left + wrs.dr - 1) / wrs.dr);
    }
    /* the load stream (WD_PF steps ahead): its step, tile and rows */
    int ls = 0, lit = 0;
    const uint8_t *lw[2], *lsw[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        lw[h] = wrs.w[h] + tile0 * wrs.dw;
        lsw[h] = wrs.sw[h] + tile0 * wrs.ds;
    }
    struct tc_wraw wr[WD_PF][2] = {};
    auto load_w = [&](struct tc_wraw(&w)[2]) {
        if (lit >= nt) return;
#pragma unroll
        for (int h = 0; h < 2; h++)
            wq_load_w<DSI_TYPE_FP4_E2M1>(lit < vt[h] ? lw[h] : nullptr, lsw[h], (uint32_t)ls, t4,
                                         w[h]);
        if (++ls == steps) {
            ls = 0;
            lit++;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                lw[h] += wrs.dw;
                lsw[h] += wrs.ds;
            }
        }
    };
#pragma unroll
    for (int u = 0; u < WD_PF; u++)
        load_w(wr[u]);
    cu_cp_wait<0>();
    wg_fence_smem();
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, part[4];
    uint32_t fr[2][4][4]; /* the fragments of steps q (set q % 2) and q + 1 */
    float wsc[2][2];      /* their weight scales (rows g, g + 8) */
    int dit = 0, ds_ = 0; /* the decode stream's tile and step (one ahead of the wgmma) */
    /* the next step's fragments and weight scales into set v from its raw weights w (then the
       raw registers take the load stream's next step) */
    auto decode = [&](int v, struct tc_wraw(&w)[2]) {
        if (dit >= nt) return;
        const bool valid[2] = {dit < vt[0], dit < vt[1]};
        /* B per row and step: the largest of the 4 lanes' scale bytes */
        uint32_t b[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t m = valid[h] ? w[h].sb : 0u;
            m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
            b[h] = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
            wsc[v][h] = valid[h] ? wq_pow2((int)b[h] - 133) : 0.0f;
        }
        float unused[2];
        wq_decode<DSI_TYPE_FP4_E2M1>(w, valid, b, fr[v], unused);
        load_w(w);
        if (++ds_ == steps) {
            ds_ = 0;
            dit++;
        }
    };
    /* the outputs of weight tile it, then the accumulators cleared */
    auto finish = [&](int it) {
        int64_t tile = tile0 + it;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int jr = 2 * t4 + (i & 1);
            if (MODE == TC_UP) {
                if (i < 2)
                    tc_put_up(p, opos, jr, tile * (WD_BM / 2) + w4 * 8 + g, acc[i], acc[i + 2]);
            } else {
                tc_put<MODE>(p, opos, jr, 0, tile * WD_BM + w4 * 16 + g + 8 * (i >> 1), acc[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[i] = 0.0f;
    };
    int it = 0, s = 0; /* the wgmma's tile and step */
    /* a step (u = its index % WD_PF): its wgmma on fragment set u % 2, the next step's decode
       while they run, then the wait and the promotion (one set of partial sums: ptxas
       serialised two sets read across a wait_group 1, C7514) */
    auto step = [&](int u) {
        const int v = u & 1;
        wg_fence();
#pragma unroll
        for (int i = 0; i < 4; i++)
            wd_mma(part, fr[v][i], wg_desc(base + (uint32_t)s * (WD_N * WQ_BK) + i * 32),
                   (uint32_t)i);
        wg_commit();
        decode(1 - v, wr[(u + 1) % WD_PF]);
        wg_wait<0>();
        wg_pin(part);
        float2 as = *(const float2 *)(scs + s * WD_N + 2 * t4);
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[i] = fmaf(part[i] * ((i & 1) ? as.y : as.x), wsc[v][i >> 1], acc[i]);
        if (++s == steps) {
            finish(it);
            s = 0;
            it++;
        }
    };
    decode(0, wr[0]);
    wg_k_loop<WD_PF>((int64_t)nt * steps, [&](int64_t, int u) { step(u); });
#endif
}

bool wgd_ok(int64_t D, int64_t I) { return D % WQ_BK == 0 && I % WQ_BK == 0; }

bool launch_wgd_moe(struct cu_ctx *c, const struct moe_p *mp, bool up, unsigned tiles) {
    static size_t smem_set[2];
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    int64_t K = up ? mp->D : mp->I;
    int64_t nt = up ? cu_div_up(mp->I, WD_BM / 2) : cu_div_up(mp->D, WD_BM);
    dim3 grid((unsigned)cu_div_up(nt, WD_TPB), tiles);
    size_t sm = wd_smem_bytes(K);
    auto kern = up ? k_wgd<TC_UP> : k_wgd<TC_DOWN>;
    if (sm > smem_set[up] && sm > 48 * 1024) { /* (the largest K so far: tests run several) */
        if (sm > c->smem_optin ||
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
                cudaSuccess) {
            cudaGetLastError();
            cu_fail(c, DSI_ERR_UNSUPPORTED, "moe (wgmma decode): %zu bytes of shared memory", sm);
            return false;
        }
        smem_set[up] = sm;
    }
    cu_launch(c, kern, grid, WD_T, sm, p);
    return cu_check(c, "moe (wgmma decode)");
}
