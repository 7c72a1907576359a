/* test_ops_cuda.c - the CUDA backend against the CPU backend (the reference), op by op on
 * random inputs at tiny and real DeepSeek-V4-Flash shapes with edge cases (the whole model:
 * test_model_cuda.c). Ops whose arithmetic has no transcendental function must be
 * bitwise equal (the CUDA kernels keep cpu_dot's order and are built without FMA contraction);
 * the others (exp, sin/cos, log1p) are held to a relative error and their differing element
 * count is printed. Outputs are poisoned (NaN bytes) before every GPU run, and whole buffers
 * (padding included) are compared, so unwritten and stray writes both show. Without a CUDA
 * device every test prints "skipped" and passes. */
#include "cuda_util.h"

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/quant.h"
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- act_quant, hadamard_q4 -------------------------------------------------------------------
 */

int test_cuda_act_quant(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 2);
    struct {
        int64_t n, dim, ldx, ldy;
        int block;
        bool inplace;
    } cs[] = {{5, 4096, 4096, 4096, 128, false},
              {7, 448, 512, 512, 64, true},
              {1, 1024, 1024, 2048, 0, false},
              {33, 2048, 2048, 2048, 128, true},
              {3, 256, 258, 256, 128, false}}; /* blocks of 128 off 16 bytes: k_act_quant */
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        int64_t nx = cs[c].n * cs[c].ldx, ny = cs[c].inplace ? nx : cs[c].n * cs[c].ldy;
        float *x = fnorm(&r, nx, 1.0f);
        int blk = cs[c].block ? cs[c].block : 128;
        for (int64_t i = 0; i < cs[c].n; i++) /* per-block magnitudes, zero, tiny, subnormal */
            for (int64_t b = 0; b < cs[c].dim / blk; b++) {
                float s = ldexpf(1.0f, rint_below(&r, 40) - 20);
                int kind = rint_below(&r, 8);
                for (int64_t e = 0; e < blk; e++) {
                    float *v = &x[i * cs[c].ldx + b * blk + e];
                    *v = kind == 0   ? 0.0f
                         : kind == 1 ? *v * 1e-7f
                         : kind == 2 ? *v * 1e-40f
                                     : *v * s;
                }
            }
        float *yc = cs[c].inplace ? malloc(sizeof(float) * (size_t)nx) : hpoison(ny);
        if (cs[c].inplace) memcpy(yc, x, sizeof(float) * (size_t)nx);
        float *yg = malloc(sizeof(float) * (size_t)ny);
        float *dx = dput(x, sizeof(float) * (size_t)nx);
        float *dy = cs[c].inplace ? dx : dpoison(sizeof(float) * (size_t)ny);
        struct dsi_act_quant_args a = {cs[c].inplace ? yc : x,
                                       yc,
                                       cs[c].n,
                                       cs[c].dim,
                                       cs[c].ldx,
                                       cs[c].inplace ? cs[c].ldx : cs[c].ldy,
                                       cs[c].block};
        g_cpu->ops->act_quant(g_cpu, &a);
        a.x = dx;
        a.y = dy;
        g_gpu->ops->act_quant(g_gpu, &a);
        TEST_ASSERT(gsync("act_quant") == 0);
        dget(yg, dy, sizeof(float) * (size_t)ny);
        TEST_ASSERT(same("act_quant", yg, yc, sizeof(float) * (size_t)ny));
        dfree(dx);
        if (!cs[c].inplace) dfree(dy);
        free(x);
        free(yc);
        free(yg);
    }
    return 0;
}

int test_cuda_hadamard_q4(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 3);
    struct {
        int64_t n, groups, dim, ldx;
    } cs[] = {/* one warp per group (step 25): dims 128-1024 on 16-byte aligned rows */
              {3, 64, 128, 8192},
              {5, 1, 128, 128},
              {2, 4, 128, 600},
              {4, 3, 256, 800},
              {2, 2, 512, 1024},
              {2, 1, 1024, 1024},
              /* a block per group: other dims, rows not on 16 bytes */
              {9, 2, 64, 128},
              {3, 1, 128, 130}};
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        int64_t nx = cs[c].n * cs[c].ldx;
        float *x = fnorm(&r, nx, 0.7f), *xg = malloc(sizeof(float) * (size_t)nx);
        float *dx = dput(x, sizeof(float) * (size_t)nx);
        struct dsi_hadamard_q4_args a = {x, cs[c].n, cs[c].groups, cs[c].dim, cs[c].ldx};
        g_cpu->ops->hadamard_q4(g_cpu, &a);
        a.x = dx;
        g_gpu->ops->hadamard_q4(g_gpu, &a);
        TEST_ASSERT(gsync("hadamard_q4") == 0);
        dget(xg, dx, sizeof(float) * (size_t)nx);
        TEST_ASSERT(same("hadamard_q4", xg, x, sizeof(float) * (size_t)nx));
        dfree(dx);
        free(x);
        free(xg);
    }
    return 0;
}

/* ---- embed, add, copy, gather
 * --------------------------------------------------------------------- */

int test_cuda_small_ops(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 4);
    /* embed: BF16 tables [1000, 4096], 4 copies (k_embed_bf16) and [1000, 100], 2 copies (the
       generic kernel: D % 8 != 0) */
    const int64_t edim[2][2] = {{4096, 4}, {100, 2}};
    for (int ei = 0; ei < 2; ei++) {
        struct wt tab;
        wt_make(&tab, &r, DSI_TYPE_BF16, 1000, edim[ei][0], 1.0f);
        int32_t tok[7] = {0, 999, 5, 5, 17, 500, 3};
        int64_t n = 7, cp = edim[ei][1], D = edim[ei][0], no = n * cp * D;
        float *oc = hpoison(no), *og = hpoison(no);
        int32_t *dtok = dput(tok, sizeof(tok));
        float *dout = dpoison(sizeof(float) * (size_t)no);
        struct dsi_embed_args ea = {&tab.h, tok, n, cp, oc, false};
        g_cpu->ops->embed(g_cpu, &ea);
        ea.table = &tab.d;
        ea.tokens = dtok;
        ea.out = dout;
        g_gpu->ops->embed(g_gpu, &ea);
        TEST_ASSERT(gsync("embed") == 0);
        dget(og, dout, sizeof(float) * (size_t)no);
        TEST_ASSERT(same("embed", og, oc, sizeof(float) * (size_t)no));
        dfree(dtok);
        dfree(dout);
        free(oc);
        free(og);
        wt_free(&tab);
    }
    /* add with strides, both roundings */
    for (int rnd = 0; rnd < 2; rnd++) {
        int64_t m = 9, dim = 4096, lda = 4100, ldb = 8192, ldy = 4096;
        float *A = fnorm(&r, m * lda, 1), *B = fnorm(&r, m * ldb, 1);
        float *yc = hpoison(m * ldy), *yg = hpoison(m * ldy);
        float *dA = dput(A, sizeof(float) * (size_t)(m * lda)),
              *dB = dput(B, sizeof(float) * (size_t)(m * ldb));
        float *dY = dpoison(sizeof(float) * (size_t)(m * ldy));
        struct dsi_add_args aa = {A, B, yc, m, dim, lda, ldb, ldy, rnd == 1};
        g_cpu->ops->add(g_cpu, &aa);
        aa.a = dA;
        aa.b = dB;
        aa.y = dY;
        g_gpu->ops->add(g_gpu, &aa);
        TEST_ASSERT(gsync("add") == 0);
        dget(yg, dY, sizeof(float) * (size_t)(m * ldy));
        TEST_ASSERT(same("add", yg, yc, sizeof(float) * (size_t)(m * ldy)));
        /* copy: rows of A into Y */
        struct dsi_copy_args ca = {A, yc, m, 1000, lda, ldy};
        g_cpu->ops->copy(g_cpu, &ca);
        ca.src = dA;
        ca.dst = dY;
        g_gpu->ops->copy(g_gpu, &ca);
        TEST_ASSERT(gsync("copy") == 0);
        dget(yg, dY, sizeof(float) * (size_t)(m * ldy));
        TEST_ASSERT(same("copy", yg, yc, sizeof(float) * (size_t)(m * ldy)));
        dfree(dA);
        dfree(dB);
        dfree(dY);
        free(A);
        free(B);
        free(yc);
        free(yg);
    }
    /* gather */
    int64_t dim = 16384, ns = 6;
    float *src = fnorm(&r, ns * dim, 1), *gc = hpoison(4 * dim), *gg = hpoison(4 * dim);
    int32_t idx[4] = {5, 0, 5, 2};
    float *dsrc = dput(src, sizeof(float) * (size_t)(ns * dim)),
          *ddst = dpoison(sizeof(float) * (size_t)(4 * dim));
    int32_t *didx = dput(idx, sizeof(idx));
    struct dsi_gather_args ga = {src, idx, gc, 4, dim, false};
    g_cpu->ops->gather(g_cpu, &ga);
    ga.src = dsrc;
    ga.idx = didx;
    ga.dst = ddst;
    g_gpu->ops->gather(g_gpu, &ga);
    TEST_ASSERT(gsync("gather") == 0);
    dget(gg, ddst, sizeof(float) * (size_t)(4 * dim));
    TEST_ASSERT(same("gather", gg, gc, sizeof(float) * (size_t)(4 * dim)));
    dfree(dsrc);
    dfree(ddst);
    dfree(didx);
    free(src);
    free(gc);
    free(gg);
    return 0;
}

/* ---- rms_norm, rope
 * ---------------------------------------------------------------------------------- */

