/* hc.cu - mHC: hc_pre (mix GEMM, then per token: norm statistic, pre/post/comb, Sinkhorn and
 * the collapse fused in one block), hc_post and the final hc_head, as cpu/ops.c. */
#include "gemm.cuh"
#include "hc.cuh"
#include "norm.cuh"

#include <algorithm>

#define HC_AHEAD 8 /* loads in flight per thread in the norm statistic */

#define MIX_STEP   CU_WARPS            /* k_hc_mix: chunks of 32 per step, one per warp */
#define MIX_MAX    32                  /* k_hc_mix: outputs at most (hc_pre: hc <= 4; hc_head) */
#define MIX_CV_MAX ((int64_t)64 << 20) /* k_hc_mix: the split's chunk values, bytes at most */
/* k_hc_mix with RPL rows per lane: X rows per block, floats per output in a step's chunk values
 * (odd: conflict-free), outputs a thread adds or copies */
#define MIX_ROWS(RPL) (32 * (RPL))
#define MIX_CS(RPL)   (32 * (RPL) + 1)
#define MIX_OWN(RPL)  (MIX_ROWS(RPL) * MIX_MAX / CU_THREADS)

/* The mix GEMM (step 24): fn[o] . X[r] for rows r < n of len floats (F32 fn of row stride ldw,
 * len % 32 == 0, X and fn 16-byte aligned) and outputs o < n_mix <= MIX_MAX, in cpu_dot's bits.
 * A block takes MIX_ROWS(RPL) rows, rows r0 + lane + 32 u (u < RPL) in every warp, and chunks
 * [qa, qb) of K (qa = blockIdx.y qpb), MIX_STEP at a time: chunk q0 + w in warp w. Each thread
 * holds its rows' chunks in registers (loaded a step ahead) and computes chunk_dot with the
 * step's n_mix fn chunks of its warp, read from shared memory by all lanes at one address; they
 * come in by cp.async a step ahead (two buffers), so fn is read from L2 once per block, and X
 * once. (Step 14's kernel staged 8 rows and held fn in registers: shared-memory bound, 0.88 ms
 * for 8192 rows.) A broadcast LDS.128 still delivers 512 bytes to the registers, 4 of the
 * SM's 128-byte cycles, for 4 multiplies and 4 adds per lane: with one row per lane (RPL 1) the
 * 16 warps of two blocks need twice the shared-memory cycles of their fp32 issue (step 24's 2.2x
 * off the issue bound, read off the SASS in step 25); RPL 2 uses each fn value for two rows
 * (one block of 8 warps per SM: the registers). A step's chunk values go to cs[chunk][o][row]
 * (stride MIX_CS: conflict-free both ways), then
 *   ORD (the block has all of K): thread t adds outputs f = t, t + CU_THREADS, ... (f = row *
 *       n_mix + o) chunk by chunk: acc = 0, acc += chunk q for q = 0 .. nq - 1, then acc + 0.0f,
 *       cpu_dot's additions (the same bits as launch_gemm), out = mraw [n][n_mix];
 *   else (split along K) the values go out as they are, coalesced, to out = [nq][n * n_mix]
 *       (launch_gemm_reduce's layout; it or hc_pre's finish adds them in the same order).
 * Barriers per step: (1) after the step's fn copies have landed: cs is free again (the previous
 * step's adds or copies are done); (2) after cs is written. The next step's fn copies, issued at
 * the top of a step, overwrite the buffer of the step before, whose reads ended before its (2).
 * Lanes past n compute on row n - 1 (no predicates) and write nothing. */
struct mix_p {
    const float *X, *fn;
    int64_t ldw;
    int n_mix;
    int64_t len, n, qpb;
    float *out;
};

template <bool ORD, int RPL>
__global__ void __launch_bounds__(CU_THREADS, RPL == 1 ? 2 : 1) k_hc_mix(struct mix_p mp) {
    cu_pdl_enter();
    const float *X = mp.X, *fn = mp.fn;
    const int64_t ldw = mp.ldw, len = mp.len, n = mp.n, qpb = mp.qpb;
    const int n_mix = mp.n_mix;
    float *out = mp.out;
    extern __shared__ float4 mix_sm[];
    float *ws = (float *)mix_sm;                /* [2][MIX_STEP][n_mix][32] */
    float *cs = ws + 2 * MIX_STEP * n_mix * 32; /* [MIX_STEP][n_mix][MIX_CS] */
    constexpr int ROWS = MIX_ROWS(RPL), CS = MIX_CS(RPL), OWN = MIX_OWN(RPL);
    int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, nw4 = MIX_STEP * n_mix * 8;
    int per = n_mix * CS;
    int64_t r0 = (int64_t)blockIdx.x * ROWS, nq = len / 32, qa = (int64_t)blockIdx.y * qpb;
    int64_t qb = min(nq, qa + qpb);
    int nr = (int)min((int64_t)ROWS, n - r0), nf = nr * n_mix;
    const float *xr[RPL];
#pragma unroll
    for (int u = 0; u < RPL; u++)
        xr[u] = X + (r0 + min(lane + 32 * u, nr - 1)) * len;
    /* this thread's outputs f = tid + i CU_THREADS: their place in cs (row, o from f once) */
    int ci[OWN];
#pragma unroll
    for (int i = 0; i < OWN; i++) {
        int f = tid + i * CU_THREADS, rr = f / n_mix;
        ci[i] = (f - rr * n_mix) * CS + rr;
    }
    /* fn chunks q0 .. q0 + MIX_STEP - 1 into buffer b (zeros past qb), as one cp.async group */
    auto stage = [&](int64_t q0, int b) {
        float *dst = ws + b * MIX_STEP * n_mix * 32;
        for (int e = tid; e < nw4; e += CU_THREADS) {
            int jo = e >> 3, j = jo / n_mix, o = jo - j * n_mix;
            int64_t q = q0 + j;
            cu_cp16((uint32_t)__cvta_generic_to_shared(dst + e * 4),
                    fn + o * ldw + (q < qb ? q : qa) * 32 + (e & 7) * 4, q < qb);
        }
        cu_cp_commit();
    };
    /* this thread's rows' chunk q (past qb: chunk qa, computed and never used) */
    auto load = [&](int64_t q, float(&v)[RPL][32]) {
#pragma unroll
        for (int u = 0; u < RPL; u++)
            load_x_chunk(xr[u] + (q < qb ? q : qa) * 32, true, v[u]);
    };
    float xn[RPL][32], acc[OWN];
#pragma unroll
    for (int i = 0; i < OWN; i++)
        acc[i] = 0.0f;
    load(qa + w, xn);
    stage(qa, 0);
    int b = 0;
    for (int64_t q0 = qa; q0 < qb; q0 += MIX_STEP, b ^= 1) {
        float x[RPL][32];
#pragma unroll
        for (int u = 0; u < RPL; u++)
#pragma unroll
            for (int k = 0; k < 32; k++)
                x[u][k] = xn[u][k];
        if (q0 + MIX_STEP < qb) { /* block-uniform */
            load(q0 + MIX_STEP + w, xn);
            stage(q0 + MIX_STEP, b ^ 1);
            cu_cp_wait<1>();
        } else {
            cu_cp_wait<0>();
        }
        __syncthreads(); /* (1) */
        if (q0 + w < qb) {
            const float *wq = ws + (b * MIX_STEP + w) * n_mix * 32;
            float *cq = cs + w * per + lane;
            /* fn's chunks from shared memory, all lanes at one address (a broadcast), each for
               the thread's RPL rows; unrolled by 4 (step 24: the prefill's mix -7%) */
#pragma unroll 4
            for (int o = 0; o < n_mix; o++) {
                float wf[32];
                load_x_chunk(wq + o * 32, true, wf);
#pragma unroll
                for (int u = 0; u < RPL; u++)
                    cq[o * CS + 32 * u] = chunk_dot(x[u], wf);
            }
        }
        __syncthreads(); /* (2) */
        int cnt = (int)min((int64_t)MIX_STEP, qb - q0);
        int64_t T = n * n_mix;
#pragma unroll
        for (int i = 0; i < OWN; i++) {
            int f = tid + i * CU_THREADS;
            if (f >= nf) break;
            if (ORD)
                for (int j = 0; j < cnt; j++)
                    acc[i] += cs[j * per + ci[i]];
            else
                for (int j = 0; j < cnt; j++)
                    out[(q0 + j) * T + r0 * n_mix + f] = cs[j * per + ci[i]];
        }
    }
    if (ORD)
#pragma unroll
        for (int i = 0; i < OWN; i++) {
            int f = tid + i * CU_THREADS;
            if (f < nf) out[r0 * n_mix + f] = acc[i] + 0.0f;
        }
}

