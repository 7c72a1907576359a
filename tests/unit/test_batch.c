/* test_batch.c - the serving API (src/run/batch.c) on the tiny random checkpoint
 * tests/golden/tiny-a/model (vocab 1024, no tokenizer) and, for text, the same weights with
 * the tokenizer of models/dsv4-tiny:
 *  - batch composition: a greedy request alone (async) == inside a batch of others (sync)
 *    == dsi_engine_generate;
 *  - oversubscription: many more requests than the page pool holds all complete, with
 *    preemptions, and their greedy / seeded outputs equal a run that never preempts;
 *    and asynchronous scheduling on == off (tokens, logprobs, finish reasons);
 *  - seeds: same seed same output whatever the batch, n > 1 completion 0 == n = 1;
 *  - logprobs == log-softmax of the logits of the prompt + generated tokens;
 *  - stop strings across token boundaries (text cut, streamed text == final text),
 *    stop token ids, cancellation, bad requests, no page leaked at idle.
 * Skipped (passes with a note) when the checkpoint is not there. */
#include "test.h"

#include "core/core.h"
#include "dsinfer.h"
#include "tok/bpe.h"
#include "batch_util.h"

#include <stdlib.h>
#include <unistd.h>

static const char *model_dir(struct test_ctx *t) {
    static char dir[2048];
    snprintf(dir, sizeof(dir), "%s", test_path(t, "tests/golden/tiny-a/model"));
    char cfg[2100];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    if (access(cfg, R_OK)) {
        fprintf(stderr, "  [skipped: no %s] ", dir);
        return NULL;
    }
    return dir;
}

/* Wait until the engine thread is idle with every page back (results can arrive a moment
 * before the engine has released the last sequence's pages). */
static int wait_idle(struct dsi_engine *e, struct dsi_batch_stats *st) {
    for (int i = 0; i < 2000; i++) {
        dsi_batch_get_stats(e, st);
        if (!st->n_running && !st->n_waiting && !st->n_inflight &&
            st->pages_free == st->pages_total)
            return 0;
        usleep(1000);
    }
    fprintf(stderr, "  not idle: %d running, %d waiting, %lld of %lld pages free\n", st->n_running,
            st->n_waiting, (long long)st->pages_free, (long long)st->pages_total);
    return -1;
}

static bool same_completion(const struct dsi_completion *a, const struct dsi_completion *b) {
    if (a->n_tokens != b->n_tokens || a->finish != b->finish || a->stop_token != b->stop_token)
        return false;
    if (memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens)) return false;
    if ((a->logprobs != NULL) != (b->logprobs != NULL)) return false;
    if (a->logprobs && memcmp(a->logprobs, b->logprobs, sizeof(float) * (size_t)a->n_tokens))
        return false;
    if ((a->text != NULL) != (b->text != NULL)) return false;
    if (a->text && (a->text_len != b->text_len || memcmp(a->text, b->text, a->text_len)))
        return false;
    return true;
}

