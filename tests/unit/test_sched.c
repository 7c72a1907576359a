/* test_sched.c - the scheduler (src/run/sched.c) with a fake forward: a hash chain over each
 * sequence's tokens stands in for the model, so a row's logits depend on its sequence's whole
 * prefix and nothing else (like the real forward). Checks, under 10,000 random requests with
 * random lengths, arrivals, cancellations and text-level stops on a small page pool:
 *  - the scheduler's invariants after every step (pages accounted once, slots, list order,
 *    running older than waiting) and the batch contract the forward relies on;
 *  - every request finishes exactly once, nothing is leaked at idle;
 *  - outputs after preemption + recompute equal the outputs of the same request run alone
 *    with a pool that never preempts (greedy and seeded sampling);
 *  - grammar-constrained sequences (test_sched_grammar): masked before the draw, the matcher
 *    advanced, finished when complete, intact across preemption. */
#include "test.h"

#include "core/core.h"
#include "grammar/grammar.h"
#include "run/sched.h"

#include <stdlib.h>

#define FAKE_V 64

struct fake {
    struct dsi_kv *kv;
    uint64_t state[64]; /* per slot: hash of the tokens so far */
    int64_t rows, bad;
    char why[200];
};

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int fake_fwd(void *user, const struct dsi_batch *b, float *logits, struct dsi_err *err) {
    struct fake *f = user;
    struct dsi_kv *kv = f->kv;
    int nl = 0;
    for (int r = 0; r < b->n; r++) {
        int s = b->slot[r];
        bool first = r == 0 || b->slot[r - 1] != s;
        int64_t want = first ? kv->seqs[s].n_past : b->pos[r - 1] + 1;
        if (s < 0 || s >= kv->max_seqs || !kv->seqs[s].used || b->pos[r] != want ||
            b->pos[r] >= (int64_t)kv->seqs[s].n_pages * kv->page_tokens) {
            f->bad++;
            snprintf(f->why, sizeof(f->why), "row %d slot %d pos %d want %lld pages %d", r, s,
                     b->pos[r], (long long)want, kv->seqs[s].n_pages);
            return dsi_errf(err, DSI_ERR_INVALID, "fake forward: bad batch: %s", f->why);
        }
        if (first)
            for (int q = 0; q < r; q++)
                if (b->slot[q] == s) {
                    f->bad++;
                    return dsi_errf(err, DSI_ERR_INVALID, "fake forward: slot %d not contiguous",
                                    s);
                }
        if (b->pos[r] == 0) f->state[s] = 0x1234;
        f->state[s] = mix(f->state[s] ^ ((uint64_t)b->tokens[r] << 20) ^ (uint64_t)b->pos[r]);
        if (b->want_logits[r]) {
            for (int v = 0; v < FAKE_V; v++)
                logits[nl * FAKE_V + v] =
                    (float)(mix(f->state[s] + (uint64_t)v) >> 40) / 2097152.0f;
            nl++;
        }
    }
    for (int r = 0; r < b->n; r++)
        kv->seqs[b->slot[r]].n_past = b->pos[r] + 1;
    f->rows += b->n;
    return DSI_OK;
}

/* A cache pool with one window layer: pages of 256 positions, nothing else of size. */
static int fake_kv(struct dsi_backend **be,
                   struct dsi_config *cfg,
                   struct dsi_kv **kv,
                   int n_pages,
                   int max_seqs,
                   int max_ctx,
                   int max_rows) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->n_layers_total = 1;
    cfg->num_hidden_layers = 1;
    cfg->head_dim = 4;
    cfg->index_head_dim = 4;
    cfg->sliding_window = 4;
    cfg->vocab_size = FAKE_V;
    if (dsi_backend_cpu_new(be, 1, NULL)) return -1;
    struct dsi_kv_opts ko = {
        .max_seqs = max_seqs, .max_ctx = max_ctx, .max_rows = max_rows, .n_pages = n_pages};
    return dsi_kv_new(kv, cfg, *be, &ko, NULL);
}

struct req {
    struct dsi_sseq q;
    int32_t *prompt;
    int done;    /* times finished */
    int removed; /* finished by the test (cancel / text stop) */
};