int test_cuda_rms_norm(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 5);
    struct {
        int64_t n, groups, dim, ldx, ldy;
        int wtype; /* -1: no weight */
        bool round, inplace;
    } cs[] = {
        {1, 1, 4096, 4096, 4096, DSI_TYPE_BF16, true, false},
        {7, 1, 4096, 4096, 4096, DSI_TYPE_BF16, false, false},
        {5, 1, 1024, 1024, 1024, DSI_TYPE_BF16, true, true},
        {3, 64, 512, 32768, 32768, -1, true, true},
        {3, 64, 512, 32768, 32768, -1, false, true},
        {11, 1, 512, 512, 512, DSI_TYPE_F32, true, false},
        {4, 1, 128, 256, 128, DSI_TYPE_BF16, true, false},
        {16, 1, 4096, 4096, 4096, DSI_TYPE_BF16, true, true},
        {9, 2, 2048, 4096, 4100, DSI_TYPE_F32, false, false},
        {2, 2, 8192, 16384, 16388, DSI_TYPE_F32, true, false}, /* k_rms_norm_blk<8> */
        {3, 1, 4096, 4097, 4099, DSI_TYPE_BF16, false, false}, /* unaligned: k_rms_norm */
    };
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        int64_t nx = cs[c].n * cs[c].ldx, ny = cs[c].inplace ? nx : cs[c].n * cs[c].ldy;
        float *x = fnorm(&r, nx, 3.0f);
        float *wv = fnorm(&r, cs[c].dim, 0.1f);
        for (int64_t i = 0; i < cs[c].dim; i++)
            wv[i] += 1.0f;
        struct wt w;
        if (cs[c].wtype >= 0) vec_make(&w, wv, cs[c].dim, (enum dsi_type)cs[c].wtype);
        float *yc = cs[c].inplace ? malloc(sizeof(float) * (size_t)nx) : hpoison(ny);
        if (cs[c].inplace) memcpy(yc, x, sizeof(float) * (size_t)nx);
        float *yg = malloc(sizeof(float) * (size_t)ny);
        float *dx = dput(x, sizeof(float) * (size_t)nx);
        float *dy = cs[c].inplace ? dx : dpoison(sizeof(float) * (size_t)ny);
        struct dsi_rms_norm_args a = {.x = cs[c].inplace ? yc : x,
                                      .y = yc,
                                      .n = cs[c].n,
                                      .n_groups = cs[c].groups,
                                      .dim = cs[c].dim,
                                      .ldx = cs[c].ldx,
                                      .ldy = cs[c].inplace ? cs[c].ldx : cs[c].ldy,
                                      .w = cs[c].wtype >= 0 ? &w.h : NULL,
                                      .eps = 1e-6f,
                                      .round_bf16 = cs[c].round};
        /* one group of whole 128-blocks: also the act_quant copy (yq), as the forward asks */
        bool q = cs[c].groups == 1 && cs[c].dim % 128 == 0;
        int64_t nq = cs[c].n * cs[c].dim;
        float *qc = q ? hpoison(nq) : NULL, *qg = q ? malloc(sizeof(float) * (size_t)nq) : NULL;
        float *dq = q ? dpoison(sizeof(float) * (size_t)nq) : NULL;
        a.yq = qc;
        g_cpu->ops->rms_norm(g_cpu, &a);
        a.x = dx;
        a.y = dy;
        a.w = cs[c].wtype >= 0 ? &w.d : NULL;
        a.yq = dq;
        g_gpu->ops->rms_norm(g_gpu, &a);
        TEST_ASSERT(gsync("rms_norm") == 0);
        dget(yg, dy, sizeof(float) * (size_t)ny);
        TEST_ASSERT(close_to("rms_norm", yg, yc, ny, 1e-6));
        if (q) { /* bit for bit the CPU's act_quant of the GPU's own y (y itself: within 1e-6) */
            dget(qg, dq, sizeof(float) * (size_t)nq);
            int64_t ldy = cs[c].inplace ? cs[c].ldx : cs[c].ldy;
            struct dsi_act_quant_args aq = {yg, qc, cs[c].n, cs[c].dim, ldy, cs[c].dim, 128};
            g_cpu->ops->act_quant(g_cpu, &aq);
            TEST_ASSERTF(same("rms_norm yq", qg, qc, sizeof(float) * (size_t)nq),
                         "rms_norm case %zu: quantised copy", c);
            dfree(dq);
            free(qc);
            free(qg);
        }
        dfree(dx);
        if (!cs[c].inplace) dfree(dy);
        free(x);
        free(wv);
        free(yc);
        free(yg);
        if (cs[c].wtype >= 0) wt_free(&w);
    }
    return 0;
}

/* rms_norm with the RoPE and quantisation after it (rope_dim, q_dim: the forward's q-head and KV
 * norms): without q_dim within 1e-6 of the CPU's op (its norm, then its rope); with it bit for
 * bit the GPU's own ops one by one (norm, rope, act_quant; a norm output a last bit off the CPU's
 * can round to another e4m3 value, so the CPU comparison stops before the quantisation). With
 * DSI_CUDA_NORM_RQ=1 dims 128 / 512 / 1024 take the fused warp kernel, 256 the separate
 * launches. */
static int norm_rope_cases(struct test_ctx *t) {
    struct rng r = rng_of(t, 15);
    struct {
        int64_t n, groups, dim, ld;
        int wtype, rope, qd, qb;
        bool round;
    } cs[] = {
        {3, 64, 512, 32768, -1, 64, 0, 0, true}, /* the q heads */
        {1, 64, 512, 32768, -1, 64, 0, 0, false},
        {1, 1, 512, 512, DSI_TYPE_BF16, 64, 448, 64, true}, /* KV */
        {6, 1, 512, 512, DSI_TYPE_F32, 64, 448, 64, false},
        {2, 1, 1024, 1024, DSI_TYPE_BF16, 64, 896, 128, true}, /* 128-blocks */
        {5, 2, 128, 260, -1, 32, 0, 0, true},                  /* ld past the groups */
        {3, 1, 256, 256, DSI_TYPE_BF16, 32, 192, 64, true},    /* separate launches */
        {2, 4, 256, 1024, -1, 64, 0, 0, false},
    };
    float freq[32];
    for (int i = 0; i < 32; i++)
        freq[i] = powf(10000.0f, -(float)i / 32.0f);
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        int64_t n = cs[c].n, nx = n * cs[c].ld, D = cs[c].dim;
        float *x = fnorm(&r, nx, 3.0f), *wv = fnorm(&r, D, 0.1f);
        for (int64_t i = 0; i < D; i++)
            wv[i] += 1.0f;
        int32_t pos[8];
        for (int64_t i = 0; i < n; i++)
            pos[i] = rint_below(&r, 70000);
        int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)n);
        struct wt w;
        if (cs[c].wtype >= 0) vec_make(&w, wv, D, (enum dsi_type)cs[c].wtype);
        float *yc = malloc(sizeof(float) * (size_t)nx), *yg = malloc(sizeof(float) * (size_t)nx),
              *ys = malloc(sizeof(float) * (size_t)nx);
        memcpy(yc, x, sizeof(float) * (size_t)nx);
        float *dx = dput(x, sizeof(float) * (size_t)nx), *dx2 = dput(x, sizeof(float) * (size_t)nx);
        struct dsi_rms_norm_args a = {.x = yc,
                                      .y = yc,
                                      .n = n,
                                      .n_groups = cs[c].groups,
                                      .dim = D,
                                      .ldx = cs[c].ld,
                                      .ldy = cs[c].ld,
                                      .w = cs[c].wtype >= 0 ? &w.h : NULL,
                                      .eps = 1e-6f,
                                      .round_bf16 = cs[c].round,
                                      .rope_dim = cs[c].rope,
                                      .pos = pos,
                                      .freq = freq};
        g_cpu->ops->rms_norm(g_cpu, &a); /* without the quantisation */
        a.x = a.y = dx;
        a.w = cs[c].wtype >= 0 ? &w.d : NULL;
        a.pos = dpos;
        g_gpu->ops->rms_norm(g_gpu, &a);
        TEST_ASSERT(gsync("rms_norm+rope") == 0);
        dget(yg, dx, sizeof(float) * (size_t)nx);
        TEST_ASSERTF(close_to("rms_norm+rope", yg, yc, nx, 1e-6), "case %zu", c);
        if (cs[c].qd > 0) { /* fused vs the GPU's ops one by one, bitwise */
            dfree(dx);
            dx = dput(x, sizeof(float) * (size_t)nx);
            a.x = a.y = dx;
            a.q_dim = cs[c].qd;
            a.q_block = cs[c].qb;
            g_gpu->ops->rms_norm(g_gpu, &a);
            struct dsi_rms_norm_args b = a;
            b.x = b.y = dx2;
            b.rope_dim = 0;
            b.q_dim = 0;
            g_gpu->ops->rms_norm(g_gpu, &b);
            struct dsi_rope_args ra = {.x = dx2,
                                       .n = n,
                                       .ldx = cs[c].ld,
                                       .n_heads = cs[c].groups,
                                       .head_stride = D,
                                       .width = (int)D,
                                       .rope_dim = cs[c].rope,
                                       .pos = dpos,
                                       .freq = freq,
                                       .inverse = false,
                                       .round_bf16 = cs[c].round};
            g_gpu->ops->rope(g_gpu, &ra);
            struct dsi_act_quant_args q = {dx2, dx2, n, cs[c].qd, cs[c].ld, cs[c].ld, cs[c].qb};
            g_gpu->ops->act_quant(g_gpu, &q);
            TEST_ASSERT(gsync("rms_norm+rope+quant") == 0);
            dget(yg, dx, sizeof(float) * (size_t)nx);
            dget(ys, dx2, sizeof(float) * (size_t)nx);
            TEST_ASSERTF(same("rms_norm+rope+quant", yg, ys, sizeof(float) * (size_t)nx),
                         "case %zu", c);
        }
        dfree(dx);
        dfree(dx2);
        dfree(dpos);
        free(x);
        free(wv);
        free(yc);
        free(yg);
        free(ys);
        if (cs[c].wtype >= 0) wt_free(&w);
    }
    return 0;
}

