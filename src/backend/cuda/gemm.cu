/* gemm.cu - y = x W^T on weights in their stored formats (BF16, F16, F32, FP8 e4m3 with UE8M0
 * block scales, FP4 e2m1 with per-32 scales), dequantised in registers, fp32 arithmetic.
 *
 * Order of the arithmetic (the same as cpu_dot, so results are bitwise equal to the CPU
 * backend and independent of the batch): K is cut into 32-wide chunks; a chunk's value is
 * ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) with l_i = sum over j of x[j*8+i]*w[j*8+i]; the chunk
 * values are added in chunk order. Here lane L of a warp computes chunk 32p+L of piece p for
 * every (x row, weight row) pair of the warp, writes it to shared memory, and the lane that
 * owns the output adds the 32 chunk values in order. When there are too few blocks to fill the
 * GPU (few output rows: decode), the pieces are split over blocks, the chunk values go to
 * global scratch and a second kernel adds them in order (split-K without changing the order).
 * Shapes the fast kernel does not take (K % 32 != 0, unaligned rows) go to a simple kernel,
 * one thread per output, with the same arithmetic.
 *
 * Tensor cores come later (a separate fast path; these kernels stay as the batch-invariant
 * reference path). */
#include "common.cuh"
#include "gemm.cuh"

/* ---- the generic kernel: one thread per output --------------------------------------------- */

__global__ void k_gemm_generic(struct cu_w w,
                               int64_t row0,
                               int64_t n_out,
                               const float *x,
                               int64_t n,
                               int64_t ldx,
                               float *y,
                               int64_t ldy,
                               bool round) {
    cu_pdl_enter();
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * n_out) return;
    int64_t i = t / n_out, o = t % n_out, K = w.K, row = row0 + o;
    const float *a = x + i * ldx;
    float acc = 0.0f;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        float l[8];
#pragma unroll
        for (int q = 0; q < 8; q++)
            l[q] = 0.0f;
        for (int j = 0; j < 32; j += 8)
#pragma unroll
            for (int q = 0; q < 8; q++)
                l[q] += a[k + j + q] * w_get(w, row, k + j + q);
        acc += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    float tl = 0.0f;
    for (; k < K; k++)
        tl += a[k] * w_get(w, row, k);
    y[i * ldy + o] = rbf(acc + tl, round);
}

/* ---- the fast kernel ---------------------------------------------------------------------------
 */

/* A chunk value: to the split-K scratch (valid pairs only) or to the warp's shared rows. */
template <int RX>
__device__ __forceinline__ void gemm_put(float c,
                                         float *cv,
                                         float (*cvs)[33],
                                         bool valid,
                                         int64_t q,
                                         int64_t n,
                                         int64_t i0,
                                         int rx,
                                         int64_t n_out,
                                         int64_t o0,
                                         int r,
                                         int lane) {
    if (cv) {
        if (valid) cv[(q * n + i0 + rx) * n_out + o0 + r] = c;
    } else {
        cvs[rx * GEMM_RW + r][lane] = c;
    }
}

/* Row pieces are 1024 elements; lanes own 32-element chunks. Block: 8 warps x 2 weight rows.
 * With `stage` (the default, c->xstage) the block stages each piece of its RX activation rows
 * in shared memory (see stage_x); without it every lane loads its chunks from global memory.
 * Dynamic shared memory: gemm_smem_bytes(RX). Every warp takes part in the block barriers, also
 * one without weight rows. */