static bool same_result(const struct dsi_result *a, const struct dsi_result *b) {
    if (a->status != b->status || a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (!same_completion(&a->c[i], &b->c[i])) return false;
    return true;
}

static int32_t *rand_prompt(unsigned *rs, int n) {
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        p[i] = 2 + rand_r(rs) % 1000;
    return p;
}

static struct dsi_request greedy_req(const int32_t *p, int n, int max_tokens) {
    struct dsi_request q;
    dsi_request_init(&q);
    q.prompt_ids = p;
    q.n_prompt_ids = n;
    q.max_tokens = max_tokens;
    q.temperature = 0.0f;
    q.ignore_eos = true;
    return q;
}

static int collect_token(int32_t tok, void *user) {
    int32_t **p = user;
    *(*p)++ = tok;
    return 0;
}

int test_batch_invariance(struct test_ctx *t) {
    const char *dir = model_dir(t);
    if (!dir) return 0;
    unsigned rs = t->seed;
    enum { N = 6 };
    int32_t *p[N];
    struct dsi_request q[N];
    for (int i = 0; i < N; i++) {
        int len = 3 + rand_r(&rs) % 40;
        p[i] = rand_prompt(&rs, len);
        q[i] = greedy_req(p[i], len, 6 + i);
        if (i % 3 == 1) { /* some sampled neighbours */
            q[i].temperature = 0.9f;
            q[i].has_seed = true;
            q[i].seed = (uint64_t)i;
        }
    }
    struct dsi_engine *e = NULL;
    struct dsi_result *alone[1], *all[N];
    TEST_ASSERT(!tb_open(&e, dir, 8, 0, false, NULL)); /* alone: async */
    TEST_ASSERT(!tb_run(e, &q[0], 1, alone));
    dsi_batch_close(e);
    TEST_ASSERT(!tb_open(&e, dir, 8, 0, true, NULL)); /* in a batch: sync */
    TEST_ASSERT(!tb_run(e, q, N, all));
    TEST_ASSERT(alone[0]->status == 0 && alone[0]->c[0].n_tokens == 6);
    TEST_ASSERT(same_result(alone[0], all[0]));
    TEST_ASSERT(all[0]->c[0].finish == DSI_FINISH_LENGTH);
    struct dsi_batch_stats st;
    TEST_ASSERT(!wait_idle(e, &st));
    dsi_batch_close(e);
    /* the same tokens as dsi_engine_generate (same forward, same greedy rule) */
    struct dsi_engine_opts eo = {.model_dir = dir, .n_threads = 1, .max_ctx = 256};
    TEST_ASSERT(!dsi_engine_open(&e, &eo, NULL));
    int32_t got[16], *w = got;
    struct dsi_sampling s = {0};
    TEST_ASSERT(!dsi_engine_generate(e, p[0], q[0].n_prompt_ids, 6, &s, collect_token, &w, NULL));
    TEST_ASSERT(w - got == 6 && !memcmp(got, alone[0]->c[0].tokens, sizeof(int32_t) * 6));
    dsi_engine_close(e);
    tb_free(alone, 1);
    tb_free(all, N);
    for (int i = 0; i < N; i++)
        free(p[i]);
    return 0;
}

/* Oversubscription and asynchronous scheduling. A page pool of 2 pages (512 positions) holds
 * two sequences at a time (a page is 256 positions); 20 requests (40 with --slow), some with
 * n > 1, are submitted at once (async; --slow also sync). The first is long (250 + 10 tokens): when
 * it crosses its first page boundary the pool is empty and the youngest running sequence is
 * preempted, then recomputed later. Every request completes; outputs with asynchronous scheduling
 * on and off are identical (tokens, logprobs, finish reasons); the preempted requests (greedy or
 * seeded, with penalties, top-k, min-p, stop ids) give the same output as when run alone with a
 * large pool. The fake-forward test (test_sched_random) preempts far more, under 10,000 requests.
 */
int test_batch_oversubscribe(struct test_ctx *t) {
    const char *dir = model_dir(t);
    if (!dir) return 0;
    unsigned rs = t->seed + 1;
    int n = t->slow ? 40 : 20;
    int32_t *p[40];
    struct dsi_request q[40];
    struct dsi_result *res[2][40];
    int32_t stop_ids[2] = {7, 9};
    for (int i = 0; i < n; i++) {
        int len = i ? 3 + rand_r(&rs) % 6 : 250;
        p[i] = rand_prompt(&rs, len);
        q[i] = greedy_req(p[i], len, i ? 6 + rand_r(&rs) % 6 : 10);
        if (i % 2) { /* seeded sampling survives preemption too (keyed draws) */
            q[i].temperature = 0.8f + 0.1f * (float)(i % 3);
            q[i].has_seed = true;
            q[i].seed = 100u + (uint64_t)i;
        }
        q[i].n = i % 4 == 3 ? 2 : 1;
        q[i].top_p = i % 3 == 1 ? 0.9f : 1.0f;
        q[i].top_k = i % 5 == 3 ? 20 : 0;
        q[i].min_p = i % 5 == 4 ? 0.05f : 0.0f;
        q[i].presence_penalty = i % 3 == 2 ? 0.7f : 0.0f;
        q[i].frequency_penalty = i % 4 == 1 ? 0.3f : 0.0f;
        q[i].repetition_penalty = i % 4 == 2 ? 1.3f : 1.0f;
        q[i].top_logprobs = i % 3;
        q[i].logprobs = i % 2;
        q[i].ignore_eos = i % 3 != 2;
        if (i % 4 == 0 && i) {
            q[i].stop_token_ids = stop_ids;
            q[i].n_stop_token_ids = 2;
        }
    }
    struct dsi_engine *e = NULL;
    struct dsi_batch_stats st;
    for (int mode = t->slow ? 0 : 1; mode < 2; mode++) { /* sync (--slow), async */
        TEST_ASSERT(!tb_open(&e, dir, 8, 2, mode == 0, NULL));
        TEST_ASSERT(!tb_run(e, q, n, res[mode]));
        TEST_ASSERT(!wait_idle(e, &st));
        fprintf(stderr, "[%s: %lld preemptions, %lld steps] ", mode ? "async" : "sync",
                (long long)st.preemptions, (long long)st.steps);
        TEST_ASSERT(st.preemptions > 0 && st.pages_total == 2);
        dsi_batch_close(e);
    }
    TEST_ASSERT(!tb_open(&e, dir, 8, 0, false, NULL)); /* room for all: no preemption */
    int preempted = 0;
    for (int i = 0; i < n; i++) {
        struct dsi_result *r = res[1][i];
        TEST_ASSERTF(r->status == 0 && r->n == q[i].n, "%s", r->error);
        TEST_ASSERTF(!t->slow || same_result(r, res[0][i]), "request %d: async differs from sync",
                     i);
        bool pre = false;
        for (int k = 0; k < r->n; k++) {
            const struct dsi_completion *c = &r->c[k];
            pre |= c->n_preemptions > 0;
            TEST_ASSERT(c->n_tokens >= 1 && c->n_tokens <= q[i].max_tokens);
            TEST_ASSERT((c->logprobs != NULL) == (q[i].logprobs || q[i].top_logprobs));
            if (c->finish == DSI_FINISH_STOP) {
                int32_t last = c->tokens[c->n_tokens - 1];
                TEST_ASSERT(last == c->stop_token && (last == 1 || last == 7 || last == 9));
            } else {
                TEST_ASSERT(c->finish == DSI_FINISH_LENGTH && c->n_tokens == q[i].max_tokens);
            }
        }
        if (!pre) continue;
        preempted++;
        struct dsi_result *alone[1];
        TEST_ASSERT(!tb_run(e, &q[i], 1, alone));
        TEST_ASSERTF(same_result(r, alone[0]), "request %d differs after preemption", i);
        dsi_result_free(alone[0]);
    }
    TEST_ASSERT(preempted > 0);
    dsi_batch_get_stats(e, &st);
    TEST_ASSERT(st.preemptions == 0);
    dsi_batch_close(e);
    if (t->slow) tb_free(res[0], n);
    tb_free(res[1], n);
    for (int i = 0; i < n; i++)
        free(p[i]);
    return 0;
}

/* Seeds: the same seed gives the same tokens alone and in a crowd; completion 0 of n = 3 is
 * the n = 1 output; different seeds differ; logprobs match the teacher-forced logits. */
int test_batch_seed_logprobs(struct test_ctx *t) {
    const char *dir = model_dir(t);
    if (!dir) return 0;
    unsigned rs = t->seed + 3;
    int32_t *p = rand_prompt(&rs, 17);
    struct dsi_request q[6];
    for (int i = 0; i < 6; i++) {
        q[i] = greedy_req(p, 17, 8);
        q[i].temperature = 1.0f;
        q[i].top_p = 0.95f;
        q[i].has_seed = true;
        q[i].seed = 1234;
        q[i].top_logprobs = 3;
    }
    q[1].n = 3;
    q[2].seed = 1235;
    int32_t *other[3];
    for (int i = 3; i < 6; i++) { /* background load */
        other[i - 3] = rand_prompt(&rs, 5 + 3 * i);
        q[i].prompt_ids = other[i - 3];
        q[i].n_prompt_ids = 5 + 3 * i;
        q[i].seed = (uint64_t)i;
    }
    struct dsi_engine *e = NULL;
    TEST_ASSERT(!tb_open(&e, dir, 8, 0, false, NULL));
    struct dsi_result *alone[1], *r[6];
    TEST_ASSERT(!tb_run(e, q, 1, alone));
    TEST_ASSERT(!tb_run(e, q, 6, r));
    dsi_batch_close(e);
    TEST_ASSERT(same_result(alone[0], r[0]));
    TEST_ASSERT(r[1]->n == 3 && same_completion(&r[1]->c[0], &r[0]->c[0]));
    TEST_ASSERT(!same_completion(&r[1]->c[1], &r[1]->c[0]) ||
                !same_completion(&r[1]->c[2], &r[1]->c[0]));
    TEST_ASSERT(!same_completion(&r[2]->c[0], &r[0]->c[0]));
    TEST_ASSERT(r[0]->seed == 1234);
    /* logprobs: log-softmax of the logits at each position of prompt + generated tokens */
    const struct dsi_completion *c = &r[0]->c[0];
    int L = 17 + c->n_tokens - 1;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)L);
    memcpy(seq, p, sizeof(int32_t) * 17);
    memcpy(seq + 17, c->tokens, sizeof(int32_t) * (size_t)(c->n_tokens - 1));
    struct dsi_engine_opts eo = {.model_dir = dir, .n_threads = 1, .max_ctx = 256};
    TEST_ASSERT(!dsi_engine_open(&e, &eo, NULL));
    float *lg = malloc(sizeof(float) * (size_t)L * 1024);
    const int32_t *ps[1] = {seq};
    TEST_ASSERT(!dsi_engine_prompt_logits(e, ps, &L, 1, 0, lg, NULL, NULL));
    dsi_engine_close(e);
    for (int k = 0; k < c->n_tokens; k++) {
        const float *row = lg + (int64_t)(16 + k) * 1024;
        double mx = -1e30, z = 0.0;
        for (int v = 0; v < 1024; v++)
            mx = fmax(mx, (double)row[v]);
        for (int v = 0; v < 1024; v++)
            z += exp((double)row[v] - mx);
        double want = (double)row[c->tokens[k]] - mx - log(z);
        TEST_ASSERTF(fabs(want - (double)c->logprobs[k]) < 1e-5, "token %d: %g vs %g", k, want,
                     (double)c->logprobs[k]);
        TEST_ASSERT(c->n_top == 3);
        for (int j = 0; j < 3; j++) {
            int32_t id = c->top_ids[k * 3 + j];
            TEST_ASSERT(fabs((double)row[id] - mx - log(z) - (double)c->top_logprobs[k * 3 + j]) <
                        1e-5);
            if (j) TEST_ASSERT(c->top_logprobs[k * 3 + j] <= c->top_logprobs[k * 3 + j - 1]);
        }
        TEST_ASSERT(c->top_logprobs[k * 3] >= c->logprobs[k]);
    }
    free(lg);
    free(seq);
    tb_free(alone, 1);
    tb_free(r, 6);
    free(p);
    for (int i = 0; i < 3; i++)
        free(other[i]);
    return 0;
}

