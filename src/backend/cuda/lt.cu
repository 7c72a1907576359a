/* lt.cu - dense FP8 GEMMs of `fast` numerics on the FP8 tensor cores through cuBLASLt's
 * block-scaled FP8 matmul (cuBLAS 12.9 and later on Hopper: one fp32 scale per 128x128 weight
 * block, one per 128 activation values along K, exactly the checkpoint's and act_quant's
 * blocks), for many activation rows (prefill, large decode batches). A library does what
 * DeepGEMM does for DeepSeek's engine; the decode walks (gemv.cu, gvf.cu) stay ours.
 *
 * Per call: k_lt_prep turns the activation rows (act_quant's output: every value is an FP8
 * code times its block's power-of-two scale) back into FP8 bytes and fp32 block scales, and the
 * weight's UE8M0 block scales into fp32 (exact: a UE8M0 byte is a power of two); then one
 * cublasLtMatmul into bf16 (the block-scaled FP8 matmul's output; so only GEMMs whose outputs
 * are bf16-rounded are taken, and the bf16 store is that rounding), widened into y. The
 * re-quantisation is exact: the scale is recomputed from the block's largest dequantised value
 * with act_quant's rule, which gives the original scale or a smaller power of two, so every
 * value divided by it is an FP8 code again (the codes only double).
 *
 * Numerics: the products are exact; the tensor cores add them within a 128-block in their
 * own order and precision, cuBLAS then scales each block's sum and adds the blocks in fp32:
 * the `fast` profile's licence (another order of the fp32 sums), with the truncating adds of
 * Hopper's FP8 tensor cores inside a block (as tc.cu's bf16 ones truncate).
 *
 * Taken (launch_lt_gemm) in `fast` numerics for n >= c->lt_min rows (DSI_CUDA_LT_MIN, default
 * 128; 0: never, c->lt is then NULL) and at least c->lt_min_out output columns
 * (DSI_CUDA_LT_MIN_OUT, default 0; step 37: cuBLASLt runs the 512- and 1024-column calls at 256
 * rows on 8 and 16 CTAs) when the caller says the rows are act_quant's output
 * (dsi_gemm_args.x_fp8) and wants the outputs bf16-rounded, on FP8 E4M3 weights with 128x128
 * scale blocks, K and n_out multiples of 512 (the scale tensors' leading dimensions multiples
 * of 4), row0 a multiple of 128, n a multiple of 4 (cuda_gemm gives lt.cu the rows in fours
 * and the last 1-3 to gvf.cu), x and y 16-byte aligned with ldx, ldy multiples of 4; else
 * false (the caller takes tc.cu).
 *
 * Ownership: struct cu_lt (the cuBLASLt handle and the plan cache) belongs to the cu_ctx,
 * made by cu_lt_new at backend creation and freed by cu_lt_free; the per-call buffers (the
 * cuBLASLt workspace, the FP8 rows, the scales) are carved from lt.cu's own scratch (CU_SCR_LT),
 * apart from the op scratch of its caller. */
#include "gemm.cuh"

#include <algorithm>
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <stdlib.h>
#include <string.h>

#define LT_PLANS 64          /* cached (shape -> algorithm) plans, replaced in turn */
#define LT_WS    (32u << 20) /* cuBLASLt workspace (NVIDIA's advice for Hopper) */