/* on the default backend (the norm, then the rope and act_quant launches), then with the fused
 * kernels (DSI_CUDA_NORM_RQ=1; off by default) */
int test_cuda_norm_rope(struct test_ctx *t) {
    NEED_GPU();
    TEST_ASSERT(norm_rope_cases(t) == 0);
    struct dsi_backend *rq = cuda_backend_with("DSI_CUDA_NORM_RQ=1"), *keep = g_gpu;
    TEST_ASSERT(rq != NULL);
    g_gpu = rq;
    int rc = norm_rope_cases(t);
    g_gpu = keep;
    rq->ops->free(rq);
    TEST_ASSERT(rc == 0);
    return 0;
}

int test_cuda_rope(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 6);
    float freq[32];
    for (int i = 0; i < 32; i++)
        freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 64.0f);
    float *dfreq = dput(freq, sizeof(freq));
    struct {
        int64_t n, heads, stride, ldx;
        int width;
        bool inverse, round, dev_freq;
    } cs[] = {{9, 64, 512, 32768, 512, false, true, false},
              {9, 64, 512, 32768, 512, true, true, true},
              {5, 1, 512, 512, 512, false, false, false},
              {3, 64, 128, 8192, 128, false, true, false},
              {1, 4, 128, 512, 128, true, false, false},
              /* head groups (steps 25-26): 1-2 heads a thread; all 20 heads in one thread, in
                 rounds of 8, 8 and 4 */
              {300, 16, 128, 2048, 128, false, false, true},
              {1100, 8, 128, 1024, 128, true, true, false},
              {4100, 20, 128, 2560, 128, false, false, false}};
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        int64_t nx = cs[c].n * cs[c].ldx;
        float *x = fnorm(&r, nx, 1.0f), *xg = malloc(sizeof(float) * (size_t)nx);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)cs[c].n);
        for (int64_t i = 0; i < cs[c].n; i++)
            pos[i] = i == 0 ? 0 : i % 2 ? rint_below(&r, 1 << 20) : rint_below(&r, 5000);
        float *dx = dput(x, sizeof(float) * (size_t)nx);
        int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)cs[c].n);
        struct dsi_rope_args a = {.x = x,
                                  .n = cs[c].n,
                                  .ldx = cs[c].ldx,
                                  .n_heads = cs[c].heads,
                                  .head_stride = cs[c].stride,
                                  .width = cs[c].width,
                                  .rope_dim = 64,
                                  .pos = pos,
                                  .freq = freq,
                                  .inverse = cs[c].inverse,
                                  .round_bf16 = cs[c].round};
        g_cpu->ops->rope(g_cpu, &a);
        a.x = dx;
        a.pos = dpos;
        a.freq = cs[c].dev_freq ? dfreq : freq; /* the forward passes its host table */
        g_gpu->ops->rope(g_gpu, &a);
        TEST_ASSERT(gsync("rope") == 0);
        dget(xg, dx, sizeof(float) * (size_t)nx);
        TEST_ASSERT(close_to("rope", xg, x, nx, cs[c].round ? 1e-2 : 1e-6));
        dfree(dx);
        dfree(dpos);
        free(x);
        free(xg);
        free(pos);
    }
    dfree(dfreq);
    return 0;
}

/* ---- a step over cached sequences
 * ----------------------------------------------------------------- */

struct scen {
    int n, S, MP, PT, ring_cap, window;
    int32_t *tokens, *pos, *slot, *row0, *pt;
    void *d_tokens, *d_pos, *d_slot, *d_row0, *d_pt;
    struct dsi_step hst, dst;
};

/* Sequences q = 0..nseq-1 in slots slot_of[q] with rows at positions start[q] .. +len[q]-1. */
static void scen_make(struct scen *s,
                      struct rng *r,
                      int window,
                      int PT,
                      int MP,
                      int S,
                      const int *start,
                      const int *len,
                      int nseq) {
    memset(s, 0, sizeof(*s));
    int n = 0, maxlen = 1;
    for (int q = 0; q < nseq; q++) {
        n += len[q];
        if (len[q] > maxlen) maxlen = len[q];
    }
    s->n = n;
    s->S = S;
    s->MP = MP;
    s->PT = PT;
    s->window = window;
    s->ring_cap = window - 1 + maxlen;
    s->tokens = malloc(sizeof(int32_t) * (size_t)n);
    s->pos = malloc(sizeof(int32_t) * (size_t)n);
    s->slot = malloc(sizeof(int32_t) * (size_t)n);
    s->row0 = malloc(sizeof(int32_t) * (size_t)n);
    s->pt = malloc(sizeof(int32_t) * (size_t)(S * MP));
    for (int i = 0; i < S * MP; i++)
        s->pt[i] = i;
    for (int i = S * MP - 1; i > 0; i--) { /* random page assignment */
        int j = rint_below(r, i + 1), tmp = s->pt[i];
        s->pt[i] = s->pt[j];
        s->pt[j] = tmp;
    }
    int row = 0;
    for (int q = 0; q < nseq; q++) {
        int slot = (q * 7 + 3) % S;
        for (int j = 0; j < len[q]; j++, row++) {
            s->tokens[row] = rint_below(r, 1000);
            s->pos[row] = start[q] + j;
            s->slot[row] = slot;
            s->row0[row] = row - j;
        }
    }
    s->d_tokens = dput(s->tokens, sizeof(int32_t) * (size_t)n);
    s->d_pos = dput(s->pos, sizeof(int32_t) * (size_t)n);
    s->d_slot = dput(s->slot, sizeof(int32_t) * (size_t)n);
    s->d_row0 = dput(s->row0, sizeof(int32_t) * (size_t)n);
    s->d_pt = dput(s->pt, sizeof(int32_t) * (size_t)(S * MP));
    s->hst = (struct dsi_step){n,     s->tokens, s->pos, s->slot,     s->row0,
                               s->pt, MP,        PT,     s->ring_cap, window};
    s->dst = (struct dsi_step){n,       s->d_tokens, s->d_pos, s->d_slot,   s->d_row0,
                               s->d_pt, MP,          PT,       s->ring_cap, window};
}

static void scen_free(struct scen *s) {
    free(s->tokens);
    free(s->pos);
    free(s->slot);
    free(s->row0);
    free(s->pt);
    dfree(s->d_tokens);
    dfree(s->d_pos);
    dfree(s->d_slot);
    dfree(s->d_row0);
    dfree(s->d_pt);
}

/* entry_store into FP8 / FP4 rows (over random bytes, so that stray writes show): the CPU's and
 * the GPU's bytes, data and scales, the same. */
static int entry_storeq(struct rng *r,
                        int dtype,
                        const struct scen *s,
                        const int32_t *emit,
                        const int32_t *entry,
                        const int32_t *demit,
                        const int32_t *dentry,
                        int ne,
                        int R,
                        const float *src,
                        const float *dsrc,
                        int64_t W,
                        int64_t rows) {
    int rope = dtype == DSI_KV_FP8 ? 64 : 0;
    int64_t rb = dsi_kv_row_bytes(dtype, (int)W, rope), sb = dsi_kv_sc_bytes(dtype, (int)W, rope);
    size_t nb = (size_t)(rows * (rb + sb));
    float *junk = fnorm(r, (int64_t)nb / 4 + 1, 1);
    uint8_t *h = malloc(nb), *g = malloc(nb);
    memcpy(h, junk, nb);
    uint8_t *d = dput(h, nb);
    struct dsi_kv_rows hk = {h, h + rows * rb, dtype, (int)W, rope};
    struct dsi_kv_rows dk = {d, d + rows * rb, dtype, (int)W, rope};
    struct dsi_entry_store_args es = {&s->hst, emit, entry, ne, R, src, W, hk};
    g_cpu->ops->entry_store(g_cpu, &es);
    es = (struct dsi_entry_store_args){&s->dst, demit, dentry, ne, R, dsrc, W, dk};
    g_gpu->ops->entry_store(g_gpu, &es);
    int ok = gsync("entry_store fp8/fp4") == 0;
    dget(g, d, nb);
    ok = ok && same(dtype == DSI_KV_FP8 ? "entry_store fp8" : "entry_store fp4", g, h, nb);
    dfree(d);
    free(h);
    free(g);
    free(junk);
    return ok;
}