/* The page pool sized from a byte budget: slots + 2 pages' worth -> 2 pages. */
int test_batch_kv_budget(struct test_ctx *t) {
    const char *dir = model_dir(t);
    if (!dir) return 0;
    struct dsi_engine *e = NULL;
    struct dsi_batch_stats full, one, two;
    TEST_ASSERT(!tb_open(&e, dir, 4, 0, false, NULL));
    dsi_batch_get_stats(e, &full);
    dsi_batch_close(e);
    TEST_ASSERT(!tb_open(&e, dir, 4, 1, false, NULL));
    dsi_batch_get_stats(e, &one);
    dsi_batch_close(e);
    TEST_ASSERT(full.pages_total == 16 && one.pages_total == 1 && one.max_positions == 256);
    int64_t per_page = (full.kv_bytes - one.kv_bytes) / (full.pages_total - 1);
    TEST_ASSERT(per_page > 0);
    struct dsi_engine_opts eo = {
        .model_dir = dir, .n_threads = 1, .max_rows = 128, .max_ctx = 1024, .max_seqs = 4};
    struct dsi_batch_opts bo = {.kv_bytes = one.kv_bytes + per_page + per_page / 2};
    TEST_ASSERT(!dsi_batch_open(&e, &eo, &bo, NULL));
    dsi_batch_get_stats(e, &two);
    dsi_batch_close(e);
    TEST_ASSERTF(two.pages_total == 2 && two.kv_bytes == one.kv_bytes + per_page, "%lld pages",
                 (long long)two.pages_total);
    struct dsi_err err;
    bo.kv_bytes = one.kv_bytes / 2;
    TEST_ASSERT(dsi_batch_open(&e, &eo, &bo, &err) == DSI_ERR_NOMEM &&
                strstr(err.msg, "kv budget"));
    TEST_ASSERT(!e);
    return 0;
}