struct lt_plan {
    int64_t m, n, k; /* the key: n_out, rows, K */
    bool used, ok;
    bool swap; /* A = the activations, B = the weight (D = y^T), see lt_plan_get */
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

struct cu_lt {
    cublasLtHandle_t h;
    int layout; /* scale tensor layouts, see k_lt_prep (DSI_CUDA_LT_LAYOUT, default 1) */
    int next;   /* the plan replaced next when the cache is full */
    bool warned;
    struct lt_plan plans[LT_PLANS];
};

struct cu_lt *cu_lt_new(int layout) {
    struct cu_lt *lt = (struct cu_lt *)calloc(1, sizeof(*lt));
    if (!lt) return NULL;
    if (cublasLtCreate(&lt->h) != CUBLAS_STATUS_SUCCESS) {
        free(lt);
        return NULL;
    }
    lt->layout = layout;
    return lt;
}

void cu_lt_free(struct cu_lt *lt) {
    if (!lt) return;
    cublasLtDestroy(lt->h);
    free(lt);
}

/* Activation rows -> FP8 bytes xq [n][K] and fp32 scales xs; weight block scales -> fp32 ws.
 * One warp per (row, 128-block); the first mb * kb threads of the grid also convert one weight
 * scale each. layout bit 0: xs is [K/128][n] (the rows contiguous) instead of [n][K/128];
 * bit 1: ws is [K/128][n_out/128] instead of [n_out/128][K/128]. */
__global__ void k_lt_prep(const float *__restrict__ x,
                          int64_t n,
                          int64_t K,
                          int64_t ldx,
                          uint8_t *__restrict__ xq,
                          float *__restrict__ xs,
                          const uint8_t *__restrict__ wsrc, /* the first scale row of the call */
                          int64_t srs,
                          int64_t mb,
                          float *__restrict__ ws,
                          int layout) {
    cu_pdl_enter();
    int64_t kb = K / 128;
    int64_t gid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid < mb * kb) {
        int64_t r = gid / kb, b = gid % kb;
        ws[(layout & 2) ? b * mb + r : r * kb + b] = e8m0_to_f32(wsrc[r * srs + b]);
    }
    int64_t pair = gid / 32;
    int lane = threadIdx.x & 31;
    if (pair >= n * kb) return;
    int64_t t = pair / kb, b = pair % kb;
    float4 v = *(const float4 *)(x + t * ldx + b * 128 + lane * 4);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float s, inv;
    fp8_requant_scale(amax, &s, &inv);
    uint32_t q = 0;
    float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        q |= (uint32_t)__nv_cvt_float_to_fp8(f[i] * inv, __NV_SATFINITE, __NV_E4M3) << (8 * i);
    *(uint32_t *)(xq + t * K + b * 128 + lane * 4) = q;
    if (lane == 0) xs[(layout & 1) ? b * n + t : t * kb + b] = s;
}

/* y[r][o] = the bf16 output as a float for r < n, o < m: d is [n][m] (a plain plan) or [m][n]
 * (a swapped one; a plain plan takes k_lt_widen8). */
__global__ void
k_lt_widen(const uint16_t *d, float *y, int64_t n, int64_t m, int64_t ldy, bool swap) {
    cu_pdl_enter();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * m) return;
    int64_t r = i / m, o = i % m;
    y[r * ldy + o] = __uint_as_float((uint32_t)d[swap ? o * n + r : i] << 16);
}

/* The plain plan's widening (d [n][m], m % 8 == 0, y 16-byte aligned, ldy % 4 == 0): grid
 * (column blocks of 8 x 256, rows; rows past gridDim.y in turn), 8 values a thread: one 16-byte
 * load, two 16-byte stores, no divisions (step 24: k_lt_widen's 64-bit division per value made
 * it instruction-bound at wide outputs, e.g. wq_b's 32768 columns). */
__global__ void k_lt_widen8(const uint16_t *d, float *y, int64_t n, int64_t m, int64_t ldy) {
    cu_pdl_enter();
    int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (o >= m) return;
    for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
        uint4 v = *(const uint4 *)(d + r * m + o);
        float *yr = y + r * ldy + o;
        *(float4 *)yr = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                                    __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
        *(float4 *)(yr + 4) =
            make_float4(__uint_as_float(v.z << 16), __uint_as_float(v.z & 0xffff0000u),
                        __uint_as_float(v.w << 16), __uint_as_float(v.w & 0xffff0000u));
    }
}

void launch_lt_widen(
    struct cu_ctx *c, const uint16_t *d, float *y, int64_t n, int64_t m, int64_t ldy) {
    if (n <= 0) return;
    cu_launch(c, k_lt_widen8,
              dim3((unsigned)cu_div_up(m, 8 * CU_THREADS), (unsigned)std::min<int64_t>(n, 65535)),
              dim3(CU_THREADS), 0, d, y, n, m, ldy);
}

static bool
lt_set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t at, const void *v, size_t sz) {
    return cublasLtMatmulDescSetAttribute(op, at, v, sz) == CUBLAS_STATUS_SUCCESS;
}

/* Descriptors of one arrangement and the heuristic's first algorithm; the status of the query.
 * Plain: A = the weight rows (K x m, column-major: a row of W per column, 128x128 scales), B =
 * the activation rows (K x n, 1x128 scales), D = bf16 (m x n: [n][m]). Swapped: A = the
 * activations, B = the weight, D = (n x m: [m][n]). */