template <int WT, int RX>
__global__ void __launch_bounds__(CU_THREADS, 2) k_gemm(struct cu_w w,
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
                                                        bool stage) {
    cu_pdl_enter();
    extern __shared__ float4 gsm[];
    float *xs = (float *)gsm;
    float(*cvs)[RX * GEMM_RW][33] = (float(*)[RX * GEMM_RW][33])(xs + RX * 32 * XS_STRIDE);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t o0 = ((int64_t)blockIdx.x * CU_WARPS + warp) * GEMM_RW;
    int64_t i0 = (int64_t)blockIdx.y * RX;
    bool wact = o0 < n_out; /* this warp has weight rows */
    int64_t nq = w.K / 32, np = (nq + 31) / 32;
    int64_t p0 = (int64_t)blockIdx.z * pps, p1 = p0 + pps < np ? p0 + pps : np;
    const uint8_t *wr[GEMM_RW], *sr[GEMM_RW];
    bool wv[GEMM_RW];
#pragma unroll
    for (int r = 0; r < GEMM_RW; r++) {
        wv[r] = o0 + r < n_out;
        int64_t row = row0 + (wv[r] ? o0 + r : 0);
        wr[r] = w.data + row * w.row_bytes;
        sr[r] = w_scale_row(w, row);
    }
    __shared__ int64_t xoff[RX]; /* offset of x row rx in x, -1: none */
    if (threadIdx.x < RX) xoff[threadIdx.x] = i0 + threadIdx.x < n ? (i0 + threadIdx.x) * ldx : -1;
    __syncthreads();
    float acc = 0.0f;
    /* Small tiles are bound by the latency of the weight loads: issue piece p + 1's before
     * staging and decoding piece p (registers permitting: not for F32 or 8-row tiles). */
    constexpr bool PF = WT != DSI_TYPE_F32 && RX <= 4;
    w_raw raw[GEMM_RW], nxt[GEMM_RW];
    if (PF && p0 < p1) {
        int64_t q = p0 * 32 + lane;
#pragma unroll
        for (int r = 0; r < GEMM_RW; r++)
            load_w_raw<WT>(w, wr[r], sr[r], q < nq && wv[r] ? q : -1, raw[r]);
    }
    for (int64_t p = p0; p < p1; p++) {
        int64_t q = p * 32 + lane;
        bool qv = q < nq;
        if (PF && p + 1 < p1) {
            int64_t qn = q + 32;
#pragma unroll
            for (int r = 0; r < GEMM_RW; r++)
                load_w_raw<WT>(w, wr[r], sr[r], qn < nq && wv[r] ? qn : -1, nxt[r]);
        }
        if (stage) {
            __syncthreads(); /* the previous piece is consumed */
            stage_x<RX>(xs, x, xoff, w.K, p);
        }
        if (PF) { /* one weight row at a time: fewer live registers */
            if (stage) __syncthreads();
#pragma unroll
            for (int r = 0; r < GEMM_RW; r++) {
                float wf[32];
                decode_w_raw<WT>(raw[r], qv && wv[r] ? q : -1, wf);
                raw[r] = nxt[r];
                if (!wact) continue;
#pragma unroll
                for (int rx = 0; rx < RX; rx++) {
                    bool xv = i0 + rx < n && qv;
                    float xf[32];
                    if (stage)
                        load_x_staged(xs, rx, lane, xf);
                    else
                        load_x_chunk(x + (xv ? (i0 + rx) * ldx + q * 32 : 0), xv, xf);
                    gemm_put<RX>(chunk_dot(xf, wf), cv, cvs[warp], xv && wv[r], q, n, i0, rx, n_out,
                                 o0, r, lane);
                }
            }
            if (!wact) continue;
        } else {
            float wf[GEMM_RW][32];
#pragma unroll
            for (int r = 0; r < GEMM_RW; r++)
                load_w_chunk<WT>(w, wr[r], sr[r], qv && wv[r] ? q : -1, wf[r]);
            if (stage) __syncthreads();
            if (!wact) continue;
#pragma unroll
            for (int rx = 0; rx < RX; rx++) {
                bool xv = i0 + rx < n && qv;
                float xf[32];
                if (stage)
                    load_x_staged(xs, rx, lane, xf);
                else
                    load_x_chunk(x + (xv ? (i0 + rx) * ldx + q * 32 : 0), xv, xf);
#pragma unroll
                for (int r = 0; r < GEMM_RW; r++)
                    gemm_put<RX>(chunk_dot(xf, wf[r]), cv, cvs[warp], xv && wv[r], q, n, i0, rx,
                                 n_out, o0, r, lane);
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
        }
    }
    if (cv || !wact || lane >= RX * GEMM_RW) return;
    int rx = lane / GEMM_RW, r = lane % GEMM_RW;
    if (i0 + rx < n && wv[r]) y[(i0 + rx) * ldy + o0 + r] = rbf(acc + 0.0f, round);
}

/* Split-K second pass: y[t] = sum of the chunk values cv[q][t] (t = i * n_out + o) in chunk
 * order (chunk_sum_staged, gemm.cuh); a block owns 32 consecutive outputs. */
__global__ void __launch_bounds__(CU_THREADS) k_gemm_reduce(
    const float *cv, int64_t nq, int64_t n, int64_t n_out, float *y, int64_t ldy, bool round) {
    cu_pdl_enter();
    __shared__ float buf[RED_ROWS][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t T = n * n_out, t = (int64_t)blockIdx.x * 32 + lane;
    float acc = chunk_sum_staged(cv, nq, T, t, t < T, buf);
    if (warp == 0 && t < T) y[(t / n_out) * ldy + t % n_out] = rbf(acc + 0.0f, round);
}

/* The same sums for few chunks (nq <= RED_SMALL, tc.cu's pieces along K): a thread per output
 * adds its nq values in chunk order itself (the same fp32 adds as chunk_sum_staged's, so the
 * same bits), their loads all in flight; no shared-memory rounds. */
#define RED_SMALL 32
__global__ void __launch_bounds__(CU_THREADS) k_gemm_reduce_small(
    const float *cv, int nq, int64_t n, int64_t n_out, float *y, int64_t ldy, bool round) {
    cu_pdl_enter();
    int64_t T = n * n_out, t = (int64_t)blockIdx.x * CU_THREADS + threadIdx.x;
    if (t >= T) return;
    float v[RED_SMALL];
#pragma unroll
    for (int q = 0; q < RED_SMALL; q++)
        v[q] = q < nq ? __ldcg(cv + q * T + t) : 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < RED_SMALL; q++)
        if (q < nq) acc += v[q];
    y[(t / n_out) * ldy + t % n_out] = rbf(acc + 0.0f, round);
}

bool gemm_w_ok(const struct cu_w *w) {
    if (w->K % 32 || w->K <= 0 || (uintptr_t)w->data % 16 || w->row_bytes % 16) return false;
    switch (w->type) {
    case DSI_TYPE_F32:
    case DSI_TYPE_BF16:
    case DSI_TYPE_F16:
        return true;
    case DSI_TYPE_F8_E4M3:
    case DSI_TYPE_FP4_E2M1:
        return w->scale && w->sb1 % 32 == 0;
    default:
        return false;
    }
}

bool gemm_fast_ok(const struct cu_w *w, const float *x, int64_t ldx) {
    return gemm_w_ok(w) && (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
}

static int gemm_rx(int64_t n) { return n >= 8 ? 8 : n >= 3 ? 4 : n == 2 ? 2 : 1; }

/* k_gemm's split along K: pieces of 32 chunks per z-slice (*pps); > 1: split-K (chunk values
 * in CU_SCR_GEMM, then launch_gemm_reduce) */
static int64_t
gemm_split(const struct cu_ctx *c, const struct cu_w *w, int64_t n, int64_t n_out, int64_t *pps) {
    int64_t blocks = cu_div_up(n_out, CU_WARPS * GEMM_RW) * cu_div_up(n, gemm_rx(n));
    int64_t nq = w->K / 32, np = cu_div_up(nq, 32), target = 2 * (int64_t)c->n_sms;
    *pps = np;
    if (blocks >= target || np <= 1 || nq * n * n_out * 4 > ((int64_t)64 << 20)) return 1;
    return cu_split_even(cu_div_up(target, blocks), np, pps);
}

template <int WT>
static void launch_fast(struct cu_ctx *c,
                        const struct cu_w *w,
                        int64_t row0,
                        int64_t n_out,
                        const float *x,
                        int64_t n,
                        int64_t ldx,
                        float *y,
                        int64_t ldy,
                        bool round) {
    int rx = gemm_rx(n);
    int64_t gx = cu_div_up(n_out, CU_WARPS * GEMM_RW), gy = cu_div_up(n, rx), nq = w->K / 32;
    int64_t pps, split = gemm_split(c, w, n, n_out, &pps);
    float *cv = NULL;
    if (split > 1) {
        cv = (float *)cu_scratch(c, CU_SCR_GEMM, (size_t)(nq * n * n_out) * 4);
        if (!cv) return;
    }
    if (gy > 65535) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "gemm: %lld rows in one call", (long long)n);
        return;
    }
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)split);
#define GEMM_LAUNCH(R)                                                                             \
    cu_launch(c, k_gemm<WT, R>, grid, CU_THREADS, gemm_smem_bytes(R), *w, row0, n_out, x, n, ldx,  \
              y, ldy, round, (int)pps, cv, c->xstage)
    static bool smem8 = false;
    if (rx == 8 && !smem_limit(c, k_gemm<WT, 8>, gemm_smem_bytes(8), &smem8, "gemm")) return;
    int pm = cv ? cu_prof_begin(c, "gemm.splitk") : -1;
    switch (rx) {
    case 1:
        GEMM_LAUNCH(1);
        break;
    case 2:
        GEMM_LAUNCH(2);
        break;
    case 4:
        GEMM_LAUNCH(4);
        break;
    default:
        GEMM_LAUNCH(8);
        break;
    }