/* Refused requests come back from dsi_submit; the engine keeps serving. Cancellation. */
int test_batch_bad_and_cancel(struct test_ctx *t) {
    const char *dir = model_dir(t);
    if (!dir) return 0;
    struct dsi_engine *e = NULL;
    TEST_ASSERT(!tb_open(&e, dir, 4, 0, false, NULL));
    int32_t ok[3] = {5, 6, 7}, bad[2] = {5, 4000};
    struct dsi_err err;
    struct dsi_request q = greedy_req(ok, 3, 4);
    q.max_tokens = -3;
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_INVALID);
    q = greedy_req(bad, 2, 4);
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_INVALID &&
                strstr(err.msg, "out of range"));
    int32_t *longp = calloc(2000, sizeof(int32_t));
    q = greedy_req(longp, 2000, 4);
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_CONTEXT_FULL);
    free(longp);
    q = greedy_req(ok, 3, 4);
    q.prompt = "text";
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_INVALID); /* two prompts */
    q.prompt_ids = NULL;
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_UNSUPPORTED); /* no tokenizer */
    q = greedy_req(ok, 3, 4);
    const char *stops[1] = {"x"};
    q.stop = stops;
    q.n_stop = 1;
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_UNSUPPORTED);
    q = greedy_req(ok, 3, 4);
    q.top_p = 0.0f;
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_INVALID);
    q.top_p = 1.0f;
    q.n = 0;
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_INVALID);
    q.n = 1;
    q.top_logprobs = 21;
    TEST_ASSERT(dsi_submit(e, &q, NULL, &err) == DSI_ERR_INVALID);
    /* cancellation: two long requests, cancel one; the other finishes normally */
    struct dsi_request lq[2] = {greedy_req(ok, 3, 900), greedy_req(ok, 3, 20)};
    uint64_t id0 = 0;
    TEST_ASSERT(!dsi_submit(e, &lq[0], &id0, &err));
    lq[1].tag = 1;
    lq[1].stream = true;
    TEST_ASSERT(!dsi_submit(e, &lq[1], NULL, &err));
    struct dsi_result *res[2] = {NULL, NULL};
    int got = 0, streamed = 0;
    struct dsi_event ev[8];
    while (got < 2) {
        int k = dsi_poll(e, ev, 8, 20000);
        TEST_ASSERT(k > 0);
        for (int i = 0; i < k; i++) {
            if (ev[i].kind == DSI_EVENT_TOKENS) {
                TEST_ASSERT(ev[i].tag == 1 && ev[i].index == 0);
                streamed += ev[i].n_tokens;
                if (streamed >= 5) dsi_cancel(e, id0);
                continue;
            }
            res[ev[i].tag] = ev[i].result;
            got++;
        }
    }
    TEST_ASSERT(res[0]->c[0].finish == DSI_FINISH_CANCELLED && res[0]->c[0].n_tokens < 900);
    TEST_ASSERT(res[1]->c[0].finish == DSI_FINISH_LENGTH && res[1]->c[0].n_tokens == 20);
    TEST_ASSERT(streamed == 20);
    /* the prefix before the cancel equals the uncancelled run (greedy) */
    TEST_ASSERT(!memcmp(res[0]->c[0].tokens, res[1]->c[0].tokens,
                        sizeof(int32_t) * (size_t)DSI_MIN(20, res[0]->c[0].n_tokens)));
    dsi_cancel(e, id0);   /* finished: ignored */
    dsi_cancel(e, 12345); /* unknown: ignored */
    TEST_ASSERT(dsi_poll(e, ev, 8, 50) == 0);
    struct dsi_batch_stats st;
    TEST_ASSERT(!wait_idle(e, &st));
    tb_free(res, 2);
    dsi_batch_close(e);
    return 0;
}

