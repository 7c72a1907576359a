/* test_hc_cuda.c - the CUDA backend's mHC ops (hc_pre, hc_post, hc_head) against the CPU
 * backend on random inputs, as test_ops_cuda.c does for the other ops (bitwise where no
 * transcendental function is involved; the mix at other row counts and on other paths bitwise
 * the same as the whole run). Without a CUDA device the test prints "skipped" and passes. */
#include "cuda_util.h"

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/quant.h"
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- mHC
 * -------------------------------------------------------------------------------------------- */

/* The last k rows of a GPU run of hc_pre or hc_head (n rows; its outputs fetched to y, post,
 * comb) again on their own on backend be: bitwise the same. k < n: the mix at fewer rows (another
 * grid of k_hc_mix, or k_hc_pre_one); be another backend (k = n): the mix on another path. */
static int hc_tail_same(struct dsi_backend *be,
                        const struct dsi_hc_pre_args *pre,
                        const struct dsi_hc_head_args *head,
                        const float *y,
                        const float *post,
                        const float *comb,
                        int64_t k) {
    int64_t n = pre ? pre->n : head->n, D = pre ? pre->dim : head->dim,
            hc = pre ? pre->hc : head->hc, r0 = n - k;
    float *dy = dpoison(sizeof(float) * (size_t)(k * D)),
          *dp = dpoison(sizeof(float) * (size_t)(k * hc)),
          *dc = dpoison(sizeof(float) * (size_t)(k * hc * hc));
    /* (the poison and the caller's uploads went on g_gpu's stream; be may be another backend,
       with a stream of its own) */
    if (gsync("hc tail inputs") != 0) return 0;
    if (pre) {
        struct dsi_hc_pre_args a = *pre;
        a.X += r0 * hc * D;
        a.n = k;
        a.y = dy;
        a.post = dp;
        a.comb = dc;
        be->ops->hc_pre(be, &a);
    } else {
        struct dsi_hc_head_args a = *head;
        a.X += r0 * hc * D;
        a.n = k;
        a.y = dy;
        be->ops->hc_head(be, &a);
    }
    int ok = gsync_on(be, "hc tail") == 0;
    float *yt = hpoison(k * D), *pt = hpoison(k * hc), *ct = hpoison(k * hc * hc);
    dget(yt, dy, sizeof(float) * (size_t)(k * D));
    dget(pt, dp, sizeof(float) * (size_t)(k * hc));
    dget(ct, dc, sizeof(float) * (size_t)(k * hc * hc));
    ok = ok && same("hc tail y", yt, y + r0 * D, sizeof(float) * (size_t)(k * D));
    ok = ok && (!pre || same("hc tail post", pt, post + r0 * hc, sizeof(float) * (size_t)(k * hc)));
    ok = ok && (!pre || same("hc tail comb", ct, comb + r0 * hc * hc,
                             sizeof(float) * (size_t)(k * hc * hc)));
    dfree(dy);
    dfree(dp);
    dfree(dc);
    free(yt);
    free(pt);
    free(ct);
    return ok;
}

/* hc_pre with the norm after it in the same op (norm_w: BF16 weights when rnd, else F32; zq
 * where dim % 128 == 0) on the GPU backend be (pre: the device pointers): y, post and comb bit for
 * bit those of the GPU run without the norm (yg, pg, cg), z within 1e-6 of the CPU's rms_norm of
 * the GPU's own y, zq bit for bit the CPU's act_quant of the GPU's own z; and the CPU's fused op
 * (host rows X, host tensors fn_h ...): its z within hc_pre's tolerance of the GPU's. */
