/* test_model.c - the whole forward pass against outside references, on the tiny random
 * checkpoints of tests/golden/<case> (written by ref/make_goldens.py):
 *  - `plain` logits of every position vs HF transformers' DeepseekV4ForCausalLM in fp32:
 *    relative error (max-norm over the row) <= 1e-4 and the same argmax everywhere, with all
 *    prompts of a case run as several sequences in one batch;
 *  - chunked prefill (chunks 1, 3, 17, whole) bitwise equal, and any thread count bitwise equal;
 *  - the MTP layer's logits vs the spec-written Python reference (ref/mtp_ref.py);
 *  - `reference` numerics: chunk-invariant and close to `plain`; the same bit for bit with the
 *    fp8 and the f32 cache. */
#include "test.h"

#include "dsinfer.h"
#include "core/core.h"

#include <jansson.h>
#include <stdlib.h>

struct golden {
    int n_prompts;
    int32_t *prompts[8];
    int lens[8];
    int vocab;
    int64_t total;
    float *logits, *mtp;
    char model[1024];
};

static float *read_f32(const char *path, int64_t n) {
    char *d = NULL;
    size_t len = 0;
    struct dsi_err err;
    if (dsi_read_file(path, &d, &len, &err) || len != (size_t)n * 4) {
        fprintf(stderr, "  %s: want %lld floats (%s)\n", path, (long long)n,
                d ? "wrong size" : err.msg);
        free(d);
        return NULL;
    }
    return (float *)d;
}