static size_t mix_smem(int n_mix, int rpl) {
    return (size_t)(2 * MIX_STEP * 32 + MIX_STEP * MIX_CS(rpl)) * n_mix * 4;
}

/* k_hc_mix<ORD, RPL>'s launch (smem: its dynamic shared memory; raised once per instance). */
template <bool ORD, int RPL>
static bool mix_launch(struct cu_ctx *c, dim3 grid, size_t smem, const struct mix_p &mp) {
    static bool raised = false;
    if (!smem_limit(c, k_hc_mix<ORD, RPL>, mix_smem(MIX_MAX, RPL), &raised, "hc mix")) return false;
    cu_launch(c, k_hc_mix<ORD, RPL>, grid, CU_THREADS, smem, mp);
    return true;
}

/* fn[o] . X[r] in cpu_dot's bits for r < n, o < n_mix (the caller checked fn's shape): into mraw
 * ([n][n_mix]), or, where the mix is split along K and want_cv (hc_pre's finish adds them:
 * c->hc_fuse), the chunk values [nq][n * n_mix] (returned, *nq_out their count; else NULL).
 * k_hc_mix from c->hc_mix_min rows (DSI_CUDA_HC_MIX_MIN; 0: never), else launch_gemm; two rows
 * per lane from 33 rows where the blocks fill the SMs (c->hc_mix_rpl, DSI_CUDA_HC_MIX_RPL=1:
 * never, 3: always, for the tests). It splits K where its row
 * blocks are fewer than the SMs (c->hc_mix_split, DSI_CUDA_HC_MIX_SPLIT=0: never) into about two
 * blocks per SM (one of two rows per lane, whose blocks fill an SM alone), the chunk values in
 * CU_SCR_GEMM (at most MIX_CV_MAX bytes). */
static const float *hc_mix(struct cu_ctx *c,
                           const struct cu_w *fn,
                           int n_mix,
                           const float *X,
                           int64_t n,
                           int64_t len,
                           float *mraw,
                           bool want_cv,
                           int64_t *nq_out) {
    if (c->hc_mix_min <= 0 || n < c->hc_mix_min || n_mix > MIX_MAX || fn->type != DSI_TYPE_F32 ||
        !gemm_fast_ok(fn, X, len) || (uintptr_t)fn->data % 16 || fn->row_bytes % 16) {
        launch_gemm(c, fn, 0, n_mix, X, n, len, mraw, n_mix, false);
        return NULL;
    }
    /* two rows per lane where its blocks still fill the SMs: split along K, or about a row block
       per SM (from ~7400 rows; hc_pre's 1366-7400 take neither: one row per lane, twice the
       blocks) */
    int64_t nq = len / 32;
    bool cv_fits = c->hc_mix_split && nq * n * n_mix * 4 <= MIX_CV_MAX;
    bool fills = cv_fits || cu_div_up(n, 64) * 8 >= c->n_sms * 7 || c->hc_mix_rpl >= 3;
    int rpl = c->hc_mix_rpl >= 2 && n > 32 && fills ? 2 : 1, bps = rpl == 1 ? 2 : 1;
    int64_t rt = cu_div_up(n, MIX_ROWS(rpl)), qpb = nq, split = 1;
    if (cv_fits && rt < c->n_sms) {
        qpb = cu_div_up(cu_div_up(nq, cu_div_up(bps * (int64_t)c->n_sms, rt)), MIX_STEP) * MIX_STEP;
        split = cu_div_up(nq, qpb);
    }
    float *cv = NULL;
    if (split > 1 && !(cv = (float *)cu_scratch(c, CU_SCR_GEMM, (size_t)(nq * n * n_mix) * 4)))
        return NULL;
    dim3 grid((unsigned)rt, (unsigned)split);
    size_t sm = mix_smem(n_mix, rpl);
    const float *w = (const float *)fn->data;
    int64_t ldw = fn->row_bytes / 4;
    struct mix_p mp = {X, w, ldw, n_mix, len, n, qpb, cv ? cv : mraw};
    int pm = cu_prof_begin(c, "hc.mix");
    bool ok = cv         ? rpl == 2 ? mix_launch<false, 2>(c, grid, sm, mp)
                                    : mix_launch<false, 1>(c, grid, sm, mp)
                      : rpl == 2 ? mix_launch<true, 2>(c, grid, sm, mp)
                         : mix_launch<true, 1>(c, grid, sm, mp);
    cu_prof_end(c, pm);
    if (!ok) return NULL;
    if (!cu_check(c, "hc mix") || !cv) return NULL;
    if (want_cv) {
        *nq_out = nq;
        return cv;
    }
    launch_gemm_reduce(c, cv, nq, n, n_mix, mraw, n_mix, false);
    return NULL;
}

/* Barrier of the threads that do the small maths: warp 0 (hc * hc <= 32) or warps 0-1. */
__device__ __forceinline__ void small_sync(int nt) {
    if (nt <= 32)
        __syncwarp();
    else
        asm volatile("bar.sync 1, 64;" ::: "memory");
}