static int hc_norm_same(struct dsi_backend *be,
                        struct rng *r,
                        const struct dsi_hc_pre_args *pre,
                        const struct dsi_tensor *fn_h,
                        const struct dsi_tensor *base_h,
                        const struct dsi_tensor *scale_h,
                        const float *X,
                        const float *yg,
                        const float *pg,
                        const float *cg,
                        int rnd) {
    int64_t n = pre->n, D = pre->dim, hc = pre->hc, nz = n * D;
    bool q = D % 128 == 0;
    float *wv = fnorm(r, D, 0.2f);
    for (int64_t i = 0; i < D; i++)
        wv[i] += 1.0f;
    struct wt w;
    vec_make(&w, wv, D, rnd ? DSI_TYPE_BF16 : DSI_TYPE_F32);
    float *dy = dpoison(sizeof(float) * (size_t)nz),
          *dp = dpoison(sizeof(float) * (size_t)(n * hc)),
          *dc = dpoison(sizeof(float) * (size_t)(n * hc * hc)),
          *dz = dpoison(sizeof(float) * (size_t)nz),
          *dq = q ? dpoison(sizeof(float) * (size_t)nz) : NULL;
    struct dsi_hc_pre_args a = *pre;
    a.y = dy;
    a.post = dp;
    a.comb = dc;
    a.norm_w = &w.d;
    a.z_eps = 1e-6f;
    a.z = dz;
    a.zq = dq;
    be->ops->hc_pre(be, &a);
    int ok = gsync_on(be, "hc_pre with norm") == 0;
    float *y2 = hpoison(nz), *p2 = hpoison(n * hc), *c2 = hpoison(n * hc * hc), *zg = hpoison(nz),
          *qg = hpoison(nz), *zc = hpoison(nz), *qc = hpoison(nz), *yc = hpoison(nz),
          *pc = hpoison(n * hc), *cc = hpoison(n * hc * hc);
    dget(y2, dy, sizeof(float) * (size_t)nz);
    dget(p2, dp, sizeof(float) * (size_t)(n * hc));
    dget(c2, dc, sizeof(float) * (size_t)(n * hc * hc));
    dget(zg, dz, sizeof(float) * (size_t)nz);
    ok = ok && same("hc_pre+norm y", y2, yg, sizeof(float) * (size_t)nz);
    ok = ok && same("hc_pre+norm post", p2, pg, sizeof(float) * (size_t)(n * hc));
    ok = ok && same("hc_pre+norm comb", c2, cg, sizeof(float) * (size_t)(n * hc * hc));
    if (q) { /* zq: the CPU's act_quant of the GPU's own z */
        dget(qg, dq, sizeof(float) * (size_t)nz);
        struct dsi_act_quant_args aq = {zg, qc, n, D, D, D, 128};
        g_cpu->ops->act_quant(g_cpu, &aq);
        ok = ok && same("hc_pre+norm zq", qg, qc, sizeof(float) * (size_t)nz);
    }
    /* the CPU's own fused op (hc_pre, then rms_norm) on the host rows: z within hc_pre's
       tolerance of the GPU's */
    struct dsi_hc_pre_args ac = *pre;
    ac.X = X;
    ac.fn = fn_h;
    ac.base = base_h;
    ac.scale = scale_h;
    ac.y = yc;
    ac.post = pc;
    ac.comb = cc;
    ac.norm_w = &w.h;
    ac.z_eps = 1e-6f;
    ac.z = zc;
    ac.zq = NULL;
    g_cpu->ops->hc_pre(g_cpu, &ac);
    ok = ok && close_to("hc_pre+norm z (CPU op)", zg, zc, nz, rnd ? 2e-2 : 2e-5);
    /* z against the CPU's norm of the GPU's own y (the CPU's y may differ within hc_pre's
       tolerance) */
    struct dsi_rms_norm_args na = {.x = yg,
                                   .y = zc,
                                   .n = n,
                                   .n_groups = 1,
                                   .dim = D,
                                   .ldx = D,
                                   .ldy = D,
                                   .w = &w.h,
                                   .eps = 1e-6f,
                                   .round_bf16 = rnd == 1};
    g_cpu->ops->rms_norm(g_cpu, &na);
    ok = ok && close_to("hc_pre+norm z", zg, zc, nz, 1e-6);
    dfree(dy);
    dfree(dp);
    dfree(dc);
    dfree(dz);
    if (dq) dfree(dq);
    free(y2);
    free(p2);
    free(c2);
    free(zg);
    free(qg);
    free(zc);
    free(qc);
    free(yc);
    free(pc);
    free(cc);
    free(wv);
    wt_free(&w);
    return ok;
}

/* hc_pre with post_first, the forward's way (step 41: the hc_post owed by the last sublayer
 * in the same op, its post and comb the buffers this op then overwrites) on backend be, with the
 * norm after it (F32 weights; zq where dim % 128 == 0). pre: device arguments whose X holds the
 * old streams; df, the CPU's post and comb (pc, cc) and its hc_post of them (Xc, the new
 * streams). The streams written bit for bit Xc, and y, post, comb, z and zq bit for bit those of
 * the same backend's hc_pre on Xc alone; with tol > 0 (a `fast` mix that sums in another order
 * with the hc_post: k_hc_mix_tf_post) y, post, comb and z within tol of them (y and z: ytol) and
 * zq not compared. */