static int golden_load(struct test_ctx *t, const char *name, struct golden *g) {
    memset(g, 0, sizeof(*g));
    char path[2400], dir[1100];
    snprintf(dir, sizeof(dir), "%s", test_path(t, "tests/golden"));
    snprintf(path, sizeof(path), "%s/%s/golden.json", dir, name);
    snprintf(g->model, sizeof(g->model), "%.900s/%.60s/model", dir, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        fprintf(stderr, "  %s: %s\n", path, je.text);
        return -1;
    }
    json_t *ps = json_object_get(j, "prompts");
    g->vocab = (int)json_integer_value(json_object_get(j, "vocab_size"));
    g->n_prompts = (int)json_array_size(ps);
    for (int p = 0; p < g->n_prompts && p < 8; p++) {
        json_t *a = json_array_get(ps, (size_t)p);
        g->lens[p] = (int)json_array_size(a);
        g->prompts[p] = malloc(sizeof(int32_t) * (size_t)g->lens[p]);
        for (int i = 0; i < g->lens[p]; i++)
            g->prompts[p][i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
        g->total += g->lens[p];
    }
    snprintf(path, sizeof(path), "%s/%s/%s", dir, name,
             json_string_value(json_object_get(j, "logits")));
    g->logits = read_f32(path, g->total * g->vocab);
    const char *mt = json_string_value(json_object_get(j, "mtp_logits"));
    if (mt) {
        snprintf(path, sizeof(path), "%s/%s/%s", dir, name, mt);
        g->mtp = read_f32(path, (g->total - g->n_prompts) * g->vocab);
    }
    json_decref(j);
    return g->logits && g->n_prompts > 0 && g->vocab > 0 ? 0 : -1;
}

static void golden_free(struct golden *g) {
    for (int p = 0; p < g->n_prompts; p++)
        free(g->prompts[p]);
    free(g->logits);
    free(g->mtp);
}

/* Run the prompts as one batch stream; out has total rows (mtp: total - n_prompts rows). */
static int run_kv(const struct golden *g,
                  int chunk,
                  int threads,
                  int numerics,
                  int kv_cache,
                  float *out,
                  float *mtp) {
    struct dsi_engine_opts o = {.model_dir = g->model,
                                .n_threads = threads,
                                .max_rows = 1024,
                                .max_ctx = 1024,
                                .numerics = numerics,
                                .kv_cache = kv_cache};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    int rc = dsi_engine_open(&e, &o, &err);
    if (!rc)
        rc = dsi_engine_prompt_logits(e, (const int32_t *const *)g->prompts, g->lens, g->n_prompts,
                                      chunk, out, mtp, &err);
    if (rc) fprintf(stderr, "  engine: %s\n", err.msg);
    dsi_engine_close(e);
    return rc;
}

static int
run(const struct golden *g, int chunk, int threads, int numerics, float *out, float *mtp) {
    return run_kv(g, chunk, threads, numerics, DSI_OPT_KV_AUTO, out, mtp);
}

/* Max over rows of max|a-b| / max|b|, and the number of rows whose argmax differs. */
static double compare(const float *a, const float *b, int64_t rows, int vocab, int *argmax_diff) {
    double worst = 0;
    *argmax_diff = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = a + r * vocab, *y = b + r * vocab;
        double md = 0, my = 0;
        int ax = 0, ay = 0;
        for (int i = 0; i < vocab; i++) {
            md = fmax(md, fabs((double)x[i] - (double)y[i]));
            my = fmax(my, fabs((double)y[i]));
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        worst = fmax(worst, md / (my > 0 ? my : 1));
        *argmax_diff += ax != ay;
    }
    return worst;
}

static int check_case(struct test_ctx *t, const char *name) {
    struct golden g;
    TEST_ASSERTF(golden_load(t, name, &g) == 0, "golden %s", name);
    int64_t n = g.total * g.vocab, nm = (g.total - g.n_prompts) * g.vocab;
    float *whole = malloc(sizeof(float) * (size_t)n), *other = malloc(sizeof(float) * (size_t)n);
    float *mtp = malloc(sizeof(float) * (size_t)(nm + 1));
    TEST_ASSERT(whole && other && mtp);
    TEST_ASSERT(run(&g, 0, 0, DSI_OPT_NUMERICS_PLAIN, whole, g.mtp ? mtp : NULL) == 0);
    int ad;
    double err = compare(whole, g.logits, g.total, g.vocab, &ad);
    fprintf(stderr, "[%s: HF rel err %.2e] ", name, err);
    TEST_ASSERTF(err <= 1e-4, "%s: relative error %.3g vs HF", name, err);
    TEST_ASSERTF(ad == 0, "%s: argmax differs from HF on %d rows", name, ad);
    if (g.mtp) {
        double em = compare(mtp, g.mtp, g.total - g.n_prompts, g.vocab, &ad);
        fprintf(stderr, "[MTP rel err %.2e] ", em);
        TEST_ASSERTF(em <= 1e-4 && ad == 0, "%s: MTP relative error %.3g, %d argmax differ", name,
                     em, ad);
    }
    static const int chunks[] = {1, 3, 17};
    for (int i = 0; i < 3; i++) {
        TEST_ASSERT(run(&g, chunks[i], 0, DSI_OPT_NUMERICS_PLAIN, other, NULL) == 0);
        TEST_ASSERTF(memcmp(other, whole, sizeof(float) * (size_t)n) == 0,
                     "%s: chunk %d differs from the whole-prompt logits", name, chunks[i]);
    }
    TEST_ASSERT(run(&g, 0, 1, DSI_OPT_NUMERICS_PLAIN, other, NULL) == 0);
    TEST_ASSERTF(memcmp(other, whole, sizeof(float) * (size_t)n) == 0, "%s: 1 thread differs",
                 name);
    TEST_ASSERT(run(&g, 0, 3, DSI_OPT_NUMERICS_PLAIN, other, NULL) == 0);
    TEST_ASSERTF(memcmp(other, whole, sizeof(float) * (size_t)n) == 0, "%s: 3 threads differ",
                 name);
    /* Reference numerics: chunk-invariant, and near plain (the [QAT] steps are small). */
    float *ref = malloc(sizeof(float) * (size_t)n);
    TEST_ASSERT(ref && run(&g, 0, 0, DSI_OPT_NUMERICS_REFERENCE, ref, NULL) == 0);
    TEST_ASSERT(run(&g, 5, 0, DSI_OPT_NUMERICS_REFERENCE, other, NULL) == 0);
    TEST_ASSERTF(memcmp(other, ref, sizeof(float) * (size_t)n) == 0,
                 "%s: reference numerics differ between chunked and whole prefill", name);
    /* The FP8 cache rows (the default with reference numerics) hold the [QAT] values exactly:
     * the fp32 cache gives the same logits bit for bit, whole and in chunks of 1 (decode). */
    TEST_ASSERT(run_kv(&g, 0, 0, DSI_OPT_NUMERICS_REFERENCE, DSI_OPT_KV_F32, other, NULL) == 0);
    TEST_ASSERTF(memcmp(other, ref, sizeof(float) * (size_t)n) == 0,
                 "%s: reference numerics differ between the fp8 and the f32 cache", name);
    TEST_ASSERT(run_kv(&g, 1, 0, DSI_OPT_NUMERICS_REFERENCE, DSI_OPT_KV_FP8, other, NULL) == 0);
    TEST_ASSERTF(memcmp(other, ref, sizeof(float) * (size_t)n) == 0,
                 "%s: reference numerics with the fp8 cache differ at chunk 1", name);
    /* The fp8 cache with plain numerics (values that are not FP8's) is refused. */
    TEST_ASSERT(run_kv(&g, 0, 0, DSI_OPT_NUMERICS_PLAIN, DSI_OPT_KV_FP8, other, NULL) != 0);
    /* `fast` numerics is reference's arithmetic with freedom for a device's GEMMs; the CPU
     * backend, the reference, computes it exactly as reference. */
    TEST_ASSERT(run(&g, 0, 0, DSI_OPT_NUMERICS_FAST, other, NULL) == 0);
    TEST_ASSERTF(memcmp(other, ref, sizeof(float) * (size_t)n) == 0,
                 "%s: fast numerics differ from reference on the CPU", name);
    double er = compare(ref, whole, g.total, g.vocab, &ad);
    fprintf(stderr, "[reference vs plain %.2e] ", er);
    /* Random-weight models amplify the [QAT] noise, so only "it differs" is checked here; the
     * trained default model's perplexity under both profiles is compared in t_tiny_model.sh. */
    TEST_ASSERTF(er > 0, "%s: reference numerics equal plain", name);
    free(ref);
    free(whole);
    free(other);
    free(mtp);
    golden_free(&g);
    return 0;
}

int test_model_tiny_a(struct test_ctx *t) { return check_case(t, "tiny-a"); }
int test_model_tiny_b(struct test_ctx *t) { return check_case(t, "tiny-b"); }

/* Out-of-range token ids are refused before they reach the model. */
int test_model_bad_tokens(struct test_ctx *t) {
    struct golden g;
    TEST_ASSERT(golden_load(t, "tiny-a", &g) == 0);
    int32_t bad[3] = {5, g.vocab, 7};
    const int32_t *ps[1] = {bad};
    int lens[1] = {3};
    struct dsi_engine_opts o = {.model_dir = g.model, .max_rows = 16, .max_ctx = 64};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_engine_open(&e, &o, &err) == 0);
    float *out = malloc(sizeof(float) * 3 * (size_t)g.vocab);
    int rc = dsi_engine_prompt_logits(e, ps, lens, 1, 0, out, NULL, &err);
    TEST_ASSERTF(rc == DSI_ERR_INVALID && strstr(err.msg, "out of range"), "%s", err.msg);
    bad[1] = -1;
    rc = dsi_engine_prompt_logits(e, ps, lens, 1, 0, out, NULL, &err);
    TEST_ASSERT(rc == DSI_ERR_INVALID);
    free(out);
    dsi_engine_close(e);
    golden_free(&g);
    return 0;
}