/* The norm fused after hc_pre's collapse (z = RMSNorm(y) w, zq = act_quant(z); z null: none). */
struct hc_norm_p {
    struct cu_vec nw;
    float eps;
    float *z, *zq; /* the row's */
};

#define HC_ONE_CW (CU_THREADS - 32) /* the collapse's threads: warps 1.. */

#define HC_CU(HM) (20 / (HM)) /* float4 columns per collapse thread in flight */

/* The loads of one round of hc_collapse_norm's (a collapse thread's CU float4 columns from
 * e0 of each of the hc streams of X4, d4 float4 a stream; zeros past them). XB: X4 holds bf16
 * values (xs_ld4), 4 a column as before. */
template <int HM, bool CG, bool XB = false>
__device__ __forceinline__ void
hc_collapse_load(const float4 *X4, int hc, int64_t d4, int64_t e0, float4 (&xv)[HC_CU(HM)][HM]) {
    constexpr int CO = CG ? XS_CG : 0;
#pragma unroll
    for (int u = 0; u < HC_CU(HM); u++)
#pragma unroll
        for (int k = 0; k < HM; k++) {
            int64_t e = e0 + (int64_t)u * HC_ONE_CW;
            xv[u][k] = e < d4 && k < hc ? xs_ld4<XB, CO>((const float *)X4, (k * d4 + e) * 4)
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
}

/* Warps 1.. of a block (HC_ONE_CW threads; warp 0 runs the Sinkhorn meanwhile): the collapse of
 * row Xr (hc streams of dim) into y, k_hc_pre_finish's arithmetic by float4, CU of them (HM
 * streams each) loaded at once; then with nm.z the norm as k_rms_norm_blk (y kept in ys, dim
 * floats of shared memory; the sums of squares in double in another order: the float results
 * equal but for the rare last-bit tie, as between the other kernels) and with nm.zq its act_quant
 * copy. red: CU_WARPS doubles of shared memory. Used by k_hc_pre_one and k_hc_pre_finish.
 * PRE: xpre holds the thread's first round of loads, made by the caller with hc_collapse_load
 * ahead of the work before (else null). XB: Xr holds bf16 values (xs_at's pointer). */
template <int HM, bool CG = false, bool PRE = false, bool XB = false>
__device__ __forceinline__ void hc_collapse_norm(const float *Xr,
                                                 const float *pre_s,
                                                 int hc,
                                                 int64_t dim,
                                                 float *y,
                                                 const struct hc_norm_p &nm,
                                                 bool round,
                                                 float4 *ys,
                                                 double *red,
                                                 const float4 (*xpre)[HM] = nullptr) {
    constexpr int CU = HC_CU(HM);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ct = threadIdx.x - 32;
    bool norm = nm.z != nullptr;
    int64_t d4 = dim / 4;
    const float4 *X4 = (const float4 *)Xr;
    float4 *y4 = (float4 *)y;
    double zs = 0.0;
    for (int64_t e0 = ct; e0 < d4; e0 += (int64_t)HC_ONE_CW * CU) {
        float4 xv[CU][HM];
        if (PRE && e0 == ct) {
#pragma unroll
            for (int u = 0; u < CU; u++)
#pragma unroll
                for (int k = 0; k < HM; k++)
                    xv[u][k] = xpre[u][k];
        } else {
            hc_collapse_load<HM, CG, XB>(X4, hc, d4, e0, xv);
        }
#pragma unroll
        for (int u = 0; u < CU; u++) {
            int64_t e = e0 + (int64_t)u * HC_ONE_CW;
            if (e >= d4) break;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
            for (int k = 0; k < HM; k++)
                if (k < hc) {
                    a0 += pre_s[k] * xv[u][k].x;
                    a1 += pre_s[k] * xv[u][k].y;
                    a2 += pre_s[k] * xv[u][k].z;
                    a3 += pre_s[k] * xv[u][k].w;
                }
            float4 yv = make_float4(rbf(a0, round), rbf(a1, round), rbf(a2, round), rbf(a3, round));
            y4[e] = yv;
            if (norm) {
                ys[e] = yv;
                rms_in4(yv, round, zs); /* its squares, as the norm kernels add them */
            }
        }
    }
    if (!norm) return;
    zs = warp_sum_d(zs);
    if (lane == 0) red[warp] = zs;
    asm volatile("bar.sync 1, %0;" ::"n"(HC_ONE_CW) : "memory");
    double tot = 0.0;
    for (int w = 1; w < CU_WARPS; w++)
        tot += red[w];
    float inv = rms_inv(tot, dim, nm.eps, round, nm.nw.data != nullptr);
    float4 *z4 = (float4 *)nm.z;
    for (int64_t e = ct; e < d4; e += HC_ONE_CW) {
        float4 o = rms_out4(ys[e], inv, nm.nw, e * 4, round);
        z4[e] = o;
        ys[e] = o;
    }
    if (!nm.zq) return;
    asm volatile("bar.sync 1, %0;" ::"n"(HC_ONE_CW) : "memory");
    float4 *q4 = (float4 *)nm.zq;
#pragma unroll 1
    for (int64_t b = warp - 1; b < dim / 128; b += CU_WARPS - 1)
        q8_warp_block(ys[b * 32 + lane], q4 + b * 32 + lane);
}

/* Per row (blockIdx.x): rho from the flattened streams, then pre and post, then the collapse y
 * alongside the rest of the small maths. gridDim.y blocks share a row: each computes the same rho
 * and pre (the same operations in the same order, so the same bits) and collapses its slice of
 * the dim columns; block 0 also runs the small maths (on its first one or two warps; its other
 * warps collapse) and writes post and comb. A collapse thread issues its hc loads together.
 * (Measured, docs/cuda.md step 12: as fast as one block per row; the time is Sinkhorn's.) The
 * small maths (pre/post, the comb softmax and the Sinkhorn iterations) run on hc * hc threads, one
 * per comb element, each computing its row or column sum in the CPU's order from shared memory: the
 * same operations as the CPU's loops, so the same results, without a single thread walking the
 * hc x hc matrix (in local memory) 2 * iters times. With cv (DSI_CUDA_HC_FUSE=1), the mix comes
 * as k_hc_mix's split-K chunk values, [nq][n * n_mix]: the block adds each
 * output's nq values in chunk order (chunk_sum_staged, as k_gemm_reduce: the same bits) instead
 * of a reduce launch reading them before. With ssp (`fast` numerics, hc_tf.cu), cv holds
 * hc_mix_tf's nq split values in the same layout and ssp [nq][n] the splits' sums of squares,
 * added here in double: X is read once, by the collapse. The finish runs on CU_THREADS threads.
 * XB: X holds bf16 values (dsi_hc_pre_args.xbf16; only with ssp). */
template <bool NORM, bool XB>
__global__ void k_hc_pre_finish(const float *X,
                                const float *mraw,
                                const float *cv,
                                const float *ssp,
                                int64_t nq,
                                int64_t n,
                                int hc,
                                int64_t dim,
                                struct cu_vec base,
                                struct cu_vec scale,
                                int iters,
                                float norm_eps,
                                float hc_eps,
                                float *y,
                                float *post,
                                float *comb,
                                bool round,
                                struct hc_norm_p nm) {
    cu_pdl_enter();
    extern __shared__ float4 fin_sm[]; /* nm.z: y of the row, then z */
    __shared__ double red[32];
    __shared__ float pre_s[HC_MAX];
    __shared__ float M[HC_MAX * HC_MAX];
    __shared__ float mix_s[(2 + HC_MAX) * HC_MAX];
    int64_t r = blockIdx.x, len = hc * dim;
    const float *Xr = xs_at<XB>(X, r * len);
    int n_mix = (2 + hc) * hc;
    const float *mr = mraw + r * n_mix;
    if (cv) { /* 32 outputs at a time, the block's warps staging their chunk values */
        __shared__ float red_buf[RED_ROWS][32];
        int lane = threadIdx.x & 31;
        for (int o0 = 0; o0 < n_mix; o0 += 32) {
            bool tv = o0 + lane < n_mix;
            float acc = chunk_sum_staged(cv, nq, n * n_mix, r * n_mix + o0 + lane, tv, red_buf);
            if (threadIdx.x < 32 && tv) mix_s[o0 + lane] = acc + 0.0f;
        }
        __syncthreads();
        mr = mix_s;
    }
    double ss = 0.0;
    if (XB || ssp) { /* hc_mix_tf's partial sums of squares, in split order (every thread) */
        for (int64_t q = 0; q < nq; q++)
            ss += (double)__ldcg(ssp + q * n + r);
    } else if (len % 4 == 0 && (uintptr_t)Xr % 16 == 0) {
        /* HC_AHEAD float4 of a thread in flight at once, added in the same order as one by one */
        const float4 *X4 = (const float4 *)Xr;
        int64_t n4 = len / 4;
        for (int64_t i0 = threadIdx.x; i0 < n4; i0 += HC_AHEAD * blockDim.x) {
            float4 v[HC_AHEAD];
#pragma unroll
            for (int j = 0; j < HC_AHEAD; j++) {
                int64_t i = i0 + (int64_t)j * blockDim.x;
                v[j] = i < n4 ? X4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int j = 0; j < HC_AHEAD; j++) {
                if (i0 + (int64_t)j * blockDim.x >= n4) break;
                ss += (double)v[j].x * (double)v[j].x;
                ss += (double)v[j].y * (double)v[j].y;
                ss += (double)v[j].z * (double)v[j].z;
                ss += (double)v[j].w * (double)v[j].w;
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
            ss += (double)Xr[i] * (double)Xr[i];
    }
    if (!ssp) ss = block_sum_d(ss, red); /* the same value in every thread */
    int nt = hc * hc, tid = threadIdx.x, small = nt <= 32 ? 32 : 64;
    float rho = 1.0f / sqrtf((float)(ss / (double)len) + norm_eps);
    bool lead = blockIdx.y == 0;
    if (tid < hc) {
        int k = tid;
        float m0 = mr[k] * rho, m1 = mr[hc + k] * rho;
        pre_s[k] = sigmoid_ref(m0 * vec_get(scale, 0) + vec_get(base, k)) + hc_eps;
        if (lead)
            post[r * hc + k] = 2.0f * sigmoid_ref(m1 * vec_get(scale, 1) + vec_get(base, hc + k));
    }
    __syncthreads();
    if (!lead || tid >= small) { /* the collapse (block 0: while the first warp(s) run Sinkhorn) */
        if (NORM) { /* one block a row, warps 1..7 (hc_pre_norm_fused): the norm after it too */
            struct hc_norm_p nr = {nm.nw, nm.eps, nm.z + r * dim,
                                   nm.zq ? nm.zq + r * dim : nullptr};
            if (hc == 4)
                hc_collapse_norm<4, false, false, XB>(Xr, pre_s, hc, dim, y + r * dim, nr, round,
                                                      fin_sm, red);
            else
                hc_collapse_norm<5, false, false, XB>(Xr, pre_s, hc, dim, y + r * dim, nr, round,
                                                      fin_sm, red);
            return;
        }
        int64_t part = (dim + gridDim.y - 1) / gridDim.y;
        int64_t d1 = (blockIdx.y + 1) * part < dim ? (blockIdx.y + 1) * part : dim;
        int first = lead ? tid - small : tid, step = lead ? blockDim.x - small : blockDim.x;
        if (dim % 4 == 0 && part % 4 == 0 && (uintptr_t)Xr % (XB ? 8 : 16) == 0 &&
            (uintptr_t)(y + r * dim) % 16 == 0) {
            /* four columns a thread: the hc float4 loads issued together (step 32: with the sum
               of squares from hc_mix_tf this is the one read of X, no longer an L2 hit after the
               statistic's pass), each column's operations as below */
            for (int64_t d = blockIdx.y * part + 4 * first; d < d1; d += 4 * step) {
                float4 xv[HC_MAX];
#pragma unroll
                for (int k = 0; k < HC_MAX; k++)
                    xv[k] = k < hc ? xs_ld4<XB, XS_CS>(Xr, k * dim + d)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int k = 0; k < HC_MAX; k++)
                    if (k < hc) {
                        acc.x += pre_s[k] * xv[k].x;
                        acc.y += pre_s[k] * xv[k].y;
                        acc.z += pre_s[k] * xv[k].z;
                        acc.w += pre_s[k] * xv[k].w;
                    }
                *(float4 *)(y + r * dim + d) = make_float4(rbf(acc.x, round), rbf(acc.y, round),
                                                           rbf(acc.z, round), rbf(acc.w, round));
            }
            return;
        }
        for (int64_t d = blockIdx.y * part + first; d < d1; d += step) {
            float xv[HC_MAX];
#pragma unroll
            for (int k = 0; k < HC_MAX; k++)
                xv[k] = k < hc ? xs_ld1<XB>(Xr, k * dim + d) : 0.0f;
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < HC_MAX; k++)
                if (k < hc) acc += pre_s[k] * xv[k];
            y[r * dim + d] = rbf(acc, round);
        }
        return;
    }
    if (nt <= 32) { /* warp 0: the matrix in its lanes' registers, sums by shuffles */
        hc_comb_warp(mr, rho, hc, base, scale, iters, hc_eps, comb + r * nt);
        return;
    }
    {
        bool act = tid < nt;
        int jr = act ? tid / hc : 0, k = act ? tid % hc : 0;
        float v = 0.0f;
        if (act) {
            float m2 = mr[2 * hc + tid] * rho;
            M[tid] = m2 * vec_get(scale, 2) + vec_get(base, 2 * hc + tid);
        }
        small_sync(nt);
        if (act) { /* row softmax + eps */
            float mx = -INFINITY;
            for (int kk = 0; kk < hc; kk++)
                mx = fmaxf(mx, M[jr * hc + kk]);
            v = exp_ref(M[tid] - mx);
        }
        small_sync(nt);
        if (act) M[tid] = v;
        small_sync(nt);
        if (act) {
            float z = 0.0f;
            for (int kk = 0; kk < hc; kk++)
                z += M[jr * hc + kk];
            v = v / z + hc_eps;
        }
        small_sync(nt);
        if (act) M[tid] = v;
        small_sync(nt);
        for (int it = 0; it < iters; it++) {
            if (it > 0) { /* rows */
                if (act) {
                    float s = 0.0f;
                    for (int kk = 0; kk < hc; kk++)
                        s += M[jr * hc + kk];
                    v /= s + hc_eps;
                }
                small_sync(nt);
                if (act) M[tid] = v;
                small_sync(nt);
            }
            if (act) { /* columns */
                float s = 0.0f;
                for (int j = 0; j < hc; j++)
                    s += M[j * hc + k];
                v /= s + hc_eps;
            }
            small_sync(nt);
            if (act) M[tid] = v;
            small_sync(nt);
        }
        if (act) comb[r * nt + tid] = v;
    }
}

/* ---- hc_pre at a few rows in one launch (c->hc_one rows at most, DSI_CUDA_HC_ONE; step 19).
 * At decode the three launches above (the mix's split-K pass, its reduce, the finish) are each a
 * chain of latencies on one or two blocks, ~20 us together per call, and the norm after hc_pre
 * is another single-block launch. Here grid (S, n), S = ceil(nq / 32) pieces of 32 chunks of K:
 * block (s, r) writes the chunk values of piece s of row r for every mix output (lane l: chunk
 * 32 s + l, warp w: outputs w, w + 8, ...: chunk_dot, as launch_gemm's split-K pass) into
 * cv[q][r n_mix + o] and the sum of squares of its X values (double) into ssp[r][s]. The block
 * that completes a row last (a counter per row in c->hc_cnt, put back to zero by that block)
 * runs the row's finish: the mix sums in chunk order (chunk_sum_staged: launch_gemm's bits), rho
 * from the S partial sums in order, pre / post, comb on warp 0 (hc * hc <= 32) while warps 1..7
 * collapse y, then with norm_w z = RMSNorm(y) w and zq = act_quant(z) as k_rms_norm_blk (the
 * sums of squares in double in another order: the float results equal but for the rare last-bit
 * tie, as between the other kernels). */

/* k_hc_pre_one's fused hc_post (p.pX): the block's piece of row r's new streams (its 32 chunks of
 * 32 values, from chunk 32 s; dim % 32 == 0, so a chunk lies in one stream k) from the old
 * streams, f and the old post / comb, as k_hc_post computes them (hc_post_val): thread t the
 * float4 t % 8 of chunk t / 8, all its loads in flight at once (one round trip), into pc (9
 * float4 a chunk: the lanes' reads below without bank conflicts) and with st into X too (one
 * block of the row's og does); after the block's barrier each lane reads its chunk's 32 values.
 * The old post / comb are read here, before the block's count: the block that writes the new
 * ones counts last. (Step 41's first form had every warp compute its lanes' chunks itself, the
 * loads in four rounds: the step +6% at batch 1.) */
__device__ __forceinline__ void hc_post_piece(const struct hc_one_p &p,
                                              int64_t r,
                                              int64_t nq,
                                              int hc,
                                              int64_t dim,
                                              bool st,
                                              float4 *pc,
                                              float (&xf)[32]) {
    static_assert(CU_THREADS == 256, "a thread per float4 of the piece");
    int t = threadIdx.x, c = t >> 3, v = t & 7, lane = t & 31;
    int64_t len = hc * dim, q = (int64_t)blockIdx.x * 32 + c;
    if (q < nq) {
        int64_t e0 = q * 32 + 4 * v, k = e0 / dim, d = e0 - k * dim;
        const float *Xo = p.pX + r * len + d;
        float4 xv[HC_MAX], fv = *(const float4 *)(p.pf + r * dim + d);
        float cc[HC_MAX], pk = p.ppost[r * hc + k];
#pragma unroll
        for (int j = 0; j < HC_MAX; j++) {
            xv[j] = j < hc ? *(const float4 *)(Xo + j * dim) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            cc[j] = j < hc ? p.pcomb[(r * hc + j) * hc + k] : 0.0f;
        }
        float x0[HC_MAX], x1[HC_MAX], x2[HC_MAX], x3[HC_MAX];
#pragma unroll
        for (int j = 0; j < HC_MAX; j++) {
            x0[j] = xv[j].x;
            x1[j] = xv[j].y;
            x2[j] = xv[j].z;
            x3[j] = xv[j].w;
        }
        float4 o = make_float4(
            hc_post_val(cc, x0, pk, fv.x, hc, p.round), hc_post_val(cc, x1, pk, fv.y, hc, p.round),
            hc_post_val(cc, x2, pk, fv.z, hc, p.round), hc_post_val(cc, x3, pk, fv.w, hc, p.round));
        pc[c * 9 + v] = o;
        if (st) *(float4 *)(p.X + r * len + e0) = o;
    }
    __syncthreads();
    if (blockIdx.x * 32 + lane < nq) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            float4 o = pc[lane * 9 + u];
            xf[4 * u] = o.x;
            xf[4 * u + 1] = o.y;
            xf[4 * u + 2] = o.z;
            xf[4 * u + 3] = o.w;
        }
    } else {
#pragma unroll
        for (int u = 0; u < 32; u++)
            xf[u] = 0.0f;
    }
}