int test_cuda_cache_ops(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 8);
    /* seq A from 0 (emits inside the step), B continuing from 5 (earlier tokens in the slots),
     * C at an HCA boundary, D a decode row closing a CSA window. */
    const int start[] = {0, 5, 126, 303}, len[] = {9, 3, 3, 1};
    struct scen s;
    scen_make(&s, &r, 128, 256, 2, 5, start, len, 4);
    int n = s.n;
    /* kv_store */
    int64_t hd = 512, nring = (int64_t)s.S * s.ring_cap * hd;
    float *ring = fnorm(&r, nring, 1), *ringg = malloc(sizeof(float) * (size_t)nring);
    float *kv = fnorm(&r, n * hd, 1);
    float *dring = dput(ring, sizeof(float) * (size_t)nring),
          *dkv = dput(kv, sizeof(float) * (size_t)(n * hd));
    struct dsi_kv_store_args ks = {&s.hst, kv, hd, dsi_kv_rows_f32(ring, (int)hd)};
    g_cpu->ops->kv_store(g_cpu, &ks);
    ks = (struct dsi_kv_store_args){&s.dst, dkv, hd, dsi_kv_rows_f32(dring, (int)hd)};
    g_gpu->ops->kv_store(g_gpu, &ks);
    TEST_ASSERT(gsync("kv_store") == 0);
    dget(ringg, dring, sizeof(float) * (size_t)nring);
    TEST_ASSERT(same("kv_store", ringg, ring, sizeof(float) * (size_t)nring));
    { /* FP8 rows (any values: the same bytes), over random bytes */
        int64_t rows = nring / hd, rb = dsi_kv_row_bytes(DSI_KV_FP8, (int)hd, 64);
        size_t nb = (size_t)(rows * (rb + dsi_kv_sc_bytes(DSI_KV_FP8, (int)hd, 64)));
        uint8_t *h = malloc(nb), *g = malloc(nb);
        memcpy(h, ring, nb); /* ring: random floats, more bytes than nb */
        uint8_t *d = dput(h, nb);
        struct dsi_kv_rows hk = {h, h + rows * rb, DSI_KV_FP8, (int)hd, 64};
        struct dsi_kv_rows dk = {d, d + rows * rb, DSI_KV_FP8, (int)hd, 64};
        ks = (struct dsi_kv_store_args){&s.hst, kv, hd, hk};
        g_cpu->ops->kv_store(g_cpu, &ks);
        ks = (struct dsi_kv_store_args){&s.dst, dkv, hd, dk};
        g_gpu->ops->kv_store(g_gpu, &ks);
        TEST_ASSERT(gsync("kv_store fp8") == 0);
        dget(g, d, nb);
        TEST_ASSERT(same("kv_store fp8", g, h, nb));
        dfree(d);
        free(h);
        free(g);
    }
    dfree(dring);
    dfree(dkv);
    free(ring);
    free(ringg);
    free(kv);
    /* compressors: CSA (overlap) main and indexer widths, HCA, a small non-overlap ratio */
    struct {
        int ratio, width;
        bool overlap;
    } cs[] = {{4, 512, true}, {4, 128, true}, {128, 512, false}, {8, 128, false}};
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        int R = cs[c].ratio, W = cs[c].width, n_slots = cs[c].overlap ? 2 * R : R;
        int64_t sw = (cs[c].overlap ? 2 : 1) * (int64_t)W, nsl = (int64_t)s.S * n_slots * sw;
        float *a = fnorm(&r, n * sw, 1), *b = fnorm(&r, n * sw, 1),
              *bg = malloc(sizeof(float) * (size_t)(n * sw));
        float *sa = fnorm(&r, nsl, 1), *sb = fnorm(&r, nsl, 1);
        float *apev = fnorm(&r, (int64_t)R * sw, 0.5f);
        struct wt ape;
        vec_make(&ape, apev, (int64_t)R * sw, DSI_TYPE_F32);
        float *da = dput(a, sizeof(float) * (size_t)(n * sw)),
              *db = dput(b, sizeof(float) * (size_t)(n * sw));
        float *dsa = dput(sa, sizeof(float) * (size_t)nsl),
              *dsb = dput(sb, sizeof(float) * (size_t)nsl);
        struct dsi_comp_ape_args ap = {&s.hst, b, sw, &ape.h, R};
        g_cpu->ops->comp_ape(g_cpu, &ap);
        ap = (struct dsi_comp_ape_args){&s.dst, db, sw, &ape.d, R};
        g_gpu->ops->comp_ape(g_gpu, &ap);
        TEST_ASSERT(gsync("comp_ape") == 0);
        dget(bg, db, sizeof(float) * (size_t)(n * sw));
        TEST_ASSERT(same("comp_ape", bg, b, sizeof(float) * (size_t)(n * sw)));
        /* emitted rows and slot stores, as the forward builds them */
        int32_t emit[64], entry[64];
        uint8_t store[64];
        int ne = 0;
        for (int i = 0; i < n; i++) {
            int last = i;
            while (last + 1 < n && s.slot[last + 1] == s.slot[i])
                last++;
            store[i] = s.pos[i] > s.pos[last] - n_slots;
            if ((s.pos[i] + 1) % R == 0) {
                emit[ne] = i;
                entry[ne++] = (s.pos[i] + 1) / R - 1;
            }
        }
        TEST_ASSERT(ne > 0);
        int32_t *demit = dput(emit, sizeof(int32_t) * (size_t)ne),
                *dentry = dput(entry, sizeof(int32_t) * (size_t)ne);
        uint8_t *dstore = dput(store, (size_t)n);
        float *oc = hpoison((int64_t)ne * W), *og = hpoison((int64_t)ne * W);
        float *dout = dpoison(sizeof(float) * (size_t)ne * (size_t)W);
        struct dsi_compress_args ca = {&s.hst, emit,          ne, a, b, sa, sb, n_slots, R,
                                       W,      cs[c].overlap, oc};
        g_cpu->ops->compress(g_cpu, &ca);
        ca = (struct dsi_compress_args){&s.dst, demit,         ne,  da, db, dsa, dsb, n_slots, R,
                                        W,      cs[c].overlap, dout};
        g_gpu->ops->compress(g_gpu, &ca);
        TEST_ASSERT(gsync("compress") == 0);
        dget(og, dout, sizeof(float) * (size_t)ne * (size_t)W);
        TEST_ASSERT(close_to("compress", og, oc, (int64_t)ne * W, 1e-5));
        /* entry_store into a paged pool */
        int64_t per_page = s.PT / R, npool = (int64_t)s.S * s.MP * per_page * W;
        float *pool = fnorm(&r, npool, 1), *poolg = malloc(sizeof(float) * (size_t)npool);
        float *dpool = dput(pool, sizeof(float) * (size_t)npool);
        float *dsrc = dput(oc, sizeof(float) * (size_t)ne * (size_t)W);
        struct dsi_entry_store_args es = {&s.hst, emit, entry, ne,
                                          R,      oc,   W,     dsi_kv_rows_f32(pool, (int)W)};
        g_cpu->ops->entry_store(g_cpu, &es);
        es = (struct dsi_entry_store_args){&s.dst, demit, dentry, ne,
                                           R,      dsrc,  W,      dsi_kv_rows_f32(dpool, (int)W)};
        g_gpu->ops->entry_store(g_gpu, &es);
        TEST_ASSERT(gsync("entry_store") == 0);
        dget(poolg, dpool, sizeof(float) * (size_t)npool);
        TEST_ASSERT(same("entry_store", poolg, pool, sizeof(float) * (size_t)npool));
        if (dsi_kv_fp8_ok((int)W, 64)) /* FP8 rows (any values: the same bytes) */
            TEST_ASSERT(entry_storeq(&r, DSI_KV_FP8, &s, emit, entry, demit, dentry, ne, R, oc,
                                     dsrc, W, npool / W));
        if (dsi_kv_fp4_ok((int)W)) /* FP4 rows */
            TEST_ASSERT(entry_storeq(&r, DSI_KV_FP4, &s, emit, entry, demit, dentry, ne, R, oc,
                                     dsrc, W, npool / W));
        /* comp_store */
        float *sag = malloc(sizeof(float) * (size_t)nsl),
              *sbg = malloc(sizeof(float) * (size_t)nsl);
        struct dsi_comp_store_args cst = {&s.hst, store, a, b, sa, sb, n_slots, sw};
        g_cpu->ops->comp_store(g_cpu, &cst);
        cst = (struct dsi_comp_store_args){&s.dst, dstore, da, db, dsa, dsb, n_slots, sw};
        g_gpu->ops->comp_store(g_gpu, &cst);
        TEST_ASSERT(gsync("comp_store") == 0);
        dget(sag, dsa, sizeof(float) * (size_t)nsl);
        dget(sbg, dsb, sizeof(float) * (size_t)nsl);
        TEST_ASSERT(same("comp_store a", sag, sa, sizeof(float) * (size_t)nsl));
        TEST_ASSERT(same("comp_store b", sbg, sb, sizeof(float) * (size_t)nsl));
        dfree(da);
        dfree(db);
        dfree(dsa);
        dfree(dsb);
        dfree(demit);
        dfree(dentry);
        dfree(dstore);
        dfree(dout);
        dfree(dpool);
        dfree(dsrc);
        free(a);
        free(b);
        free(bg);
        free(sa);
        free(sb);
        free(sag);
        free(sbg);
        free(apev);
        free(oc);
        free(og);
        free(pool);
        free(poolg);
        wt_free(&ape);
    }
    scen_free(&s);
    return 0;
}

/* ---- attention
 * ------------------------------------------------------------------------------------ */

struct attn_case {
    int H, hd, window, ratio, topk;
    bool use_sel, reference;
    int nseq;
    int start[6], len[6];
    bool fast; /* `fast` numerics (reference rounding, tensor cores from 128 rows): q and the
                  keys bf16 values, as the forward makes them */
};

static void round_bf16_all(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = dsi_bf16_round(x[i]);
}

/* run_attn with FP8 cache rows (g_attn_fp8): the keys made [QAT] values (nope dims Q8 over
 * 64-blocks, the 64 rope dims bf16), stored in the FP8 format by the CPU's cpu_kv_row_put, the
 * same bytes on both backends. */
static int g_attn_fp8;
#define ATTN_ROPE 64

/* rows of hd values -> host FP8 rows (data, scales), returned with their device copies */
static struct dsi_kv_rows attn_rows8(float *v, int64_t rows, int hd, struct dsi_kv_rows *dev) {
    int64_t rb = dsi_kv_row_bytes(DSI_KV_FP8, hd, ATTN_ROPE),
            sb = dsi_kv_sc_bytes(DSI_KV_FP8, hd, ATTN_ROPE);
    struct dsi_kv_rows h = {malloc((size_t)(rows * rb)), malloc((size_t)(rows * sb)), DSI_KV_FP8,
                            hd, ATTN_ROPE};
    for (int64_t i = 0; i < rows; i++) {
        dsi_q8_roundtrip(v + i * hd, hd - ATTN_ROPE, 64);
        for (int d = hd - ATTN_ROPE; d < hd; d++)
            v[i * hd + d] = dsi_bf16_round(v[i * hd + d]);
        cpu_kv_row_put(&h, i, v + i * hd);
    }
    *dev = h;
    dev->data = dput(h.data, (size_t)(rows * rb));
    dev->sc = dput(h.sc, (size_t)(rows * sb));
    return h;
}

