/* test_model_cuda.c - the whole model on the CUDA backend against the CPU backend, on the
 * golden tiny checkpoints (split from test_ops_cuda.c, which tests op by op). Without a CUDA
 * device the tests print "skipped" and pass. */
#include "test.h"

#include "backend/backend.h"
#include "core/core.h"
#include "dsinfer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int gpu_available(void) {
    static int state; /* 0 not tried, 1 yes, -1 no */
    if (!state) {
        struct dsi_backend *be = NULL;
        struct dsi_err err = {0};
        setenv("DSI_CUDA_PDL", "2", 0); /* every launch overlapped (unless the caller says) */
        state = dsi_backend_cuda_new(&be, 0, &err) == 0 ? 1 : -1;
        if (state < 0) fprintf(stderr, "[%s] ", err.msg);
        dsi_backend_free(be);
    }
    return state > 0;
}

/* ---- the whole model: CUDA vs CPU
 * ----------------------------------------------------------------- */

struct prompts {
    int n;
    int32_t *p[8];
    int len[8];
    int64_t total;
};

static int
load_prompts(struct test_ctx *t, const char *name, struct prompts *ps, char *model, size_t cap) {
    memset(ps, 0, sizeof(*ps));
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s/golden.json", test_path(t, "tests/golden"), name);
    snprintf(model, cap, "%s/%s/model", test_path(t, "tests/golden"), name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return -1;
    json_t *a = json_object_get(j, "prompts");
    for (size_t i = 0; i < json_array_size(a) && ps->n < 8; i++) {
        json_t *p = json_array_get(a, i);
        int L = (int)json_array_size(p);
        ps->p[ps->n] = malloc(sizeof(int32_t) * (size_t)L);
        for (int k = 0; k < L; k++)
            ps->p[ps->n][k] = (int32_t)json_integer_value(json_array_get(p, (size_t)k));
        ps->len[ps->n++] = L;
        ps->total += L;
    }
    json_decref(j);
    return ps->n ? 0 : -1;
}

static int engine_logits(const char *model,
                         const char *backend,
                         int numerics,
                         int chunk,
                         const struct prompts *ps,
                         float *out,
                         float *mtp) {
    struct dsi_engine_opts o = {.model_dir = model,
                                .backend = backend,
                                .max_rows = 1024,
                                .max_ctx = 1024,
                                .numerics = numerics};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    int rc = dsi_engine_open(&e, &o, &err);
    if (!rc)
        rc = dsi_engine_prompt_logits(e, (const int32_t *const *)ps->p, ps->len, ps->n, chunk, out,
                                      mtp, &err);
    if (rc) fprintf(stderr, "\n  engine (%s): %s\n", backend, err.msg);
    dsi_engine_close(e);
    return rc;
}

/* Max over rows of max|a-b| / max|b|; rows whose argmax differs; rows over 2e-2. */
static double
rows_rel(const float *a, const float *b, int64_t rows, int vocab, int64_t *nd, int64_t *over) {
    double worst = 0;
    *nd = 0;
    *over = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = a + r * vocab, *y = b + r * vocab;
        double md = 0, my = 0;
        int ax = 0, ay = 0;
        for (int i = 0; i < vocab; i++) {
            double d = fabs((double)x[i] - (double)y[i]);
            md = isnan(d) ? (double)INFINITY : fmax(md, d);
            my = fmax(my, fabs((double)y[i]));
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        double rel = md / (my > 0 ? my : 1);
        worst = fmax(worst, rel);
        *over += rel > 2e-2;
        *nd += ax != ay;
    }
    return worst;
}

/* The CUDA logits with var=val set, whole (same[0]) and at chunk 1 (same[1]): whether each
 * equals g (n floats) bit for bit; -1 if a run failed. o: scratch of n floats. */
static int same_with(const char *model,
                     int num,
                     const struct prompts *ps,
                     float *o,
                     const float *g,
                     int64_t n,
                     const char *var,
                     const char *val,
                     int same[2]) {
    int rc = 0;
    setenv(var, val, 1);
    for (int ch = 0; ch < 2; ch++) {
        int r = engine_logits(model, "cuda", num, ch, ps, o, NULL);
        same[ch] = !r && !memcmp(o, g, sizeof(float) * (size_t)n);
        if (r) rc = -1;
    }
    unsetenv(var);
    return rc;
}

static int model_case(struct test_ctx *t, const char *name, bool fast_check) {
    if (!gpu_available()) {
        fprintf(stderr, "[skipped: no CUDA device] ");
        return 0;
    }
    struct prompts ps;
    char model[1200];
    if (load_prompts(t, name, &ps, model, sizeof(model))) {
        fprintf(stderr, "[skipped: tests/golden/%s missing] ", name);
        return 0;
    }
    const int V = 1024; /* tiny presets */
    int64_t n = ps.total * V, nm = (ps.total - ps.n) * V;
    float *c = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n),
          *o = malloc(sizeof(float) * (size_t)n);
    float *cm = malloc(sizeof(float) * (size_t)nm), *gm = malloc(sizeof(float) * (size_t)nm);
    for (int num = 1; num >= 0; num--) { /* reference first: the brief's criterion */
        const char *pn = num ? "reference" : "plain";
        TEST_ASSERT(engine_logits(model, "cpu", num, 0, &ps, c, cm) == 0);
        TEST_ASSERT(engine_logits(model, "cuda", num, 0, &ps, g, gm) == 0);
        int64_t nd, ndm, ov, ovm, rows = ps.total, mrows = ps.total - ps.n;
        double e = rows_rel(g, c, rows, V, &nd, &ov), em = rows_rel(gm, cm, mrows, V, &ndm, &ovm);
        int64_t bits = 0;
        for (int64_t i = 0; i < n; i++)
            bits += memcmp(&g[i], &c[i], 4) != 0;
        fprintf(stderr,
                "[%s %s: rel %.2e, argmax differs %lld/%lld, %lld values not bitwise; MTP: rel "
                "%.2e, %lld rows > 2e-2, argmax differs %lld/%lld] ",
                name, pn, e, (long long)nd, (long long)rows, (long long)bits, em, (long long)ovm,
                (long long)ndm, (long long)mrows);
        /* The brief's criterion on the logits. For the MTP logits in reference numerics only
         * the argmax: a last-bit difference (exp/log1p/sin/cos, see cuda/common.cuh) can flip
         * an FP8/bf16 rounding or a top-k expert in one row, and the MTP layer's window then
         * carries that row's KV into the next 128 positions (tiny-b: 27 of 438 MTP rows over
         * 2e-2, max 4e-2, one argmax of 438, while the main logits differ in one row by 9e-4). */
        TEST_ASSERTF(e <= 2e-2, "%s %s: CUDA vs CPU relative error %.3g", name, pn, e);
        TEST_ASSERTF(num || em <= 2e-2, "%s %s: MTP relative error %.3g", name, pn, em);
        TEST_ASSERTF(nd * 100 <= rows && ndm * 100 <= mrows,
                     "%s %s: argmax differs on %lld rows (MTP %lld)", name, pn, (long long)nd,
                     (long long)ndm);
        if (num && fast_check) {
            /* `fast` numerics (tensor-core GEMMs) against the CPU in reference numerics, by the
             * same rule. Only on tiny-a: tiny-b's indexer picks 8 of up to 75 entries whose
             * random-weight scores come close enough that a tensor-core sum order changes a
             * pick at position 57, and the window carries that into the next positions (rel
             * 3e-2; with index_topk raised over the entry count, 3.6e-7: fast_flips.sh). Twice:
             * the whole prompt with the GEMM kernels at their minimum (every dense GEMM and
             * expert on tc.cu), then token by token with the default thresholds (gvf.cu at
             * every step). Attention stays on the exact kernels (the tensor-core products from
             * 128 rows, which tiny-a's prompts do not reach; the fused kernel of attn_fa.cu,
             * default from 32 rows, off here: DSI_CUDA_ATTN_FA=0): with the tensor-core
             * products forced on, a probability rounded to bf16 on its other neighbour moves
             * tiny-a's second prompt from position 12 (0.33), and the fused kernel, which
             * rounds the probabilities before the normalisation, moves it from the first
             * position (0.93). The op test test_cuda_attn bounds those kernels themselves, and
             * tests/cli/t_cuda.sh checks them on the trained model by perplexity. */
            /* (Step 31 added a third pass, the MoE on wgq.cu's FP8 tensor cores from 1 row per
             * expert: step 32 measured rel 0.48 from the first position, argmax 13/115, as
             * step 31's wgd.cu on the same numerics. tiny-a's random weights turn a 4e-3 change
             * of one attention probability into 0.93 (above), so this model cannot tell FP8
             * numerics from a bug; tests/cli/t_cuda.sh checks wgq.cu on the trained model by
             * perplexity instead, and test_cuda_moe_fast bounds the op.) */
            bool set = !getenv("DSI_CUDA_TC_DENSE") && !getenv("DSI_CUDA_TC_MOE");
            /* (k_hc_pre_one's pieces summed by shuffles, the default since step 41, move the
               mix by ~1e-7 (test_cuda_hc bounds them within 2e-5 of the CPU), which tiny-a's
               random weights turned into 2.4e-2 at pass 1 in step 41's run 2: off here too,
               DSI_CUDA_HC_TREE=0, the pieces in chunk order) */
            bool set_fa = !getenv("DSI_CUDA_ATTN_FA"), set_tree = !getenv("DSI_CUDA_HC_TREE");
            for (int pass = 0; pass < 2; pass++) {
                if (set && pass == 0) {
                    setenv("DSI_CUDA_TC_DENSE", "1", 1);
                    setenv("DSI_CUDA_TC_MOE", "0", 1);
                }
                if (set_fa) setenv("DSI_CUDA_ATTN_FA", "0", 1);
                if (set_tree) setenv("DSI_CUDA_HC_TREE", "0", 1);
                int rc = engine_logits(model, "cuda", DSI_OPT_NUMERICS_FAST, pass == 1, &ps, o, gm);
                if (set_fa) unsetenv("DSI_CUDA_ATTN_FA");
                if (set_tree) unsetenv("DSI_CUDA_HC_TREE");
                if (set && pass == 0) {
                    unsetenv("DSI_CUDA_TC_DENSE");
                    unsetenv("DSI_CUDA_TC_MOE");
                }
                TEST_ASSERT(rc == 0);
                double ef = rows_rel(o, c, rows, V, &nd, &ov);
                double efm = rows_rel(gm, cm, mrows, V, &ndm, &ovm);
                fprintf(stderr, "[%s fast%s: rel %.2e, argmax differs %lld/%lld; MTP rel %.2e] ",
                        name, pass == 1 ? " decode" : "", ef, (long long)nd, (long long)rows, efm);
                for (int64_t rr = 0, shown = 0; ef > 2e-2 && rr < rows && shown < 12; rr++) {
                    int64_t a1, a2;
                    double er = rows_rel(o + rr * V, c + rr * V, 1, V, &a1, &a2);
                    if (er > 1e-3) {
                        fprintf(stderr, "\n    row %lld rel %.3g argmax %s", (long long)rr, er,
                                a1 ? "differs" : "same");
                        shown++;
                    }
                }
                TEST_ASSERTF(ef <= 2e-2,
                             "%s fast pass %d: CUDA vs CPU reference relative error %.3g", name,
                             pass, ef);
                TEST_ASSERTF(nd * 100 <= rows && ndm * 100 <= mrows,
                             "%s fast pass %d: argmax differs on %lld rows (MTP %lld)", name, pass,
                             (long long)nd, (long long)ndm);
            }
            if (!getenv("DSI_CUDA_MOE_SIDE")) {
                /* the shared expert on a side stream (the default since step 38; forked into
                   the captured steps) changes no `fast` logit: token by token (the steps
                   captured and replayed as graphs), against the same run without it
                   (DSI_CUDA_MOE_SIDE=0) */
                float *o2 = malloc(sizeof(float) * (size_t)n);
                TEST_ASSERT(o2 != NULL);
                int r1 = engine_logits(model, "cuda", DSI_OPT_NUMERICS_FAST, 1, &ps, o, NULL);
                setenv("DSI_CUDA_MOE_SIDE", "0", 1);
                int r2 = engine_logits(model, "cuda", DSI_OPT_NUMERICS_FAST, 1, &ps, o2, NULL);
                unsetenv("DSI_CUDA_MOE_SIDE");
                bool same = !r1 && !r2 && !memcmp(o, o2, sizeof(float) * (size_t)n);
                free(o2);
                TEST_ASSERTF(same, "%s fast: CUDA with the shared expert's side stream differs",
                             name);
            }
            if (!getenv("DSI_CUDA_XBF16") && !getenv("DSI_CUDA_HC_TF_MIN") &&
                !getenv("DSI_CUDA_HC_ONE")) {
                /* the residual streams in bf16 (step 52; on by default from 128 rows; their
                   values are bf16) change no `fast` logit: whole and token by token, against the
                   same kernels on float streams (DSI_CUDA_XBF16=0; both from 1 row on the TF32
                   mix, without k_hc_pre_one: DSI_CUDA_HC_TF_MIN=1, DSI_CUDA_HC_ONE=0) */
                float *o2 = malloc(sizeof(float) * (size_t)n);
                TEST_ASSERT(o2 != NULL);
                setenv("DSI_CUDA_HC_TF_MIN", "1", 1);
                setenv("DSI_CUDA_HC_ONE", "0", 1);
                bool same[2];
                for (int ch = 0; ch < 2; ch++) {
                    setenv("DSI_CUDA_XBF16", "0", 1);
                    int r1 = engine_logits(model, "cuda", DSI_OPT_NUMERICS_FAST, ch, &ps, o, NULL);
                    setenv("DSI_CUDA_XBF16", "1", 1);
                    int r2 = engine_logits(model, "cuda", DSI_OPT_NUMERICS_FAST, ch, &ps, o2, NULL);
                    same[ch] = !r1 && !r2 && !memcmp(o, o2, sizeof(float) * (size_t)n);
                }
                unsetenv("DSI_CUDA_XBF16");
                unsetenv("DSI_CUDA_HC_TF_MIN");
                unsetenv("DSI_CUDA_HC_ONE");
                free(o2);
                TEST_ASSERTF(same[0] && same[1],
                             "%s fast: CUDA with bf16 streams differs (whole %d, chunk 1 %d)", name,
                             same[0], same[1]);
            }
        }
        static const int chunks[] = {1, 3, 17};
        for (int i = 0; i < 3; i++) {
            TEST_ASSERT(engine_logits(model, "cuda", num, chunks[i], &ps, o, NULL) == 0);
            TEST_ASSERTF(!memcmp(o, g, sizeof(float) * (size_t)n),
                         "%s %s: CUDA chunk %d differs from the whole-prompt CUDA logits", name, pn,
                         chunks[i]);
        }
        if (num && !getenv("DSI_CUDA_L2PF")) {
            /* the prefetch hints taken at every step (DSI_CUDA_L2PF, step 35: a side stream
               forked into the captured steps) change no logit: whole and at chunk 1 (the
               token-by-token steps captured and replayed as graphs) */
            int same[2];
            TEST_ASSERT(same_with(model, num, &ps, o, g, n, "DSI_CUDA_L2PF", "4096", same) == 0);
            TEST_ASSERTF(same[0] && same[1],
                         "%s %s: CUDA with prefetch hints differs (whole %d, chunk 1 %d)", name, pn,
                         same[0], same[1]);
        }
        if (!getenv("DSI_CUDA_HC_PF")) {
            /* the hc_post owed by each sublayer made inside the next hc_pre's k_hc_pre_one (the
               default since step 41, up to 32 rows: the token-by-token steps) gives the logits
               of its own launch first (DSI_CUDA_HC_PF=0) bit for bit, whole and at chunk 1 */
            int same[2];
            TEST_ASSERT(same_with(model, num, &ps, o, g, n, "DSI_CUDA_HC_PF", "0", same) == 0);
            TEST_ASSERTF(same[0] && same[1],
                         "%s %s: CUDA with hc_post's own launch differs (whole %d, chunk 1 %d)",
                         name, pn, same[0], same[1]);
        }
        if (num && !getenv("DSI_CUDA_KV_FP8")) {
            /* FP8 cache rows (the engine's auto format, step 30) hold the reference values
               exactly: fp32 rows (DSI_CUDA_KV_FP8=0) give the same logits bit for bit, whole and
               at chunk 1 */
            int same[2];
            TEST_ASSERT(same_with(model, num, &ps, o, g, n, "DSI_CUDA_KV_FP8", "0", same) == 0);
            TEST_ASSERTF(same[0] && same[1],
                         "%s %s: CUDA with fp32 cache rows differs from FP8 rows (whole %d, chunk "
                         "1 %d)",
                         name, pn, same[0], same[1]);
        }
    }
    for (int i = 0; i < ps.n; i++)
        free(ps.p[i]);
    free(c);
    free(g);
    free(o);
    free(cm);
    free(gm);
    return 0;
}

int test_cuda_model_tiny_a(struct test_ctx *t) { return model_case(t, "tiny-a", true); }
int test_cuda_model_tiny_b(struct test_ctx *t) { return model_case(t, "tiny-b", false); }