/* HC: hc when > 0 (4: V4's), else any hc <= 5 (hc * hc <= 32). EARLY: p.early (an instance of
 * its own: the first round's X values held through the mix's sums take ~90 more registers) */
template <int HC, bool EARLY = false>
__global__ void __launch_bounds__(CU_THREADS) k_hc_pre_one(struct hc_one_p p) {
    extern __shared__ float4 one_sm[]; /* with norm: y of the row, then z */
    __shared__ int last;
    __shared__ float pre_s[HC_MAX];
    __shared__ float mix_s[(2 + HC_MAX) * HC_MAX];
    __shared__ float red_buf[RED_ROWS][32];
    __shared__ double red[CU_WARPS];
    __shared__ float4 pc_s[32 * 9];     /* the fused hc_post's piece (hc_post_piece) */
    constexpr int HM = HC > 0 ? HC : 5; /* streams held per float4 of the collapse */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hc = HC > 0 ? HC : p.hc;
    int n_mix = (2 + hc) * hc;
    int64_t r = blockIdx.y, S = gridDim.x, dim = p.dim, len = hc * dim, nq = len / 32,
            T = p.n * n_mix, q = (int64_t)blockIdx.x * 32 + lane;
    const float *Xr = p.X + r * len;
    bool qv = q < nq;
    { /* block (s, r, og): piece s of row r, outputs 8 og + warp. The weights (immutable) before
         the wait for the previous kernel: the mix's chunk here, and into L2 the vectors the
         finish reads (a DRAM latency each there otherwise: step 19) */
        int o = blockIdx.z * CU_WARPS + warp;
        float xf[32], wf[32];
        load_x_chunk(p.fn + (o < n_mix ? o : 0) * p.ldw + (qv ? q * 32 : 0), qv && o < n_mix, wf);
        if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.z == 0) {
            cu_prefetch_l2(p.base.data, (size_t)n_mix * vec_esize(p.base));
            cu_prefetch_l2(p.scale.data, 3 * vec_esize(p.scale));
            if (p.z) cu_prefetch_l2(p.nw.data, (size_t)dim * vec_esize(p.nw));
        }
        cu_pdl_enter();
        if (p.pX) /* the hc_post first: the block's piece of X made here */
            hc_post_piece(p, r, nq, hc, dim, blockIdx.z == 0, pc_s, xf);
        else
            load_x_chunk(Xr + (qv ? q * 32 : 0), qv, xf);
        float v = qv && o < n_mix ? chunk_dot(xf, wf) : 0.0f;
        if (p.tree) { /* the piece's sum (xor butterfly: every lane the same value) */
#pragma unroll
            for (int m = 16; m > 0; m >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, m);
            if (lane == 0 && o < n_mix) p.cv[blockIdx.x * T + r * n_mix + o] = v;
        } else if (qv && o < n_mix) {
            p.cv[q * T + r * n_mix + o] = v;
        }
        if (warp == 0 && blockIdx.z == 0) {
            double ss = 0.0;
#pragma unroll
            for (int e = 0; e < 32; e++)
                ss += (double)xf[e] * (double)xf[e];
            ss = warp_sum_d(ss);
            if (lane == 0) p.ssp[r * S + blockIdx.x] = ss;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence(); /* this block's values, before its count */
        last = atomicAdd(p.cnt + r, 1) == (int)(S * gridDim.z) - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence(); /* the other blocks' values (read below through L2: __ldcg) */
    /* p.early: the first 32 partial sums of squares and the collapse's first round of X loads
       issued now, in flight with the mix's sums (their own round trips after them otherwise) */
    float4 xpre[HC_CU(HM)][HM];
    double sv0 = 0.0;
    if (EARLY) {
        sv0 = lane < S ? __ldcg(p.ssp + r * S + lane) : 0.0;
        if (warp > 0)
            hc_collapse_load<HM, true>((const float4 *)Xr, hc, dim / 4, threadIdx.x - 32, xpre);
    }
    for (int o0 = 0; o0 < n_mix; o0 += 32) {
        bool tv = o0 + lane < n_mix;
        float acc = chunk_sum_staged(p.cv, p.tree ? S : nq, T, r * n_mix + o0 + lane, tv, red_buf);
        if (warp == 0 && tv) mix_s[o0 + lane] = acc + 0.0f;
    }
    double ss = 0.0; /* the S partial sums in order: 32 loads at a time, then shuffles */
    for (int64_t s0 = 0; s0 < S; s0 += 32) {
        double v = EARLY && s0 == 0 ? sv0 : s0 + lane < S ? __ldcg(p.ssp + r * S + s0 + lane) : 0.0;
        int cnt = (int)(S - s0 < 32 ? S - s0 : 32);
        for (int j = 0; j < cnt; j++)
            ss += __shfl_sync(0xffffffffu, v, j);
    }
    float rho = 1.0f / sqrtf((float)(ss / (double)len) + p.norm_eps);
    __syncthreads(); /* mix_s */
    if (threadIdx.x < hc) {
        int k = threadIdx.x;
        float m0 = mix_s[k] * rho, m1 = mix_s[hc + k] * rho;
        pre_s[k] = sigmoid_ref(m0 * vec_get(p.scale, 0) + vec_get(p.base, k)) + p.hc_eps;
        p.post[r * hc + k] = 2.0f * sigmoid_ref(m1 * vec_get(p.scale, 1) + vec_get(p.base, hc + k));
    }
    __syncthreads();
    if (warp == 0) {
        hc_comb_warp(mix_s, rho, hc, p.base, p.scale, p.iters, p.hc_eps, p.comb + r * hc * hc);
        if (lane == 0) p.cnt[r] = 0; /* for the next launch (kernel order makes it visible) */
        return;
    }
    /* warps 1..: the collapse and the norm */
    struct hc_norm_p nm = {p.nw, p.z_eps, p.z ? p.z + r * dim : nullptr,
                           p.zq ? p.zq + r * dim : nullptr};
    /* (X through L2: with the fused hc_post, other blocks of this grid wrote it) */
    if (EARLY)
        hc_collapse_norm<HM, true, true>(Xr, pre_s, hc, dim, p.y + r * dim, nm, p.round, one_sm,
                                         red, xpre);
    else
        hc_collapse_norm<HM, true>(Xr, pre_s, hc, dim, p.y + r * dim, nm, p.round, one_sm, red);
}

static void hc_norm_after(struct dsi_backend *be, const struct dsi_hc_pre_args *a);

/* k_hc_pre_one for a's rows, or false (not taken: the caller runs the other kernels, and
 * a->post_first first); *normed: it did the norm too (else the caller runs it, where a asks for
 * it). With a->post_first the hc_post inside k_hc_pre_one where its rows allow (else its own
 * launch before). */
static bool hc_pre_one(struct dsi_backend *be,
                       const struct dsi_hc_pre_args *a,
                       const struct cu_w *fn,
                       bool *normed) {
    struct cu_ctx *c = cu_ctx_of(be);
    int hc = (int)a->hc;
    int64_t len = hc * a->dim, nq = len / 32, S = cu_div_up(nq, 32), n_mix = (2 + hc) * hc;
    bool norm = a->norm_w && a->dim % 128 == 0 && a->dim * 4 <= 48 * 1024 &&
                (uintptr_t)a->z % 16 == 0 && (uintptr_t)a->zq % 16 == 0;
    size_t sm = norm ? (size_t)a->dim * 4 : 0;
    *normed = norm;
    if (a->n > c->hc_one || a->n > CU_HC_ONE_MAX || hc * hc > 32 || len % 32 || a->dim % 4 ||
        (uintptr_t)a->y % 16 || fn->type != DSI_TYPE_F32 || !gemm_fast_ok(fn, a->X, len) ||
        fn->row_bytes % 16 || S > 65535)
        return false;
    const struct dsi_hc_post_args *pa = a->post_first;
    bool fuse = pa && c->hc_pf && !c->hc_cl && a->dim % 32 == 0 && (uintptr_t)pa->X % 16 == 0 &&
                (uintptr_t)pa->f % 16 == 0 && (uintptr_t)a->X % 16 == 0;
    if (pa && !fuse) cuda_hc_post(be, pa);              /* its own launch first */
    if (hc_pre_cl(c, a, fn, norm)) return true;         /* one cluster a row (c->hc_cl; hc_cl.cu) */
    unsigned og = (unsigned)cu_div_up(n_mix, CU_WARPS); /* blocks along the outputs */
    float *cv = (float *)cu_scratch(c, CU_SCR_GEMM, (size_t)(nq * a->n * n_mix) * 4);
    double *ssp = (double *)cu_scratch(c, CU_SCR_OP, (size_t)(a->n * S) * 8);
    if (!cv || !ssp) return true; /* failed (sticky), or the capture gave up */
    struct hc_one_p p = hc_one_params(a, fn, norm);
    p.cv = cv;
    p.ssp = ssp;
    p.cnt = c->hc_cnt;
    p.tree = a->fast && c->hc_tree;
    p.early = c->hc_early;
    if (fuse) {
        p.pX = pa->X;
        p.pf = pa->f;
        p.ppost = pa->post;
        p.pcomb = pa->comb;
    }
    int pf = cu_prof_begin(c, "hc_pre.one");
    dim3 grid((unsigned)S, (unsigned)a->n, og);
    if (hc == 4 && p.early)
        cu_launch(c, k_hc_pre_one<4, true>, grid, CU_THREADS, sm, p);
    else if (hc == 4)
        cu_launch(c, k_hc_pre_one<4>, grid, CU_THREADS, sm, p);
    else
        cu_launch(c, k_hc_pre_one<0>, grid, CU_THREADS, sm, p);
    cu_prof_end(c, pf);
    cu_check(c, "hc_pre");
    return true;
}

/* Whether k_hc_pre_finish (one block a row) can run a's norm itself (c->hc_fin_norm,
 * DSI_CUDA_HC_FIN_NORM=1; step 33, off until measured): warps 1..7 collapse (hc * hc <= 32: warp 0
 * runs the Sinkhorn), the row's y in shared memory, float4 rows. */
static bool hc_pre_norm_fused(const struct cu_ctx *c, const struct dsi_hc_pre_args *a) {
    return c->hc_fin_norm && a->norm_w && a->z && a->hc * a->hc <= 32 && a->dim % 128 == 0 &&
           a->dim * 4 <= 48 * 1024 && (uintptr_t)a->X % 16 == 0 && (uintptr_t)a->y % 16 == 0 &&
           (uintptr_t)a->z % 16 == 0 && (uintptr_t)a->zq % 16 == 0;
}

extern "C" void cuda_hc_pre(struct dsi_backend *be, const struct dsi_hc_pre_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0) return;
    int hc = (int)a->hc;
    if (hc < 1 || hc > HC_MAX) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "hc_pre: hc_mult %d (at most %d)", hc, HC_MAX);
        return;
    }
    int64_t n_mix = (2 + hc) * hc, len = hc * a->dim;
    float *mraw = (float *)cu_scratch(c, CU_SCR_OP, (size_t)(a->n * n_mix) * 4);
    if (!mraw) return;
    struct cu_w fn = cu_w_of(a->fn);
    if (fn.K != len || fn.rows < n_mix) {
        cu_fail(c, DSI_ERR_INVALID, "hc_pre: fn is [%lld, %lld], want [%lld, %lld]",
                (long long)fn.rows, (long long)fn.K, (long long)n_mix, (long long)len);
        return;
    }
    bool normed = false;
    /* (bf16 streams: only the TF32 mix's kernels below read them) */
    if (!a->xbf16 && hc_pre_one(be, a, &fn, &normed)) { /* (a->post_first in it, or before it) */
        if (!normed) hc_norm_after(be, a);
        return;
    }
    /* the mix: mraw, or its split-K chunk values for the finish to add (c->hc_fuse); in `fast`
       numerics from c->hc_tf_min rows on the tensor cores (hc_tf.cu), split along K, with the
       rows' sums of squares (ssp); with c->hc_ptf (DSI_CUDA_HC_PTF, 2 by default since step 47) the
       hc_post first in the same pass there, else its own launch first (the other kernels read X) */
    int64_t nq = 0;
    float *tcv = NULL, *ssp = NULL;
    const float *cv = NULL;
    bool tf = a->fast && c->hc_tf_min > 0 && a->n >= c->hc_tf_min;
    const struct dsi_hc_post_args *pa = a->post_first;
    if (pa) {
        if (tf && c->hc_ptf && pa->n == a->n && pa->Xo == a->X &&
            hc_mix_tf_post(c, &fn, (int)n_mix, pa, &tcv, &ssp, &nq))
            cv = tcv;
        else if (c->sticky)
            return;
        else
            cuda_hc_post(be, pa);
    }
    if (cv)
        ;
    else if (tf && hc_mix_tf(c, &fn, (int)n_mix, a->X, a->xbf16, a->n, len, &tcv, &ssp, &nq))
        cv = tcv;
    else if (c->sticky)
        return;
    else if (a->xbf16) {
        cu_fail(c, DSI_ERR_UNSUPPORTED,
                "hc_pre: bf16 streams need the TF32 mix (fast numerics, %lld rows from "
                "DSI_CUDA_HC_TF_MIN, fn F32, hc * dim %% 64 == 0)",
                (long long)a->n);
        return;
    } else
        cv = hc_mix(c, &fn, (int)n_mix, a->X, a->n, len, mraw, c->hc_fuse, &nq);
    int pf = cu_prof_begin(c, "hc_pre.finish");
    /* blocks per row: about one wave over all rows (c->hc_split at most, DSI_CUDA_HC_SPLIT) */
    int64_t split = std::max<int64_t>(1, std::min<int64_t>(c->hc_split, 2 * c->n_sms / a->n));
    dim3 grid((unsigned)a->n, (unsigned)split);
    struct hc_norm_p nm = {};
    bool fused = split == 1 && hc_pre_norm_fused(c, a);
    if (fused) {
        nm.nw = cu_vec_of(a->norm_w);
        nm.eps = a->z_eps;
        nm.z = a->z;
        nm.zq = a->zq;
    }
    auto fin = a->xbf16 ? (fused ? k_hc_pre_finish<true, true> : k_hc_pre_finish<false, true>)
                        : (fused ? k_hc_pre_finish<true, false> : k_hc_pre_finish<false, false>);
    cu_launch(c, fin, grid, CU_THREADS, fused ? (size_t)a->dim * 4 : 0, a->X, mraw, cv,
              (const float *)ssp, nq, a->n, hc, a->dim, cu_vec_of(a->base), cu_vec_of(a->scale),
              a->iters, a->norm_eps, a->hc_eps, a->y, a->post, a->comb, a->round_bf16, nm);
    cu_prof_end(c, pf);
    if (cu_check(c, "hc_pre") && !fused) hc_norm_after(be, a);
}