static void init_req(struct req *r, uint64_t order, unsigned *rs, int max_prompt) {
    memset(r, 0, sizeof(*r));
    int n = 1 + rand_r(rs) % max_prompt;
    r->prompt = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        r->prompt[i] = rand_r(rs) % FAKE_V;
    r->q.order = order;
    r->q.prompt = r->prompt;
    r->q.n_prompt = n;
    r->q.max_new = 1 + rand_r(rs) % 40;
    r->q.gen = malloc(sizeof(int32_t) * (size_t)r->q.max_new);
    r->q.sp =
        (struct dsi_sample_params){.repetition_penalty = 1.0f, .seed = (uint64_t)order * 7919};
    if (rand_r(rs) % 2) r->q.sp.temperature = 0.8f;
    if (rand_r(rs) % 4 == 0) r->q.sp.top_k = 8;
    if (rand_r(rs) % 4 == 0) r->q.sp.frequency_penalty = 0.5f;
    r->q.ignore_eos = rand_r(rs) % 2;
    r->q.user = r;
}

/* Run one request alone on a roomy pool; returns 0 if its tokens equal `want`. */
static int rerun_alone(struct req *r) {
    struct dsi_backend *be = NULL;
    struct dsi_config cfg;
    struct dsi_kv *kv = NULL;
    int rc = fake_kv(&be, &cfg, &kv, 64, 2, 4096, 64);
    struct fake f = {.kv = kv};
    struct dsi_sched *s = NULL;
    struct dsi_sched_opts so = {.max_rows = 64,
                                .chunk_align = 32,
                                .n_vocab = FAKE_V,
                                .eos = 1,
                                .fwd = fake_fwd,
                                .fwd_user = &f};
    if (!rc) rc = dsi_sched_new(&s, kv, &so, NULL);
    struct dsi_sseq q = r->q;
    q.gen = malloc(sizeof(int32_t) * (size_t)q.max_new);
    if (!rc) rc = dsi_sched_add(s, &q, NULL);
    while (!rc && q.state != DSI_SSEQ_DONE) {
        const struct dsi_sched_tok *t;
        int nt;
        rc = dsi_sched_step(s, &t, &nt, NULL);
        if (q.n_gen >= r->q.n_gen && q.state != DSI_SSEQ_DONE) dsi_sched_remove(s, &q);
    }
    if (!rc &&
        (q.n_gen != r->q.n_gen || memcmp(q.gen, r->q.gen, sizeof(int32_t) * (size_t)q.n_gen)))
        rc = 1;
    if (!rc && q.n_preempt) rc = 2;
    free(q.gen);
    dsi_sched_free(s);
    dsi_kv_free(kv);
    dsi_backend_free(be);
    return rc;
}

