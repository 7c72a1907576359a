/* test_batch_grammar.c - structured outputs through the serving API (response_format in
 * struct dsi_request; src/run/rformat.c, the mask in src/run/sched.c) on the tiny random
 * checkpoint tests/golden/tiny-a/model with the tokenizer of models/dsv4-tiny (ids < 1024):
 *  - greedy requests constrained by a JSON schema, a regex and an EBNF grammar give complete
 *    outputs that an outside parser accepts (jansson, PCRE2, by hand) and finish with "stop";
 *  - malformed / invalid / unsupported response formats are refused by dsi_submit with a
 *    message naming the problem, and the requests around them finish; no tokenizer: refused;
 *  - seeded constrained sampling with n = 2: the same outputs alone (async) and in a batch
 *    (sync); completion 0 == the n = 1 output;
 *  - a small page pool: constrained requests are preempted and recomputed, and give the same
 *    outputs as alone on a large pool (the matcher is not rewound: generated tokens are kept);
 *  - the compiled-grammar cache (dsi_rformat_*): hits by source, eviction of idle entries.
 * Skipped (passes with a note) when the checkpoint or the tokenizer is not there. */
#include "test.h"

#include "core/core.h"
#include "dsinfer.h"
#include "grammar/grammar.h"
#include "run/rformat.h"
#include "tok/bpe.h"
#include "batch_util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <unistd.h>

static const char *gdir(struct test_ctx *t, const char *rel, const char *file) {
    static char dir[2][2048];
    char *d = dir[file[0] == 't'];
    snprintf(d, sizeof(dir[0]), "%s", test_path(t, rel));
    char p[2200];
    snprintf(p, sizeof(p), "%s/%s", d, file);
    if (access(p, R_OK)) {
        fprintf(stderr, "  [skipped: no %s] ", p);
        return NULL;
    }
    return d;
}

/* Model and tokenizer directories, or false (skip). */
static bool dirs(struct test_ctx *t, const char **model, const char **tok) {
    *model = gdir(t, "tests/golden/tiny-a/model", "config.json");
    *tok = *model ? gdir(t, "models/dsv4-tiny", "tokenizer.json") : NULL;
    return *model && *tok;
}

static bool same_comp(const struct dsi_completion *a, const struct dsi_completion *b) {
    return a->n_tokens == b->n_tokens && a->finish == b->finish && a->stop_token == b->stop_token &&
           !memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens) &&
           a->text_len == b->text_len && !memcmp(a->text, b->text, a->text_len);
}

static struct dsi_request creq(const int32_t *p, int n, const char *rf, float temp, uint64_t seed) {
    struct dsi_request q;
    dsi_request_init(&q);
    q.prompt_ids = p;
    q.n_prompt_ids = n;
    q.max_tokens = 160;
    q.temperature = temp;
    q.has_seed = true;
    q.seed = seed;
    q.response_format = rf;
    return q;
}

static const char *const SCHEMA =
    "{\"type\": \"json_schema\", \"whitespace\": \"compact\", \"json_schema\": {\"name\": "
    "\"person\", \"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 6}, "
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 120}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"red\", \"green\", \"blue\"]}, "
    "\"minItems\": 1, \"maxItems\": 3}, \"ok\": {\"type\": \"boolean\"}}, "
    "\"required\": [\"name\", \"age\", \"tags\", \"ok\"]}}}";
static const char *const REGEX =
    "{\"type\": \"regex\", \"regex\": \"[a-z]{2,5}@[a-z]{2,5}\\\\.(com|org)\"}";
static const char *const EBNF =
    "{\"type\": \"grammar\", \"grammar\": \"root ::= \\\"SELECT \\\" col (\\\", \\\" col){0,2} "
    "\\\" FROM t\\\"\\ncol ::= \\\"a\\\" | \\\"b\\\" | \\\"price\\\"\"}";