/* a's norm (norm_w) as its own op after hc_pre */
static void hc_norm_after(struct dsi_backend *be, const struct dsi_hc_pre_args *a) {
    if (!a->norm_w) return;
    struct dsi_rms_norm_args na = dsi_hc_pre_norm(a);
    cuda_rms_norm(be, &na);
}

/* Xo[k] = post[k] f + sum_j comb[j][k] X[j]: one thread per (row, V consecutive d) computes every
 * stream k, so X[.][d] and f[d] are read once (each output's operations in the CPU's order, as
 * before: bitwise); grid (column blocks, rows), rows past gridDim.y in turn. HC > 0: hc is HC (the
 * loops unrolled). V = 4 (dim % 4 == 0, 16-byte aligned rows): float4 loads and stores, four
 * times the bytes in flight per thread (step 24: at batch 256 the scalar kernel moved ~1.3 TB/s).
 * No 64-bit divisions. */
template <int V> struct hc_fv { float v[V]; };
template <int V, bool XB = false> __device__ __forceinline__ hc_fv<V> hc_ld(const float *p) {
    hc_fv<V> r;
    if constexpr (V == 4) {
        float4 q = xs_ld4<XB>(p, 0);
        r.v[0] = q.x;
        r.v[1] = q.y;
        r.v[2] = q.z;
        r.v[3] = q.w;
    } else {
#pragma unroll
        for (int i = 0; i < V; i++)
            r.v[i] = p[i];
    }
    return r;
}
/* XB (dsi_hc_post_args.xbf16; V = 4): X and Xo hold bf16 values */
template <int HC, int V, bool XB>
__global__ void k_hc_post(const float *f,
                          const float *X,
                          const float *post,
                          const float *comb,
                          float *Xo,
                          int64_t n,
                          int hc_rt,
                          int64_t dim,
                          bool round) {
    cu_pdl_enter();
    const int hc = HC > 0 ? HC : hc_rt;
    int64_t d = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (d >= dim) return;
    for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
        const float *Xr = xs_at<XB>(X, r * hc * dim + d), *C = comb + r * hc * hc,
                    *P = post + r * hc;
        float *Or = (float *)xs_at<XB>(Xo, r * hc * dim + d);
        hc_fv<V> x[HC_MAX];
#pragma unroll
        for (int j = 0; j < HC_MAX; j++)
            if (j < hc) x[j] = hc_ld<V, XB>(xs_at<XB>(Xr, j * dim));
        hc_fv<V> fd = hc_ld<V>(f + r * dim + d);
#pragma unroll
        for (int k = 0; k < HC_MAX; k++) {
            if (k >= hc) break;
            hc_fv<V> o;
#pragma unroll
            for (int i = 0; i < V; i++) { /* (hc_post_val's operations) */
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < HC_MAX; j++)
                    if (j < hc) acc += C[j * hc + k] * x[j].v[i];
                o.v[i] = rbf(P[k] * fd.v[i] + acc, round);
            }
            if constexpr (V == 4)
                xs_st4<XB>(Or, k * dim, make_float4(o.v[0], o.v[1], o.v[2], o.v[3]));
            else
                Or[k * dim] = o.v[0];
        }
    }
}