#undef GEMM_LAUNCH
    cu_prof_end(c, pm);
    if (!cu_check(c, "gemm")) return;
    if (cv) launch_gemm_reduce(c, cv, nq, n, n_out, y, ldy, round);
}

void launch_gemm_reduce(struct cu_ctx *c,
                        const float *cv,
                        int64_t nq,
                        int64_t n,
                        int64_t n_out,
                        float *y,
                        int64_t ldy,
                        bool round) {
    int pr = cu_prof_begin(c, "gemm.reduce");
    /* (step 23: tc.cu's 2-32 pieces took as long as its GEMM on the staged k_gemm_reduce) */
    if (nq <= RED_SMALL)
        cu_launch(c, k_gemm_reduce_small, (unsigned)cu_div_up(n * n_out, CU_THREADS), CU_THREADS, 0,
                  cv, (int)nq, n, n_out, y, ldy, round);
    else
        cu_launch(c, k_gemm_reduce, (unsigned)cu_div_up(n * n_out, 32), CU_THREADS, 0, cv, nq, n,
                  n_out, y, ldy, round);
    cu_prof_end(c, pr);
    cu_check(c, "gemm reduce");
}

void launch_gemm(struct cu_ctx *c,
                 const struct cu_w *w,
                 int64_t row0,
                 int64_t n_out,
                 const float *x,
                 int64_t n,
                 int64_t ldx,
                 float *y,
                 int64_t ldy,
                 bool round) {
    if (n <= 0 || n_out <= 0) return;
    if (row0 < 0 || row0 + n_out > w->rows) {
        cu_fail(c, DSI_ERR_INVALID, "gemm: rows %lld..%lld of a weight with %lld rows",
                (long long)row0, (long long)(row0 + n_out), (long long)w->rows);
        return;
    }
    if (!gemm_fast_ok(w, x, ldx)) {
        int64_t t = n * n_out;
        cu_launch(c, k_gemm_generic, (unsigned)cu_div_up(t, 128), 128, 0, *w, row0, n_out, x, n,
                  ldx, y, ldy, round);
        cu_check(c, "gemm (generic)");
        return;
    }
    struct cu_gemm_call call = {w,   row0,  n_out, x, n, ldx,   y,
                                ldy, round, 1,     0, 0, false, false}; /* field order */
    if (launch_gemv(c, &call)) return;
    switch (w->type) {
    case DSI_TYPE_F32:
        launch_fast<DSI_TYPE_F32>(c, w, row0, n_out, x, n, ldx, y, ldy, round);
        break;
    case DSI_TYPE_BF16:
        launch_fast<DSI_TYPE_BF16>(c, w, row0, n_out, x, n, ldx, y, ldy, round);
        break;
    case DSI_TYPE_F16:
        launch_fast<DSI_TYPE_F16>(c, w, row0, n_out, x, n, ldx, y, ldy, round);
        break;
    case DSI_TYPE_F8_E4M3:
        launch_fast<DSI_TYPE_F8_E4M3>(c, w, row0, n_out, x, n, ldx, y, ldy, round);
        break;
    default:
        launch_fast<DSI_TYPE_FP4_E2M1>(c, w, row0, n_out, x, n, ldx, y, ldy, round);
        break;
    }
}