static int hc_post_first_same(struct dsi_backend *be,
                              struct rng *r,
                              const struct dsi_hc_pre_args *pre,
                              const float *df,
                              const float *pc,
                              const float *cc,
                              const float *Xc,
                              double tol,
                              double ytol) {
    int64_t n = pre->n, D = pre->dim, hc = pre->hc, len = hc * D, nz = n * D;
    bool q = D % 128 == 0;
    float *wv = fnorm(r, D, 0.2f);
    struct wt w;
    vec_make(&w, wv, D, DSI_TYPE_F32);
    float *d[2][5], *h[2][5];
    int64_t sz[5] = {nz, n * hc, n * hc * hc, nz, nz};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++) {
            d[k][i] = dpoison(sizeof(float) * (size_t)sz[i]);
            h[k][i] = hpoison(sz[i]);
        }
    /* the reference: hc_pre alone on the new streams */
    float *dXn = dput(Xc, sizeof(float) * (size_t)(n * len));
    struct dsi_hc_pre_args a = *pre;
    a.X = dXn;
    a.y = d[0][0];
    a.post = d[0][1];
    a.comb = d[0][2];
    a.norm_w = &w.d;
    a.z_eps = 1e-6f;
    a.z = d[0][3];
    a.zq = q ? d[0][4] : NULL;
    /* (the uploads above ran on g_gpu's stream and may still be landing: be is another
       backend, with a stream of its own, when it is not g_gpu) */
    int ok = gsync("post_first inputs") == 0;
    be->ops->hc_pre(be, &a);
    /* post_first: the old post and comb in the buffers the op writes */
    dfree(d[1][1]);
    dfree(d[1][2]);
    d[1][1] = dput(pc, sizeof(float) * (size_t)(n * hc));
    d[1][2] = dput(cc, sizeof(float) * (size_t)(n * hc * hc));
    float *dXo = dpoison(sizeof(float) * (size_t)(n * len));
    struct dsi_hc_post_args pa = {df, pre->X, d[1][1], d[1][2],         dXo,
                                  n,  hc,     D,       pre->round_bf16, false};
    struct dsi_hc_pre_args b = a;
    b.X = dXo;
    b.y = d[1][0];
    b.post = d[1][1];
    b.comb = d[1][2];
    b.z = d[1][3];
    b.zq = q ? d[1][4] : NULL;
    b.post_first = &pa;
    ok = ok && gsync("post_first inputs") == 0 && gsync_on(be, "hc_pre alone") == 0;
    be->ops->hc_pre(be, &b);
    ok = ok && gsync_on(be, "hc_pre with post_first") == 0;
    float *Xg = hpoison(n * len);
    dget(Xg, dXo, sizeof(float) * (size_t)(n * len));
    ok = ok && same("post_first streams", Xg, Xc, sizeof(float) * (size_t)(n * len));
    const char *names[5] = {"post_first y", "post_first post", "post_first comb", "post_first z",
                            "post_first zq"};
    for (int i = 0; i < (q && tol <= 0 ? 5 : 4); i++) {
        for (int k = 0; k < 2; k++)
            dget(h[k][i], d[k][i], sizeof(float) * (size_t)sz[i]);
        if (tol > 0)
            ok = ok && close_to(names[i], h[1][i], h[0][i], sz[i], i == 0 || i == 3 ? ytol : tol);
        else
            ok = ok && same(names[i], h[1][i], h[0][i], sizeof(float) * (size_t)sz[i]);
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++) {
            dfree(d[k][i]);
            free(h[k][i]);
        }
    dfree(dXn);
    dfree(dXo);
    free(Xg);
    free(wv);
    wt_free(&w);
    return ok;
}

/* hc_pre takes k_hc_pre_one up to 32 rows, then k_hc_mix (hc_head: from 2 rows): n = 40 and 601
 * have a partial last block of 8 and 25 rows, split along K; D = 200: 25 chunks of 32, the last
 * piece of K one chunk. Each run again on backends with the mix on the other paths (bitwise):
 * launch_gemm (DSI_CUDA_HC_MIX_MIN=0), k_hc_mix without the split (all of K in a block, the
 * chunk values added there), the split's values added by hc_pre's finish (DSI_CUDA_HC_FUSE=1),
 * k_hc_mix with one row per lane where it takes two by default (from 33 rows; step 25:
 * DSI_CUDA_HC_MIX_RPL=1), and two rows per lane with all of K in a block (the prefill's way:
 * DSI_CUDA_HC_MIX_SPLIT=0 with DSI_CUDA_HC_MIX_RPL=3, as these rows would take one). */