static cublasStatus_t lt_try(struct cu_lt *lt, struct lt_plan *p, bool swap, int *found) {
    int64_t m = p->m, n = p->n, k = p->k;
    int64_t ra = swap ? n : m, rb = swap ? m : n; /* columns of A and B */
    cublasLtMatmulDesc_t op = (cublasLtMatmulDesc_t)&p->op;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int32_t sw = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
            sx = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const void *dummy = (const void *)(uintptr_t)256; /* the scale pointers are set per call */
    *found = 0;
    if (cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
        !lt_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) ||
        !lt_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) ||
        !lt_set(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, swap ? &sx : &sw, sizeof(sw)) ||
        !lt_set(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, swap ? &sw : &sx, sizeof(sw)) ||
        !lt_set(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof(dummy)) ||
        !lt_set(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof(dummy)) ||
        cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&p->la, CUDA_R_8F_E4M3, (uint64_t)k,
                                 (uint64_t)ra, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&p->lb, CUDA_R_8F_E4M3, (uint64_t)k,
                                 (uint64_t)rb, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&p->ld, CUDA_R_16BF, (uint64_t)ra,
                                 (uint64_t)rb, ra) != CUBLAS_STATUS_SUCCESS)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreferenceOpaque_t pr;
    cublasLtMatmulPreference_t pref = (cublasLtMatmulPreference_t)&pr;
    uint64_t wsb = LT_WS;
    cublasLtMatmulHeuristicResult_t hr;
    cublasStatus_t st = cublasLtMatmulPreferenceInit(pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &wsb, sizeof(wsb));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(
            lt->h, op, (cublasLtMatrixLayout_t)&p->la, (cublasLtMatrixLayout_t)&p->lb,
            (cublasLtMatrixLayout_t)&p->ld, (cublasLtMatrixLayout_t)&p->ld, pref, 1, &hr, found);
    if (st == CUBLAS_STATUS_SUCCESS && *found > 0) p->algo = hr.algo;
    return st;
}

/* The plan for (m, n, k): the plain arrangement, else the swapped one (host calls, no device
 * work: safe while a step is captured). NULL: cuBLASLt has no algorithm for it (said once). */
static struct lt_plan *lt_plan_get(struct cu_lt *lt, int64_t m, int64_t n, int64_t k) {
    for (int i = 0; i < LT_PLANS; i++) {
        struct lt_plan *p = &lt->plans[i];
        if (p->used && p->m == m && p->n == n && p->k == k) return p->ok ? p : NULL;
    }
    struct lt_plan *p = &lt->plans[lt->next];
    lt->next = (lt->next + 1) % LT_PLANS;
    memset(p, 0, sizeof(*p));
    p->used = true;
    p->m = m;
    p->n = n;
    p->k = k;
    int f0 = 0, f1 = 0;
    cublasStatus_t s0 = lt_try(lt, p, false, &f0), s1 = CUBLAS_STATUS_SUCCESS;
    p->ok = s0 == CUBLAS_STATUS_SUCCESS && f0 > 0;
    if (!p->ok) {
        s1 = lt_try(lt, p, true, &f1);
        p->ok = p->swap = s1 == CUBLAS_STATUS_SUCCESS && f1 > 0;
    }
    if (!p->ok && !lt->warned) { /* once: the GEMMs it does not take stay on tc.cu */
        lt->warned = true;
        dsi_log(DSI_LOG_WARN,
                "cuda: cuBLASLt has no block-scaled FP8 matmul for [%lld x %lld] x %lld rows "
                "(status %d / %d, %d / %d found); those GEMMs run on tc.cu",
                (long long)m, (long long)k, (long long)n, (int)s0, (int)s1, f0, f1);
    }
    return p->ok ? p : NULL;
}