/* Whitespace outside JSON strings. */
static bool ws_outside(const char *s) {
    bool in = false;
    for (; *s; s++) {
        if (in && *s == '\\' && s[1])
            s++;
        else if (*s == '"')
            in = !in;
        else if (!in && strchr(" \t\r\n", *s))
            return true;
    }
    return false;
}

/* The person schema, checked with jansson. */
static bool valid_person(const char *text, char *why, size_t cap) {
    json_error_t je;
    json_t *v = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    const char *bad = NULL;
    if (!v || !json_is_object(v) || json_object_size(v) != 4) bad = "not an object of 4 keys";
    json_t *name = v ? json_object_get(v, "name") : NULL,
           *age = v ? json_object_get(v, "age") : NULL;
    json_t *tags = v ? json_object_get(v, "tags") : NULL, *ok = v ? json_object_get(v, "ok") : NULL;
    if (!bad && (!json_is_string(name) || !json_is_integer(age) || !json_is_array(tags) ||
                 !json_is_boolean(ok)))
        bad = "types";
    if (!bad) {
        size_t cps = 0; /* code points */
        for (const char *p = json_string_value(name); *p; p++)
            cps += ((unsigned char)*p & 0xc0) != 0x80;
        json_int_t a = json_integer_value(age);
        size_t n = json_array_size(tags);
        if (cps > 6 || a < 0 || a > 120 || n < 1 || n > 3) bad = "bounds";
        for (size_t i = 0; !bad && i < n; i++) {
            const char *s = json_string_value(json_array_get(tags, i));
            if (!s || (strcmp(s, "red") && strcmp(s, "green") && strcmp(s, "blue"))) bad = "enum";
        }
        if (!bad && ws_outside(text)) bad = "whitespace in compact output";
    }
    json_decref(v);
    if (bad) snprintf(why, cap, "%s", bad);
    return !bad;
}

static bool full_match(const char *re, const char *text) {
    int e;
    PCRE2_SIZE off;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
                                  PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &e, &off, NULL);
    if (!c) return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)text, strlen(text), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(c);
    return rc >= 0;
}

static bool valid_select(const char *s) {
    if (strncmp(s, "SELECT ", 7)) return false;
    s += 7;
    for (int k = 0; k < 3; k++) {
        if (!strncmp(s, "price", 5))
            s += 5;
        else if (*s == 'a' || *s == 'b')
            s++;
        else
            return false;
        if (!strcmp(s, " FROM t")) return true;
        if (k == 2 || strncmp(s, ", ", 2)) return false;
        s += 2;
    }
    return false;
}