int test_sched_random(struct test_ctx *t) {
    enum { N = 10000 };
    unsigned rs = t->seed;
    struct dsi_backend *be = NULL;
    struct dsi_config cfg;
    struct dsi_kv *kv = NULL;
    TEST_ASSERT(!fake_kv(&be, &cfg, &kv, 10, 8, 1024, 64));
    struct fake f = {.kv = kv};
    struct dsi_sched *s = NULL;
    struct dsi_sched_opts so = {.max_rows = 64,
                                .chunk_align = 32,
                                .n_vocab = FAKE_V,
                                .eos = 1,
                                .fwd = fake_fwd,
                                .fwd_user = &f};
    struct dsi_err err = {0};
    TEST_ASSERT(!dsi_sched_new(&s, kv, &so, &err));
    struct req *reqs = calloc(N, sizeof(*reqs));
    struct req **live = calloc(N, sizeof(*live));
    int n_sub = 0, n_live = 0, n_done = 0, fails = 0;
    int64_t steps = 0;
    while (n_done < N) {
        /* arrivals: about the service rate, with an occasional burst */
        int arrive = rand_r(&rs) % 5 == 0 ? 1 : 0;
        if (rand_r(&rs) % 2000 == 0) arrive = 50;
        for (int a = arrive; a > 0 && n_sub < N; a--) {
            struct req *r = &reqs[n_sub];
            init_req(r, (uint64_t)n_sub + 1, &rs, 500);
            n_sub++;
            TEST_ASSERTF(!dsi_sched_add(s, &r->q, &err), "%s", err.msg);
            live[n_live++] = r;
        }
        /* cancellations and text-level stops: remove a random live request */
        if (n_live && rand_r(&rs) % 40 == 0) {
            int i = rand_r(&rs) % n_live;
            struct req *r = live[i];
            dsi_sched_remove(s, &r->q);
            r->done++;
            r->removed = 1;
            live[i] = live[--n_live];
            n_done++;
        }
        const struct dsi_sched_tok *tk;
        int nt;
        int rc = dsi_sched_step(s, &tk, &nt, &err);
        TEST_ASSERTF(!rc, "step %lld: %s", (long long)steps, err.msg);
        steps++;
        const struct dsi_batch *b = dsi_sched_last_batch(s);
        TEST_ASSERT(b->n <= so.max_rows);
        TEST_ASSERTF(!dsi_sched_check(s, &err), "step %lld: %s", (long long)steps, err.msg);
        for (int i = 0; i < nt; i++) {
            struct req *r = tk[i].q->user;
            TEST_ASSERT(tk[i].index == r->q.n_gen - 1 && r->q.gen[tk[i].index] == tk[i].token);
            if (!tk[i].finish) continue;
            TEST_ASSERT(r->q.state == DSI_SSEQ_DONE);
            r->done++;
            n_done++;
            for (int j = 0; j < n_live; j++)
                if (live[j] == r) {
                    live[j] = live[--n_live];
                    break;
                }
        }
        TEST_ASSERT(steps < 2000000);
    }
    TEST_ASSERT(dsi_sched_idle(s));
    TEST_ASSERT(kv->n_free == kv->n_pages);
    for (int i = 0; i < kv->max_seqs; i++)
        TEST_ASSERT(!kv->seqs[i].used);
    struct dsi_sched_stats st;
    dsi_sched_get_stats(s, &st);
    int n_preempted = 0, checked = 0;
    for (int i = 0; i < N; i++) {
        TEST_ASSERTF(reqs[i].done == 1, "request %d finished %d times", i, reqs[i].done);
        struct dsi_sseq *q = &reqs[i].q;
        if (!reqs[i].removed)
            TEST_ASSERT(q->finish == DSI_SSEQ_FIN_LENGTH || q->finish == DSI_SSEQ_FIN_EOS);
        if (q->n_preempt) n_preempted++;
        /* preempted (and some other) finished requests replayed alone give the same tokens */
        if (!reqs[i].removed && (q->n_preempt || i % 97 == 0) && checked < 300) {
            int rr = rerun_alone(&reqs[i]);
            if (rr) fails++;
            if (rr && fails < 5)
                fprintf(stderr, "  request %d (%d preemptions): alone differs (%d)\n", i,
                        q->n_preempt, rr);
            checked++;
        }
    }
    fprintf(stderr,
            "  [%lld steps, %lld rows (%lld prefill, %lld decode), %lld preemptions of "
            "%d requests, %d replayed] ",
            (long long)st.steps, (long long)st.rows, (long long)st.prefill_rows,
            (long long)st.decode_rows, (long long)st.preemptions, n_preempted, checked);
    TEST_ASSERT(fails == 0);
    TEST_ASSERT(st.preemptions > 100); /* the pool really was oversubscribed */
    for (int i = 0; i < N; i++) {
        free(reqs[i].prompt);
        free(reqs[i].q.gen);
    }
    free(reqs);
    free(live);
    dsi_sched_free(s);
    dsi_kv_free(kv);
    dsi_backend_free(be);
    return 0;
}

