/* test_gemm_cuda.c - the CUDA backend's GEMM op against the CPU backend's: exact numerics bit
 * for bit, `fast` numerics within a tolerance (tensor cores: sums in another order), grouped
 * calls and pairs (the conventions of test_ops_cuda.c: poisoned outputs, whole buffers compared,
 * "skipped" without a device). */
#include "cuda_util.h"

#include "backend/cpu/quant.h"
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
/* ---- GEMM -------------------------------------------------------------------------------------
 */

struct gemm_case {
    enum dsi_type type;
    int64_t rows, K, n, row0, n_out, ldx, ldy;
    bool round;
};

/* A grouped call: group g of gc multiplies x + g gx into y + g gy (ldx, ldy cover them). */
struct gemm_groups {
    int groups;
    int64_t gx, gy;
};

/* fast: the `fast` numerics flag, the x rows FP8-quantised as that profile's forward does
 * (the tensor-core kernels' bf16 operands are then exact), compared within a tolerance. */
static int
run_gemm_g(struct rng *r, const struct gemm_case *gc, const struct gemm_groups *gg, bool fast) {
    struct wt w;
    wt_make(&w, r, gc->type, gc->rows, gc->K, 0.05f);
    int64_t ldx = gc->ldx ? gc->ldx : gc->K, ldy = gc->ldy ? gc->ldy : gc->n_out;
    float *x = fnorm(r, gc->n * ldx, 1.0f);
    int64_t qd = gg->groups > 1 ? ldx : gc->K; /* grouped: every group's columns */
    if (fast && qd % 128 == 0) {
        struct dsi_act_quant_args q = {x, x, gc->n, qd, ldx, ldx, 128};
        g_cpu->ops->act_quant(g_cpu, &q);
    } else if (fast) { /* as a bf16-rounded activation of reference numerics */
        for (int64_t i = 0; i < gc->n * ldx; i++)
            x[i] = dsi_bf16_round(x[i]);
    }
    float *yc = hpoison(gc->n * ldy), *yg = hpoison(gc->n * ldy);
    float *dx = dput(x, sizeof(float) * (size_t)(gc->n * ldx));
    float *dy = dpoison(sizeof(float) * (size_t)(gc->n * ldy));
    struct dsi_gemm_args a = {.w = &w.h,
                              .row0 = gc->row0,
                              .n_out = gc->n_out,
                              .x = x,
                              .n = gc->n,
                              .ldx = ldx,
                              .y = yc,
                              .ldy = ldy,
                              .round_bf16 = gc->round,
                              .fast = fast,
                              .x_fp8 = fast && qd % 128 == 0,
                              .groups = gg->groups,
                              .gx = gg->gx,
                              .gy = gg->gy};
    if (gg->groups > 1) { /* the expected result: the groups one by one */
        for (int g = 0; g < gg->groups; g++) {
            struct dsi_gemm_args ga = a;
            ga.groups = 0;
            ga.row0 = gc->row0 + g * gc->n_out;
            ga.x = x + g * gg->gx;
            ga.y = yc + g * gg->gy;
            g_cpu->ops->gemm(g_cpu, &ga);
        }
    } else {
        g_cpu->ops->gemm(g_cpu, &a);
    }
    a.w = &w.d;
    a.x = dx;
    a.y = dy;
    g_gpu->ops->gemm(g_gpu, &a);
    int ok = gsync("gemm") == 0;
    dget(yg, dy, sizeof(float) * (size_t)(gc->n * ldy));
    char what[160];
    snprintf(what, sizeof(what), "gemm%s type %d [%lld x %lld] n %lld rows %lld+%lld groups %d",
             fast ? " fast" : "", gc->type, (long long)gc->rows, (long long)gc->K, (long long)gc->n,
             (long long)gc->row0, (long long)gc->n_out, gg->groups);
    /* fast: fp32 sums in another order (the tensor cores' adds truncate), then (round) one
     * bf16 rounding that may land on the neighbour: 2^-8 of the value at most */
    ok = ok && (fast ? close_to(what, yg, yc, gc->n * ldy, gc->round ? 8e-3 : 1e-4)
                     : same(what, yg, yc, sizeof(float) * (size_t)(gc->n * ldy)));
    dfree(dx);
    dfree(dy);
    free(x);
    free(yc);
    free(yg);
    wt_free(&w);
    return ok;
}

