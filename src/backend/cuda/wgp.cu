/* wgp.cu - the routed experts' block GEMMs at many rows per expert (the prefill's MoE) on
 * Hopper's FP8 tensor cores with a producer warpgroup (DeepGEMM's form; c->wg_p,
 * DSI_CUDA_WG_P=1; step 40). wgq.cu has each warp load, convert and multiply in turn, and its
 * 8 warps an SM wait on their own loads (step 31's profile: long scoreboard 2.3 cycles an
 * instruction, ~17% of the FP8 rate); here the roles are split:
 *
 * - warpgroup 0, the producer: thread t copies (cp.async) a step's activation codes and
 *   scales (chunk t % 8 of rows t / 8 + 16 v) and weight row t's 64 FP4 bytes and 4 scale bytes
 *   into a stage WP_AH steps ahead, then converts its row of the current step into e4m3 bytes in
 *   the stage's swizzled weight tile (wq.cuh's table: code x 2^(S_q - B + 6), B the row's largest
 *   scale, as wgq.cu), fences them for the async proxy and arrives on the stage's `full` barrier;
 * - warpgroups 1 and 2, the consumers: activation rows 64 (wg - 1) .. + 63 of the tile x the
 *   block's 128 weight rows, 4 wgmma m64n128k32 a step with both operands in shared memory,
 *   then the promotion (acc += the step's sums x the row's activation scale) and an arrival on
 *   the stage's `empty` barrier; a consumer whose rows are all past the tile's skips the wgmma.
 *
 * Tokens are the wgmma's M here (wgq.cu has the weights there, in registers), so a promotion
 * needs two activation scales a thread, not one per column. The block's weight rows: MoE up,
 * W1 columns 64 bx .. + 63 (B rows 0-63) and the same W3 columns (rows 64-127), so a gate value
 * and its up value sit in one thread (accumulators 4 j + i and 4 (j + 8) + i); down, W2 rows
 * 128 bx ... Tiles of up to 128 rows (moe.cu's table, not balanced: an expert's last tile of 1-64
 * rows runs one consumer).
 *
 * Numerics: wgq.cu's (its header): each 128-k step's products exact, summed by the tensor cores,
 * times the activation scale into fp32; the row's weight scale 2^(B - 133) after the loop; the
 * ends are wg_finish's arithmetic (the same SwiGLU, clamp, exp_nb, roundings). The K order within
 * a 128-group is act_quant's codes' (wq_perm_byte) on both operands: chunk q of a converted row
 * holds, for m = 0..3, elements 32 m + 8 (q / 2) + 4 (q % 2) .. + 3, i.e. the low (q even) or
 * high (q odd) half of raw word 4 m + q / 2 converted with 32-block m's table. */
#include "gemm.cuh"
#include "moe.cuh"
#include "tc.cuh"
#include "wg.cuh"
#include "wq.cuh"

#define WP_T  384 /* a producer and two consumer warpgroups */
#define WP_BM 128 /* activation rows a block */
#define WP_ST 5   /* stages */
#define WP_AH 3   /* the producer's copies run this many steps ahead */
/* A stage: the activation codes [128][128] and the converted weights [128][128] (swizzled
   tiles), the raw FP4 rows [128][64] (chunk u of row t at slot (u + t / 2) % 4: no bank
   conflicts on its reads), the activation scales [128] and the weight scale bytes [128][4] */
#define WP_A     0u
#define WP_W     16384u
#define WP_R     32768u
#define WP_AS    40960u
#define WP_WS    41472u
#define WP_STAGE 41984u
#define WP_SPINS (1u << 24)

static size_t wp_smem_bytes() { return (size_t)WP_ST * WP_STAGE + 1024; }

#ifdef WG_HAVE
/* wq_table's bytes as a value: the out-of-line path's pointers stay inside it (with wq_table's
 * references into the producer's arrays those arrays lived in local memory, read back each step:
 * step 40's profile) */