int test_batch_grammar_greedy(struct test_ctx *t) {
    const char *model, *tok;
    if (!dirs(t, &model, &tok)) return 0;
    int32_t p[3][6] = {{5, 17, 300, 42, 9, 11}, {7, 8, 9, 10, 11, 12}, {400, 3, 500, 6, 7, 8}};
    const char *rf[3] = {SCHEMA, REGEX, EBNF};
    struct dsi_request q[9];
    for (int i = 0; i < 9; i++) {
        q[i] = creq(p[i % 3], 6, rf[i / 3], 0.0f, 1);
        q[i].ignore_eos = i % 2; /* ends anyway: the grammar is complete */
        q[i].top_logprobs = i == 0 ? 3 : 0;
    }
    struct dsi_engine *e = NULL;
    struct dsi_result *res[9];
    TEST_ASSERT(!tb_open(&e, model, 8, 0, false, tok));
    TEST_ASSERT(!tb_run(e, q, 9, res));
    char why[128] = "";
    for (int i = 0; i < 9; i++) {
        TEST_ASSERTF(res[i]->status == 0, "%d: %s", i, res[i]->error);
        const struct dsi_completion *c = &res[i]->c[0];
        TEST_ASSERTF(c->finish == DSI_FINISH_STOP, "%d: finish %s after %d tokens: '%s'", i,
                     dsi_finish_str(c->finish), c->n_tokens, c->text);
        TEST_ASSERT(c->stop_token == -1 || c->stop_token == 1);
        for (int k = 0; k < c->n_tokens - 1; k++) /* no control token inside */
            TEST_ASSERT(c->tokens[k] > 2);
        bool ok = i < 3   ? valid_person(c->text, why, sizeof(why))
                  : i < 6 ? full_match("[a-z]{2,5}@[a-z]{2,5}\\.(com|org)", c->text)
                          : valid_select(c->text);
        TEST_ASSERTF(ok, "%d: invalid output '%s' (%s)", i, c->text, why);
    }
    /* logprobs are those of the masked row: the chosen tokens are finite, masked ids -inf */
    const struct dsi_completion *c = &res[0]->c[0];
    TEST_ASSERT(c->logprobs && c->n_top == 3);
    bool neg_inf = false;
    for (int k = 0; k < c->n_tokens; k++) {
        TEST_ASSERT(isfinite(c->logprobs[k]) && c->logprobs[k] <= 0.0f);
        TEST_ASSERT(c->top_ids[k * 3] == c->tokens[k]); /* greedy: the best one */
        neg_inf |= isinf(c->top_logprobs[k * 3 + 2]);
    }
    TEST_ASSERT(neg_inf); /* some step allowed fewer than 3 tokens ("{" first) */
    fprintf(stderr, "[%s | %s | %s] ", res[0]->c[0].text, res[3]->c[0].text, res[6]->c[0].text);
    tb_free(res, 9);
    dsi_batch_close(e);
    return 0;
}

int test_batch_grammar_bad(struct test_ctx *t) {
    const char *model, *tok;
    if (!dirs(t, &model, &tok)) return 0;
    static const char *const bad[][2] = {
        {"{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": "
         "\"object\", \"properties\": {\"a\": {\"type\": \"strin\"}}}}}",
         "strin"},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": "
         "\"object\", \"properties\": {\"a\": {\"not\": {\"type\": \"string\"}}}}}}",
         "unsupported keyword 'not' at #/properties/a"},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": "
         "\"array\", \"uniqueItems\": true}}}",
         "uniqueItems"},
        {"{\"type\": \"regex\", \"regex\": \"(ab\"}", "regex"},
        {"{\"type\": \"regex\", \"regex\": \"a(?=b)\"}", "lookaround"},
        {"{\"type\": \"yaml\"}", "unknown type \"yaml\""},
        {"{\"type\": \"grammar\", \"grammar\": \"root ::= item\"}", "item"},
        {"{\"type\": \"regex\", \"regex\": \"a\", \"flags\": \"i\"}", "unknown field \"flags\""},
        {"{\"type\": \"regex\"}", "\"regex\""},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\"}}", "no \"schema\""},
        {"{\"type\": \"json_object\", \"whitespace\": \"some\"}", "whitespace"},
        {"{type: 1}", "malformed JSON"},
        {"[1]", "want an object"},
    };
    int nb = (int)(sizeof(bad) / sizeof(bad[0]));
    int32_t p[4] = {5, 6, 7, 8};
    struct dsi_engine *e = NULL;
    TEST_ASSERT(!tb_open(&e, model, 4, 0, false, tok));
    struct dsi_request a = creq(p, 4, REGEX, 1.0f, 3), b = creq(p, 4, SCHEMA, 1.0f, 4);
    uint64_t ida = 0, idb = 0;
    struct dsi_err err = {0};
    TEST_ASSERT(!dsi_submit(e, &a, &ida, &err));
    for (int i = 0; i < nb; i++) {
        struct dsi_request q = creq(p, 4, bad[i][0], 1.0f, 1);
        memset(&err, 0, sizeof(err));
        int rc = dsi_submit(e, &q, NULL, &err);
        TEST_ASSERTF(rc == DSI_ERR_INVALID || rc == DSI_ERR_UNSUPPORTED, "%d: rc %d", i, rc);
        TEST_ASSERTF(strstr(err.msg, bad[i][1]) && !strncmp(err.msg, "response_format", 15) &&
                         !strchr(err.msg, '\n'),
                     "%d: message '%s' lacks '%s'", i, err.msg, bad[i][1]);
    }
    b.tag = 1;
    TEST_ASSERT(!dsi_submit(e, &b, &idb, &err));
    int got = 0;
    struct dsi_event ev[8];
    while (got < 2) {
        int k = dsi_poll(e, ev, 8, 30000);
        TEST_ASSERT(k > 0);
        for (int i = 0; i < k; i++) {
            if (ev[i].kind != DSI_EVENT_DONE) continue;
            TEST_ASSERT(ev[i].id == ida || ev[i].id == idb);
            TEST_ASSERT(ev[i].result->status == 0 && ev[i].result->c[0].n_tokens > 0);
            dsi_result_free(ev[i].result);
            got++;
        }
    }
    dsi_batch_close(e);
    /* no tokenizer: refused */
    TEST_ASSERT(!tb_open(&e, model, 4, 0, false, NULL));
    memset(&err, 0, sizeof(err));
    TEST_ASSERT(dsi_submit(e, &a, NULL, &err) == DSI_ERR_UNSUPPORTED);
    TEST_ASSERTF(strstr(err.msg, "response_format") && strstr(err.msg, "tokenizer"), "%s", err.msg);
    struct dsi_request txt = creq(p, 4, "{\"type\": \"text\"}", 0.0f, 1); /* no constraint */
    txt.max_tokens = 3;
    struct dsi_result *r1[1];
    TEST_ASSERT(!tb_run(e, &txt, 1, r1));
    TEST_ASSERT(r1[0]->status == 0 && r1[0]->c[0].n_tokens == 3);
    tb_free(r1, 1);
    dsi_batch_close(e);
    return 0;
}