/* ---- recorded (graph) steps ------------------------------------------------------------------
 * A backend with graph ops makes the forward pad the compressors' emit lists of decode steps
 * to every row (emit_rows -1). On the CPU backend with graph ops that always answer "eager",
 * decode steps with several sequences (entries closing at different steps, CSA and HCA) give
 * the same logits, bit for bit, as without them. (Capture and replay: tests/ops on the GPU.) */
#include "backend/backend.h"
#include "cache/kv.h"
#include "model/forward.h"

static int eager_begin(struct dsi_backend *be, uint64_t key) {
    (void)be;
    (void)key;
    return DSI_GRAPH_EAGER;
}
static int eager_end(struct dsi_backend *be) {
    (void)be;
    return DSI_OK;
}
static void eager_reset(struct dsi_backend *be) { (void)be; }

static int decode_run(const char *dir, bool pad, int n_seq, int steps, float *out, int vocab) {
    struct dsi_err err = {0};
    struct dsi_model *m = NULL;
    struct dsi_backend *be = NULL;
    struct dsi_kv *kv = NULL;
    struct dsi_fwd *f = NULL;
    struct dsi_backend_ops ops;
    const struct dsi_backend_ops *cpu_ops = NULL;
    int rc = dsi_model_load(&m, dir, &err);
    if (!rc) rc = dsi_backend_cpu_new(&be, 1, &err);
    if (!rc && pad) {
        cpu_ops = be->ops;
        ops = *be->ops;
        ops.graph_begin = eager_begin;
        ops.graph_end = eager_end;
        ops.graph_reset = eager_reset;
        be->ops = &ops;
    }
    if (!rc) rc = dsi_model_import(m, be, &err);
    struct dsi_kv_opts ko = {.max_seqs = n_seq, .max_ctx = steps + 1, .max_rows = n_seq};
    if (!rc) rc = dsi_kv_new(&kv, &m->cfg, be, &ko, &err);
    if (!rc) rc = dsi_fwd_new(&f, m, be, kv, n_seq, DSI_NUMERICS_PLAIN, &err);
    int32_t tok[16], pos[16], slot[16];
    for (int s = 0; s < n_seq && !rc; s++)
        rc = dsi_kv_seq_new(kv, &slot[s], &err);
    for (int t = 0; t < steps && !rc; t++) {
        /* sequence s joins at step s, so the sequences' compression windows close apart */
        int n = 0;
        for (int s = 0; s < n_seq; s++) {
            if (t < s) continue;
            tok[n] = (int32_t)((7 * s + 13 * t + 1) % vocab);
            pos[n] = t - s;
            slot[n] = slot[s];
            n++;
        }
        for (int i = 0; i < n && !rc; i++)
            rc = dsi_kv_reserve(kv, slot[i], pos[i] + 1, &err);
        struct dsi_batch b = {n, tok, pos, slot, NULL};
        if (!rc) rc = dsi_forward(f, &b, out + (int64_t)t * n_seq * vocab, NULL, &err);
    }
    if (rc) fprintf(stderr, "%s ", err.msg);
    dsi_fwd_free(f);
    dsi_kv_free(kv);
    if (cpu_ops) be->ops = cpu_ops;
    dsi_backend_free(be);
    dsi_model_free(m);
    return rc;
}

int test_model_graph_padding(struct test_ctx *t) {
    struct golden g;
    TEST_ASSERT(golden_load(t, "tiny-b", &g) == 0);
    int n_seq = 5, steps = 40;
    size_t n = (size_t)steps * n_seq * g.vocab;
    float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
    TEST_ASSERT(a && b);
    TEST_ASSERT(decode_run(g.model, false, n_seq, steps, a, g.vocab) == 0);
    TEST_ASSERT(decode_run(g.model, true, n_seq, steps, b, g.vocab) == 0);
    TEST_ASSERTF(memcmp(a, b, n * sizeof(float)) == 0,
                 "padded emit lists change the logits of decode steps");
    free(a);
    free(b);
    golden_free(&g);
    return 0;
}