/* run_attn as the forward calls the op (g_attn_qn): q un-normalised with attn's q_norm (the
 * q-head norm and RoPE) and out_rope (the inverse RoPE of the output): the CPU's op (its norm,
 * its attention, its rope) against the GPU's (the norm and rope launches, or the fused kernel's
 * staging of q and writes of out); with g_attn_alt also that backend's output, bit for bit the
 * GPU's (the fused paths have the norm and rope kernels' arithmetic). */
static int g_attn_qn;
static struct dsi_backend *g_attn_alt;
/* run_attn: with out_to_gemm, then a grouped gemm of out (x_from_attn: the forward's wo_a) on
   g_gpu and on g_attn_alt, whose results must be equal bit for bit */
static int g_attn_o16;
/* with g_attn_o16: g_gpu writes out itself (DSI_CUDA_ATTN_OSKIP=0), so it is checked too; else
   g_gpu may leave it unwritten (dsi_attn_args.out_gemm), and the CPU checks g_attn_alt's out */
static int g_attn_o16_out;

/* run_attn's q made by a gemm (wq_b's role: FP8 weights [H hd][512] on act_quant's rows of 512)
   with y_to_attn, on be into dq (n rows of cols) */
static void attn_q16_gemm(struct dsi_backend *be,
                          const struct wt *w,
                          const float *dx,
                          int64_t n,
                          int64_t cols,
                          float *dq) {
    struct dsi_gemm_args ga = {.w = &w->d,
                               .n_out = cols,
                               .x = dx,
                               .n = n,
                               .ldx = 512,
                               .y = dq,
                               .ldy = cols,
                               .round_bf16 = true,
                               .fast = true,
                               .x_fp8 = true,
                               .y_to_attn = true};
    be->ops->gemm(be, &ga);
}

/* The grouped output projection of run_attn's out (n rows of H hd): groups of 4096 columns (of
   256 where H hd < 4096), 64 output rows each, FP8 weights; y [n][groups 64]. */
static struct dsi_gemm_args
attn_o16_args(const struct wt *w, float *dout, int64_t n, int64_t cols, float *dy) {
    int64_t gx = cols >= 4096 ? 4096 : 256;
    struct dsi_gemm_args ga = {.w = &w->d,
                               .n_out = 64,
                               .x = dout,
                               .n = n,
                               .ldx = cols,
                               .y = dy,
                               .ldy = cols / gx * 64,
                               .round_bf16 = true,
                               .fast = true,
                               .groups = (int)(cols / gx),
                               .gx = gx,
                               .gy = 64,
                               .x_from_attn = true};
    return ga;
}

static int run_attn(struct rng *r, const struct attn_case *ac) {
    int maxpos = 0;
    for (int q = 0; q < ac->nseq; q++)
        if (ac->start[q] + ac->len[q] > maxpos) maxpos = ac->start[q] + ac->len[q];
    int PT = 256, MP = maxpos / PT + 1, S = ac->nseq + 1;
    struct scen s;
    scen_make(&s, r, ac->window, PT, MP, S, ac->start, ac->len, ac->nseq);
    int n = s.n, H = ac->H, hd = ac->hd;
    int64_t nring = (int64_t)S * s.ring_cap * hd;
    float *ring = fnorm(r, nring, 1), *q = fnorm(r, (int64_t)n * H * hd, 0.3f);
    if (ac->fast) {
        round_bf16_all(ring, nring);
        round_bf16_all(q, (int64_t)n * H * hd);
    }
    /* g_attn_o16: q as wq_b's gemm leaves it (y_to_attn), made on g_attn_alt (y written) for the
       CPU, then again on g_gpu right before its attention (q_from_gemm) */
    int64_t cols = (int64_t)H * hd;
    bool q16 = g_attn_o16 && g_attn_alt && ac->fast && cols % 512 == 0;
    struct wt wq = {0};
    float *dxq = NULL;
    if (q16) {
        float *xq = fnorm(r, (int64_t)n * 512, 1.0f);
        struct dsi_act_quant_args aq = {xq, xq, n, 512, 512, 512, 128};
        g_cpu->ops->act_quant(g_cpu, &aq);
        wt_make(&wq, r, DSI_TYPE_F8_E4M3, cols, 512, 0.05f);
        dxq = dput(xq, sizeof(float) * (size_t)n * 512);
        free(xq);
        float *dqt = dpoison(sizeof(float) * (size_t)(n * cols));
        attn_q16_gemm(g_attn_alt, &wq, dxq, n, cols, dqt);
        if (gsync_on(g_attn_alt, "attn: q's gemm (other backend)") != 0) q16 = false;
        dget(q, dqt, sizeof(float) * (size_t)(n * cols));
        dfree(dqt);
    }
    struct dsi_kv_rows hr8 = {0}, dr8 = {0}, he8 = {0}, de8 = {0};
    if (g_attn_fp8) hr8 = attn_rows8(ring, nring / hd, hd, &dr8);
    float *dring = dput(ring, sizeof(float) * (size_t)nring),
          *dq = dput(q, sizeof(float) * (size_t)n * H * hd);
    float *ent = NULL, *dent = NULL;
    int64_t nent = 0;
    if (ac->ratio) {
        nent = (int64_t)S * MP * (PT / ac->ratio) * hd;
        ent = fnorm(r, nent, 1);
        if (ac->fast) round_bf16_all(ent, nent);
        if (g_attn_fp8) he8 = attn_rows8(ent, nent / hd, hd, &de8);
        dent = dput(ent, sizeof(float) * (size_t)nent);
    }
    int32_t *sel = NULL, *nsel = NULL, *dsel = NULL, *dnsel = NULL;
    if (ac->use_sel) {
        sel = malloc(sizeof(int32_t) * (size_t)n * ac->topk);
        nsel = malloc(sizeof(int32_t) * (size_t)n);
        memset(sel, 0xff, sizeof(int32_t) * (size_t)n * ac->topk);
        for (int i = 0; i < n; i++) {
            int vis = (s.pos[i] + 1) / ac->ratio, mk = vis < ac->topk ? vis : ac->topk;
            int k = i % 4 == 0 ? 0 : i % 4 == 1 ? mk : mk ? rint_below(r, mk + 1) : 0;
            if (i % 4 == 3 && mk) k = 1;
            nsel[i] = k;
            int c = 0; /* ascending random subset of size k of [0, vis) */
            for (int e = 0; e < vis && c < k; e++)
                if (rint_below(r, vis - e) < k - c) sel[(int64_t)i * ac->topk + c++] = e;
        }
        dsel = dput(sel, sizeof(int32_t) * (size_t)n * ac->topk);
        dnsel = dput(nsel, sizeof(int32_t) * (size_t)n);
    }
    float *sv = fnorm(r, H, 0.5f);
    struct wt sinks;
    vec_make(&sinks, sv, H, DSI_TYPE_F32);
    int64_t no = (int64_t)n * H * hd;
    float qfreq[ATTN_ROPE / 2];
    for (int i = 0; i < ATTN_ROPE / 2; i++)
        qfreq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)ATTN_ROPE);
    struct dsi_rms_norm_args qn = {.x = q,
                                   .y = q,
                                   .n = n,
                                   .n_groups = H,
                                   .dim = hd,
                                   .ldx = (int64_t)H * hd,
                                   .ldy = (int64_t)H * hd,
                                   .eps = 1e-6f,
                                   .round_bf16 = ac->reference,
                                   .rope_dim = ATTN_ROPE,
                                   .pos = s.pos,
                                   .freq = qfreq},
                             qng = qn;
    qng.x = qng.y = dq;
    qng.pos = s.d_pos;
    float *q0 = NULL; /* q before the CPU's norm changes it */
    if (g_attn_qn) {
        q0 = malloc(sizeof(float) * (size_t)no);
        memcpy(q0, q, sizeof(float) * (size_t)no);
    }
    float *oc = hpoison(no), *og = hpoison(no);
    float *dout = dpoison(sizeof(float) * (size_t)no);
    struct dsi_rope_args orc = {.x = oc,
                                .n = n,
                                .ldx = (int64_t)H * hd,
                                .n_heads = H,
                                .head_stride = hd,
                                .width = hd,
                                .rope_dim = ATTN_ROPE,
                                .pos = s.pos,
                                .freq = qfreq,
                                .inverse = true,
                                .round_bf16 = ac->reference},
                         org = orc;
    org.x = dout;
    org.pos = s.d_pos;
    struct dsi_attn_args a = {.st = &s.hst,
                              .q = q,
                              .out = oc,
                              .n_heads = H,
                              .head_dim = hd,
                              .ring = dsi_kv_rows_f32(ring, (int)hd),
                              .entries = dsi_kv_rows_f32(ent, (int)hd),
                              .ratio = ac->ratio,
                              .sel = sel,
                              .n_sel = nsel,
                              .topk = ac->topk,
                              .sinks = &sinks.h,
                              .scale = 1.0f / sqrtf((float)hd),
                              .round_probs = ac->reference,
                              .round_bf16 = ac->reference,
                              .fast = ac->fast,
                              .q_norm = g_attn_qn ? &qn : NULL,
                              .out_rope = g_attn_qn ? &orc : NULL};
    if (g_attn_fp8) {
        a.ring = hr8;
        a.entries = he8;
    }
    g_cpu->ops->attn(g_cpu, &a);
    a.q_norm = g_attn_qn ? &qng : NULL;
    a.out_rope = g_attn_qn ? &org : NULL;
    a.st = &s.dst;
    a.q = dq;
    a.out = dout;
    a.ring = g_attn_fp8 ? dr8 : dsi_kv_rows_f32(dring, (int)hd);
    a.entries = g_attn_fp8 ? de8 : dsi_kv_rows_f32(dent, (int)hd);
    a.sel = dsel;
    a.n_sel = dnsel;
    a.sinks = &sinks.d;
    int64_t ny = cols / (cols >= 4096 ? 4096 : 256) * 64;
    bool o16 = g_attn_o16 && g_attn_alt && ac->fast && cols % 256 == 0;
    struct wt wo = {0};
    float *dy = NULL, *y1 = NULL;
    struct dsi_gemm_args ga = {0};
    if (o16) {
        wt_make(&wo, r, DSI_TYPE_F8_E4M3, ny, cols >= 4096 ? 4096 : 256, 0.05f);
        dy = dpoison(sizeof(float) * (size_t)(n * ny));
        y1 = hpoison(n * ny);
        ga = attn_o16_args(&wo, dout, n, cols, dy);
    }
    a.out_to_gemm = o16;
    a.out_gemm = o16 ? &ga : NULL;
    a.q_from_gemm = q16;
    if (q16) { /* (dq poisoned first: the attention must take the gemm's rows) */
        float *pz = hpoison(n * cols);
        g_gpu->ops->upload(g_gpu, dq, pz, sizeof(float) * (size_t)(n * cols));
        free(pz);
        attn_q16_gemm(g_gpu, &wq, dxq, n, cols, dq);
    }
    g_gpu->ops->attn(g_gpu, &a);
    if (o16) { /* the gemm right after the attention, as the forward runs them */
        g_gpu->ops->gemm(g_gpu, &ga);
        dget(y1, dy, sizeof(float) * (size_t)(n * ny));
    }
    int ok = gsync("attn") == 0;
    dget(og, dout, sizeof(float) * (size_t)no);
    bool out_ok = !o16 || g_attn_o16_out; /* (else out may be unwritten: g_attn_alt's checked) */
    ok = ok && (!out_ok || close_to("attn", og, oc, no, ac->reference ? 1e-2 : 1e-5));
    if (ok && g_attn_qn && g_attn_alt) { /* q as it was, on the other backend */
        float *o2 = hpoison(no);
        g_gpu->ops->upload(g_gpu, dq, q0, sizeof(float) * (size_t)no);
        ok = gsync("attn: q again") == 0;
        g_attn_alt->ops->attn(g_attn_alt, &a);
        ok = ok && gsync_on(g_attn_alt, "attn (q norm, other backend)") == 0;
        dget(o2, dout, sizeof(float) * (size_t)no);
        ok = ok &&
             (out_ok ? same("attn (q norm, other backend)", o2, og, sizeof(float) * (size_t)no)
                     : close_to("attn (other backend)", o2, oc, no, ac->reference ? 1e-2 : 1e-5));
        if (o16) {
            float *y2 = hpoison(n * ny);
            g_attn_alt->ops->gemm(g_attn_alt, &ga);
            ok = ok && gsync_on(g_attn_alt, "attn's gemm (other backend)") == 0;
            dget(y2, dy, sizeof(float) * (size_t)(n * ny));
            ok =
                ok && same("attn's gemm (other backend)", y2, y1, sizeof(float) * (size_t)(n * ny));
            free(y2);
        }
        free(o2);
    }
    if (o16) {
        wt_free(&wo);
        dfree(dy);
        free(y1);
    }
    if (q16) {
        wt_free(&wq);
        dfree(dxq);
    }
    free(q0);
    dfree(dring);
    dfree(dq);
    dfree(dent);
    dfree(dr8.data);
    dfree(dr8.sc);
    dfree(de8.data);
    dfree(de8.sc);
    free(hr8.data);
    free(hr8.sc);
    free(he8.data);
    free(he8.sc);
    dfree(dsel);
    dfree(dnsel);
    dfree(dout);
    free(ring);
    free(q);
    free(ent);
    free(sel);
    free(nsel);
    free(sv);
    free(oc);
    free(og);
    wt_free(&sinks);
    scen_free(&s);
    return ok;
}