static int run_gemm_mode(struct rng *r, const struct gemm_case *gc, bool fast) {
    const struct gemm_groups one = {1, 0, 0};
    return run_gemm_g(r, gc, &one, fast);
}

static int run_gemm(struct rng *r, const struct gemm_case *gc) {
    return run_gemm_mode(r, gc, false);
}

/* `fast` numerics: cuBLASLt's FP8 GEMM (lt.cu) for FP8 weights from 128 rows whose rows are
 * act_quant's (K, n_out multiples of 512, n of 4); the tensor-core kernel (tc.cu) for n >= 64 rows
 * on FP8/BF16 weights with K % 64 == 0, every block width (32, 64, 128 rows), partial weight and
 * row tiles, padded ld, an offset row0; the decode kernel (gvf.cu) for 3 <= n <= 32 (1, 2 and 4
 * column tiles, one to eight warps along K, FP8 / FP4 / BF16, partial tiles, row0, padded ld),
 * and for 17-63 rows in up to 8 launches of the
 * rows that fit in shared memory; other calls (FP4 or K % 64 != 0 from 64 rows, more launches)
 * the exact kernels. Twice: the usual scale bytes and a range past the largest one gvf.cu's
 * short decode takes. */
int test_cuda_gemm_fast(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 21);
    const struct gemm_case cases[] = {
        {DSI_TYPE_F8_E4M3, 256, 256, 64, 0, 256, 0, 0, false},
        {DSI_TYPE_F8_E4M3, 384, 256, 65, 128, 200, 300, 333, true},
        {DSI_TYPE_BF16, 200, 192, 130, 0, 200, 0, 0, false},
        {DSI_TYPE_BF16, 256, 128, 600, 3, 250, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 1024, 4096, 520, 0, 1024, 0, 0, true}, /* wq_a, prefill */
        {DSI_TYPE_F8_E4M3, 256, 256, 200, 0, 256, 0, 0, false},
        {DSI_TYPE_F8_E4M3, 384, 128, 600, 0, 384, 0, 0, false},
        {DSI_TYPE_F8_E4M3, 4096, 8192, 96, 0, 4096, 0, 0, false},          /* wo_b */
        {DSI_TYPE_F8_E4M3, 8192, 4096, 70, 1024, 1024, 32768, 8192, true}, /* wo_a group */
        {DSI_TYPE_FP4_E2M1, 256, 128, 100, 0, 256, 0, 0, false},           /* not taken */
        {DSI_TYPE_BF16, 70, 96, 80, 0, 70, 0, 0, false},                   /* K % 64: not taken */
        {DSI_TYPE_F8_E4M3, 256, 256, 7, 0, 256, 0, 0, true},               /* gvf */
        {DSI_TYPE_F8_E4M3, 1024, 4096, 1, 0, 1024, 0, 0, true},            /* 1 row: exact */
        {DSI_TYPE_F8_E4M3, 1024, 4096, 3, 0, 1024, 0, 0, true},            /* wq_a, decode */
        {DSI_TYPE_F8_E4M3, 32768, 1024, 4, 0, 32768, 0, 0, true},          /* wq_b */
        {DSI_TYPE_F8_E4M3, 4096, 8192, 8, 0, 4096, 0, 0, false},           /* wo_b: 2 loads */
        {DSI_TYPE_F8_E4M3, 8192, 4096, 5, 1024, 1000, 4100, 8200, true},   /* offset, ld */
        {DSI_TYPE_F8_E4M3, 4096, 4096, 13, 0, 4096, 0, 0, false},          /* 2 column tiles */
        {DSI_TYPE_F8_E4M3, 4096, 4096, 32, 0, 4096, 0, 0, true},           /* 4 column tiles */
        {DSI_TYPE_F8_E4M3, 300, 160, 3, 0, 300, 0, 0, false},              /* K % 128 != 0 */
        {DSI_TYPE_BF16, 70, 96, 3, 0, 70, 0, 0, false},                    /* BF16, odd K */
        {DSI_TYPE_BF16, 512, 4096, 20, 0, 512, 0, 0, true},                /* BF16 */
        {DSI_TYPE_FP4_E2M1, 256, 192, 4, 0, 256, 0, 0, false},             /* FP4 dense */
        {DSI_TYPE_F8_E4M3, 256, 256, 40, 0, 256, 0, 0, true},              /* 33-63 rows: 32 + 8 */
        /* 1-8 rows (step 44): tiles across a 128-row scale block, K = 8192 at one row, BF16 */
        {DSI_TYPE_F8_E4M3, 4096, 1536, 2, 40, 2000, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 4096, 8192, 1, 0, 4096, 0, 0, true},
        {DSI_TYPE_BF16, 200, 192, 3, 0, 200, 0, 0, false},
        {DSI_TYPE_BF16, 300, 1088, 8, 0, 300, 0, 0, true},
        /* gvf.cu in launches of as many rows as fit in shared memory (32, 16, 8), at most 4 */
        {DSI_TYPE_F8_E4M3, 4096, 8192, 32, 0, 4096, 0, 0, true}, /* wo_b: 2 x 16 */
        {DSI_TYPE_BF16, 512, 4096, 48, 0, 512, 0, 0, false},     /* 3 x 16 */
        {DSI_TYPE_F8_E4M3, 1024, 4096, 63, 0, 1024, 0, 0, true}, /* FP8 codes: 32 + 31 */
        {DSI_TYPE_BF16, 256, 8192, 40, 0, 256, 0, 0, false},     /* 5 x 8 */
        {DSI_TYPE_BF16, 64, 16384, 40, 0, 64, 0, 0, false},      /* 8 rows do not fit */
        /* lt.cu (cuBLASLt FP8) from DSI_CUDA_LT_MIN (128) rows with bf16-rounded outputs: wo_b at
           batch 256 (not rounded: tc.cu), an offset row0 with padded ld, a 132-row prefill chunk;
           130 rows: 128 on lt.cu, 2 on gvf.cu */
        {DSI_TYPE_F8_E4M3, 4096, 8192, 256, 0, 4096, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 4096, 8192, 256, 0, 4096, 0, 0, false},
        {DSI_TYPE_F8_E4M3, 8192, 4096, 128, 1024, 1024, 4100, 8200, true},
        {DSI_TYPE_F8_E4M3, 2048, 1024, 132, 512, 1536, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 1024, 4096, 130, 0, 1024, 0, 0, true},
        /* tc.cu split along K (grids under 2 blocks per SM, step 23): the compressor's and the
           router's shapes at batch 256 (the cases of 64-511 rows above split too) */
        {DSI_TYPE_F8_E4M3, 1024, 4096, 256, 0, 1024, 0, 0, false},
        {DSI_TYPE_BF16, 256, 4096, 256, 0, 256, 0, 0, false},
        /* ltb.cu (cuBLASLt's bf16 matmul) from DSI_CUDA_LTB_MIN (2048) rows: BF16 weights (FP8
           ones with act_quant's rows are lt.cu's), fp32 outputs into y and bf16 ones widened */
        {DSI_TYPE_BF16, 256, 512, 2050, 0, 256, 0, 0, false},
        {DSI_TYPE_BF16, 320, 1024, 2052, 0, 320, 0, 0, true},
    };
    int n = (int)(sizeof(cases) / sizeof(cases[0]));
    for (int wide = 0; wide < 2; wide++) { /* gvf.cu's short and fp32 weight decoding */
        wt_scales_wide(wide);
        for (int i = 0; i < n; i++) {
            if (tiny_only() && cases[i].rows * cases[i].K > (1 << 20)) continue;
            int ok = run_gemm_mode(&r, &cases[i], true);
            if (!ok) wt_scales_wide(false);
            TEST_ASSERTF(ok, "gemm fast case %d (%s scales)", i, wide ? "wide" : "usual");
        }
    }
    wt_scales_wide(false);
    /* cuBLASLt off: the FP8 cases of 128 rows and more on tc.cu, and from 512 rows on the
       wgmma kernels (DSI_CUDA_WG=1, the default): wgr.cu's with the weights in registers (the
       default from step 26), then wg.cu's (DSI_CUDA_WG_RS=0) */
    const char *wgenv[2] = {"DSI_CUDA_WG=1,DSI_CUDA_LT_MIN=0",
                            "DSI_CUDA_WG=1,DSI_CUDA_LT_MIN=0,DSI_CUDA_WG_RS=0"};
    struct dsi_backend *keep = g_gpu;
    int ok = 1;
    for (int b = 0; b < 2 && ok; b++) {
        struct dsi_backend *wg = cuda_backend_with(wgenv[b]);
        TEST_ASSERT(wg != NULL);
        g_gpu = wg;
        for (int i = 0; i < n && ok; i++) {
            if (cases[i].n < 128 || (tiny_only() && cases[i].rows * cases[i].K > (1 << 20)))
                continue;
            ok = run_gemm_mode(&r, &cases[i], true);
            if (!ok) fprintf(stderr, "[gemm fast wgmma case %d with %s] ", i, wgenv[b]);
        }
        g_gpu = keep;
        wg->ops->free(wg);
    }
    TEST_ASSERT(ok);
    /* tc.cu without its split along K (DSI_CUDA_TC_SPLIT=0): the cases of 64-511 rows */
    struct dsi_backend *ns = cuda_backend_with("DSI_CUDA_TC_SPLIT=0,DSI_CUDA_LT_MIN=0");
    TEST_ASSERT(ns != NULL);
    g_gpu = ns;
    for (int i = 0; i < n && ok; i++) {
        if (cases[i].n < 64 || cases[i].n >= 512 ||
            (tiny_only() && cases[i].rows * cases[i].K > (1 << 20)))
            continue;
        ok = run_gemm_mode(&r, &cases[i], true);
        if (!ok) fprintf(stderr, "[gemm fast unsplit case %d] ", i);
    }
    g_gpu = keep;
    ns->ops->free(ns);
    TEST_ASSERT(ok);
    /* step 33's switches: gvf.cu's warps along K on named barriers (DSI_CUDA_GVF_NBAR=1) on the
       cases of 1-63 rows; the wgmma kernels from 128 rows (DSI_CUDA_WG_DENSE_MIN=128, cuBLASLt
       off) on those of 128-511; step 36's evict-first weight loads (DSI_CUDA_GVF_EF=1) on those
       of 1-63; step 37's cuBLASLt only from 2048 output columns (DSI_CUDA_LT_MIN_OUT=2048: the
       narrower FP8 calls of 128 rows and more on tc.cu); step 47's ltb.cu from 128 rows (the
       wgmma kernels' calls from 128 rows, cuBLASLt's FP8 off) and the cases from 2048 rows
       without it */
    const struct {
        const char *env;
        int64_t nmin, nmax;
    } s33[] = {{"DSI_CUDA_GVF_NBAR=1", 1, 63},
               {"DSI_CUDA_WG_DENSE_MIN=128,DSI_CUDA_LT_MIN=0", 128, 511},
               {"DSI_CUDA_GVF_EF=1", 1, 63},
               {"DSI_CUDA_LT_MIN_OUT=2048", 128, INT64_MAX},
               {"DSI_CUDA_WG_DENSE_MIN=128,DSI_CUDA_LT_MIN=0,DSI_CUDA_LTB_MIN=128", 128, INT64_MAX},
               {"DSI_CUDA_LTB_MIN=0", 2048, INT64_MAX}};
    for (size_t b = 0; b < sizeof(s33) / sizeof(s33[0]) && ok; b++) {
        struct dsi_backend *g2 = cuda_backend_with(s33[b].env);
        TEST_ASSERT(g2 != NULL);
        g_gpu = g2;
        for (int i = 0; i < n && ok; i++) {
            if (cases[i].n < s33[b].nmin || cases[i].n > s33[b].nmax ||
                (tiny_only() && cases[i].rows * cases[i].K > (1 << 20)))
                continue;
            ok = run_gemm_mode(&r, &cases[i], true);
            if (!ok) fprintf(stderr, "[gemm fast case %d with %s] ", i, s33[b].env);
        }
        g_gpu = keep;
        g2->ops->free(g2);
    }
    TEST_ASSERT(ok);
    return 0;
}