/* Chunking, budget and admission details on a hand-made case. */
int test_sched_chunks(struct test_ctx *t) {
    struct dsi_backend *be = NULL;
    struct dsi_config cfg;
    struct dsi_kv *kv = NULL;
    TEST_ASSERT(!fake_kv(&be, &cfg, &kv, 8, 4, 2048, 100));
    struct fake f = {.kv = kv};
    struct dsi_sched *s = NULL;
    struct dsi_sched_opts so = {.max_rows = 100,
                                .chunk_align = 32,
                                .n_vocab = FAKE_V,
                                .eos = -1,
                                .fwd = fake_fwd,
                                .fwd_user = &f};
    TEST_ASSERT(!dsi_sched_new(&s, kv, &so, NULL));
    int32_t pa[250], pb[10];
    for (int i = 0; i < 250; i++)
        pa[i] = i % FAKE_V;
    for (int i = 0; i < 10; i++)
        pb[i] = i;
    int32_t ga[4], gb[4];
    struct dsi_sseq a = {.order = 1, .prompt = pa, .n_prompt = 250, .gen = ga, .max_new = 3};
    struct dsi_sseq b = {.order = 2, .prompt = pb, .n_prompt = 10, .gen = gb, .max_new = 3};
    struct dsi_err err;
    TEST_ASSERT(!dsi_sched_add(s, &a, &err));
    TEST_ASSERT(!dsi_sched_add(s, &b, &err));
    const struct dsi_sched_tok *tk;
    int nt;
    /* step 1: a gets 96 rows (aligned end), b gets the remaining 4 */
    TEST_ASSERT(!dsi_sched_step(s, &tk, &nt, &err));
    const struct dsi_batch *bt = dsi_sched_last_batch(s);
    TEST_ASSERTF(bt->n == 100 && nt == 0 && a.n_past == 96 && b.n_past == 4, "n %d a %lld b %lld",
                 bt->n, (long long)a.n_past, (long long)b.n_past);
    /* step 2: a 96..192 (aligned), b 4..8 (aligned to 32 impossible: takes the rest of budget) */
    TEST_ASSERT(!dsi_sched_step(s, &tk, &nt, &err));
    TEST_ASSERTF(a.n_past == 192 && b.n_past == 8, "a %lld b %lld", (long long)a.n_past,
                 (long long)b.n_past);
    /* step 3: a finishes its prompt (58 rows) and samples; b its last 2 rows and samples */
    TEST_ASSERT(!dsi_sched_step(s, &tk, &nt, &err));
    TEST_ASSERTF(nt == 2 && a.n_gen == 1 && b.n_gen == 1, "nt %d", nt);
    /* step 4: two decode rows */
    TEST_ASSERT(!dsi_sched_step(s, &tk, &nt, &err));
    TEST_ASSERT(dsi_sched_last_batch(s)->n == 2 && nt == 2);
    TEST_ASSERT(!dsi_sched_step(s, &tk, &nt, &err));
    TEST_ASSERT(nt == 2 && tk[0].finish == DSI_SSEQ_FIN_LENGTH &&
                tk[1].finish == DSI_SSEQ_FIN_LENGTH);
    TEST_ASSERT(dsi_sched_idle(s) && kv->n_free == kv->n_pages);
    /* bad requests */
    struct dsi_sseq c = {.order = 3, .prompt = pa, .n_prompt = 0, .gen = ga, .max_new = 3};
    TEST_ASSERT(dsi_sched_add(s, &c, &err) == DSI_ERR_INVALID);
    c.n_prompt = 3000;
    TEST_ASSERT(dsi_sched_add(s, &c, &err) == DSI_ERR_CONTEXT_FULL);
    c.n_prompt = 3;
    c.max_new = 0;
    TEST_ASSERT(dsi_sched_add(s, &c, &err) == DSI_ERR_INVALID);
    pb[0] = FAKE_V;
    c.prompt = pb;
    c.max_new = 2;
    TEST_ASSERT(dsi_sched_add(s, &c, &err) == DSI_ERR_INVALID);
    dsi_sched_free(s);
    dsi_kv_free(kv);
    dsi_backend_free(be);
    return 0;
}

/* A pool that holds one long sequence: the oldest always progresses, the others are
 * preempted and recomputed, and the context stop fires at the pool's size. */