static __device__ __noinline__ uint2 wp_table_small(int dp) {
    uint32_t a, b;
    wq_table_small(dp, &a, &b);
    return make_uint2(a, b);
}
__device__ __forceinline__ uint2 wp_table(int dp) {
    if (dp >= -5)
        return make_uint2(0x3c383000u + (uint32_t)dp * 0x08080800u,
                          0x4c484440u + (uint32_t)dp * 0x08080808u);
    return wp_table_small(dp);
}

/* the producer: see the header. CF (c->wgp_cf): its copies arrive on the stage's `full` barrier
 * themselves when they land (cp.async.mbarrier.arrive.noinc) and the consumers fence the stage for
 * the async proxy after their wait, so this thread's fence never waits for the copies it has in
 * flight for later steps (else, fenced here after each conversion: the step as the fence). */
template <int MODE, bool CF, bool CC>
__device__ __forceinline__ void wp_produce(const struct tc_p &p,
                                           int e,
                                           int64_t steps,
                                           int64_t K,
                                           uint32_t base,
                                           const uint8_t *const *xrow,
                                           const float *const *srow,
                                           float *wsc_s,
                                           int *b_s,
                                           uint32_t full0,
                                           uint32_t empty0) {
    const int t = threadIdx.x;
    const uint8_t *xs = MODE == TC_UP ? p.m.x8 : p.m.h8;
    const float *ss = MODE == TC_UP ? p.m.x8s : p.m.h8s;
    int64_t r = -1;
    int mat = 0;
    if (MODE == TC_UP) {
        int64_t col = (int64_t)blockIdx.x * 64 + (t & 63);
        mat = t >> 6;
        if (col < p.m.I) r = col;
    } else {
        int64_t o = (int64_t)blockIdx.x * 128 + t;
        if (o < p.m.D) r = o;
    }
    const uint8_t *wrow, *wsrow;
    int sh1, sb1;
    tc_wsrc<MODE>(p, e, mat, r, &wrow, &wsrow, &sh1, &sb1);
    const bool wv = wrow != nullptr;
    const int xc = t & 7, xj = t >> 3;
    const uint32_t rot = (uint32_t)(t >> 1);
    /* the copies' sources and shared offsets, once (step 40's profile: each step re-read the
       row pointers from shared memory, ~480 instructions a step a producer warp): chunk xc of
       rows xj + 16 v (valid: bit v of xv; offsets wg_sw(xj, xc) + 2048 v: rows 16 apart share
       the swizzle), the row's activation scales, the weight row */
    const uint8_t *xp[8];
    uint32_t xv = 0;
#pragma unroll
    for (int v = 0; v < 8; v++) {
        const uint8_t *src = xrow[xj + 16 * v];
        xp[v] = src ? src + xc * 16 : xs;
        xv |= src ? 1u << v : 0u;
    }
    const float *const sr = srow[t];
    const uint32_t aoff = WP_A + wg_sw(xj, xc);
    auto issue = [&](int64_t s) {
        if (s < steps) {
            uint32_t st = base + (uint32_t)(s % WP_ST) * WP_STAGE;
#pragma unroll
            for (int v = 0; v < 8; v++) {
                bool ok = (xv >> v) & 1u;
                cu_cp16(st + aoff + (uint32_t)v * 2048u, ok ? xp[v] + s * WQ_BK : xp[v], ok);
            }
            cu_cp4(st + WP_AS + (uint32_t)t * 4u, sr ? sr + s : ss, sr != nullptr);
#pragma unroll
            for (int u = 0; u < 4; u++)
                cu_cp16(st + WP_R + (uint32_t)t * 64u + (((uint32_t)u + rot) & 3u) * 16u,
                        wv ? wrow + s * 64 + u * 16 : xs, wv);
            cu_cp4(st + WP_WS + (uint32_t)t * 4u, wv ? wsrow + s * 4 : xs, wv);
            if (CF) /* an arrival on step s's barrier once these copies have landed */
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                                 full0 + (uint32_t)(s % WP_ST) * 8u)
                             : "memory");
        }
        cu_cp_commit();
    };