int test_cuda_attn(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 9);
    const struct attn_case cases[] = {
        /* tiny-a shapes: window 16, ratios 0 / 4 with selection / 8 all entries */
        {4, 128, 16, 0, 4, false, true, 4, {0, 14, 200, 255}, {20, 5, 1, 2}, false},
        {4, 128, 16, 4, 4, true, true, 4, {0, 14, 200, 255}, {20, 5, 1, 2}, false},
        {4, 128, 16, 8, 4, false, true, 4, {0, 14, 200, 255}, {20, 5, 1, 2}, false},
        {4, 128, 16, 4, 4, false, false, 2, {3, 63}, {1, 3}, false},
        /* V4-Flash: 64 heads x 512, window 128, CSA top-512, HCA ratio 128 */
        {64, 512, 128, 4, 512, true, true, 5, {0, 126, 1000, 4095, 300}, {3, 4, 1, 2, 8}, false},
        {64, 512, 128, 128, 512, false, true, 5, {0, 126, 1000, 4095, 300}, {3, 4, 1, 2, 8}, false},
        {64, 512, 128, 0, 512, false, false, 3, {0, 127, 2000}, {2, 3, 1}, false},
        /* fast numerics with >= 128 rows (the tensor-core products): tiny heads (4 of a
         * 64-head block), V4-Flash CSA with selection (short and full top-k), HCA, window */
        {4, 128, 16, 4, 4, true, true, 3, {0, 200, 14}, {100, 50, 3}, true},
        {64, 512, 128, 4, 512, true, true, 4, {0, 1000, 4095, 126}, {40, 40, 40, 9}, true},
        {64, 512, 128, 128, 512, false, true, 3, {0, 2000, 8000}, {60, 50, 30}, true},
        {64, 512, 128, 0, 512, false, true, 2, {0, 127}, {100, 40}, true},
        /* fast, 32-127 rows: the fused kernel, split along the keys (4 splits) */
        {4, 128, 16, 4, 4, true, true, 3, {0, 200, 14}, {20, 15, 5}, true},
        {64, 512, 128, 4, 512, true, true, 3, {0, 1000, 4095}, {16, 16, 8}, true},
        /* fast, 1-31 rows (decode): the fused kernel split along the keys into up to 20 parts
           of 2 tiles; CSA, HCA (splits past a row's keys), window only, tiny heads (2 tiles:
           not split) */
        {64, 512, 128, 4, 512, true, true, 2, {4095, 1000}, {1, 2}, true},
        {64, 512, 128, 128, 512, false, true, 1, {8000}, {1}, true},
        {64, 512, 128, 0, 512, false, true, 2, {0, 127}, {1, 8}, true},
        {4, 128, 16, 4, 4, true, true, 1, {200}, {3}, true},
        /* HCA far along (1094 entries + the window: 77 tiles, 39 splits at one row): the merge's
           splits past a warp's 32 lanes and its FA_MQ rows in flight */
        {64, 512, 128, 128, 512, false, true, 1, {140000}, {1}, true},
        /* the same with tiny heads and enough keys to split (so that the sanitizers' tiny runs
           see the split and the merge): all entries, 4 splits; selection, a split past the
           rows' keys */
        {4, 128, 64, 8, 32, false, true, 1, {500}, {2}, true},
        {4, 128, 64, 4, 32, true, true, 1, {40}, {3}, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (tiny_only() && cases[i].H > 4) continue;
        TEST_ASSERTF(run_attn(&r, &cases[i]), "attn case %zu", i);
    }
    /* the `fast` cases once more on the other paths: the fused kernel (attn_fa.cu) is the
       default from 1 row; DSI_CUDA_ATTN_FA=0 runs attn_tc.cu's products (from 128 rows) or the
       exact kernels and the softmax; DSI_CUDA_ATTN_FA_SPLIT=0 the fused kernel unsplit; its
       blocks of 32 heads (the default below DSI_CUDA_ATTN_FA_BIG rows, step 35), of 64 heads with
       tiles of 32 keys (the default from there) and of 64 heads with tiles of 16 keys (the
       default until step 35), each at every row count; the softmax's other exps
       (DSI_CUDA_ATTN_FA_EXP: 0 exp_ref, 2 exp_nb, 3 __expf; 1, expf, is the default) */
#define H64 "DSI_CUDA_ATTN_FA_HB=64,DSI_CUDA_ATTN_FA_KT=16"
#define K32 "DSI_CUDA_ATTN_FA_HB=64,DSI_CUDA_ATTN_FA_KT=32"
    const char *envs[] = {
        "DSI_CUDA_ATTN_FA=0",     "DSI_CUDA_ATTN_FA_SPLIT=0", "DSI_CUDA_ATTN_FA_HB=32", K32, H64,
        "DSI_CUDA_ATTN_FA_EXP=0", "DSI_CUDA_ATTN_FA_EXP=2",   "DSI_CUDA_ATTN_FA_EXP=3"};
    int ok = 1;
    for (size_t e = 0; e < sizeof(envs) / sizeof(envs[0]) && ok; e++) {
        struct dsi_backend *g2 = cuda_backend_with(envs[e]), *keep = g_gpu;
        TEST_ASSERT(g2 != NULL);
        g_gpu = g2;
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]) && ok; i++) {
            if (!cases[i].fast || (tiny_only() && cases[i].H > 4)) continue;
            ok = run_attn(&r, &cases[i]);
            if (!ok) fprintf(stderr, "attn case %zu (%s) failed\n", i, envs[e]);
        }
        g_gpu = keep;
        g2->ops->free(g2);
    }
    TEST_ASSERT(ok);
    /* FP8 cache rows (DSI_CUDA_KV_FP8): every case on the default paths (the fused kernel's
       16-byte chunks, step 30), the fast ones also on the exact / tensor-core kernels
       (DSI_CUDA_ATTN_FA=0), on the fused kernel's float4 loads (DSI_CUDA_ATTN_FA_K8=0) and on its
       blocks of 32 heads, of 64 heads with tiles of 32 keys and with tiles of 16 keys */
    g_attn_fp8 = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]) && ok; i++) {
        if (tiny_only() && cases[i].H > 4) continue;
        ok = run_attn(&r, &cases[i]);
        if (!ok) fprintf(stderr, "attn case %zu with FP8 rows failed\n", i);
    }
    const char *envs8[] = {"DSI_CUDA_ATTN_FA=0", "DSI_CUDA_ATTN_FA_K8=0", "DSI_CUDA_ATTN_FA_HB=32",
                           K32, H64};
    for (size_t e = 0; e < sizeof(envs8) / sizeof(envs8[0]) && ok; e++) {
        const char *env = envs8[e];
        struct dsi_backend *g2 = cuda_backend_with(env), *keep = g_gpu;
        TEST_ASSERT(g2 != NULL);
        g_gpu = g2;
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]) && ok; i++) {
            if (!cases[i].fast || (tiny_only() && cases[i].H > 4)) continue;
            ok = run_attn(&r, &cases[i]);
            if (!ok) fprintf(stderr, "attn case %zu with FP8 rows (%s) failed\n", i, env);
        }
        g_gpu = keep;
        g2->ops->free(g2);
    }
    g_attn_fp8 = 0;
    TEST_ASSERT(ok);
    /* attn's q_norm and out_rope (the forward's q-head norm and RoPE, the output's inverse RoPE;
       step 34): every case on the default backend (the norm and rope launches around the
       attention) against the CPU; the fast ones also with the fused kernel's staging of q
       (DSI_CUDA_ATTN_FA_QN=1) and writes of out (DSI_CUDA_ATTN_FA_OR=1), bit for bit the same
       backend without them (=0; from DSI_CUDA_ATTN_FA_BIG rows both are the default since step
       35): 64 heads a block, 32, tiles of 32 keys, FP8 rows */
    g_attn_qn = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]) && ok; i++) {
        if (tiny_only() && cases[i].H > 4) continue;
        ok = run_attn(&r, &cases[i]);
        if (!ok) fprintf(stderr, "attn case %zu with the q norm failed\n", i);
    }