int test_sched_preempt(struct test_ctx *t) {
    struct dsi_backend *be = NULL;
    struct dsi_config cfg;
    struct dsi_kv *kv = NULL;
    TEST_ASSERT(!fake_kv(&be, &cfg, &kv, 2, 4, 4096, 64));
    struct fake f = {.kv = kv};
    struct dsi_sched *s = NULL;
    struct dsi_sched_opts so = {.max_rows = 64,
                                .chunk_align = 1,
                                .n_vocab = FAKE_V,
                                .eos = -1,
                                .fwd = fake_fwd,
                                .fwd_user = &f};
    TEST_ASSERT(!dsi_sched_new(&s, kv, &so, NULL));
    TEST_ASSERT(dsi_sched_max_positions(s) == 512);
    int32_t p[300];
    for (int i = 0; i < 300; i++)
        p[i] = (i * 7) % FAKE_V;
    int32_t g[3][400];
    struct dsi_sseq q[3];
    for (int i = 0; i < 3; i++) {
        q[i] = (struct dsi_sseq){.order = (uint64_t)i + 1,
                                 .prompt = p,
                                 .n_prompt = 200 + 40 * i,
                                 .gen = g[i],
                                 .max_new = 400};
        TEST_ASSERT(!dsi_sched_add(s, &q[i], NULL));
    }
    struct dsi_err err;
    int steps = 0;
    while (!dsi_sched_idle(s) && steps < 10000) {
        const struct dsi_sched_tok *tk;
        int nt;
        TEST_ASSERTF(!dsi_sched_step(s, &tk, &nt, &err), "%s", err.msg);
        TEST_ASSERTF(!dsi_sched_check(s, &err), "%s", err.msg);
        steps++;
    }
    TEST_ASSERT(dsi_sched_idle(s) && kv->n_free == 2);
    for (int i = 0; i < 3; i++) {
        TEST_ASSERTF(q[i].finish == DSI_SSEQ_FIN_CONTEXT, "seq %d finish %d", i, q[i].finish);
        TEST_ASSERT(q[i].n_prompt + q[i].n_gen == 512);
    }
    TEST_ASSERT(q[0].n_preempt == 0 && q[1].n_preempt + q[2].n_preempt > 0);
    dsi_sched_free(s);
    dsi_kv_free(kv);
    dsi_backend_free(be);
    return 0;
}

/* ---- grammar-constrained sequences (matcher + mask in struct dsi_sseq) ------------------ */

/* The fake model's vocabulary as the grammar sees it: 0 a control token, 1 EOS, then single
 * characters and a few multi-character tokens; the rest have no text (never allowed). */
static int fake_vocab(struct dsi_grammar_vocab **v) {
    static const char *const text[] = {"a", "b",  "c",   "d",  "e",  "x",   "y",  "0",  "1",
                                       "2", "ab", "abc", "cd", "ba", "abd", "dd", "cc", "{",
                                       "}", "\"", ":",   ",",  " ",  "[",   "]",  "ca", "bab"};
    const char *tok[FAKE_V] = {0};
    uint32_t len[FAKE_V] = {0};
    uint8_t flags[FAKE_V] = {0};
    tok[0] = "<s>";
    len[0] = 3;
    flags[0] = DSI_GRAMMAR_TOKEN_SPECIAL;
    for (size_t i = 0; i < sizeof(text) / sizeof(text[0]); i++) {
        tok[i + 2] = text[i];
        len[i + 2] = (uint32_t)strlen(text[i]);
    }
    return dsi_grammar_vocab_new(v, tok, len, flags, FAKE_V, 1, NULL);
}

static int fake_grammar(struct dsi_grammar_compiled **cg,
                        const struct dsi_grammar_vocab *v,
                        const char *regex) {
    struct dsi_grammar *g = NULL;
    int rc = dsi_grammar_parse(&g, DSI_GRAMMAR_REGEX, regex, strlen(regex), NULL, NULL);
    if (!rc) rc = dsi_grammar_compile(cg, g, v, NULL, NULL);
    dsi_grammar_free(g);
    return rc;
}

/* The text of q's tokens (EOS and text-less ids skipped). */
static void fake_text(const struct dsi_grammar_vocab *v, const struct dsi_sseq *q, char *out) {
    size_t n = 0;
    for (int i = 0; i < q->n_gen; i++) {
        uint32_t l = 0;
        const char *b = q->gen[i] == 1 ? "" : dsi_grammar_vocab_token(v, q->gen[i], &l);
        memcpy(out + n, b, l);
        n += l;
    }
    out[n] = 0;
}