extern "C" void cuda_hc_post(struct dsi_backend *be, const struct dsi_hc_post_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0) return;
    if (a->hc < 1 || a->hc > HC_MAX) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "hc_post: hc_mult %d (at most %d)", (int)a->hc, HC_MAX);
        return;
    }
    size_t xa = a->xbf16 ? 8 : 16; /* (the streams' alignment) */
    bool v4 = a->dim % 4 == 0 && (uintptr_t)a->f % 16 == 0 && (uintptr_t)a->X % xa == 0 &&
              (uintptr_t)a->Xo % xa == 0;
    if (a->xbf16 && (!v4 || !a->round_bf16)) {
        cu_fail(c, DSI_ERR_UNSUPPORTED,
                "hc_post: bf16 streams need dim %% 4 == 0, aligned rows and bf16 rounding");
        return;
    }
    dim3 grid((unsigned)cu_div_up(a->dim, v4 ? 1024 : 256),
              (unsigned)std::min<int64_t>(a->n, 65535));
#define HC_POST(HC, V, XB)                                                                         \
    cu_launch(c, k_hc_post<HC, V, XB>, grid, 256, 0, a->f, a->X, a->post, a->comb, a->Xo, a->n,    \
              (int)a->hc, a->dim, a->round_bf16)
    if (a->xbf16 && a->hc == 4)
        HC_POST(4, 4, true);
    else if (a->xbf16)
        HC_POST(0, 4, true);
    else if (v4 && a->hc == 4)
        HC_POST(4, 4, false);
    else if (v4)
        HC_POST(0, 4, false);
    else
        HC_POST(0, 1, false);
