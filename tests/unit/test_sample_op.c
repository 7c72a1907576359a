/* test_sample_op.c - the CPU backend's sample op against the sampler (run/sample.c without
 * penalties): every row of the batches of sample_cases.h, several threads, rows the op does
 * not take (-1), ld > n_vocab; and the serving engine on the tiny checkpoint with tokens drawn
 * on the host and by the op (the same tokens). */
#include "test.h"

#include "backend/backend.h"
#include "core/core.h"
#include "core/draw.h"
#include "dsinfer.h"
#include "run/sample.h"
#include "unit/sample_cases.h"

#include <stdlib.h>
#include <unistd.h>

/* Run the op on case c with backend be; compare with the sampler row by row. */
static int check_case(struct dsi_backend *be, const struct sample_case *c, int *n_taken) {
    int32_t *out = malloc(sizeof(int32_t) * (size_t)c->n);
    for (int64_t r = 0; r < c->n; r++)
        out[r] = 0x5a5a5a5a;
    struct dsi_sample_args a = {.logits = c->logits,
                                .n = c->n,
                                .n_vocab = c->n_vocab,
                                .ld = c->ld,
                                .rows = c->rows,
                                .out = out};
    be->ops->sample(be, &a);
    struct dsi_sampler *s = dsi_sampler_new((int)c->n_vocab);
    int bad = 0;
    for (int64_t r = 0; r < c->n && !bad; r++) {
        const struct dsi_sample_row *row = &c->rows[r];
        int32_t want = -1;
        if (dsi_sample_op_takes(row, c->n_vocab)) {
            struct dsi_sample_params p = {.temperature = row->temperature,
                                          .top_k = row->top_k,
                                          .top_p = row->top_p,
                                          .min_p = row->min_p,
                                          .repetition_penalty = 1.0f,
                                          .seed = row->seed,
                                          .stream = row->stream};
            want = dsi_sampler_sample(s, c->logits + r * c->ld, &p, NULL, row->pos, NULL);
            (*n_taken)++;
        }
        if (out[r] != want) {
            fprintf(stderr,
                    "\n  %s: row %lld (T %g top_k %d top_p %g min_p %g pos %lld): op %d, "
                    "sampler %d\n",
                    c->name, (long long)r, (double)row->temperature, row->top_k, (double)row->top_p,
                    (double)row->min_p, (long long)row->pos, out[r], want);
            bad = 1;
        }
    }
    dsi_sampler_free(s);
    free(out);
    return bad;
}

int test_sample_op_cpu(struct test_ctx *t) {
    struct dsi_backend *be3 = NULL, *be1 = NULL;
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_backend_cpu_new(&be3, 3, &err) == 0);
    TEST_ASSERT(dsi_backend_cpu_new(&be1, 1, &err) == 0);
    TEST_ASSERT(be3->ops->sample);
    int taken = 0, total = 0;
    for (int i = 0; i < sample_cases_count(); i++) {
        struct sample_case c;
        TEST_ASSERT(sample_case_make(&c, i, t->seed) == 0);
        int bad = check_case(be3, &c, &taken) || check_case(be1, &c, &taken);
        total += 2 * (int)c.n;
        sample_case_free(&c);
        TEST_ASSERT(!bad);
    }
    /* the rows the op takes never need more than DSI_SAMPLE_OP_MAX_TOPK candidates */
    for (int k = -1; k <= 2 * DSI_SAMPLE_OP_MAX_TOPK; k += 7)
        for (int pi = 0; pi < 3; pi++) {
            struct dsi_sample_row row = {.temperature = 1.0f, .top_k = k};
            row.top_p = pi == 0 ? 1.0f : pi == 1 ? 0.5f : 0.0f;
            struct dsi_draw_params p = {.temperature = 1.0f, .top_k = k, .top_p = row.top_p};
            for (int n = 1; n < 3 * DSI_SAMPLE_OP_MAX_TOPK; n = 2 * n + 1)
                if (dsi_sample_op_takes(&row, n))
                    TEST_ASSERT(dsi_draw_scratch(n, &p) <= DSI_SAMPLE_OP_MAX_TOPK);
        }
    fprintf(stderr, "[%d of %d rows drawn] ", taken, total);
    dsi_backend_free(be3);
    dsi_backend_free(be1);
    return 0;
}

/* ---- the engine: host sampling == the sample op ------------------------------------------- */