int test_cuda_hc(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 7);
    enum { NALT = 5 };
    struct dsi_backend *alt[NALT] = {
        cuda_backend_with("DSI_CUDA_HC_MIX_MIN=0"), cuda_backend_with("DSI_CUDA_HC_MIX_SPLIT=0"),
        cuda_backend_with("DSI_CUDA_HC_FUSE=1"), cuda_backend_with("DSI_CUDA_HC_MIX_RPL=1"),
        cuda_backend_with("DSI_CUDA_HC_MIX_SPLIT=0,DSI_CUDA_HC_MIX_RPL=3")};
    for (int i = 0; i < NALT; i++)
        TEST_ASSERT(alt[i] != NULL);
    struct dsi_backend *tf1 = cuda_backend_with("DSI_CUDA_HC_TF_MIN=1"),
                       *fin = cuda_backend_with("DSI_CUDA_HC_FIN_NORM=1"),
                       *cl = cuda_backend_with("DSI_CUDA_HC_CL=1"),
                       *npf = cuda_backend_with("DSI_CUDA_HC_PF=0"),
                       *tree = cuda_backend_with("DSI_CUDA_HC_TREE=0"),
                       *early = cuda_backend_with("DSI_CUDA_HC_EARLY=1"),
                       *ptf[4] = {cuda_backend_with("DSI_CUDA_HC_PTF=1,DSI_CUDA_HC_TF_MIN=1"),
                                  cuda_backend_with("DSI_CUDA_HC_PTF=2,DSI_CUDA_HC_TF_MIN=1"),
                                  cuda_backend_with("DSI_CUDA_HC_PTF=3,DSI_CUDA_HC_TF_MIN=1"),
                                  cuda_backend_with("DSI_CUDA_HC_PTF=0,DSI_CUDA_HC_TF_MIN=1")};
    TEST_ASSERT(tf1 != NULL && fin != NULL && cl != NULL && npf != NULL && tree != NULL &&
                early != NULL && ptf[0] != NULL && ptf[1] != NULL && ptf[2] != NULL &&
                ptf[3] != NULL);
    const int64_t dims[] = {128, 200, 4096}, ns[] = {1, 3, 17, 40, 601};
    for (int di = 0; di < (tiny_only() ? 2 : 3); di++)
        for (int ni = 0; ni < 5; ni++)
            for (int rnd = 0; rnd < 2; rnd++) {
                int64_t D = dims[di], n = ns[ni], hc = 4, len = hc * D, mix = (2 + hc) * hc;
                struct wt fn, base, scale, hfn, hbase, hscale;
                wt_make(&fn, &r, DSI_TYPE_F32, mix, len, 1.0f / sqrtf((float)len));
                float *bv = fnorm(&r, mix, 0.5f), sv[3];
                for (int i = 0; i < 3; i++)
                    sv[i] = 1.0f + 0.1f * rnorm(&r);
                vec_make(&base, bv, mix, DSI_TYPE_F32);
                vec_make(&scale, sv, 3, DSI_TYPE_F32);
                float *X = fnorm(&r, n * len, 1.0f);
                float *dX = dput(X, sizeof(float) * (size_t)(n * len));
                float *yc = hpoison(n * D), *pc = hpoison(n * hc), *cc = hpoison(n * hc * hc);
                float *yg = hpoison(n * D), *pg = hpoison(n * hc), *cg = hpoison(n * hc * hc);
                float *dy = dpoison(sizeof(float) * (size_t)(n * D)),
                      *dp = dpoison(sizeof(float) * (size_t)(n * hc)),
                      *dc = dpoison(sizeof(float) * (size_t)(n * hc * hc));
                struct dsi_hc_pre_args a = {.X = X,
                                            .n = n,
                                            .hc = hc,
                                            .dim = D,
                                            .fn = &fn.h,
                                            .base = &base.h,
                                            .scale = &scale.h,
                                            .iters = 20,
                                            .norm_eps = 1e-6f,
                                            .hc_eps = 1e-6f,
                                            .y = yc,
                                            .post = pc,
                                            .comb = cc,
                                            .round_bf16 = rnd == 1};
                g_cpu->ops->hc_pre(g_cpu, &a);
                a.X = dX;
                a.fn = &fn.d;
                a.base = &base.d;
                a.scale = &scale.d;
                a.y = dy;
                a.post = dp;
                a.comb = dc;
                g_gpu->ops->hc_pre(g_gpu, &a);
                TEST_ASSERT(gsync("hc_pre") == 0);
                dget(yg, dy, sizeof(float) * (size_t)(n * D));
                dget(pg, dp, sizeof(float) * (size_t)(n * hc));
                dget(cg, dc, sizeof(float) * (size_t)(n * hc * hc));
                TEST_ASSERT(close_to("hc_pre y", yg, yc, n * D, rnd ? 1e-2 : 1e-5));
                TEST_ASSERT(close_to("hc_pre post", pg, pc, n * hc, 1e-5));
                TEST_ASSERT(close_to("hc_pre comb", cg, cc, n * hc * hc, 1e-5));
                if (n > 17) TEST_ASSERT(hc_tail_same(g_gpu, &a, NULL, yg, pg, cg, 17));
                /* up to k_hc_pre_one's 32 rows, on a thread block cluster a row instead
                   (DSI_CUDA_HC_CL=1, step 38; clusters of 1 block at D = 128 and 200, of 16 at
                   4096): its bits, and with the norm as hc_norm_same holds it */
                if (n <= 32) {
                    TEST_ASSERT(hc_tail_same(cl, &a, NULL, yg, pg, cg, n));
                    TEST_ASSERT(
                        hc_norm_same(cl, &r, &a, &fn.h, &base.h, &scale.h, X, yg, pg, cg, rnd));
                    /* the same with k_hc_pre_one's finish issuing its loads early
                       (DSI_CUDA_HC_EARLY=1, step 42): its bits */
                    TEST_ASSERT(hc_tail_same(early, &a, NULL, yg, pg, cg, n));
                    TEST_ASSERT(
                        hc_norm_same(early, &r, &a, &fn.h, &base.h, &scale.h, X, yg, pg, cg, rnd));
                }
                for (int i = 0; i < NALT && n > 32; i++)
                    TEST_ASSERT(hc_tail_same(alt[i], &a, NULL, yg, pg, cg, n));
                /* the norm in hc_pre's finish at one block a row (fin: DSI_CUDA_HC_FIN_NORM=1;
                   n = 601) and after it (the default backend) */
                for (int b = 0; b < 2; b++)
                    TEST_ASSERT(hc_norm_same(b ? fin : g_gpu, &r, &a, &fn.h, &base.h, &scale.h, X,
                                             yg, pg, cg, rnd));
                /* `fast` numerics: the mix on hc_tf.cu's 3xTF32 tensor cores with the sums of
                   squares, from DSI_CUDA_HC_TF_MIN rows (tf1: from 1 row, every n, partial row
                   tiles; the default backend from 128: n = 601), within 2e-5 of the CPU (one
                   TF32 product alone would be ~1e-3 off); len % 64 != 0 (D = 200) is not taken
                   and runs the exact kernels; k_hc_pre_one's pieces summed by shuffles (the
                   default) and in chunk order (tree: DSI_CUDA_HC_TREE=0). Then the norm after
                   it, as above. */
                struct dsi_hc_pre_args af = a;
                af.fast = true;
                for (int b = 0; b < 3; b++) { /* (tree: DSI_CUDA_HC_TREE=0; g_gpu last: its
                                                 values are hc_norm_same's below) */
                    struct dsi_backend *be = b == 0 ? tf1 : b == 1 ? tree : g_gpu;
                    be->ops->hc_pre(be, &af);
                    TEST_ASSERT(gsync_on(be, "hc_pre fast") == 0);
                    dget(yg, dy, sizeof(float) * (size_t)(n * D));
                    dget(pg, dp, sizeof(float) * (size_t)(n * hc));
                    dget(cg, dc, sizeof(float) * (size_t)(n * hc * hc));
                    TEST_ASSERT(close_to("hc_pre fast y", yg, yc, n * D, rnd ? 1e-2 : 2e-5));
                    TEST_ASSERT(close_to("hc_pre fast post", pg, pc, n * hc, 2e-5));
                    TEST_ASSERT(close_to("hc_pre fast comb", cg, cc, n * hc * hc, 2e-5));
                }
                for (int b = 0; b < 2; b++)
                    TEST_ASSERT(hc_norm_same(b ? fin : g_gpu, &r, &af, &fn.h, &base.h, &scale.h, X,
                                             yg, pg, cg, rnd));
                /* hc_post: Xo = post f + comb^T X, on the CPU's post/comb */
                float *f = fnorm(&r, n * D, 1.0f);
                float *df = dput(f, sizeof(float) * (size_t)(n * D));
                float *dpc = dput(pc, sizeof(float) * (size_t)(n * hc)),
                      *dcc = dput(cc, sizeof(float) * (size_t)(n * hc * hc));
                float *Xc = hpoison(n * len), *Xg = hpoison(n * len);
                float *dXo = dpoison(sizeof(float) * (size_t)(n * len));
                struct dsi_hc_post_args pa = {f, X, pc, cc, Xc, n, hc, D, rnd == 1, false};
                g_cpu->ops->hc_post(g_cpu, &pa);
                pa = (struct dsi_hc_post_args){df, dX, dpc, dcc, dXo, n, hc, D, rnd == 1, false};
                g_gpu->ops->hc_post(g_gpu, &pa);
                TEST_ASSERT(gsync("hc_post") == 0);
                dget(Xg, dXo, sizeof(float) * (size_t)(n * len));
                TEST_ASSERT(same("hc_post", Xg, Xc, sizeof(float) * (size_t)(n * len)));
                /* hc_pre with the hc_post first (the forward's op; k_hc_pre_one makes the
                   streams itself up to 32 rows, else and with DSI_CUDA_HC_PF=0 k_hc_post's
                   launch first; with DSI_CUDA_HC_CL=1 the cluster kernel after k_hc_post) */
                {
                    struct dsi_hc_pre_args ap = a;
                    ap.X = dX;
                    struct dsi_backend *pbe[4] = {g_gpu, npf, cl, early};
                    for (int b = 0; b < (n <= 32 ? 4 : 1); b++)
                        TEST_ASSERT(hc_post_first_same(pbe[b], &r, &ap, df, pc, cc, Xc, 0, 0));
                    /* `fast`, past k_hc_pre_one's rows, the hc_post inside the mix's pass
                       (ptf: DSI_CUDA_HC_PTF=1, 2 (the default) and 3 from 1 row; step 46), and
                       k_hc_post's launch before the mix (=0): the streams bit for bit, the rest
                       within the two TF32 mixes' bounds of each other (D = 200 is not taken:
                       dim % 16) */
                    ap.fast = true;
                    for (int b = 0; b < 4 && n > 32; b++)
                        TEST_ASSERT(hc_post_first_same(ptf[b], &r, &ap, df, pc, cc, Xc, 4e-5,
                                                       rnd ? 2e-2 : 4e-5));
                }
                /* hc_head */
                wt_make(&hfn, &r, DSI_TYPE_F32, hc, len, 1.0f / sqrtf((float)len));
                float *hb = fnorm(&r, hc, 0.5f), hs = 1.0f + 0.1f * rnorm(&r);
                vec_make(&hbase, hb, hc, DSI_TYPE_F32);
                vec_make(&hscale, &hs, 1, DSI_TYPE_F32);
                struct dsi_hc_head_args ha = {.X = X,
                                              .n = n,
                                              .hc = hc,
                                              .dim = D,
                                              .fn = &hfn.h,
                                              .base = &hbase.h,
                                              .scale = &hscale.h,
                                              .norm_eps = 1e-6f,
                                              .hc_eps = 1e-6f,
                                              .y = yc,
                                              .round_bf16 = rnd == 1};
                g_cpu->ops->hc_head(g_cpu, &ha);
                ha.X = dX;
                ha.fn = &hfn.d;
                ha.base = &hbase.d;
                ha.scale = &hscale.d;
                ha.y = dy;
                g_gpu->ops->hc_head(g_gpu, &ha);
                TEST_ASSERT(gsync("hc_head") == 0);
                dget(yg, dy, sizeof(float) * (size_t)(n * D));
                TEST_ASSERT(close_to("hc_head", yg, yc, n * D, rnd ? 1e-2 : 1e-5));
                if (n > 17) TEST_ASSERT(hc_tail_same(g_gpu, NULL, &ha, yg, NULL, NULL, 17));
                for (int i = 0; i < NALT && n > 1; i++)
                    TEST_ASSERT(hc_tail_same(alt[i], NULL, &ha, yg, NULL, NULL, n));
                dfree(dX);
                dfree(dy);
                dfree(dp);
                dfree(dc);
                dfree(df);
                dfree(dpc);
                dfree(dcc);
                dfree(dXo);
                free(X);
                free(f);
                free(bv);
                free(hb);
                free(yc);
                free(pc);
                free(cc);
                free(yg);
                free(pg);
                free(cg);
                free(Xc);
                free(Xg);
                wt_free(&fn);
                wt_free(&base);
                wt_free(&scale);
                wt_free(&hfn);
                wt_free(&hbase);
                wt_free(&hscale);
            }
    for (int i = 0; i < NALT; i++)
        alt[i]->ops->free(alt[i]);
    tf1->ops->free(tf1);
    fin->ops->free(fin);
    cl->ops->free(cl);
    npf->ops->free(npf);
    tree->ops->free(tree);
    early->ops->free(early);
    for (int b = 0; b < 4; b++)
        ptf[b]->ops->free(ptf[b]);
    /* hc_post's other kernels: hc other than 4 (loops not unrolled), dim % 4 != 0 (scalar) */
    const int64_t pd[][2] = {{2, 128}, {3, 130}, {4, 66}};
    for (int c = 0; c < 3; c++) {
        int64_t hc = pd[c][0], D = pd[c][1], n = 5, len = hc * D;
        float *X = fnorm(&r, n * len, 1.0f), *f = fnorm(&r, n * D, 1.0f),
              *post = fnorm(&r, n * hc, 1.0f), *comb = fnorm(&r, n * hc * hc, 0.5f);
        float *Xc = hpoison(n * len), *Xg = hpoison(n * len);
        float *dX = dput(X, sizeof(float) * (size_t)(n * len)),
              *df = dput(f, sizeof(float) * (size_t)(n * D)),
              *dp = dput(post, sizeof(float) * (size_t)(n * hc)),
              *dc = dput(comb, sizeof(float) * (size_t)(n * hc * hc)),
              *dXo = dpoison(sizeof(float) * (size_t)(n * len));
        struct dsi_hc_post_args pa = {f, X, post, comb, Xc, n, hc, D, c == 1, false};
        g_cpu->ops->hc_post(g_cpu, &pa);
        pa = (struct dsi_hc_post_args){df, dX, dp, dc, dXo, n, hc, D, c == 1, false};
        g_gpu->ops->hc_post(g_gpu, &pa);
        TEST_ASSERT(gsync("hc_post") == 0);
        dget(Xg, dXo, sizeof(float) * (size_t)(n * len));
        TEST_ASSERT(same("hc_post (other shapes)", Xg, Xc, sizeof(float) * (size_t)(n * len)));
        dfree(dX);
        dfree(df);
        dfree(dp);
        dfree(dc);
        dfree(dXo);
        free(X);
        free(f);
        free(post);
        free(comb);
        free(Xc);
        free(Xg);
    }
    return 0;
}