int test_batch_grammar_seeds(struct test_ctx *t) {
    const char *model, *tok;
    if (!dirs(t, &model, &tok)) return 0;
    enum { N = 4 };
    int32_t p[N][5];
    struct dsi_request q[N];
    const char *rf[3] = {SCHEMA, REGEX, "{\"type\": \"json_object\", \"max_whitespace\": 1}"};
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 5; k++)
            p[i][k] = 3 + (i * 31 + k * 7) % 1000;
        q[i] = creq(p[i], 5, rf[i % 3], 1.0f, 100u + (uint64_t)i);
        q[i].n = 2;
        q[i].max_tokens = 48;
        q[i].top_p = i % 2 ? 0.95f : 1.0f;
        q[i].presence_penalty = i == 4 ? 0.5f : 0.0f;
    }
    struct dsi_engine *e = NULL;
    struct dsi_result *alone[1], *all[N], *one[1];
    TEST_ASSERT(!tb_open(&e, model, 8, 0, false, tok)); /* alone, async */
    TEST_ASSERT(!tb_run(e, &q[0], 1, alone));
    struct dsi_request q1 = q[0];
    q1.n = 1;
    TEST_ASSERT(!tb_run(e, &q1, 1, one));
    dsi_batch_close(e);
    TEST_ASSERT(!tb_open(&e, model, 8, 0, true, tok)); /* in a batch, sync */
    TEST_ASSERT(!tb_run(e, q, N, all));
    dsi_batch_close(e);
    TEST_ASSERT(alone[0]->status == 0 && all[0]->status == 0 && alone[0]->n == 2);
    for (int k = 0; k < 2; k++)
        TEST_ASSERTF(same_comp(&alone[0]->c[k], &all[0]->c[k]), "completion %d differs", k);
    TEST_ASSERT(same_comp(&one[0]->c[0], &alone[0]->c[0])); /* completion 0 == n = 1 */
    TEST_ASSERT(alone[0]->c[0].n_tokens != alone[0]->c[1].n_tokens ||
                memcmp(alone[0]->c[0].tokens, alone[0]->c[1].tokens,
                       sizeof(int32_t) * (size_t)alone[0]->c[0].n_tokens));
    char why[128] = "";
    for (int i = 0; i < N; i++) {
        TEST_ASSERTF(all[i]->status == 0, "%s", all[i]->error);
        for (int k = 0; k < 2; k++) {
            const struct dsi_completion *c = &all[i]->c[k];
            if (c->finish != DSI_FINISH_STOP) continue; /* cut by max_tokens */
            if (i % 3 == 0) TEST_ASSERTF(valid_person(c->text, why, sizeof(why)), "%s", why);
            if (i % 3 == 1) TEST_ASSERT(full_match("[a-z]{2,5}@[a-z]{2,5}\\.(com|org)", c->text));
            if (i % 3 == 2) {
                json_t *v = json_loads(c->text, 0, NULL);
                TEST_ASSERTF(json_is_object(v), "'%s'", c->text);
                json_decref(v);
            }
        }
    }
    tb_free(alone, 1);
    tb_free(one, 1);
    tb_free(all, N);
    return 0;
}