#pragma unroll
    for (int u = 0; u < WP_AH; u++)
        issue(u);
    /* the row's base B, the largest of its K / 32 scale bytes (4-byte loads: the scale rows are
       K / 32 bytes apart, K a multiple of 128), behind the first copies */
    uint32_t B = 0;
    if (wv) {
        uint32_t m = 0;
        if (((uintptr_t)wsrow & 15) == 0 && K % 512 == 0 && K <= 8192) {
            /* 16-byte loads, all in flight at once (one round trip before the first conversion) */
            const uint4 *sw = (const uint4 *)wsrow;
            uint4 v[16];
#pragma unroll
            for (int q = 0; q < 16; q++)
                if (q < K / 512) v[q] = __ldg(sw + q);
#pragma unroll
            for (int q = 0; q < 16; q++)
                if (q < K / 512)
                    m = __vmaxu4(m, __vmaxu4(__vmaxu4(v[q].x, v[q].y), __vmaxu4(v[q].z, v[q].w)));
        } else {
            const uint32_t *sw = (const uint32_t *)wsrow;
#pragma unroll 8
            for (int64_t q = 0; q < K / 128; q++)
                m = __vmaxu4(m, __ldg(sw + q));
        }
        B = max(max(m & 0xffu, (m >> 8) & 0xffu), max((m >> 16) & 0xffu, m >> 24));
    }
    wsc_s[t] = wv ? wq_pow2((int)B - 133) : 0.0f;
    if constexpr (CC) { /* the consumers convert: B for them, then only the copies (each step's land
                 on its `full` barrier by themselves) */
        b_s[t] = wv ? (int)B : -1;
        asm volatile("bar.sync 1, %0;" ::"n"(WP_T) : "memory");
#pragma unroll 1
        for (int64_t sn = WP_AH; sn < steps; sn++) {
            if (sn >= WP_ST)
                mbar_wait(empty0 + (uint32_t)(sn % WP_ST) * 8u, (uint32_t)((sn / WP_ST) + 1) & 1u,
                          WP_SPINS);
            issue(sn);
        }
        cu_cp_wait<0>();
        return;
    } else {
#pragma unroll 1
        for (int64_t s = 0; s < steps; s++) {
            int64_t sn = s + WP_AH;
            if (sn < steps && sn >= WP_ST) /* the consumers are done with step sn - WP_ST */
                mbar_wait(empty0 + (uint32_t)(sn % WP_ST) * 8u, (uint32_t)((sn / WP_ST) + 1) & 1u,
                          WP_SPINS);
            issue(sn);
            cu_cp_wait<WP_AH>(); /* this thread's copies of step s */
            uint32_t st = base + (uint32_t)(s % WP_ST) * WP_STAGE;
            uint4 w[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                uint32_t a = st + WP_R + (uint32_t)t * 64u + (((uint32_t)u + rot) & 3u) * 16u;
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(w[u].x), "=r"(w[u].y), "=r"(w[u].z), "=r"(w[u].w)
                             : "r"(a));
            }
            uint32_t sc;
            asm volatile("ld.shared.u32 %0, [%1];\n"
                         : "=r"(sc)
                         : "r"(st + WP_WS + (uint32_t)t * 4u));
            uint32_t t0[4], t1[4];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                uint2 tb = wp_table(wv ? (int)((sc >> (8 * m)) & 0xffu) - (int)B + 6 : 6);
                t0[m] = tb.x;
                t1[m] = tb.y;
            }
#pragma unroll
            for (int i = 0; i < 4;
                 i++) { /* raw words 4 m + i -> chunks 2 i (low), 2 i + 1 (high) */
                uint32_t lo[4], hi[4];
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    uint32_t x = i == 0 ? w[m].x : i == 1 ? w[m].y : i == 2 ? w[m].z : w[m].w;
                    wq_e2m1x8(x, t0[m], t1[m], lo[m], hi[m]);
                }
                uint32_t a = st + WP_W + wg_sw(t, 2 * i);
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(lo[0]),
                             "r"(lo[1]), "r"(lo[2]), "r"(lo[3])
                             : "memory");
                a = st + WP_W + wg_sw(t, 2 * i + 1);
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(hi[0]),
                             "r"(hi[1]), "r"(hi[2]), "r"(hi[3])
                             : "memory");
            }
            if (!CF) wg_fence_smem(); /* the converted rows and the landed copies, for wgmma */
            mbar_arrive(full0 + (uint32_t)(s % WP_ST) * 8u);
        }
    }
}