/* ---- the residual streams in bf16
 * ------------------------------------------------------------------------------------ */

static uint16_t xb_bits(float x) { /* (rounded to nearest even; finite x) */
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float xb_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* n random bf16 values (sd) as floats, their bits in *bits (the caller frees both) */
static float *xb_rows(struct rng *r, int64_t n, float sd, uint16_t **bits) {
    float *x = fnorm(r, n, sd);
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        b[i] = xb_bits(x[i]);
        x[i] = xb_float(b[i]);
    }
    *bits = b;
    return x;
}

/* n values of device memory d, bf16 (xb) or floats, as floats (the caller frees them) */
static float *xb_get(const void *d, int64_t n, bool xb) {
    float *x = hpoison(n);
    if (!xb) {
        dget(x, d, sizeof(float) * (size_t)n);
        return x;
    }
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)n);
    dget(b, d, sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = xb_float(b[i]);
    free(b);
    return x;
}

/* The outputs of the forward's two hc_pre calls (with the hc_post first, then alone on the
 * streams it made) on backend be, streams X0 in bf16 (xb) or floats: o[0] the new streams, o[1..5]
 * the first call's y, post, comb, z, zq, o[6..10] the second's (host floats, the caller frees). */
static int xb_run(struct dsi_backend *be,
                  const struct dsi_hc_pre_args *tmpl,
                  const void *dX0,
                  const float *df,
                  const float *post,
                  const float *comb,
                  bool xb,
                  float *o[11]) {
    int64_t n = tmpl->n, D = tmpl->dim, hc = tmpl->hc, nx = n * hc * D, nz = n * D;
    size_t es = xb ? 2 : 4;
    void *dXo = dpoison(es * (size_t)nx);
    float *d[2][5];
    int64_t sz[5] = {nz, n * hc, n * hc * hc, nz, nz};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++)
            d[k][i] = dpoison(sizeof(float) * (size_t)sz[i]);
    dfree(d[0][1]);
    dfree(d[0][2]);
    d[0][1] = dput(post, sizeof(float) * (size_t)(n * hc)); /* (post_first's, read first) */
    d[0][2] = dput(comb, sizeof(float) * (size_t)(n * hc * hc));
    struct dsi_hc_post_args pa = {
        df, (const float *)dX0, d[0][1], d[0][2], (float *)dXo, n, hc, D, true, xb};
    int ok = gsync("xbf16 inputs") == 0;
    for (int k = 0; k < 2; k++) {
        struct dsi_hc_pre_args a = *tmpl;
        a.X = (const float *)dXo;
        a.y = d[k][0];
        a.post = d[k][1];
        a.comb = d[k][2];
        a.z = d[k][3];
        a.zq = d[k][4];
        a.post_first = k == 0 ? &pa : NULL;
        a.xbf16 = xb;
        be->ops->hc_pre(be, &a);
        ok = ok && gsync_on(be, k ? "hc_pre (streams in bf16?)" : "hc_pre with post_first") == 0;
    }
    o[0] = xb_get(dXo, nx, xb);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++) {
            o[1 + 5 * k + i] = xb_get(d[k][i], sz[i], false);
            dfree(d[k][i]);
        }
    dfree(dXo);
    return ok;
}