static void gemm_op(struct dsi_backend *be, const struct dsi_gemm_args *a);

bool cu_gemm_takes_kept(const struct cu_ctx *c, const struct dsi_gemm_args *a) {
    /* gemm_op's grouped branch in `fast` numerics past the decode kernels' rows (gvf.cu:
       GVF_ROWS_MAX), which then hands the call to launch_tc_gemm */
    if (!a || a->w2 || a->groups <= 1 || !a->fast || !a->x_from_attn || !c->grouped || a->gx % 4 ||
        a->n <= GVF_ROWS_MAX || a->n_out <= 0 || a->row0 < 0)
        return false;
    struct cu_w w = cu_w_of(a->w);
    if (a->row0 + (int64_t)a->groups * a->n_out > w.rows) return false;
    struct cu_gemm_call call = {&w,     a->row0, a->n_out, a->x,          a->n,
                                a->ldx, a->y,    a->ldy,   a->round_bf16, a->groups,
                                a->gx,  a->gy,   a->x_fp8, a->y_to_attn};
    return tc_takes_kept_rows(c, &call);
}

/* The gemm op; with DSI_CUDA_PROFILE=2 each call's time also under its shape (rows x outputs x K,
 * groups, the weight's type: a part of the op in the profile, step 33). */
extern "C" void cuda_gemm(struct dsi_backend *be, const struct dsi_gemm_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    int ps = -1;
    if (c->prof_shapes && a->w)
        ps = cu_prof_begin(c, cu_prof_name(c, "gemm.%lldx%lldx%lld%s g%d t%d", (long long)a->n,
                                           (long long)a->n_out, (long long)a->w->ne[0],
                                           a->w2 ? "x2" : "", a->groups, (int)a->w->type));
    c->o16.take = a->x_from_attn && c->o16.valid && c->o16.src == a->x;
    bool no_out = c->o16.take && c->o16.no_out;
    c->o16.took = false;
    gemm_op(be, a);
    if (no_out && !c->o16.took && !c->sticky) /* (cu_gemm_takes_kept and the dispatch disagree) */
        cu_fail(c, DSI_ERR_DEVICE,
                "gemm: the attention left its out unwritten for this gemm, which did not take "
                "the rows it kept");
    c->o16.valid = c->o16.take = c->o16.no_out = false;
    cu_prof_end(c, ps);
}