bool launch_lt_gemm(struct cu_ctx *c, const struct cu_gemm_call *g, bool x_fp8) {
    const struct cu_w *w = g->w;
    int64_t K = w->K, m = g->n_out, n = g->n;
    if (!c->lt || !x_fp8 || !g->round || n < c->lt_min || m < c->lt_min_out || g->groups > 1 ||
        w->type != DSI_TYPE_F8_E4M3 || w->sb0 != 128 || w->sb1 != 128 || K % 512 || m % 512 ||
        g->row0 % 128 || n % 4 || g->ldx % 4 || g->ldy % 4 || (uintptr_t)g->x % 16 ||
        (uintptr_t)g->y % 16 || w->row_bytes != K)
        return false;
    struct lt_plan *p = lt_plan_get(c->lt, m, n, K);
    if (!p) return false;
    int64_t kb = K / 128, mb = m / 128;
    size_t o_xq = LT_WS, o_xs = o_xq + cu_align((size_t)(n * K)),
           o_ws = o_xs + cu_align((size_t)(n * kb) * 4),
           o_d = o_ws + cu_align((size_t)(mb * kb) * 4), total = o_d + (size_t)(n * m) * 2;
    char *s = (char *)cu_scratch(c, CU_SCR_LT, total);
    if (!s) return c->sticky != 0; /* growing inside a capture: the capture is given up */
    uint8_t *xq = (uint8_t *)(s + o_xq);
    float *xs = (float *)(s + o_xs), *ws = (float *)(s + o_ws);
    uint16_t *d = (uint16_t *)(s + o_d);
    /* the rows handed to the attention after this gemm (g->y_to_attn, c->q16): cuBLASLt's bf16
       rows stay in their own slot, not widened into y (a plain plan's [n][m] is q's layout) */
    bool keep = g->y_to_attn && c->attn_q16 && !p->swap && g->ldy == m;
    if (keep && c->q16.valid) { /* an earlier gemm's rows no attention took: into its y */
        launch_lt_widen(c, c->q16.buf, c->q16.src, c->q16.n, c->q16.cols, c->q16.ld);
        c->q16.valid = false;
    }
    if (keep) {
        uint16_t *k16 = (uint16_t *)cu_scratch(c, CU_SCR_Q16, (size_t)(n * m) * 2);
        if (k16)
            d = k16;
        else if (c->sticky)
            return true;
        keep = k16 != NULL; /* (inside a capture the slot cannot grow: widened as before) */
    }
    int pp = cu_prof_begin(c, "gemm.lt");
    /* (a pair's second call on the same x: the first's FP8 rows and scales, only the weight's
       scales converted) */
    struct cu_xc_key xk = {XC_LT, g->x, n, K, g->ldx, xq};
    bool xt = cu_xc_take(c, &xk);
    int64_t nx = xt ? 0 : n, threads = nx * kb * 32 > mb * kb ? nx * kb * 32 : mb * kb;
    cu_launch(c, k_lt_prep, dim3((unsigned)cu_div_up(threads, CU_THREADS)), dim3(CU_THREADS), 0,
              g->x, nx, K, g->ldx, xq, xs, w->scale + (g->row0 / 128) * w->srs, w->srs, mb, ws,
              c->lt->layout);
    if (!xt) cu_xc_made(c, &xk);
    if (!cu_check(c, "gemm.lt prep")) {
        cu_prof_end(c, pp);
        return true;
    }
    cublasLtMatmulDesc_t op = (cublasLtMatmulDesc_t)&p->op;
    const void *wa = (const void *)ws, *xb = (const void *)xs;
    const uint8_t *wd = w->data + g->row0 * w->row_bytes;
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = CUBLAS_STATUS_INVALID_VALUE;
    if (lt_set(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p->swap ? &xb : &wa, sizeof(wa)) &&
        lt_set(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p->swap ? &wa : &xb, sizeof(xb)))
        st = cublasLtMatmul(
            c->lt->h, op, &alpha, p->swap ? (const void *)xq : (const void *)wd,
            (cublasLtMatrixLayout_t)&p->la, p->swap ? (const void *)wd : (const void *)xq,
            (cublasLtMatrixLayout_t)&p->lb, &beta, d, (cublasLtMatrixLayout_t)&p->ld, d,
            (cublasLtMatrixLayout_t)&p->ld, &p->algo, s, LT_WS, c->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cu_fail(c, DSI_ERR_DEVICE, "gemm.lt: cublasLtMatmul [%lld x %lld] x %lld rows: status %d",
                (long long)m, (long long)K, (long long)n, (int)st);
        cu_prof_end(c, pp);
        return true;
    }
    if (keep) {
        c->q16.valid = true;
        c->q16.src = g->y;
        c->q16.buf = d;
        c->q16.n = n;
        c->q16.cols = m;
        c->q16.ld = g->ldy;
    } else if (p->swap) {
        cu_launch(c, k_lt_widen, dim3((unsigned)cu_div_up(n * m, CU_THREADS)), dim3(CU_THREADS), 0,
                  d, g->y, n, m, g->ldy, true);
    } else { /* (launch_lt_gemm's conditions: m % 512 == 0, y aligned, ldy % 4 == 0) */
        launch_lt_widen(c, d, g->y, n, m, g->ldy);
    }
    cu_check(c, "gemm.lt");
    cu_prof_end(c, pp);
    return true;
}