/* GEMM pairs (dsi_gemm_args.w2: two weights on the same x rows, as the forward's q / kv and
 * compressor projections) against the CPU's two calls: in `fast` numerics at 1-32 rows one gvf.cu
 * launch (the weights of different heights, FP8 and BF16; the tolerance of run_gemm_g), 33 rows
 * in two (32 + 1), else the two calls in turn (reference numerics bit for bit; weights of two
 * types). */
int test_cuda_gemm_pair(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 29);
    const struct {
        enum dsi_type t1, t2;
        int64_t rows1, rows2, K, n;
        bool fast, round;
    } cs[] = {
        {DSI_TYPE_F8_E4M3, DSI_TYPE_F8_E4M3, 1024, 512, 4096, 1, true, true}, /* wq_a + wkv */
        {DSI_TYPE_F8_E4M3, DSI_TYPE_F8_E4M3, 1024, 512, 4096, 3, true, true},
        {DSI_TYPE_BF16, DSI_TYPE_BF16, 512, 512, 4096, 2, true, false}, /* the compressor's */
        {DSI_TYPE_BF16, DSI_TYPE_BF16, 200, 72, 256, 17, true, false},
        {DSI_TYPE_F8_E4M3, DSI_TYPE_F8_E4M3, 256, 384, 512, 33, true, true}, /* 32 + 1 */
        {DSI_TYPE_F8_E4M3, DSI_TYPE_BF16, 256, 128, 512, 4, true, false},
        {DSI_TYPE_F8_E4M3, DSI_TYPE_F8_E4M3, 256, 128, 512, 3, false, true},
        /* from 128 rows the second call takes the first's copy of x (c->xc; step 47): lt.cu's
           FP8 rows (130: 128 of them, then 2 on gvf.cu), ltb.cu's bf16 rows from 2048, and a
           pair of two kinds (lt.cu, then ltb.cu: not taken) */
        {DSI_TYPE_F8_E4M3, DSI_TYPE_F8_E4M3, 1024, 512, 4096, 256, true, true},
        {DSI_TYPE_F8_E4M3, DSI_TYPE_F8_E4M3, 512, 512, 1024, 130, true, true},
        {DSI_TYPE_BF16, DSI_TYPE_BF16, 256, 128, 512, 2050, true, false},
        {DSI_TYPE_F8_E4M3, DSI_TYPE_BF16, 512, 256, 512, 2052, true, true},
    };
    /* (the fast cases from 128 rows again without c->xc: the same bits) */
    struct dsi_backend *nxc = cuda_backend_with("DSI_CUDA_XC=0");
    TEST_ASSERT(nxc != NULL);
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        int64_t n = cs[c].n, K = cs[c].K, m1 = cs[c].rows1, m2 = cs[c].rows2;
        struct wt w1, w2;
        wt_make(&w1, &r, cs[c].t1, m1, K, 0.05f);
        wt_make(&w2, &r, cs[c].t2, m2, K, 0.05f);
        float *x = fnorm(&r, n * K, 1.0f);
        if (cs[c].fast) {
            struct dsi_act_quant_args q = {x, x, n, K, K, K, 128};
            g_cpu->ops->act_quant(g_cpu, &q);
        }
        float *c1 = hpoison(n * m1), *c2 = hpoison(n * m2), *g1 = hpoison(n * m1),
              *g2 = hpoison(n * m2);
        float *dx = dput(x, sizeof(float) * (size_t)(n * K)),
              *d1 = dpoison(sizeof(float) * (size_t)(n * m1)),
              *d2 = dpoison(sizeof(float) * (size_t)(n * m2));
        struct dsi_gemm_args a = {.w = &w1.h,
                                  .n_out = m1,
                                  .x = x,
                                  .n = n,
                                  .ldx = K,
                                  .y = c1,
                                  .ldy = m1,
                                  .round_bf16 = cs[c].round,
                                  .fast = cs[c].fast,
                                  .x_fp8 = cs[c].fast,
                                  .w2 = &w2.h,
                                  .n_out2 = m2,
                                  .ldy2 = m2,
                                  .y2 = c2};
        g_cpu->ops->gemm(g_cpu, &a);
        a.w = &w1.d;
        a.w2 = &w2.d;
        a.x = dx;
        a.y = d1;
        a.y2 = d2;
        g_gpu->ops->gemm(g_gpu, &a);
        int ok = gsync("gemm pair") == 0;
        dget(g1, d1, sizeof(float) * (size_t)(n * m1));
        dget(g2, d2, sizeof(float) * (size_t)(n * m2));
        double tol = cs[c].round ? 8e-3 : 1e-4;
        if (cs[c].fast)
            ok = ok && close_to("gemm pair y", g1, c1, n * m1, tol) &&
                 close_to("gemm pair y2", g2, c2, n * m2, tol);
        else
            ok = ok && same("gemm pair y", g1, c1, sizeof(float) * (size_t)(n * m1)) &&
                 same("gemm pair y2", g2, c2, sizeof(float) * (size_t)(n * m2));
        if (ok && cs[c].fast && n >= 128) {
            nxc->ops->gemm(nxc, &a);
            ok = gsync_on(nxc, "gemm pair without xc") == 0;
            dget(c1, d1, sizeof(float) * (size_t)(n * m1));
            dget(c2, d2, sizeof(float) * (size_t)(n * m2));
            ok = ok && same("gemm pair y without xc", c1, g1, sizeof(float) * (size_t)(n * m1)) &&
                 same("gemm pair y2 without xc", c2, g2, sizeof(float) * (size_t)(n * m2));
        }
        dfree(dx);
        dfree(d1);
        dfree(d2);
        free(x);
        free(c1);
        free(c2);
        free(g1);
        free(g2);
        wt_free(&w1);
        wt_free(&w2);
        TEST_ASSERTF(ok, "case %zu", c);
    }
    nxc->ops->free(nxc);
    return 0;
}