static int run_engine(const char *dir, int sampling, struct dsi_result **res, int64_t *dev_steps) {
    struct dsi_engine_opts eo = {
        .model_dir = dir, .n_threads = 2, .max_rows = 64, .max_ctx = 256, .max_seqs = 8};
    struct dsi_batch_opts bo = {.sync = true, .chunk_align = 32, .sampling = sampling};
    struct dsi_err err = {0};
    struct dsi_engine *e = NULL;
    if (dsi_batch_open(&e, &eo, &bo, &err)) {
        fprintf(stderr, "  dsi_batch_open: %s\n", err.msg);
        return -1;
    }
    enum { N = 6 };
    static const struct {
        float temperature, top_p, min_p;
        int top_k, n;
    } kinds[N] = {{0.0f, 1.0f, 0.0f, 0, 1}, {0.9f, 1.0f, 0.0f, 0, 2},  {1.0f, 0.9f, 0.0f, 50, 1},
                  {1.3f, 1.0f, 0.1f, 0, 1}, {0.7f, 0.5f, 0.05f, 3, 1}, {1.0f, 1.0f, 0.0f, 1024, 1}};
    int32_t prompt[N][12];
    int rc = 0;
    for (int i = 0; i < N && !rc; i++) {
        for (int k = 0; k < 12; k++)
            prompt[i][k] = 2 + (i * 131 + k * 37) % 1000;
        struct dsi_request q;
        dsi_request_init(&q);
        q.prompt_ids = prompt[i];
        q.n_prompt_ids = 5 + i;
        q.max_tokens = 12;
        q.ignore_eos = true;
        q.temperature = kinds[i].temperature;
        q.top_p = kinds[i].top_p;
        q.top_k = kinds[i].top_k;
        q.min_p = kinds[i].min_p;
        q.n = kinds[i].n;
        q.has_seed = true;
        q.seed = 1000u + (uint64_t)i;
        q.tag = (uint64_t)i;
        res[i] = NULL;
        if (dsi_submit(e, &q, NULL, &err)) {
            fprintf(stderr, "  submit %d: %s\n", i, err.msg);
            rc = -1;
        }
    }
    for (int got = 0; got < N && !rc;) {
        struct dsi_event ev[8];
        int k = dsi_poll(e, ev, 8, 20000);
        if (k <= 0) {
            fprintf(stderr, "  poll: %d (%d of %d results)\n", k, got, N);
            rc = -1;
        }
        for (int i = 0; i < k; i++)
            if (ev[i].kind == DSI_EVENT_DONE) {
                res[ev[i].tag] = ev[i].result;
                got++;
            }
    }
    struct dsi_batch_stats st;
    dsi_batch_get_stats(e, &st);
    *dev_steps = st.device_sampled_steps;
    dsi_batch_close(e);
    return rc;
}

/* The tiny checkpoint through the serving engine with the tokens drawn on the host and by the
 * CPU backend's sample op (DSI_BATCH_SAMPLE_DEVICE): the same tokens. */
int test_sample_op_engine(struct test_ctx *t) {
    char dir[2048];
    snprintf(dir, sizeof(dir), "%s", test_path(t, "tests/golden/tiny-a/model"));
    char cfg[2100];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    if (access(cfg, R_OK)) {
        fprintf(stderr, "  [skipped: no %s] ", dir);
        return 0;
    }
    enum { N = 6 };
    struct dsi_result *host[N], *dev[N];
    int64_t host_steps = 0, dev_steps = 0;
    TEST_ASSERT(run_engine(dir, DSI_BATCH_SAMPLE_HOST, host, &host_steps) == 0);
    TEST_ASSERT(run_engine(dir, DSI_BATCH_SAMPLE_DEVICE, dev, &dev_steps) == 0);
    TEST_ASSERTF(host_steps == 0 && dev_steps > 0, "device-sampled steps: host %lld, device %lld",
                 (long long)host_steps, (long long)dev_steps);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        TEST_ASSERT(host[i] && dev[i] && host[i]->status == 0 && dev[i]->status == 0);
        TEST_ASSERT(host[i]->n == dev[i]->n);
        for (int c = 0; c < host[i]->n; c++) {
            const struct dsi_completion *a = &host[i]->c[c], *b = &dev[i]->c[c];
            if (a->n_tokens != b->n_tokens ||
                memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens)) {
                fprintf(stderr, "\n  request %d completion %d: host and op tokens differ\n", i, c);
                bad = 1;
            }
        }
        dsi_result_free(host[i]);
        dsi_result_free(dev[i]);
    }
    TEST_ASSERT(!bad);
    fprintf(stderr, "[%lld steps sampled by the op] ", (long long)dev_steps);
    return 0;
}
