/* ltb.cu - the dense GEMMs of `fast` numerics that the wgmma kernels take (wgr.cu: the grouped
 * output projection `wo_a`; wg.cu: the BF16 weights of the compressors, the indexer and the
 * router), at many rows, on cuBLASLt's bf16 matmul. The reference multiplies the attention's out
 * by `wo_a` dequantised to bf16 at load (spec: a bf16 einsum, groups of 1024 outputs); wgr.cu
 * does that product on bf16 wgmma with the FP8 weights decoded in registers, at ~370 TFLOP/s at
 * the 8k prefill (step 40: 1.47 ms a layer for 0.55 TFLOP), where the bf16 tensor cores give ~2x
 * that to a plain matmul (step 47: 0.87 ms a call here, the copy and the widening included).
 *
 * Per call (launch_ltb_gemm): for FP8 weights, k_ltb_wcopy writes the call's weight rows as bf16
 * (each FP8 code times its block's UE8M0 scale: exact in bf16) into lt.cu's scratch slot, their
 * K order permuted within each 128-column group as wgr.cu's activation copies are (wg_perm_col);
 * the activations are those copies (wg_dense_copy: the attention's kept rows, or x copied), so
 * both operands carry the same permutation and every output is the same dot product. BF16
 * weights are read as they are, with wg.cu's plain bf16 copy of x. Then one strided-batched
 * cublasLtMatmul (a batch per group: D_g = W_g x_g) into bf16 outputs [n][groups n_out] widened
 * into y where the caller wants them rounded (launch_lt_widen), else into y in fp32.
 *
 * Numerics: the products are exact in fp32 (x's bf16 copy is exact in `fast` numerics, as for
 * wg.cu / wgr.cu); cuBLASLt adds them in its own order (the `fast` profile's licence, as the
 * wgmma kernels'); at most one bf16 rounding of each sum.
 *
 * Taken for c->ltb_min <= n rows (DSI_CUDA_LTB_MIN, default 2048; 0: never) where the caller
 * would run the wgmma kernels (its check; FP8 calls only where wgr.cu would take them, so that the
 * attention's kept rows are read here too): FP8 weights with power-of-two scale blocks, or BF16
 * ones of one group with 16-byte rows; groups side by side in y (gy = n_out); rounded outputs
 * with groups n_out % 8 == 0, y 16-byte aligned and ldy % 4 == 0; else false (the caller takes
 * wgr.cu / wg.cu).
 *
 * Ownership: struct cu_ltb (the cuBLASLt handle and the plan cache) belongs to the cu_ctx, made
 * by cu_ltb_new at backend creation and freed by cu_ltb_free; the per-call buffers (the
 * workspace, the weight copy, the bf16 outputs) are carved from lt.cu's scratch slot (CU_SCR_LT:
 * lt.cu and this file never run in the same op), the activations' copy is CU_SCR_GEMM's. */
#include "gemm.cuh"
#include "tc.cuh"
#include "wg.cuh"

#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#define LTB_PLANS 16
#define LTB_WS    (32u << 20) /* cuBLASLt workspace (NVIDIA's advice for Hopper) */

/* A plan's key (column-major view, see ltb_plan_get): m x n outputs of K, `groups` batches,
 * A's (ld, batch stride), B's, D's, and D's type (bf16: the outputs rounded) */
struct ltb_key {
    int64_t m, n, k, groups, lda, sa, ldb, sb, ldd, sd;
    int64_t d16;
    uint32_t align[4]; /* A's, B's and D's: every batch's start a multiple of these bytes; 0 */
};
static_assert(sizeof(struct ltb_key) == 11 * 8 + 16, "ltb_key: no padding (compared by memcmp)");

/* The largest power of two up to 256 that divides the address and every batch's offset */
static uint32_t ltb_align(uintptr_t addr, int64_t stride_bytes) {
    uintptr_t v = addr | (uintptr_t)stride_bytes | 256;
    return (uint32_t)(v & (~v + 1));
}