/* s is a whole member of (ab|c){12,}d, or (prefix) could still become one. */
static bool abcd_match(const char *s, bool prefix) {
    size_t n = strlen(s), i = 0;
    int units = 0;
    for (; i < n && s[i] != 'd'; units++) {
        if (s[i] == 'c')
            i++;
        else if (s[i] == 'a' && (i + 1 == n ? prefix : s[i + 1] == 'b'))
            i += 2;
        else
            return false;
    }
    if (i == n) return prefix;
    return units >= 12 && i + 1 == n;
}

struct gseq {
    struct dsi_sseq q;
    int32_t prompt[300];
    int32_t gen[80];
    uint32_t mask[(FAKE_V + 31) / 32];
};

static void gseq_init(struct gseq *g, int i, const struct dsi_grammar_compiled *cg, bool ws) {
    memset(g, 0, sizeof(*g));
    int n = 200 + (i * 37) % 56; /* + the output crosses the 256-position page */
    for (int k = 0; k < n; k++)
        g->prompt[k] = 2 + (k * 13 + i) % 60;
    g->q = (struct dsi_sseq){.order = (uint64_t)i + 1,
                             .prompt = g->prompt,
                             .n_prompt = n,
                             .gen = g->gen,
                             .max_new = 80,
                             .sp = {.temperature = i % 3 ? 1.0f : 0.0f,
                                    .repetition_penalty = 1.0f,
                                    .frequency_penalty = i % 4 == 1 ? 0.5f : 0.0f,
                                    .seed = 77u + (uint64_t)i},
                             .ignore_eos = ws,
                             .mask = g->mask,
                             .n_mask = FAKE_V};
    if (cg) dsi_grammar_matcher_new(&g->q.matcher, cg, NULL);
}

/* Run sequences to the end on a pool of n_pages pages. */
static int run_gseqs(struct gseq *g, int n, int n_pages, struct dsi_err *err, int64_t *preempt) {
    struct dsi_backend *be = NULL;
    struct dsi_config cfg;
    struct dsi_kv *kv = NULL;
    int rc = fake_kv(&be, &cfg, &kv, n_pages, 4, 2048, 64);
    struct fake f = {.kv = kv};
    struct dsi_sched *s = NULL;
    struct dsi_sched_opts so = {.max_rows = 64,
                                .chunk_align = 16,
                                .n_vocab = FAKE_V,
                                .eos = 1,
                                .fwd = fake_fwd,
                                .fwd_user = &f};
    if (!rc) rc = dsi_sched_new(&s, kv, &so, err);
    for (int i = 0; i < n && !rc; i++)
        rc = dsi_sched_add(s, &g[i].q, err);
    for (int steps = 0; !rc && !dsi_sched_idle(s) && steps < 100000; steps++) {
        const struct dsi_sched_tok *tk;
        int nt;
        rc = dsi_sched_step(s, &tk, &nt, err);
        if (!rc) rc = dsi_sched_check(s, err);
    }
    struct dsi_sched_stats st;
    if (s) dsi_sched_get_stats(s, &st);
    if (!rc && preempt) *preempt = st.preemptions;
    if (!rc && !dsi_sched_idle(s)) rc = dsi_errf(err, DSI_ERR_INVALID, "not idle");
    dsi_sched_free(s);
    dsi_kv_free(kv);
    dsi_backend_free(be);
    return rc;
}

/* Masks before the draw: every completion of (ab|c){12,}d is a member (or a prefix when cut by
 * max_new), finishes with FIN_GRAMMAR after its 'd' without an EOS; the same requests
 * unconstrained leave the language (the mask did something); outputs after preemption equal
 * outputs alone; a grammar the vocabulary cannot spell fails cleanly; EOS ends a complete
 * output even with ignore_eos. */