/* Stop strings on text: the tiny-a weights with the tokenizer of models/dsv4-tiny (ids below
 * 1024 decode to bytes and early merges). */
int test_batch_stop_strings(struct test_ctx *t) {
    const char *dir = model_dir(t);
    if (!dir) return 0;
    char tok_dir[2048];
    snprintf(tok_dir, sizeof(tok_dir), "%s", test_path(t, "models/dsv4-tiny"));
    char tj[2100];
    snprintf(tj, sizeof(tj), "%s/tokenizer.json", tok_dir);
    if (access(tj, R_OK)) {
        fprintf(stderr, "  [skipped: no %s] ", tj);
        return 0;
    }
    struct dsi_engine *e = NULL;
    TEST_ASSERT(!tb_open(&e, dir, 4, 0, false, tok_dir));
    unsigned rs = t->seed + 4;
    int32_t *p = rand_prompt(&rs, 9);
    for (int i = 0; i < 9; i++)
        p[i] = 40 + p[i] % 60; /* printable bytes */
    struct dsi_request q = greedy_req(p, 9, 40);
    struct dsi_result *full[1];
    TEST_ASSERT(!tb_run(e, &q, 1, full));
    const struct dsi_completion *c = &full[0]->c[0];
    TEST_ASSERT(c->text && c->n_tokens == 40);
    /* per-token text boundaries: decode prefixes with the tokenizer */
    struct dsi_bpe *bpe = NULL;
    TEST_ASSERT(!dsi_bpe_open_limit(&bpe, tok_dir, 1024, NULL));
    size_t bound[41];
    char *buf = malloc(1 << 16);
    for (int k = 0; k <= 40; k++) {
        size_t len = 0;
        TEST_ASSERT(!dsi_bpe_decode(bpe, c->tokens, (size_t)k,
                                    DSI_DECODE_SKIP_SPECIAL | DSI_DECODE_LOSSY, buf, 1 << 16, &len,
                                    NULL));
        bound[k] = len;
    }
    TEST_ASSERT(bound[40] == c->text_len && !memcmp(buf, c->text, c->text_len));
    dsi_bpe_free(bpe);
    free(buf);
    /* a stop string that starts inside one token and ends inside a later one */
    int k0 = -1;
    for (int k = 5; k < 35 && k0 < 0; k++)
        if (bound[k + 1] - bound[k] >= 2 && bound[k + 2] > bound[k + 1]) k0 = k;
    TEST_ASSERT(k0 >= 0);
    size_t s0 = bound[k0] + 1, s1 = bound[k0 + 2] - (bound[k0 + 2] - bound[k0 + 1] > 1 ? 1 : 0);
    char stop[256];
    memcpy(stop, c->text + s0, s1 - s0);
    stop[s1 - s0] = 0;
    const char *first = strstr(c->text, stop);
    TEST_ASSERT(first);
    size_t cut = (size_t)(first - c->text);
    const char *stops[2] = {"\x01never", stop};
    struct dsi_request sq = q;
    sq.stop = stops;
    sq.n_stop = 2;
    sq.stream = true;
    TEST_ASSERT(!dsi_submit(e, &sq, NULL, NULL));
    char streamed[4096];
    size_t sl = 0;
    struct dsi_result *r = NULL;
    while (!r) {
        struct dsi_event ev[8];
        int k = dsi_poll(e, ev, 8, 20000);
        TEST_ASSERT(k > 0);
        for (int i = 0; i < k; i++) {
            if (ev[i].kind == DSI_EVENT_DONE)
                r = ev[i].result;
            else {
                TEST_ASSERT(sl + ev[i].text_len < sizeof(streamed));
                memcpy(streamed + sl, ev[i].text, ev[i].text_len);
                sl += ev[i].text_len;
            }
        }
    }
    const struct dsi_completion *sc = &r->c[0];
    TEST_ASSERTF(sc->finish == DSI_FINISH_STOP && sc->stop_str && !strcmp(sc->stop_str, stop),
                 "finish %d", sc->finish);
    TEST_ASSERT(sc->text_len == cut && !memcmp(sc->text, c->text, cut));
    TEST_ASSERT(sl == cut && !memcmp(streamed, c->text, cut));
    /* tokens: up to the token that completed the stop string */
    int kend = 0;
    while (bound[kend] < cut + strlen(stop))
        kend++;
    TEST_ASSERTF(sc->n_tokens == kend, "%d tokens, want %d", sc->n_tokens, kend);
    TEST_ASSERT(!memcmp(sc->tokens, c->tokens, sizeof(int32_t) * (size_t)kend));
    dsi_result_free(r);
    struct dsi_batch_stats st;
    TEST_ASSERT(!wait_idle(e, &st) && st.has_tokenizer);
    dsi_batch_close(e);
    tb_free(full, 1);
    free(p);
    return 0;
}