int test_batch_grammar_preempt(struct test_ctx *t) {
    const char *model, *tok;
    if (!dirs(t, &model, &tok)) return 0;
    enum { NMAX = 8 };
    int N = t->slow ? NMAX : 5;
    int32_t *p[NMAX];
    struct dsi_request q[NMAX];
    const char *rf[2] = {SCHEMA, "{\"type\": \"json_object\", \"max_whitespace\": 1}"};
    for (int i = 0; i < N; i++) {
        int len = i % 4 ? 10 + 3 * i : 246 + i; /* the long ones cross a page boundary */
        p[i] = malloc(sizeof(int32_t) * (size_t)len);
        for (int k = 0; k < len; k++)
            p[i][k] = 3 + (i * 17 + k * 11) % 1000;
        q[i] = creq(p[i], len, rf[i % 2], i % 3 ? 1.0f : 0.0f, 7u + (uint64_t)i);
        q[i].max_tokens = 30;
        q[i].n = i == 3 ? 2 : 1;
    }
    struct dsi_engine *e = NULL;
    struct dsi_result *res[NMAX];
    struct dsi_batch_stats st;
    TEST_ASSERT(!tb_open(&e, model, 8, 2, false, tok)); /* 2 pages: 512 positions */
    TEST_ASSERT(!tb_run(e, q, N, res));
    dsi_batch_get_stats(e, &st);
    dsi_batch_close(e);
    fprintf(stderr, "[%lld preemptions] ", (long long)st.preemptions);
    TEST_ASSERT(st.preemptions > 0);
    TEST_ASSERT(!tb_open(&e, model, 8, 0, false, tok)); /* room for all */
    int preempted = 0;
    for (int i = 0; i < N; i++) {
        TEST_ASSERTF(res[i]->status == 0, "%s", res[i]->error);
        bool pre = false;
        for (int k = 0; k < res[i]->n; k++)
            pre |= res[i]->c[k].n_preemptions > 0;
        if (!pre) continue;
        preempted++;
        struct dsi_result *alone[1];
        TEST_ASSERT(!tb_run(e, &q[i], 1, alone));
        for (int k = 0; k < res[i]->n; k++)
            TEST_ASSERTF(same_comp(&res[i]->c[k], &alone[0]->c[k]),
                         "request %d completion %d differs after preemption", i, k);
        tb_free(alone, 1);
    }
    TEST_ASSERT(preempted > 0);
    dsi_batch_get_stats(e, &st);
    TEST_ASSERT(st.preemptions == 0);
    dsi_batch_close(e);
    tb_free(res, N);
    for (int i = 0; i < N; i++)
        free(p[i]);
    return 0;
}