#undef HC_POST
    cu_check(c, "hc_post");
}

__global__ void k_hc_head_finish(const float *X,
                                 const float *mraw,
                                 int hc,
                                 int64_t dim,
                                 struct cu_vec base,
                                 struct cu_vec scale,
                                 float norm_eps,
                                 float hc_eps,
                                 float *y,
                                 bool round) {
    cu_pdl_enter();
    __shared__ double red[32];
    __shared__ float pre_s[HC_MAX];
    int64_t r = blockIdx.x, len = hc * dim;
    const float *Xr = X + r * len;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
        ss += (double)Xr[i] * (double)Xr[i];
    ss = block_sum_d(ss, red);
    if (threadIdx.x == 0) {
        float rho = 1.0f / sqrtf((float)(ss / (double)len) + norm_eps);
        float sc = vec_get(scale, 0);
        for (int k = 0; k < hc; k++)
            pre_s[k] = sigmoid_ref(mraw[r * hc + k] * rho * sc + vec_get(base, k)) + hc_eps;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < hc; k++)
            acc += pre_s[k] * Xr[k * dim + d];
        y[r * dim + d] = rbf(acc, round);
    }
}

extern "C" void cuda_hc_head(struct dsi_backend *be, const struct dsi_hc_head_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0) return;
    int hc = (int)a->hc;
    if (hc < 1 || hc > HC_MAX) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "hc_head: hc_mult %d (at most %d)", hc, HC_MAX);
        return;
    }
    int64_t len = hc * a->dim;
    float *mraw = (float *)cu_scratch(c, CU_SCR_OP, (size_t)(a->n * hc) * 4);
    if (!mraw) return;
    struct cu_w fn = cu_w_of(a->fn);
    if (fn.K != len || fn.rows < hc) {
        cu_fail(c, DSI_ERR_INVALID, "hc_head: fn is [%lld, %lld], want [%d, %lld]",
                (long long)fn.rows, (long long)fn.K, hc, (long long)len);
        return;
    }
    int64_t nq = 0;
    hc_mix(c, &fn, hc, a->X, a->n, len, mraw, false, &nq);
    cu_launch(c, k_hc_head_finish, (unsigned)a->n, 256, 0, a->X, mraw, hc, a->dim,
              cu_vec_of(a->base), cu_vec_of(a->scale), a->norm_eps, a->hc_eps, a->y, a->round_bf16);
    cu_check(c, "hc_head");
}