/* DSI_CUDA_WGP_CC=1 (step 42): consumer thread ct (0-255) converts half of weight row
 * t = ct % 128 of the stage at st, raw words 4 m + i for i = 2 h, 2 h + 1 (h = ct / 128) into
 * chunks 2 i and 2 i + 1, with the producer's operations (so the same bytes); b_s: the rows' B
 * (-1: row not valid, its codes zero as the producer's) */
__device__ __forceinline__ void wp_convert_half(uint32_t st, int ct, const int *b_s) {
    const int t = ct & 127, h = ct >> 7;
    const uint32_t rot = (uint32_t)(t >> 1);
    uint2 w[4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        uint32_t a =
            st + WP_R + (uint32_t)t * 64u + (((uint32_t)m + rot) & 3u) * 16u + (uint32_t)h * 8u;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w[m].x), "=r"(w[m].y) : "r"(a));
    }
    uint32_t sc;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc) : "r"(st + WP_WS + (uint32_t)t * 4u));
    const int B = b_s[t];
    uint32_t t0[4], t1[4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        uint2 tb = wp_table(B >= 0 ? (int)((sc >> (8 * m)) & 0xffu) - B + 6 : 6);
        t0[m] = tb.x;
        t1[m] = tb.y;
    }
#pragma unroll
    for (int ii = 0; ii < 2; ii++) {
        const int i = 2 * h + ii;
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int m = 0; m < 4; m++)
            wq_e2m1x8(ii == 0 ? w[m].x : w[m].y, t0[m], t1[m], lo[m], hi[m]);
        uint32_t a = st + WP_W + wg_sw(t, 2 * i);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(lo[0]), "r"(lo[1]),
                     "r"(lo[2]), "r"(lo[3])
                     : "memory");
        a = st + WP_W + wg_sw(t, 2 * i + 1);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(hi[0]), "r"(hi[1]),
                     "r"(hi[2]), "r"(hi[3])
                     : "memory");
    }
}

/* The consumers' end: wg_finish's arithmetic on the transposed tile (accumulator 4 j + i: the
 * block's activation row 64 c + 16 w4 + g + 8 (i / 2), weight row 8 j + 2 t4 + i % 2), each
 * weight row's scale applied first (wgq.cu's acc x wsr). */
template <int MODE>
__device__ __forceinline__ void wp_finish(const struct tc_p &p,
                                          const float (&acc)[64],
                                          const int64_t *opos,
                                          const float *rw_s,
                                          const float *wsc_s,
                                          int row0,
                                          int t4) {
    if constexpr (MODE == TC_UP) {
        const bool rd = p.m.round;
        const float lim = p.m.limit;
        const int64_t I = p.m.I;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = row0 + 8 * h;
            int64_t pos = opos[row];
            if (pos < 0) continue;
            float rwt = rw_s[row];
            float *hr = p.m.h + pos * I;
#pragma unroll
            for (int j0 = 0; j0 < 8; j0 += 4) {
                float gt[4][2], u[4][2], ev[4][2];
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        int n = 8 * (j0 + j) + 2 * t4 + i, k = 4 * (j0 + j) + 2 * h + i;
                        float g = rbf_cvt(acc[k] * wsc_s[n] + 0.0f, rd),
                              v = rbf_cvt(acc[k + 32] * wsc_s[n + 64] + 0.0f, rd);
                        gt[j][i] = fminf(g, lim);
                        u[j][i] = fminf(fmaxf(v, -lim), lim);
                        ev[j][i] = exp_nb(-gt[j][i]);
                    }
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int i = 0; i < 2; i++)
                        asm volatile("" : "+f"(ev[j][i]));
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int64_t col = (int64_t)blockIdx.x * 64 + 8 * (j0 + j) + 2 * t4;
                    float hv[2];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        float silu = gt[j][i] / (1.0f + ev[j][i]);
                        hv[i] = rbf_cvt(silu * u[j][i] * rwt, rd);
                    }
                    if (col < I) *(float2 *)(hr + col) = make_float2(hv[0], hv[1]);
                }
            }
        }
    } else {
        const int64_t D = p.m.D;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = row0 + 8 * h;
            int64_t orow = opos[row];
            if (orow < 0) continue;
            float *orp = p.m.out + orow * D;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                int n = 8 * j + 2 * t4;
                int64_t o = (int64_t)blockIdx.x * 128 + n;
                float v0 = rbf_cvt(acc[4 * j + 2 * h] * wsc_s[n] + 0.0f, p.m.round),
                      v1 = rbf_cvt(acc[4 * j + 2 * h + 1] * wsc_s[n + 1] + 0.0f, p.m.round);
                if (o < D) *(float2 *)(orp + o) = make_float2(v0, v1);
            }
        }
    }
}
#endif