/* The cache of compiled response formats: one compile per source, formatting ignored, idle
 * entries evicted least recently used first. */
int test_rformat_cache(struct test_ctx *t) {
    const char *tok = gdir(t, "models/dsv4-tiny", "tokenizer.json");
    if (!tok) return 0;
    struct dsi_bpe *bpe = NULL;
    struct dsi_err err = {0};
    TEST_ASSERTF(!dsi_bpe_open_limit(&bpe, tok, 1024, &err), "%s", err.msg);
    struct dsi_rformat_cache *c = NULL;
    TEST_ASSERT(!dsi_rformat_cache_new(&c, bpe, 1, 1, &err));
    static const char *const a1 = "{\"type\":\"regex\",\"regex\":\"[0-9]+\"}";
    static const char *const a2 = "{ \"regex\" : \"[0-9]+\", \"type\" : \"regex\" }";
    static const char *const s1 = "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\","
                                  "\"schema\":{\"type\":\"object\"}}}";
    static const char *const s2 = "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"b\", "
                                  "\"strict\": false, \"schema\": {\"type\":   \"object\"}}}";
    static const char *const s3 =
        "{\"type\":\"json_schema\",\"whitespace\":\"compact\","
        "\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"object\"}}}";
    struct dsi_rformat *f[6] = {0};
    TEST_ASSERT(!dsi_rformat_get(c, a1, strlen(a1), &f[0], &err));
    TEST_ASSERT(!dsi_rformat_get(c, a2, strlen(a2), &f[1], &err));
    TEST_ASSERT(!dsi_rformat_get(c, s1, strlen(s1), &f[2], &err));
    TEST_ASSERT(!dsi_rformat_get(c, s2, strlen(s2), &f[3], &err));
    TEST_ASSERT(!dsi_rformat_get(c, s3, strlen(s3), &f[4], &err));
    TEST_ASSERT(!dsi_rformat_get(c, "{\"type\":\"text\"}", 15, &f[5], &err) && !f[5]);
    TEST_ASSERT(f[0] == f[1] && f[2] == f[3] && f[2] != f[4] && f[0] != f[2]);
    TEST_ASSERT(dsi_rformat_vocab_size(f[0]) == 1024);
    struct dsi_rformat_stats st;
    dsi_rformat_cache_stats(c, &st);
    TEST_ASSERTF(st.compiles == 3 && st.hits == 2 && st.n_entries == 3, "%lld %lld %d",
                 (long long)st.compiles, (long long)st.hits, st.n_entries);
    /* a matcher on the shared grammar */
    struct dsi_grammar_matcher *m = NULL;
    TEST_ASSERT(!dsi_grammar_matcher_new(&m, dsi_rformat_grammar(f[0]), &err));
    TEST_ASSERT(!dsi_grammar_matcher_accept_bytes(m, "42", 2, &err));
    TEST_ASSERT(dsi_grammar_matcher_is_complete(m));
    dsi_grammar_matcher_free(m);
    for (int i = 0; i < 5; i++)
        dsi_rformat_put(c, f[i]);
    dsi_rformat_cache_stats(c, &st);
    TEST_ASSERT(st.n_entries == 1); /* max_idle 1: the most recently used one stays */
    TEST_ASSERT(!dsi_rformat_get(c, s3, strlen(s3), &f[0], &err));
    dsi_rformat_cache_stats(c, &st);
    TEST_ASSERT(st.hits == 3 && st.compiles == 3);
    dsi_rformat_put(c, f[0]);
    TEST_ASSERT(dsi_rformat_get(c, "{\"type\":\"regex\",\"regex\":\"a{2,1}\"}", 33, &f[1], &err));
    TEST_ASSERT(!f[1] && strstr(err.msg, "response_format: regex"));
    dsi_rformat_cache_free(c);
    dsi_bpe_free(bpe);
    return 0;
}