/* Grouped calls (the output projection's groups) against the groups one by one on the CPU:
 * one launch for 1-2 rows (bitwise, reference and fast numerics; fast from DSI_CUDA_GVF_MIN
 * rows: one gvf.cu launch; from DSI_CUDA_TC_DENSE rows one tc.cu launch), the groups one by
 * one for more rows, when the grouped launch would need split-K, and for x offsets not on 16
 * bytes; from 512 rows one wg.cu launch. */
int test_cuda_gemm_grouped(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 23);
    const struct {
        struct gemm_case c;
        struct gemm_groups g;
    } cases[] = {
        {{DSI_TYPE_F8_E4M3, 512, 256, 1, 0, 64, 2048, 520, true}, {8, 256, 64}},
        {{DSI_TYPE_F8_E4M3, 600, 256, 2, 64, 64, 2060, 530, false}, {8, 256, 65}},
        {{DSI_TYPE_BF16, 256, 128, 2, 0, 32, 1100, 300, true}, {8, 128, 36}},
        {{DSI_TYPE_F8_E4M3, 512, 256, 3, 0, 64, 2048, 520, true}, {8, 256, 64}},  /* one by one */
        {{DSI_TYPE_F8_E4M3, 64, 8192, 1, 0, 32, 16384, 64, true}, {2, 8192, 32}}, /* split-K */
        {{DSI_TYPE_F8_E4M3, 512, 256, 1, 0, 64, 2048, 520, true}, {8, 254, 64}},  /* unaligned */
        {{DSI_TYPE_F8_E4M3, 8192, 4096, 1, 0, 1024, 32768, 8192, true}, {8, 4096, 1024}}, /* wo_a */
        {{DSI_TYPE_F8_E4M3, 8192, 4096, 2, 0, 1024, 32768, 8192, true}, {8, 4096, 1024}},
        {{DSI_TYPE_F8_E4M3, 8192, 4096, 4, 0, 1024, 32768, 8192, true}, {8, 4096, 1024}},
        /* 33-63 rows: gvf.cu, launches of 32 rows */
        {{DSI_TYPE_F8_E4M3, 8192, 4096, 40, 0, 1024, 32768, 8192, true}, {8, 4096, 1024}},
        {{DSI_TYPE_BF16, 256, 128, 48, 0, 32, 1100, 300, false}, {8, 128, 36}},
        /* fast numerics from DSI_CUDA_TC_DENSE rows: one tc.cu launch (grid.z = groups; split
           along K where the grid is small and the groups' outputs side by side: the first and
           the 128-row case of the real shape, step 25) */
        {{DSI_TYPE_F8_E4M3, 512, 256, 70, 0, 64, 2048, 520, true}, {8, 256, 64}},
        {{DSI_TYPE_F8_E4M3, 8192, 4096, 128, 0, 1024, 32768, 8192, true}, {8, 4096, 1024}},
        {{DSI_TYPE_BF16, 256, 128, 65, 0, 32, 1100, 300, false}, {8, 128, 36}},
        {{DSI_TYPE_F8_E4M3, 8192, 4096, 72, 0, 1024, 32768, 8192, true}, {8, 4096, 1024}},
        /* from 512 rows: one wg.cu launch on the groups' bf16 copy */
        {{DSI_TYPE_F8_E4M3, 512, 256, 520, 0, 64, 2048, 520, true}, {8, 256, 64}},
        {{DSI_TYPE_BF16, 256, 128, 530, 0, 32, 1100, 300, false}, {8, 128, 36}},
        /* from DSI_CUDA_LTB_MIN rows (2048): ltb.cu (cuBLASLt's bf16 matmul, a batch a group) */
        {{DSI_TYPE_F8_E4M3, 1024, 512, 2052, 0, 128, 4096, 1024, true}, {8, 512, 128}},
    };
    int n = (int)(sizeof(cases) / sizeof(cases[0]));
    for (int i = 0; i < n; i++) {
        if (tiny_only() && cases[i].c.rows * cases[i].c.K > (1 << 20)) continue;
        TEST_ASSERTF(run_gemm_g(&r, &cases[i].c, &cases[i].g, false), "gemm grouped case %d", i);
        TEST_ASSERTF(run_gemm_g(&r, &cases[i].c, &cases[i].g, true), "gemm grouped fast case %d",
                     i);
    }
    /* the cases from 512 rows once more on wg.cu's kernels (DSI_CUDA_WG_RS=0; wgr.cu's are the
       default from step 26), those of 64-511 rows on tc.cu with the groups never split along K
       (DSI_CUDA_TC_SPLIT_GROUPED=0; step 25), those of 128-511 rows on wgr.cu
       (DSI_CUDA_WG_DENSE_MIN=128; step 33) and on tc.cu (DSI_CUDA_WG_GROUPED_MIN=512: the
       grouped calls' threshold before step 36, whose default is 128), those from 128 rows on
       ltb.cu (DSI_CUDA_LTB_MIN=128; step 47) and those from 2048 without it */
    const struct {
        const char *env;
        int64_t nmin, nmax;
    } other[] = {{"DSI_CUDA_WG_RS=0", 512, INT64_MAX},
                 {"DSI_CUDA_TC_SPLIT_GROUPED=0,DSI_CUDA_WG_GROUPED_MIN=512", 64, 511},
                 {"DSI_CUDA_WG_DENSE_MIN=128", 128, 511},
                 {"DSI_CUDA_WG_GROUPED_MIN=512", 128, 511},
                 {"DSI_CUDA_LTB_MIN=128", 128, INT64_MAX},
                 {"DSI_CUDA_LTB_MIN=0", 2048, INT64_MAX}};
    struct dsi_backend *keep = g_gpu;
    int ok = 1;
    for (size_t b = 0; b < sizeof(other) / sizeof(other[0]) && ok; b++) {
        struct dsi_backend *g2 = cuda_backend_with(other[b].env);
        TEST_ASSERT(g2 != NULL);
        g_gpu = g2;
        for (int i = 0; i < n && ok; i++) {
            if (cases[i].c.n < other[b].nmin || cases[i].c.n > other[b].nmax ||
                (tiny_only() && cases[i].c.rows * cases[i].c.K > (1 << 20)))
                continue;
            ok = run_gemm_g(&r, &cases[i].c, &cases[i].g, true);
            if (!ok) fprintf(stderr, "[gemm grouped fast case %d with %s] ", i, other[b].env);
        }
        g_gpu = keep;
        g2->ops->free(g2);
    }
    TEST_ASSERT(ok);
    return 0;
}