int test_sched_grammar(struct test_ctx *t) {
    enum { N = 24 };
    struct dsi_grammar_vocab *v = NULL;
    struct dsi_grammar_compiled *cg = NULL, *cz = NULL, *ca = NULL;
    TEST_ASSERT(!fake_vocab(&v));
    TEST_ASSERT(!fake_grammar(&cg, v, "(ab|c){12,}d"));
    TEST_ASSERT(!fake_grammar(&cz, v, "z"));        /* no token spells 'z' */
    TEST_ASSERT(!fake_grammar(&ca, v, "a{1,200}")); /* complete after every token */
    struct gseq *g = calloc(4 * N, sizeof(*g)), *alone = g + N, *free_run = g + 2 * N;
    struct gseq *ge = g + 3 * N;
    struct dsi_err err = {0};
    int64_t pre = 0;
    for (int i = 0; i < N; i++)
        gseq_init(&g[i], i, cg, false);
    TEST_ASSERTF(!run_gseqs(g, N, 2, &err, &pre), "%s", err.msg);
    TEST_ASSERT(pre > 0); /* 2 pages of 256 positions: preempted and recomputed */
    int n_gram = 0, outside = 0;
    char text[1024];
    for (int i = 0; i < N; i++) {
        struct dsi_sseq *q = &g[i].q;
        fake_text(v, q, text);
        if (q->finish == DSI_SSEQ_FIN_GRAMMAR) {
            n_gram++;
            TEST_ASSERTF(abcd_match(text, false), "seq %d: '%s'", i, text);
            TEST_ASSERT(q->gen[q->n_gen - 1] != 1);
        } else {
            TEST_ASSERTF(q->finish == DSI_SSEQ_FIN_LENGTH && q->n_gen == q->max_new &&
                             abcd_match(text, true),
                         "seq %d: finish %d '%s'", i, q->finish, text);
        }
        /* alone on a roomy pool, with a fresh matcher: the same tokens */
        gseq_init(&alone[i], i, cg, false);
        TEST_ASSERTF(!run_gseqs(&alone[i], 1, 64, &err, NULL), "%s", err.msg);
        TEST_ASSERTF(alone[i].q.n_gen == q->n_gen &&
                         !memcmp(alone[i].gen, q->gen, sizeof(int32_t) * (size_t)q->n_gen),
                     "seq %d (%d preemptions) differs alone", i, q->n_preempt);
        /* unconstrained */
        gseq_init(&free_run[i], i, NULL, false);
        TEST_ASSERTF(!run_gseqs(&free_run[i], 1, 64, &err, NULL), "%s", err.msg);
        fake_text(v, &free_run[i].q, text);
        outside += !abcd_match(text, true);
    }
    fprintf(stderr, "[%lld preemptions, %d of %d complete] ", (long long)pre, n_gram, N);
    TEST_ASSERT(n_gram >= N / 2 && outside >= N / 2);
    /* a vocabulary that cannot continue: FIN_GRAMMAR_ERROR, no token, nothing leaked */
    gseq_init(&ge[0], 0, cz, false);
    TEST_ASSERTF(!run_gseqs(&ge[0], 1, 4, &err, NULL), "%s", err.msg);
    TEST_ASSERT(ge[0].q.finish == DSI_SSEQ_FIN_GRAMMAR_ERROR && ge[0].q.n_gen == 0);
    dsi_grammar_matcher_free(ge[0].q.matcher);
    /* a{1,50} with ignore_eos: EOS (allowed after every token) still ends it */
    int n_eos = 0;
    for (int i = 0; i < N; i++) {
        gseq_init(&ge[i], i, ca, true);
        ge[i].q.sp.temperature = 1.0f;
        TEST_ASSERTF(!run_gseqs(&ge[i], 1, 4, &err, NULL), "%s", err.msg);
        struct dsi_sseq *q = &ge[i].q;
        fake_text(v, q, text);
        bool eos = q->finish == DSI_SSEQ_FIN_EOS;
        n_eos += eos;
        TEST_ASSERTF(eos ? q->gen[q->n_gen - 1] == 1 : q->finish == DSI_SSEQ_FIN_LENGTH,
                     "seq %d finish %d", i, q->finish);
        TEST_ASSERT(strspn(text, "a") == strlen(text) && strlen(text) >= (eos ? 1u : 50u));
    }
    TEST_ASSERT(n_eos > 0);
    for (int i = 0; i < 4 * N; i++)
        dsi_grammar_matcher_free(g[i].q.matcher);
    free(g);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_compiled_free(cz);
    dsi_grammar_compiled_free(ca);
    dsi_grammar_vocab_free(v);
    return 0;
}