struct ltb_plan {
    struct ltb_key key;
    bool used, ok;
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

struct cu_ltb {
    cublasLtHandle_t h;
    int next; /* the plan replaced next when the cache is full */
    bool warned;
    struct ltb_plan plans[LTB_PLANS];
};

struct cu_ltb *cu_ltb_new(void) {
    struct cu_ltb *b = (struct cu_ltb *)calloc(1, sizeof(*b));
    if (!b) return NULL;
    if (cublasLtCreate(&b->h) != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return NULL;
    }
    return b;
}

void cu_ltb_free(struct cu_ltb *b) {
    if (!b) return;
    cublasLtDestroy(b->h);
    free(b);
}

/* wb[r][2 q .. 2 q + 1] = the bf16 values of weight row row0 + r at columns wg_perm_col(q) and the
 * one after it (r < rows, q < K / 2): a thread 4 pairs (one 16-byte store), all in one 128-group
 * of K, so one scale. */
__global__ void k_ltb_wcopy(struct cu_w w, int64_t row0, int64_t rows, uint16_t *__restrict__ wb) {
    cu_pdl_enter();
    int64_t per = w.K / 8, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * per) return;
    int64_t r = i / per, q0 = (i % per) * 4, row = row0 + r;
    const uint8_t *src = w.data + row * w.row_bytes;
    int64_t c0 = wg_perm_col(q0);
    float s = e8m0_to_f32(w.scale[(row >> w.sh0) * w.srs + (c0 >> w.sh1)]);
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int64_t c = wg_perm_col(q0 + j);
        uint16_t v2 = *(const uint16_t *)(src + c); /* (c even: 2-byte aligned) */
        o[j] = bf16x2_rn(e4m3_to_f32(v2 & 0xff) * s, e4m3_to_f32(v2 >> 8) * s);
    }
    *(uint4 *)(wb + r * w.K + 2 * q0) = make_uint4(o[0], o[1], o[2], o[3]);
}

static bool
ltb_set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t at, const void *v, size_t sz) {
    return cublasLtMatmulDescSetAttribute(op, at, v, sz) == CUBLAS_STATUS_SUCCESS;
}

static bool ltb_layout(cublasLtMatrixLayoutOpaque_t *l,
                       cudaDataType_t type,
                       int64_t rows,
                       int64_t cols,
                       int64_t ld,
                       int64_t groups,
                       int64_t stride) {
    cublasLtMatrixLayout_t t = (cublasLtMatrixLayout_t)l;
    int32_t bc = (int32_t)groups;
    return cublasLtMatrixLayoutInit(t, type, (uint64_t)rows, (uint64_t)cols, ld) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutSetAttribute(t, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc,
                                            sizeof(bc)) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutSetAttribute(t, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                            sizeof(stride)) == CUBLAS_STATUS_SUCCESS;
}

/* The plan of a key (host calls only: safe while a step is captured); NULL: cuBLASLt has no
 * algorithm for it (said once; such calls stay on wgr.cu / wg.cu). Column-major view: A = the
 * bf16 weight rows (K x m: a row per column), B = the bf16 activations (K x n), D = the outputs
 * (m x n: [n][ldd]), bf16 or fp32; a batch a group. */
static struct ltb_plan *ltb_plan_get(struct cu_ltb *b, const struct ltb_key *key) {
    for (int i = 0; i < LTB_PLANS; i++) {
        struct ltb_plan *p = &b->plans[i];
        if (p->used && !memcmp(&p->key, key, sizeof(*key))) return p->ok ? p : NULL;
    }
    struct ltb_plan *p = &b->plans[b->next];
    b->next = (b->next + 1) % LTB_PLANS;
    memset(p, 0, sizeof(*p));
    p->used = true;
    p->key = *key;
    cublasLtMatmulDesc_t op = (cublasLtMatmulDesc_t)&p->op;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int found = 0;
    cublasStatus_t st = CUBLAS_STATUS_INVALID_VALUE;
    if (cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        ltb_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) &&
        ltb_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) &&
        ltb_layout(&p->la, CUDA_R_16BF, key->k, key->m, key->lda, key->groups, key->sa) &&
        ltb_layout(&p->lb, CUDA_R_16BF, key->k, key->n, key->ldb, key->groups, key->sb) &&
        ltb_layout(&p->ld, key->d16 ? CUDA_R_16BF : CUDA_R_32F, key->m, key->n, key->ldd,
                   key->groups, key->sd)) {
        cublasLtMatmulPreferenceOpaque_t pr;
        cublasLtMatmulPreference_t pref = (cublasLtMatmulPreference_t)&pr;
        uint64_t wsb = LTB_WS;
        cublasLtMatmulHeuristicResult_t hr;
        const cublasLtMatmulPreferenceAttributes_t al[3] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        st = cublasLtMatmulPreferenceInit(pref);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
        for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; i++)
            st = cublasLtMatmulPreferenceSetAttribute(pref, al[i], &key->align[i],
                                                      sizeof(key->align[i]));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulAlgoGetHeuristic(
                b->h, op, (cublasLtMatrixLayout_t)&p->la, (cublasLtMatrixLayout_t)&p->lb,
                (cublasLtMatrixLayout_t)&p->ld, (cublasLtMatrixLayout_t)&p->ld, pref, 1, &hr,
                &found);
        if (st == CUBLAS_STATUS_SUCCESS && found > 0) p->algo = hr.algo;
    }
    p->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (!p->ok && !b->warned) {
        b->warned = true;
        dsi_log(DSI_LOG_WARN,
                "cuda: cuBLASLt has no bf16 matmul for %lld groups of [%lld x %lld] x %lld rows "
                "(status %d); those GEMMs stay on wgr.cu / wg.cu",
                (long long)key->groups, (long long)key->m, (long long)key->k, (long long)key->n,
                (int)st);
    }
    return p->ok ? p : NULL;
}