int test_cuda_gemm(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 1);
    const struct gemm_case cases[] = {
        /* tiny shapes, every type, every rows-per-tile, split-K and not */
        {DSI_TYPE_BF16, 256, 128, 1, 0, 256, 0, 0, false},
        {DSI_TYPE_BF16, 256, 128, 3, 0, 256, 0, 0, true},
        {DSI_TYPE_BF16, 256, 128, 8, 0, 256, 0, 0, false},
        {DSI_TYPE_BF16, 256, 128, 17, 0, 256, 0, 0, true},
        {DSI_TYPE_F32, 24, 512, 5, 0, 24, 0, 0, false},
        {DSI_TYPE_F16, 64, 96, 2, 0, 64, 0, 0, false},
        {DSI_TYPE_F8_E4M3, 384, 256, 9, 128, 256, 0, 0, true},
        {DSI_TYPE_FP4_E2M1, 256, 128, 2, 0, 256, 0, 0, false},
        {DSI_TYPE_FP4_E2M1, 130, 2048, 33, 1, 129, 0, 0, true},
        /* split-K reduce: outputs not a multiple of 32, 385 chunks (4 staged rounds, the last
         * of one row), 256 chunks (2 full rounds) */
        {DSI_TYPE_F32, 24, 12320, 5, 0, 24, 0, 0, false},
        {DSI_TYPE_BF16, 72, 8192, 3, 0, 72, 0, 0, true},
        /* no split, 8-row tiles with a last tile of one row, a last block with 2 of 8 warps
         * holding weight rows (the others still take part in the staging barriers) */
        {DSI_TYPE_F16, 4100, 2048, 9, 0, 4100, 0, 0, false},
        /* the generic kernel: K % 32 != 0, unaligned rows */
        {DSI_TYPE_BF16, 70, 100, 4, 0, 70, 0, 0, false},
        {DSI_TYPE_F32, 33, 45, 3, 0, 33, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 256, 256, 3, 0, 256, 257, 300, false},
        /* V4-Flash shapes: wq_a, wkv, wq_b, wo_a group, wo_b, hc mix, gate, experts, head */
        {DSI_TYPE_F8_E4M3, 1024, 4096, 1, 0, 1024, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 512, 4096, 7, 0, 512, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 32768, 1024, 2, 0, 32768, 0, 0, true},
        {DSI_TYPE_F8_E4M3, 8192, 4096, 3, 1024, 1024, 32768, 8192, true},
        {DSI_TYPE_F8_E4M3, 4096, 8192, 17, 0, 4096, 0, 0, true},
        {DSI_TYPE_F32, 24, 16384, 2, 0, 24, 0, 0, false},
        {DSI_TYPE_BF16, 256, 4096, 64, 0, 256, 0, 0, false},
        {DSI_TYPE_FP4_E2M1, 2048, 4096, 3, 0, 2048, 0, 0, true},
        {DSI_TYPE_FP4_E2M1, 4096, 2048, 1, 0, 4096, 0, 0, true},
        {DSI_TYPE_BF16, 8192, 4096, 2, 0, 8192, 0, 0, false},
        /* the decode kernel (k_gemv, n <= 2): odd outputs with an offset, padded ld, K = 8192
         * and K = 16384 (split forced by its shared memory), enough pairs for no split */
        {DSI_TYPE_FP4_E2M1, 130, 2048, 1, 1, 129, 0, 0, false},
        {DSI_TYPE_F8_E4M3, 8192, 4096, 2, 1024, 1023, 32768, 8192, true},
        {DSI_TYPE_F8_E4M3, 4096, 8192, 1, 0, 4096, 0, 0, true},
        {DSI_TYPE_BF16, 96, 16384, 2, 0, 96, 0, 0, false},
        {DSI_TYPE_BF16, 65536, 256, 1, 0, 65536, 0, 0, false},
    };
    int n = (int)(sizeof(cases) / sizeof(cases[0]));
    for (int i = 0; i < n; i++) {
        if (tiny_only() && cases[i].rows * cases[i].K > (1 << 20)) continue;
        TEST_ASSERTF(run_gemm(&r, &cases[i]), "gemm case %d", i);
    }
    return 0;
}