/* MODE TC_UP (x8 -> h) or TC_DOWN (h8 -> out); FP4 weights with 32-blocks along K (wgp_w_ok). */
template <int MODE, bool CF, bool CC = false>
__global__ void __launch_bounds__(WP_T, 1) k_wgp(struct tc_p p) {
#ifdef WG_HAVE
    cu_pdl_enter();
    extern __shared__ uint4 wp_smem[];
    __shared__ const uint8_t *xrow[WP_BM];
    __shared__ const float *srow[WP_BM];              /* the row's activation scales (NULL: none) */
    __shared__ int64_t opos[WP_BM];                   /* up: h position; down: out row; -1: none */
    __shared__ float rw_s[WP_BM];                     /* up: the row's routing weight */
    __shared__ float wsc_s[WP_BM];                    /* the weight rows' scales (the producer's) */
    __shared__ int b_s[WP_BM];                        /* CC: the weight rows' B (the producer's) */
    __shared__ __align__(8) uint64_t bars[2 * WP_ST]; /* full[WP_ST], empty[WP_ST] */
    uint32_t raw = smem_u32(wp_smem), base = (raw + 1023u) & ~1023u;
    const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[WP_ST]);
    int tid = threadIdx.x, wgi = tid >> 7;
    int e, rows = WP_BM;
    int64_t K;
    if (!wq_block_rows<MODE, WP_BM>(p, xrow, srow, opos, &e, &K, &rows)) return;
    if (tid < WP_BM) { /* (this thread wrote opos[tid]) */
        int64_t pos = opos[tid], nk = p.m.n * p.m.topk;
        if (MODE == TC_UP)
            rw_s[tid] = pos >= 0 && pos < nk ? p.m.weight[p.m.perm[pos]] : 1.0f;
        else
            opos[tid] = pos >= 0 && pos < nk ? (int64_t)p.m.perm[pos] : pos;
    }
    if (tid == 0) {
        for (int i = 0; i < WP_ST; i++) {
            /* the producer's threads (CF: and their copies) */
            mbar_init(full0 + (uint32_t)i * 8u, CF && !CC ? 2 * WP_BM : WP_BM);
            mbar_init(empty0 + (uint32_t)i * 8u, 2 * 128u); /* the consumers' threads */
        }
        mbar_fence_init();
    }
    __syncthreads();
    const int64_t steps = K / WQ_BK;
    if (wgi == 0) {
        wp_produce<MODE, CF, CC>(p, e, steps, K, base, xrow, srow, wsc_s, b_s, full0, empty0);
        return;
    }
    if (CC) asm volatile("bar.sync 1, %0;" ::"n"(WP_T) : "memory"); /* b_s */
    const int c = wgi - 1, lane = tid & 31, w4 = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
    const bool active = 64 * c < rows; /* (warpgroup-uniform) */
    const int row0 = 64 * c + 16 * w4 + g;
    const char *sbase = (const char *)wp_smem + (base - raw);
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = part[i] = 0.0f;
#pragma unroll 1
    for (int64_t s = 0; s < steps; s++) {
        uint32_t so = (uint32_t)(s % WP_ST) * WP_STAGE, st = base + so;
        mbar_wait(full0 + (uint32_t)(s % WP_ST) * 8u, (uint32_t)(s / WP_ST) & 1u, WP_SPINS);
        if (CC) { /* the stage's weights converted by both consumers (also one without rows),
                     fenced for the async proxy by each writer, then met on barrier 2 */
            wp_convert_half(st, tid - 128, b_s);
            wg_fence_smem();
            asm volatile("bar.sync 2, 256;" ::: "memory");
        }
        if (active) {
            if (CF && !CC) wg_fence_smem(); /* the stage's bytes, written in the generic proxy */
            wg_fence();
#pragma unroll
            for (int i = 0; i < 4; i++)
                wg_mma_q8ss_k32<128>(part, wg_desc(st + WP_A + (uint32_t)c * 8192u + i * 32u),
                                     wg_desc(st + WP_W + i * 32u), (uint32_t)i);
            wg_commit();
            wg_wait<0>();
            wg_pin(part);
        }
        const float *as = (const float *)(sbase + so + WP_AS);
        float a0 = as[row0], a1 = as[row0 + 8];
        mbar_arrive(empty0 + (uint32_t)(s % WP_ST) * 8u);
        if (active) {
#pragma unroll
            for (int j = 0; j < 16; j++) {
                acc[4 * j] = fmaf(part[4 * j], a0, acc[4 * j]);
                acc[4 * j + 1] = fmaf(part[4 * j + 1], a0, acc[4 * j + 1]);
                acc[4 * j + 2] = fmaf(part[4 * j + 2], a1, acc[4 * j + 2]);
                acc[4 * j + 3] = fmaf(part[4 * j + 3], a1, acc[4 * j + 3]);
            }
        }
    }
    if (active) wp_finish<MODE>(p, acc, opos, rw_s, wsc_s, row0, t4);