#define QO  "DSI_CUDA_ATTN_FA_QN=1,DSI_CUDA_ATTN_FA_OR=1"
#define OFF "DSI_CUDA_ATTN_FA_QN=0,DSI_CUDA_ATTN_FA_OR=0"
    const char *envq[][2] = {{H64 "," OFF, H64 ",DSI_CUDA_ATTN_FA_QN=1,DSI_CUDA_ATTN_FA_OR=0"},
                             {H64 "," OFF, H64 ",DSI_CUDA_ATTN_FA_QN=0,DSI_CUDA_ATTN_FA_OR=1"},
                             {"DSI_CUDA_ATTN_FA_HB=32," OFF, "DSI_CUDA_ATTN_FA_HB=32," QO},
                             {K32 "," OFF, K32 "," QO},
                             {H64 "," OFF, H64 "," QO}};
#undef QO
#undef OFF
#undef H64
#undef K32
    for (int e = 0; e < 5 && ok; e++) {
        struct dsi_backend *g1 = cuda_backend_with(envq[e][0]), *g2 = cuda_backend_with(envq[e][1]),
                           *keep = g_gpu;
        TEST_ASSERT(g1 != NULL && g2 != NULL);
        g_gpu = g1;
        g_attn_alt = g2;
        g_attn_fp8 = e == 4;
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]) && ok; i++) {
            if (!cases[i].fast || (tiny_only() && cases[i].H > 4)) continue;
            ok = run_attn(&r, &cases[i]);
            if (!ok)
                fprintf(stderr, "attn case %zu with the q norm (%s%s) failed\n", i, envq[e][1],
                        e == 4 ? ", FP8 rows" : "");
        }
        g_gpu = keep;
        g_attn_alt = NULL;
        g_attn_fp8 = 0;
        g1->ops->free(g1);
        g2->ops->free(g2);
    }
    /* the attention's out kept in bf16 for the grouped gemm after it (dsi_attn_args.out_to_gemm)
       and its q made by a gemm that hands its rows over (q_from_gemm; step 43; from 128 rows
       on the defaults, the fused q norm and RoPE from 192): out and the gemm's results bit for
       bit a backend without them (DSI_CUDA_ATTN_O16=0, DSI_CUDA_ATTN_Q16=0), FP32 and FP8 rows;
       rows not in fours (lt.cu's last 1-3 on gvf.cu) and fewer than 192 have q16 widened; the
       cases of 192+ rows (in fours) stage it. From 128 rows the attention also leaves out
       unwritten (dsi_attn_args.out_gemm, DSI_CUDA_ATTN_OSKIP=1; step 44) with the kept rows
       stored 16 bytes at a time (DSI_CUDA_ATTN_O16V=1): the other backend's out is checked
       against the CPU then; two more passes have out written and the kept rows stored a pair at
       a time (both =0) and check both. The staging of q16 with the q norm runs lean (without
       the roundings that leave its values as they are; DSI_CUDA_ATTN_QN_LEAN=1, step 45, the
       default since step 46) in the
       first two passes and as before (=0) in the last two, each bit for bit g2's, which stages
       fp32 rows */
    const struct attn_case c16[] = {
        {4, 128, 16, 4, 4, true, true, 3, {0, 200, 14}, {100, 50, 3}, true},
        {4, 128, 16, 4, 4, true, true, 2, {0, 200}, {150, 50}, true},
        {64, 512, 128, 4, 512, true, true, 4, {0, 1000, 4095, 126}, {40, 40, 40, 9}, true},
        {64, 512, 128, 4, 512, true, true, 2, {0, 4000}, {150, 62}, true},
        {64, 512, 128, 128, 512, false, true, 2, {0, 2000}, {100, 96}, true},
        {64, 512, 128, 0, 512, false, true, 2, {0, 127}, {100, 40}, true},
    };
    for (int e = 0; e < 4 && ok; e++) { /* FP32 / FP8 rows; out left unwritten or written */
        /* (the FP8-row passes run the gemm on ltb.cu from 128 rows on both backends: its
           kept rows against its copy of out; step 47) */
        const char *ltb = e & 1 ? ",DSI_CUDA_LTB_MIN=128" : "";
        char e2[128], e3[160];
        snprintf(e2, sizeof(e2), "DSI_CUDA_ATTN_O16=0,DSI_CUDA_ATTN_Q16=0%s", ltb);
        snprintf(e3, sizeof(e3), "%s%s",
                 e >= 2 ? "DSI_CUDA_ATTN_OSKIP=0,DSI_CUDA_ATTN_O16V=0,DSI_CUDA_ATTN_QN_LEAN=0"
                        : "DSI_CUDA_ATTN_OSKIP=1,DSI_CUDA_ATTN_O16V=1,DSI_CUDA_ATTN_QN_LEAN=1",
                 ltb);
        struct dsi_backend *g2 = cuda_backend_with(e2), *keep = g_gpu, *g3;
        TEST_ASSERT(g2 != NULL);
        g3 = cuda_backend_with(e3);
        TEST_ASSERT(g3 != NULL);
        g_gpu = g3;
        g_attn_alt = g2;
        g_attn_o16 = 1;
        g_attn_o16_out = e >= 2;
        g_attn_fp8 = e & 1;
        for (size_t i = 0; i < sizeof(c16) / sizeof(c16[0]) && ok; i++) {
            if (tiny_only() && c16[i].H > 4) continue;
            ok = run_attn(&r, &c16[i]);
            if (!ok)
                fprintf(stderr, "attn case %zu with its gemm (o16%s%s) failed\n", i,
                        e & 1 ? ", FP8 rows" : "", e >= 2 ? ", out written" : "");
        }
        g_gpu = keep;
        g_attn_alt = NULL;
        g_attn_o16 = g_attn_fp8 = g_attn_o16_out = 0;
        g2->ops->free(g2);
        g3->ops->free(g3);
    }
    g_attn_qn = 0;
    TEST_ASSERT(ok);
    return 0;
}

/* ---- indexer
 * -------------------------------------------------------------------------------------------- */

static int cmp_desc_f64(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a < b) - (a > b);
}

/* `fast` numerics: the scores' sum order differs (k_idx_scores_tc), so near-ties may select
 * otherwise. Each row's selection must hold min(topk, visible) keys (n_sel as the CPU's),
 * ascending, visible, and be a top-k of the exact scores (double, cpu_indexer's formula): every
 * selected score >= the k-th largest - 1e-5 * the row's largest |score|. */