/* The residual streams in bf16 (the ops' xbf16; DSI_CUDA_XBF16=1, step 52): each op that reads
 * or writes them, on bf16 streams, against the same op of the same backend on floats of the same
 * values, bit for bit (the same values through the same operations; only the loads and stores
 * differ). The backends take the TF32 mix from 1 row and never k_hc_pre_one
 * (DSI_CUDA_HC_TF_MIN=1, DSI_CUDA_HC_ONE=0), so the float runs take the kernels the bf16 ones
 * do: the hc_post inside the mix (DSI_CUDA_HC_PTF=2, the default; 1; 3, which bf16 streams run
 * as 2), k_hc_post's launch before k_hc_mix_tf (=0), the norm inside the finish
 * (DSI_CUDA_HC_FIN_NORM=1). Then the embedding into bf16 streams and gather out of them. */
int test_cuda_hc_xbf16(struct test_ctx *t) {
    NEED_GPU();
    struct rng r = rng_of(t, 11);
    enum { NB = 5 };
    const char *set[NB] = {"", ",DSI_CUDA_HC_PTF=1", ",DSI_CUDA_HC_PTF=3", ",DSI_CUDA_HC_PTF=0",
                           ",DSI_CUDA_HC_FIN_NORM=1"};
    struct dsi_backend *bes[NB];
    for (int b = 0; b < NB; b++) {
        char buf[160];
        snprintf(buf, sizeof(buf), "DSI_CUDA_XBF16=1,DSI_CUDA_HC_TF_MIN=1,DSI_CUDA_HC_ONE=0%s",
                 set[b]);
        bes[b] = cuda_backend_with(buf);
        TEST_ASSERT(bes[b] != NULL);
    }
    struct dsi_backend *be0 = bes[0];
    TEST_ASSERT(be0->ops->xbf16_ok && be0->ops->xbf16_ok(be0, 1, 4, 4096));
    TEST_ASSERT(!be0->ops->xbf16_ok(be0, 1, 4, 200)); /* (dim % 16) */
    TEST_ASSERT(!be0->ops->xbf16_ok(be0, 1, 3, 4096));
    const int64_t dims[] = {128, 4096}, ns[] = {1, 17, 40, 601};
    const char *names[11] = {"streams", "y",        "post",     "comb",  "z",     "zq",
                             "y (2)",   "post (2)", "comb (2)", "z (2)", "zq (2)"};
    for (int di = 0; di < (tiny_only() ? 1 : 2); di++)
        for (int ni = 0; ni < 4; ni++) {
            int64_t D = dims[di], n = ns[ni], hc = 4, len = hc * D, mix = (2 + hc) * hc,
                    nx = n * len, nz = n * D;
            struct wt fn, base, scale, nw;
            wt_make(&fn, &r, DSI_TYPE_F32, mix, len, 1.0f / sqrtf((float)len));
            float *bv = fnorm(&r, mix, 0.5f), *wv = fnorm(&r, D, 0.2f), sv[3];
            for (int i = 0; i < 3; i++)
                sv[i] = 1.0f + 0.1f * rnorm(&r);
            vec_make(&base, bv, mix, DSI_TYPE_F32);
            vec_make(&scale, sv, 3, DSI_TYPE_F32);
            vec_make(&nw, wv, D, DSI_TYPE_F32);
            uint16_t *Xb;
            float *X = xb_rows(&r, nx, 1.0f, &Xb);
            float *f = fnorm(&r, nz, 1.0f), *post = fnorm(&r, n * hc, 1.0f),
                  *comb = fnorm(&r, n * hc * hc, 0.5f);
            float *dX = dput(X, sizeof(float) * (size_t)nx),
                  *df = dput(f, sizeof(float) * (size_t)nz);
            void *dXb = dput(Xb, sizeof(uint16_t) * (size_t)nx);
            struct dsi_hc_pre_args tmpl = {.n = n,
                                           .hc = hc,
                                           .dim = D,
                                           .fn = &fn.d,
                                           .base = &base.d,
                                           .scale = &scale.d,
                                           .iters = 20,
                                           .norm_eps = 1e-6f,
                                           .hc_eps = 1e-6f,
                                           .round_bf16 = true,
                                           .fast = true,
                                           .norm_w = &nw.d,
                                           .z_eps = 1e-6f};
            for (int b = 0; b < NB; b++) {
                float *o[2][11];
                TEST_ASSERT(xb_run(bes[b], &tmpl, dX, df, post, comb, false, o[0]));
                TEST_ASSERT(xb_run(bes[b], &tmpl, dXb, df, post, comb, true, o[1]));
                int64_t sz[11] = {nx, nz,     n * hc,      n * hc * hc, nz, nz,
                                  nz, n * hc, n * hc * hc, nz,          nz};
                for (int i = 0; i < 11; i++) {
                    char what[96];
                    snprintf(what, sizeof(what), "bf16 streams (%s, n %lld, D %lld): %s",
                             set[b][0] ? set[b] + 1 : "default", (long long)n, (long long)D,
                             names[i]);
                    TEST_ASSERT(same(what, o[1][i], o[0][i], sizeof(float) * (size_t)sz[i]));
                    free(o[0][i]);
                    free(o[1][i]);
                }
            }
            /* gather: rows 0 and n - 1 (twice) of the bf16 streams, widened */
            int32_t idx[3] = {(int32_t)(n - 1), 0, (int32_t)(n - 1)};
            int32_t *didx = dput(idx, sizeof(idx));
            float *dg = dpoison(sizeof(float) * (size_t)(3 * len));
            struct dsi_gather_args ga = {(const float *)dXb, didx, dg, 3, len, true};
            be0->ops->gather(be0, &ga);
            TEST_ASSERT(gsync_on(be0, "gather (bf16 rows)") == 0);
            float *gg = xb_get(dg, 3 * len, false);
            for (int i = 0; i < 3; i++)
                TEST_ASSERT(same("gather (bf16 rows)", gg + i * len, X + idx[i] * len,
                                 sizeof(float) * (size_t)len));
            free(gg);
            dfree(dg);
            dfree(didx);
            dfree(dX);
            dfree(df);
            dfree(dXb);
            free(X);
            free(Xb);
            free(f);
            free(post);
            free(comb);
            free(bv);
            free(wv);
            wt_free(&fn);
            wt_free(&base);
            wt_free(&scale);
            wt_free(&nw);
        }
    /* the embedding into bf16 streams: 4 copies of BF16 rows, their bits */
    {
        struct wt tab;
        int64_t D = 4096, n = 5, cp = 4, no = n * cp * D;
        wt_make(&tab, &r, DSI_TYPE_BF16, 300, D, 1.0f);
        int32_t tok[5] = {0, 299, 7, 7, 150};
        int32_t *dtok = dput(tok, sizeof(tok));
        float *df = dpoison(sizeof(float) * (size_t)no);
        void *db = dpoison(sizeof(uint16_t) * (size_t)no);
        struct dsi_embed_args ea = {&tab.d, dtok, n, cp, df, false};
        be0->ops->embed(be0, &ea);
        ea.out = db;
        ea.xbf16 = true;
        be0->ops->embed(be0, &ea);
        TEST_ASSERT(gsync_on(be0, "embed (bf16 streams)") == 0);
        float *of = xb_get(df, no, false), *ob = xb_get(db, no, true);
        TEST_ASSERT(same("embed (bf16 streams)", ob, of, sizeof(float) * (size_t)no));
        free(of);
        free(ob);
        dfree(dtok);
        dfree(df);
        dfree(db);
        wt_free(&tab);
    }
    for (int b = 0; b < NB; b++)
        bes[b]->ops->free(bes[b]);
    return 0;
}