/* n > 1: the prompt is computed once and the other completions copy completion 0's cache state
 * (dsi_kv_fork); their outputs equal those of prefilling the prompt once per completion, bit
 * for bit, with the expected saving in prefill rows; with too few slots for every fork the
 * others fall back to their own prefill, with the same outputs. */
static int open_share(struct dsi_engine **e, const char *dir, int max_seqs, bool no_share) {
    struct dsi_engine_opts eo = {
        .model_dir = dir, .n_threads = 1, .max_rows = 128, .max_ctx = 1024, .max_seqs = max_seqs};
    struct dsi_batch_opts bo = {.chunk_align = 32, .no_prefill_share = no_share};
    struct dsi_err err = {0};
    int rc = dsi_batch_open(e, &eo, &bo, &err);
    if (rc) fprintf(stderr, "  dsi_batch_open: %s\n", err.msg);
    return rc;
}

int test_batch_prefill_share(struct test_ctx *t) {
    const char *dir = model_dir(t);
    if (!dir) return 0;
    unsigned rs = t->seed + 11;
    int np = 300, nb = 40;
    int32_t *p = rand_prompt(&rs, np), *pb = rand_prompt(&rs, nb);
    struct dsi_request q[2];
    q[0] = greedy_req(p, np, 12);
    q[0].n = 4;
    q[0].temperature = 1.0f;
    q[0].has_seed = true;
    q[0].seed = 77;
    q[0].logprobs = true;          /* compared bit for bit: any change of the logits shows */
    q[1] = greedy_req(pb, nb, 10); /* alongside */
    struct dsi_result *shared[2], *own[2], *few[1];
    struct dsi_batch_stats s1, s2, s3;
    struct dsi_engine *e = NULL;
    TEST_ASSERT(!open_share(&e, dir, 8, false));
    TEST_ASSERT(!tb_run(e, q, 2, shared));
    TEST_ASSERT(!wait_idle(e, &s1));
    dsi_batch_close(e);
    TEST_ASSERT(!open_share(&e, dir, 8, true));
    TEST_ASSERT(!tb_run(e, q, 2, own));
    TEST_ASSERT(!wait_idle(e, &s2));
    dsi_batch_close(e);
    TEST_ASSERT(!open_share(&e, dir, 2, false)); /* slots for the leader and one fork */
    TEST_ASSERT(!tb_run(e, q, 1, few));
    TEST_ASSERT(!wait_idle(e, &s3));
    dsi_batch_close(e);
    fprintf(stderr, "[prefill rows %lld shared / %lld own, %lld + %lld forks] ",
            (long long)s1.prefill_rows, (long long)s2.prefill_rows, (long long)s1.prompt_forks,
            (long long)s3.prompt_forks);
    TEST_ASSERT(shared[0]->n == 4);
    TEST_ASSERTF(same_result(shared[0], own[0]) && same_result(shared[1], own[1]),
                 "outputs differ with the prompt computed once");
    TEST_ASSERTF(same_result(few[0], own[0]), "outputs differ when not every fork fits");
    TEST_ASSERT(!same_completion(&shared[0]->c[1], &shared[0]->c[0]) ||
                !same_completion(&shared[0]->c[2], &shared[0]->c[0]));
    TEST_ASSERT(s1.prompt_forks == 3 && s2.prompt_forks == 0);
    TEST_ASSERTF(s2.prefill_rows - s1.prefill_rows == 3 * np, "prefill rows %lld vs %lld",
                 (long long)s1.prefill_rows, (long long)s2.prefill_rows);
    TEST_ASSERT(s3.prompt_forks == 1);
    tb_free(shared, 2);
    tb_free(own, 2);
    tb_free(few, 1);
    free(p);
    free(pb);
    return 0;
}