static int idx_check_fast(const struct dsi_indexer_args *a,
                          const struct scen *s,
                          const int32_t *sel,
                          const int32_t *ns,
                          const int32_t *nc) {
    int64_t H = a->n_heads, hd = a->head_dim, per_page = s->PT / a->ratio;
    for (int r = 0; r < s->n; r++) {
        int nv = (s->pos[r] + 1) / a->ratio, k = nc[r];
        if (ns[r] != k) {
            fprintf(stderr, "  indexer fast: row %d n_sel %d, cpu %d\n", r, ns[r], k);
            return 0;
        }
        double *ex = malloc(sizeof(double) * (size_t)(2 * nv + 1)), *srt = ex + nv, mx = 0.0;
        const float *q = a->q + r * H * hd, *w = a->w + r * H;
        for (int i = 0; i < nv; i++) {
            float kb[1024]; /* the key decoded (FP4 rows) */
            const float *key = cpu_kv_row_get(
                &a->keys,
                (int64_t)s->pt[s->slot[r] * s->MP + i / per_page] * per_page + i % per_page, kb);
            double acc = 0.0;
            for (int64_t h = 0; h < H; h++) {
                double d = 0.0;
                for (int64_t c = 0; c < hd; c++)
                    d += (double)q[h * hd + c] * (double)key[c];
                acc += (d > 0.0 ? d * (double)a->score_scale : 0.0) *
                       ((double)w[h] * (double)a->w_scale);
            }
            ex[i] = srt[i] = acc;
            if (fabs(acc) > mx) mx = fabs(acc);
        }
        qsort(srt, (size_t)nv, sizeof(double), cmp_desc_f64);
        double floor = k > 0 ? srt[k - 1] - 1e-5 * mx : 0.0;
        const int32_t *sr = sel + (int64_t)r * a->topk;
        for (int i = 0; i < k; i++) {
            int bad =
                sr[i] < 0 || sr[i] >= nv || (i > 0 && sr[i] <= sr[i - 1]) || ex[sr[i]] < floor;
            if (bad) {
                fprintf(stderr,
                        "  indexer fast: row %d sel[%d] = %d (visible %d, score %g, k-th %g)\n", r,
                        i, sr[i], nv, sr[i] >= 0 && sr[i] < nv ? ex[sr[i]] : 0.0,
                        k > 0 ? srt[k - 1] : 0.0);
                free(ex);
                return 0;
            }
        }
        free(ex);
    }
    return 1;
}

static int g_idx_fp4; /* run_indexer with FP4 key rows */

static int run_indexer(
    struct rng *r, int H, int hd, int topk, int nseq, const int *start, const int *len, bool fast) {
    int ratio = 4, PT = 256, maxpos = 0;
    for (int q = 0; q < nseq; q++)
        if (start[q] + len[q] > maxpos) maxpos = start[q] + len[q];
    int MP = maxpos / PT + 1, S = nseq + 1;
    struct scen s;
    scen_make(&s, r, 128, PT, MP, S, start, len, nseq);
    int n = s.n;
    int64_t per_page = PT / ratio, nk = (int64_t)S * MP * per_page * hd;
    float *keys = fnorm(r, nk, 1);
    /* ties: copy some entries onto the next entry of the same sequence */
    for (int q = 0; q < nseq; q++) {
        int row = 0;
        for (int j = 0; j < q; j++)
            row += len[j];
        int slot = s.slot[row];
        int vis = (start[q] + len[q]) / ratio;
        for (int i = 0; i + 1 < vis; i += 3) {
            int64_t a = ((int64_t)s.pt[slot * MP + i / per_page] * per_page + i % per_page) * hd;
            int64_t b =
                ((int64_t)s.pt[slot * MP + (i + 1) / per_page] * per_page + (i + 1) % per_page) *
                hd;
            if (i % 2 == 0) memcpy(keys + b, keys + a, sizeof(float) * (size_t)hd);
        }
    }
    float *qv = fnorm(r, (int64_t)n * H * hd, 1), *w = fnorm(r, (int64_t)n * H, 1);
    if (fast) { /* q and the keys are FP4 round trips in the model: exact in bf16 */
        round_bf16_all(keys, nk);
        round_bf16_all(qv, (int64_t)n * H * hd);
    }
    /* FP4 key rows (g_idx_fp4): the keys made Q4(32) values, stored by cpu_kv_row_put, the same
       bytes on both backends */
    struct dsi_kv_rows hk4 = {0}, dk4 = {0};
    if (g_idx_fp4) {
        int64_t rows = nk / hd, rb = dsi_kv_row_bytes(DSI_KV_FP4, hd, 0),
                sb = dsi_kv_sc_bytes(DSI_KV_FP4, hd, 0);
        hk4 = (struct dsi_kv_rows){malloc((size_t)(rows * rb)), malloc((size_t)(rows * sb)),
                                   DSI_KV_FP4, hd, 0};
        for (int64_t i = 0; i < rows; i++) {
            dsi_q4_roundtrip(keys + i * hd, hd, 32);
            cpu_kv_row_put(&hk4, i, keys + i * hd);
        }
        dk4 = hk4;
        dk4.data = dput(hk4.data, (size_t)(rows * rb));
        dk4.sc = dput(hk4.sc, (size_t)(rows * sb));
    }
    float *dk = dput(keys, sizeof(float) * (size_t)nk),
          *dqv = dput(qv, sizeof(float) * (size_t)n * H * hd),
          *dw = dput(w, sizeof(float) * (size_t)n * H);
    int32_t *selc = malloc(sizeof(int32_t) * (size_t)n * topk),
            *selg = malloc(sizeof(int32_t) * (size_t)n * topk);
    int32_t *nc = malloc(sizeof(int32_t) * (size_t)n), *ng = malloc(sizeof(int32_t) * (size_t)n);
    memset(selc, 0xff, sizeof(int32_t) * (size_t)n * topk);
    memset(nc, 0xff, sizeof(int32_t) * (size_t)n);
    int32_t *dsel = dpoison(sizeof(int32_t) * (size_t)n * topk),
            *dn = dpoison(sizeof(int32_t) * (size_t)n);
    struct dsi_indexer_args a = {.st = &s.hst,
                                 .q = qv,
                                 .w = w,
                                 .n_heads = H,
                                 .head_dim = hd,
                                 .keys = g_idx_fp4 ? hk4 : dsi_kv_rows_f32(keys, hd),
                                 .ratio = ratio,
                                 .score_scale = 1.0f / sqrtf((float)hd),
                                 .w_scale = 1.0f / sqrtf((float)H),
                                 .topk = topk,
                                 .sel = selc,
                                 .n_sel = nc,
                                 .fast = fast};
    g_cpu->ops->indexer(g_cpu, &a);
    struct dsi_indexer_args ah = a;
    a.st = &s.dst;
    a.q = dqv;
    a.w = dw;
    a.keys = g_idx_fp4 ? dk4 : dsi_kv_rows_f32(dk, hd);
    a.sel = dsel;
    a.n_sel = dn;
    g_gpu->ops->indexer(g_gpu, &a);
    int ok = gsync("indexer") == 0;
    dget(selg, dsel, sizeof(int32_t) * (size_t)n * topk);
    dget(ng, dn, sizeof(int32_t) * (size_t)n);
    if (fast) {
        ok = ok && idx_check_fast(&ah, &s, selg, ng, nc);
    } else {
        ok = ok && same("indexer n_sel", ng, nc, sizeof(int32_t) * (size_t)n);
        ok = ok && same("indexer sel", selg, selc, sizeof(int32_t) * (size_t)n * topk);
    }
    dfree(dk);
    dfree(dk4.data);
    dfree(dk4.sc);
    free(hk4.data);
    free(hk4.sc);
    dfree(dqv);
    dfree(dw);
    dfree(dsel);
    dfree(dn);
    free(keys);
    free(qv);
    free(w);
    free(selc);
    free(selg);
    free(nc);
    free(ng);
    scen_free(&s);
    return ok;
}

int test_cuda_indexer(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 10);
    /* visible keys 0, < topk, == topk, > topk; tiny (4 heads, top-4) and V4-Flash (64, top-512) */
    const int s1[] = {0, 5, 12, 97, 300}, l1[] = {3, 3, 4, 4, 1};
    TEST_ASSERT(run_indexer(&r, 4, 128, 4, 5, s1, l1, false));
    const int s2[] = {0, 996, 2044, 4092, 8190}, l2[] = {3, 5, 4, 4, 2};
    if (!tiny_only()) TEST_ASSERT(run_indexer(&r, 64, 128, 512, 5, s2, l2, false));
    /* `fast`: tensor-core scores (16 heads x 128, 32 x 64 with visible counts that end inside a
     * 64-key tile), and 4 heads (the exact kernel: no tensor-core shape) */
    const int s3[] = {0, 130, 250, 1000}, l3[] = {2, 3, 12, 2};
    TEST_ASSERT(run_indexer(&r, 16, 128, 4, 5, s1, l1, true));
    TEST_ASSERT(run_indexer(&r, 32, 64, 8, 4, s3, l3, true));
    TEST_ASSERT(run_indexer(&r, 4, 128, 4, 5, s1, l1, true));
    if (!tiny_only()) TEST_ASSERT(run_indexer(&r, 64, 128, 512, 5, s2, l2, true));
    /* the tensor-core scores with 3 key tiles per block (by default as many as 8 from enough
       rows; these cases have too few for more than 1; step 25) */
    struct dsi_backend *g3 = cuda_backend_with("DSI_CUDA_IDX_TPB=3"), *keep = g_gpu;
    TEST_ASSERT(g3 != NULL);
    g_gpu = g3;
    int ok = run_indexer(&r, 32, 64, 8, 4, s3, l3, true) &&
             (tiny_only() || run_indexer(&r, 64, 128, 512, 5, s2, l2, true));
    g_gpu = keep;
    g3->ops->free(g3);
    TEST_ASSERT(ok);
    /* FP4 key rows (beside FP8 cache rows): the exact and the tensor-core scores */
    g_idx_fp4 = 1;
    ok = run_indexer(&r, 4, 128, 4, 5, s1, l1, false) &&
         run_indexer(&r, 16, 128, 4, 5, s1, l1, true) &&
         run_indexer(&r, 32, 64, 8, 4, s3, l3, true) &&
         (tiny_only() || run_indexer(&r, 64, 128, 512, 5, s2, l2, true));
    g_idx_fp4 = 0;
    TEST_ASSERT(ok);
    return 0;
}