#endif
}

template <int MODE, bool CF, bool CC = false>
static bool wp_launch(struct cu_ctx *c, const struct tc_p &p, dim3 grid) {
    static bool done = false;
    size_t sm = wp_smem_bytes();
    if (!smem_limit(c, k_wgp<MODE, CF, CC>, sm, &done, "wgmma FP8 (producer)")) return false;
    cu_launch(c, k_wgp<MODE, CF, CC>, grid, WP_T, sm, p);
    return cu_check(c, "moe (wgmma FP8, producer)");
}

bool wgp_w_ok(const struct cu_w *w) { return w->type == DSI_TYPE_FP4_E2M1 && w->sb1 == 32; }

bool launch_wgp_moe(struct cu_ctx *c, const struct moe_p *mp, bool up, unsigned tiles) {
    if (!mp->tiles || !mp->x8 || !mp->h8 || mp->D % WQ_BK || mp->I % WQ_BK ||
        !(up ? wgp_w_ok(&mp->w1) && wgp_w_ok(&mp->w3) : wgp_w_ok(&mp->w2)))
        return false;
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    dim3 grid((unsigned)(up ? cu_div_up(mp->I, 64) : cu_div_up(mp->D, WP_BM)), tiles);
    if (c->wgp_cc) /* (the copies arrive on the barriers themselves: CF's) */
        return up ? wp_launch<TC_UP, true, true>(c, p, grid)
                  : wp_launch<TC_DOWN, true, true>(c, p, grid);
    if (up)
        return c->wgp_cf ? wp_launch<TC_UP, true>(c, p, grid) : wp_launch<TC_UP, false>(c, p, grid);
    return c->wgp_cf ? wp_launch<TC_DOWN, true>(c, p, grid) : wp_launch<TC_DOWN, false>(c, p, grid);
}