bool launch_ltb_gemm(struct cu_ctx *c, const struct tc_p *p, dim3 grid) {
    const struct cu_w *w = &p->w;
    int64_t n = p->n, m = p->n_out, K = w->K, groups = grid.z, cols = groups * m;
    bool f8 = w->type == DSI_TYPE_F8_E4M3;
    if (!c->ltb || c->ltb_min <= 0 || n < c->ltb_min || (groups > 1 && p->gy != m) ||
        (p->round && (cols % 8 || p->ldy % 4 || (uintptr_t)p->y % 16)))
        return false;
    if (f8 ? !c->wg_rs || !w->scale || w->sh0 < 0 || w->sh1 < 0 || w->row_bytes != K ||
                 !wgr_dense_ok(w, (int)groups, p->gx)
           : w->type != DSI_TYPE_BF16 || groups > 1 || w->row_bytes % 16 || (uintptr_t)w->data % 16)
        return false;
    /* FP8: A is the weight copy (lda K); BF16: the weight rows themselves. B: wg_dense_copy's
       rows (permuted where FP8). D: bf16 for the widening where rounded, else y itself. */
    struct ltb_key key = {m,
                          n,
                          K,
                          groups,
                          f8 ? K : w->row_bytes / 2,
                          f8 ? m * K : 0,
                          (groups - 1) * p->gx + K,
                          groups > 1 ? p->gx : 0,
                          p->round ? cols : p->ldy,
                          groups > 1 ? (p->round ? m : p->gy) : 0,
                          p->round,
                          {0, 0, 0, 0}};
    /* (the weight copy and the activations' are scratch: 256-byte aligned) */
    key.align[0] = ltb_align(f8 ? 0 : (uintptr_t)(w->data + p->row0 * w->row_bytes), key.sa * 2);
    key.align[1] = ltb_align(0, key.sb * 2);
    key.align[2] = ltb_align(p->round ? 0 : (uintptr_t)p->y, key.sd * (p->round ? 2 : 4));
    struct ltb_plan *pl = ltb_plan_get(c->ltb, &key);
    if (!pl) return false;
    size_t o_wb = LTB_WS, o_d = o_wb + (f8 ? cu_align((size_t)(cols * K) * 2) : 0),
           total = o_d + (p->round ? (size_t)(n * cols) * 2 : 0);
    char *s = (char *)cu_scratch(c, CU_SCR_LT, total);
    if (!s) return c->sticky != 0; /* growing inside a capture: the capture is given up */
    struct tc_p q;
    if (!wg_dense_copy(c, p, grid, f8, &q)) return true; /* (the sticky error is set) */
    int pp = cu_prof_begin(c, "gemm.ltb");
    const uint16_t *wa = (const uint16_t *)(w->data + p->row0 * w->row_bytes);
    void *d = p->round ? (void *)(s + o_d) : (void *)p->y;
    if (f8) {
        uint16_t *wb = (uint16_t *)(s + o_wb);
        cu_launch(c, k_ltb_wcopy, dim3((unsigned)cu_div_up(cols * (K / 8), CU_THREADS)),
                  dim3(CU_THREADS), 0, *w, p->row0, cols, wb);
        if (!cu_check(c, "gemm.ltb weight copy")) {
            cu_prof_end(c, pp);
            return true;
        }
        wa = wb;
    }
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = cublasLtMatmul(
        c->ltb->h, (cublasLtMatmulDesc_t)&pl->op, &alpha, wa, (cublasLtMatrixLayout_t)&pl->la,
        q.x16, (cublasLtMatrixLayout_t)&pl->lb, &beta, d, (cublasLtMatrixLayout_t)&pl->ld, d,
        (cublasLtMatrixLayout_t)&pl->ld, &pl->algo, s, LTB_WS, c->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cu_fail(c, DSI_ERR_DEVICE,
                "gemm.ltb: cublasLtMatmul %lld groups of [%lld x %lld] x %lld rows: status %d",
                (long long)groups, (long long)m, (long long)K, (long long)n, (int)st);
        cu_prof_end(c, pp);
        return true;
    }
    if (p->round) launch_lt_widen(c, (const uint16_t *)d, p->y, n, cols, p->ldy);
    cu_check(c, "gemm.ltb");
    cu_prof_end(c, pp);
    return true;
}