static void gemm_op(struct dsi_backend *be, const struct dsi_gemm_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->w2) { /* a pair: one launch of gvf.cu, else the two in turn */
        struct dsi_gemm_args b = dsi_gemm_pair_part(a, 0), b2 = dsi_gemm_pair_part(a, 1);
        struct cu_w w1 = cu_w_of(a->w), w2 = cu_w_of(a->w2);
        struct cu_gemm_call g1 = {&w1,    a->row0,       a->n_out, a->x, a->n, a->ldx,   a->y,
                                  a->ldy, a->round_bf16, 1,        0,    0,    a->x_fp8, false};
        struct cu_gemm_call g2 = {&w2,    0,     a->n_out2, a->x,          a->n,
                                  a->ldx, a->y2, a->ldy2,   a->round_bf16, 1,
                                  0,      0,     a->x_fp8,  false};
        bool in = a->n > 0 && a->n_out > 0 && a->n_out2 > 0 && a->row0 >= 0 &&
                  a->row0 + a->n_out <= w1.rows && a->n_out2 <= w2.rows && a->groups <= 1;
        if (a->fast && in && launch_gvf_pair(c, &g1, &g2)) return;
        /* (the second takes the first's copy of x where the same path makes it: c->xc) */
        c->xc.on = c->xc_on_env;
        c->xc.valid = false;
        cuda_gemm(be, &b);
        cuda_gemm(be, &b2);
        c->xc.on = c->xc.valid = false;
        return;
    }
    struct cu_w w = cu_w_of(a->w);
    /* the decode launchers' call (struct cu_gemm_call's field order) */
    struct cu_gemm_call call = {
        &w,     a->row0, a->n_out, a->x,          a->n,
        a->ldx, a->y,    a->ldy,   a->round_bf16, a->groups > 1 ? a->groups : 1,
        a->gx,  a->gy,   a->x_fp8, a->y_to_attn};
    if (a->groups > 1) { /* one launch (decode kernels; tc.cu in `fast`), else one by one */
        int64_t last = a->row0 + (int64_t)a->groups * a->n_out;
        if (a->n <= 0 || a->n_out <= 0) return;
        if (a->row0 < 0 || last > w.rows) {
            cu_fail(c, DSI_ERR_INVALID,
                    "gemm: %d groups of %lld rows from row %lld of a weight "
                    "with %lld rows",
                    a->groups, (long long)a->n_out, (long long)a->row0, (long long)w.rows);
            return;
        }
        if (c->grouped && a->gx % 4 == 0 &&
            ((a->fast && (launch_gvf_gemm(c, &call) || launch_tc_gemm(c, &call))) ||
             (gemm_fast_ok(&w, a->x, a->ldx) && launch_gemv(c, &call))))
            return;
        for (int g = 0; g < a->groups; g++) {
            struct dsi_gemm_args ga = dsi_gemm_group(a, g);
            cuda_gemm(be, &ga);
        }
        return;
    }
    if (a->fast && a->n % 4 && a->n > 4 && a->n_out > 0 && a->row0 >= 0 &&
        a->row0 + a->n_out <= w.rows) { /* lt.cu takes rows in fours: the last 1-3 on gvf.cu */
        struct cu_gemm_call head = call, tail = call;
        head.n = a->n & ~(int64_t)3;
        tail.n = a->n - head.n;
        tail.x = a->x + head.n * a->ldx;
        tail.y = a->y + head.n * a->ldy;
        if (launch_lt_gemm(c, &head, a->x_fp8)) {
            if (!launch_gvf_gemm(c, &tail))
                launch_gemm(c, &w, a->row0, a->n_out, tail.x, tail.n, a->ldx, tail.y, a->ldy,
                            a->round_bf16);
            return;
        }
    }
    if (a->fast && a->n > 0 && a->n_out > 0 && a->row0 >= 0 && a->row0 + a->n_out <= w.rows &&
        (launch_gvf_gemm(c, &call) || launch_lt_gemm(c, &call, a->x_fp8) ||
         launch_tc_gemm(c, &call)))
        return;
    launch_gemm(c, &w, a->row0, a->n_out, a->x, a->n, a->ldx, a->y, a->ldy, a->round_bf16);
}
