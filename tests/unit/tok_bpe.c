/* tok_bpe.c - tokenizer tests against the goldens of ref/tok_gen_goldens.py (HF tokenizers on
 * DeepSeek-V4's tokenizer.json, which tests/golden/tok/v4/tokenizer.json.gz holds).
 *
 * The loaded tokenizer is kept for the whole run (tok_test_bpe); it stays reachable, so leak
 * checkers do not report it. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "tok/bpe.h"
#include "tok/bpe_internal.h"
#include "tok/utf8.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>

const char *tok_test_dir(struct test_ctx *t);
const struct dsi_bpe *tok_test_bpe(struct test_ctx *t);

/* Unpack the committed tokenizer into the run's scratch directory (once). */
const char *tok_test_dir(struct test_ctx *t) {
    static char dir[1200];
    if (dir[0]) return dir;
    char cmd[8192];
    snprintf(dir, sizeof(dir), "%.1000s/tok-v4", t->tmpdir);
    snprintf(cmd, sizeof(cmd),
             "mkdir -p '%s' && gzip -dc '%.1000s/tests/golden/tok/v4/tokenizer.json.gz' > "
             "'%s/tokenizer.json' && cp '%.1000s/tests/golden/tok/v4/tokenizer_config.json' '%s/'",
             dir, t->root, dir, t->root, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "  cannot unpack the test tokenizer: %s\n", cmd);
        dir[0] = 0;
        return NULL;
    }
    return dir;
}

const struct dsi_bpe *tok_test_bpe(struct test_ctx *t) {
    static struct dsi_bpe *bpe;
    if (bpe) return bpe;
    const char *dir = tok_test_dir(t);
    struct dsi_err err = {0};
    if (!dir || dsi_bpe_open(&bpe, dir, &err)) {
        fprintf(stderr, "  cannot load the test tokenizer: %s\n", err.msg);
        bpe = NULL;
    }
    return bpe;
}

static json_t *load_golden(struct test_ctx *t, const char *rel) {
    json_error_t je;
    json_t *j = json_load_file(test_path(t, rel), 0, &je);
    if (!j) fprintf(stderr, "  %s: %s\n", rel, je.text);
    return j;
}

static int ids_equal(const int32_t *a, size_t na, const json_t *b) {
    if (na != json_array_size(b)) return 0;
    for (size_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(b, i))) return 0;
    return 1;
}

static int from_hex(const char *h, char *out) {
    int n = 0;
    for (; h[0] && h[1]; h += 2) {
        unsigned v;
        if (sscanf(h, "%2x", &v) != 1) return -1;
        out[n++] = (char)v;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------- */

int test_tok_load_info(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    TEST_ASSERT(b);
    struct dsi_bpe_info in;
    dsi_bpe_get_info(b, &in);
    TEST_ASSERT(in.n_ids == 129280);
    TEST_ASSERT(in.n_model == 128000);
    TEST_ASSERT(in.n_merges == 127741);
    TEST_ASSERT(in.n_added == 1283);
    TEST_ASSERT(in.n_split_steps == 3);
    TEST_ASSERT(dsi_bpe_vocab_size(b) == 129280);
    TEST_ASSERT(dsi_bpe_bos_id(b) == 0);
    TEST_ASSERT(dsi_bpe_eos_id(b) == 1);
    TEST_ASSERT(dsi_bpe_pad_id(b) == 1);
    TEST_ASSERT(dsi_bpe_is_special(b, 0) && !dsi_bpe_is_special(b, 128803));
    return 0;
}

int test_tok_spot_ids(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    json_t *g = load_golden(t, "tests/golden/tok/encode.json");
    TEST_ASSERT(b && g);
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(g, "spot"), name, v) {
        TEST_ASSERTF(dsi_bpe_token_id(b, name, NULL) == json_integer_value(v), "%s", name);
    }
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_bpe_token_id(b, "<｜no▁such▁token｜>", &err) == -1);
    TEST_ASSERT(strstr(err.msg, "unknown token"));
    json_decref(g);
    /* spec 8.4 */
    static const char s1[] =
        "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
    static const int32_t e1[] = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
    int32_t *ids;
    size_t n;
    TEST_ASSERT(dsi_bpe_encode(b, s1, strlen(s1), true, &ids, &n, &err) == 0);
    TEST_ASSERT(n == 8 && !memcmp(ids, e1, sizeof(e1)));
    free(ids);
    static const char s2[] = "Hello! 毕老师！";
    TEST_ASSERT(dsi_bpe_encode(b, s2, strlen(s2), true, &ids, &n, &err) == 0);
    TEST_ASSERT(n >= 2 && ids[0] == 19923 && ids[1] == 3);
    free(ids);
    return 0;
}

int test_tok_encode_golden(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    json_t *g = load_golden(t, "tests/golden/tok/encode.json");
    TEST_ASSERT(b && g);
    size_t i;
    json_t *c;
    int checked = 0;
    json_array_foreach(json_object_get(g, "encode"), i, c) {
        const json_t *txt = json_object_get(c, "text");
        char buf[8192];
        const char *s;
        size_t len;
        bool lossy = !txt;
        if (txt) {
            s = json_string_value(txt);
            len = json_string_length(txt);
        } else {
            int l = from_hex(json_string_value(json_object_get(c, "bytes_hex")), buf);
            TEST_ASSERT(l >= 0);
            s = buf;
            len = (size_t)l;
        }
        bool special = json_is_true(json_object_get(c, "special"));
        int32_t *ids;
        size_t n;
        struct dsi_err err = {0};
        int rc = lossy ? dsi_bpe_encode_lossy(b, s, len, special, &ids, &n, &err)
                       : dsi_bpe_encode(b, s, len, special, &ids, &n, &err);
        TEST_ASSERTF(rc == 0, "case %zu: %s", i, err.msg);
        TEST_ASSERTF(ids_equal(ids, n, json_object_get(c, "ids")),
                     "case %zu (%.60s): ids differ "
                     "from HF",
                     i, txt ? s : "bytes");
        if (lossy && dsi_utf8_valid_len(s, len) != len) {
            int32_t *x;
            size_t xn;
            TEST_ASSERT(dsi_bpe_encode(b, s, len, special, &x, &xn, &err) == DSI_ERR_INVALID);
            TEST_ASSERT(strstr(err.msg, "UTF-8"));
        }
        free(ids);
        checked++;
    }
    TEST_ASSERT(checked >= 40);
    json_decref(g);
    return 0;
}

int test_tok_decode_golden(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    json_t *g = load_golden(t, "tests/golden/tok/encode.json");
    TEST_ASSERT(b && g);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(g, "decode"), i, c) {
        const json_t *ja = json_object_get(c, "ids");
        int32_t ids[64];
        size_t n = json_array_size(ja);
        for (size_t k = 0; k < n; k++)
            ids[k] = (int32_t)json_integer_value(json_array_get(ja, k));
        for (int skip = 0; skip < 2; skip++) {
            const json_t *want = json_object_get(c, skip ? "text_skip" : "text");
            char out[1024];
            size_t len;
            unsigned fl = DSI_DECODE_LOSSY | (skip ? DSI_DECODE_SKIP_SPECIAL : 0);
            TEST_ASSERT(dsi_bpe_decode(b, ids, n, fl, out, sizeof(out), &len, NULL) == 0);
            TEST_ASSERTF(len == json_string_length(want) &&
                             !memcmp(out, json_string_value(want), len),
                         "decode case %zu skip %d", i, skip);
            /* the size query alone */
            size_t need;
            TEST_ASSERT(dsi_bpe_decode(b, ids, n, fl, NULL, 0, &need, NULL) == 0 && need == len);
        }
    }
    json_decref(g);
    return 0;
}

/* decode(encode(x)) == x, and the stream decoder agrees with the whole decode at every prefix. */
static int roundtrip_one(const struct dsi_bpe *b, const char *s, size_t len) {
    int32_t *ids;
    size_t n;
    struct dsi_err err = {0};
    TEST_ASSERTF(dsi_bpe_encode(b, s, len, true, &ids, &n, &err) == 0, "%s", err.msg);
    char *out = malloc(len + 1);
    size_t ol;
    TEST_ASSERT(dsi_bpe_decode(b, ids, n, 0, out, len + 1, &ol, &err) == 0);
    TEST_ASSERT(ol == len && !memcmp(out, s, len));
    struct dsi_bpe_stream *st;
    TEST_ASSERT(dsi_bpe_stream_new(&st, b, 0, &err) == 0);
    char *acc = malloc(4 * len + 16);
    size_t al = 0;
    for (size_t k = 0; k < n; k++) {
        const char *piece;
        size_t pl;
        TEST_ASSERT(dsi_bpe_stream_feed(st, ids[k], &piece, &pl, &err) == 0);
        TEST_ASSERT(dsi_utf8_valid_len(piece, pl) == pl);
        memcpy(acc + al, piece, pl);
        al += pl;
        /* prefix k+1: what was emitted plus a flush equals the lossy decode of the prefix */
        size_t need;
        TEST_ASSERT(dsi_bpe_decode(b, ids, k + 1, DSI_DECODE_LOSSY, NULL, 0, &need, NULL) == 0);
        char *full = malloc(need + 1);
        TEST_ASSERT(dsi_bpe_decode(b, ids, k + 1, DSI_DECODE_LOSSY, full, need + 1, &need, NULL) ==
                    0);
        size_t held = need - al;
        TEST_ASSERT(need >= al && !memcmp(full, acc, al) && (held == 0 || held == 3));
        free(full);
    }
    const char *tail;
    size_t tl;
    dsi_bpe_stream_flush(st, &tail, &tl);
    TEST_ASSERT(tl == 0);
    TEST_ASSERT(al == len && !memcmp(acc, s, len));
    dsi_bpe_stream_free(st);
    free(acc);
    free(out);
    free(ids);
    return 0;
}

int test_tok_roundtrip_stream(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    json_t *g = load_golden(t, "tests/golden/tok/encode.json");
    TEST_ASSERT(b && g);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(g, "encode"), i, c) {
        const json_t *txt = json_object_get(c, "text");
        if (txt && roundtrip_one(b, json_string_value(txt), json_string_length(txt))) {
            fprintf(stderr, "  round trip of case %zu\n", i);
            return 1;
        }
    }
    json_decref(g);
    return 0;
}

/* Lossy stream: arbitrary ids (broken characters in the middle) still stream valid UTF-8 equal
 * to the lossy whole decode. */
int test_tok_stream_lossy(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    TEST_ASSERT(b);
    unsigned seed = t->seed;
    struct dsi_bpe_stream *st;
    TEST_ASSERT(dsi_bpe_stream_new(&st, b, 0, NULL) == 0);
    for (int round = 0; round < 200; round++) {
        int32_t ids[24];
        size_t n = 1 + (size_t)(rand_r(&seed) % 24);
        for (size_t k = 0; k < n; k++)
            ids[k] = 3 + (int32_t)(rand_r(&seed) % 127990);
        char acc[4096];
        size_t al = 0;
        for (size_t k = 0; k < n; k++) {
            const char *p;
            size_t pl;
            TEST_ASSERT(dsi_bpe_stream_feed(st, ids[k], &p, &pl, NULL) == 0);
            TEST_ASSERT(dsi_utf8_valid_len(p, pl) == pl);
            memcpy(acc + al, p, pl);
            al += pl;
        }
        const char *p;
        size_t pl;
        dsi_bpe_stream_flush(st, &p, &pl);
        memcpy(acc + al, p, pl);
        al += pl;
        char full[4096];
        size_t fl;
        TEST_ASSERT(dsi_bpe_decode(b, ids, n, DSI_DECODE_LOSSY, full, sizeof(full), &fl, NULL) ==
                    0);
        TEST_ASSERT(fl == al && !memcmp(full, acc, al));
    }
    /* errors leave the stream usable; skip-special drops BOS/EOS */
    struct dsi_err err = {0};
    const char *p;
    size_t pl;
    TEST_ASSERT(dsi_bpe_stream_feed(st, 129280, &p, &pl, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(strstr(err.msg, "129280") && pl == 0);
    TEST_ASSERT(dsi_bpe_stream_feed(st, -1, &p, &pl, &err) == DSI_ERR_INVALID);
    dsi_bpe_stream_free(st);
    TEST_ASSERT(dsi_bpe_stream_new(&st, b, DSI_DECODE_SKIP_SPECIAL, NULL) == 0);
    TEST_ASSERT(dsi_bpe_stream_feed(st, 0, &p, &pl, NULL) == 0 && pl == 0);
    TEST_ASSERT(dsi_bpe_stream_feed(st, 128803, &p, &pl, NULL) == 0 && pl == strlen("<｜User｜>"));
    dsi_bpe_stream_free(st);
    return 0;
}

/* The rank-scan and priority-queue merge loops agree (and HF's heap is the reference). */
int test_tok_merge_methods(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    TEST_ASSERT(b);
    unsigned seed = t->seed;
    static const char alpha[] = "aabcdeeinorst ,.0123\xc3\xa9\xe4\xb8\xad";
    int32_t out1[600], out2[600];
    int32_t *scratch = malloc(DSI_BPE_SCRATCH(600) * sizeof(int32_t));
    TEST_ASSERT(scratch);
    for (int round = 0; round < 400; round++) {
        char s[600];
        size_t n = 1 + (size_t)(rand_r(&seed) % 500);
        for (size_t k = 0; k < n; k++)
            s[k] = alpha[rand_r(&seed) % (sizeof(alpha) - 1)];
        size_t n1 = dsi_bpe_merge_piece(b, s, n, 1, out1, scratch);
        size_t n2 = dsi_bpe_merge_piece(b, s, n, 2, out2, scratch);
        TEST_ASSERTF(n1 == n2 && !memcmp(out1, out2, n1 * sizeof(int32_t)), "round %d", round);
    }
    free(scratch);
    return 0;
}

int test_tok_errors(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    TEST_ASSERT(b);
    struct dsi_err err = {0};
    int32_t *ids;
    size_t n;
    /* invalid UTF-8 is refused with its offset; the lossy variant replaces it */
    TEST_ASSERT(dsi_bpe_encode(b, "ab\xffz", 4, true, &ids, &n, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(strstr(err.msg, "byte 2"));
    TEST_ASSERT(dsi_bpe_encode_lossy(b, "ab\xffz", 4, true, &ids, &n, &err) == 0 && n > 0);
    free(ids);
    /* empty text */
    TEST_ASSERT(dsi_bpe_encode(b, "", 0, true, &ids, &n, &err) == 0 && n == 0 && ids);
    free(ids);
    /* ids out of range and unknown */
    int32_t bad[] = {5, 129280};
    size_t len;
    TEST_ASSERT(dsi_bpe_decode(b, bad, 2, 0, NULL, 0, &len, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(strstr(err.msg, "129280") && strstr(err.msg, "out of range"));
    const char *tb;
    TEST_ASSERT(dsi_bpe_token_bytes(b, -3, &tb, &len, &err) == DSI_ERR_INVALID);
    /* decode into a short buffer: truncated, length still reported */
    int32_t hw[] = {19923, 3};
    char small[3];
    TEST_ASSERT(dsi_bpe_decode(b, hw, 2, 0, small, sizeof(small), &len, &err) == 0);
    TEST_ASSERT(len == 6 && !memcmp(small, "Hel", 3));
    return 0;
}

/* A vocabulary limit below the tokenizer's ids (a model with fewer rows) refuses those ids. */
int test_tok_vocab_limit(struct test_ctx *t) {
    const char *dir = tok_test_dir(t);
    TEST_ASSERT(dir);
    struct dsi_bpe *b;
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_bpe_open_limit(&b, dir, 128000, &err) == 0);
    TEST_ASSERT(dsi_bpe_vocab_size(b) == 128000);
    int32_t *ids;
    size_t n;
    TEST_ASSERT(dsi_bpe_encode(b, "plain text", 10, true, &ids, &n, &err) == 0);
    free(ids);
    TEST_ASSERT(dsi_bpe_encode(b, "<think>", 7, true, &ids, &n, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(strstr(err.msg, "128821") && strstr(err.msg, "vocab_size"));
    TEST_ASSERT(dsi_bpe_encode(b, "<think>", 7, false, &ids, &n, &err) == 0 && n > 1);
    free(ids);
    int32_t x = 128803;
    size_t len;
    TEST_ASSERT(dsi_bpe_decode(b, &x, 1, 0, NULL, 0, &len, &err) == DSI_ERR_INVALID);
    dsi_bpe_free(b);
    /* config.json's vocab_size is picked up by dsi_bpe_open */
    char path[4200];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    TEST_ASSERT(f);
    fputs("{\"vocab_size\": 129000}", f);
    fclose(f);
    TEST_ASSERT(dsi_bpe_open(&b, dir, &err) == 0);
    remove(path);
    TEST_ASSERT(dsi_bpe_vocab_size(b) == 129000);
    dsi_bpe_free(b);
    return 0;
}

/* Malformed tokenizer.json / tokenizer_config.json: a clear error, never a crash. */
static int load_err(const char *tj, const char *cfg, const char *want) {
    struct dsi_bpe *b = (struct dsi_bpe *)1;
    struct dsi_err err = {0};
    int rc = dsi_bpe_load(&b, tj, strlen(tj), cfg, cfg ? strlen(cfg) : 0, 0, &err);
    if (rc == 0 || b != NULL || !strstr(err.msg, want)) {
        fprintf(stderr, "  load of %.60s: rc %d, msg '%s' (want '%s')\n", tj, rc, err.msg, want);
        if (rc == 0) dsi_bpe_free(b);
        return 1;
    }
    return 0;
}

#define TINY_HEAD                                                                                  \
    "{\"normalizer\": null, \"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": "           \
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "

int test_tok_load_errors(struct test_ctx *t) {
    const char *ok =
        TINY_HEAD "\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": "
                  "true}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, "
                  "\"ab\": 2}, \"merges\": [\"a b\"]}}";
    struct dsi_bpe *b;
    struct dsi_err err = {0};
    TEST_ASSERTF(dsi_bpe_load(&b, ok, strlen(ok), "{\"bos_token\": \"<s>\"}", 20, 0, &err) == 0,
                 "%s", err.msg);
    int32_t *ids;
    size_t n;
    TEST_ASSERT(dsi_bpe_encode(b, "ab<s>ba", 7, true, &ids, &n, &err) == 0);
    TEST_ASSERT(n == 4 && ids[0] == 2 && ids[1] == 3 && ids[2] == 1 && ids[3] == 0);
    free(ids);
    /* bytes without a symbol are dropped, as HF does */
    TEST_ASSERT(dsi_bpe_encode(b, "a c", 3, true, &ids, &n, &err) == 0 && n == 1 && ids[0] == 0);
    free(ids);
    TEST_ASSERT(dsi_bpe_bos_id(b) == 3 && dsi_bpe_eos_id(b) == -1);
    dsi_bpe_free(b);

    int fails = 0;
    fails += load_err("", NULL, "tokenizer.json: line");
    fails += load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merg", NULL,
                      "tokenizer.json: line");
    fails += load_err("[1, 2]", NULL, "not a JSON object");
    fails += load_err(TINY_HEAD "\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}", NULL,
                      "model type 'Unigram'");
    fails +=
        load_err(TINY_HEAD "\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}", NULL, "bad id");
    fails += load_err(TINY_HEAD "\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
                      NULL, "two vocab entries");
    fails += load_err(TINY_HEAD "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}", NULL,
                      "not in the vocab");
    fails += load_err(TINY_HEAD "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"abc\"]}}", NULL,
                      "not two tokens");
    fails += load_err(TINY_HEAD "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [7]}}", NULL,
                      "malformed");
    fails += load_err(TINY_HEAD "\"model\": {\"vocab\": {\"a\": 99999999}, \"merges\": []}}", NULL,
                      "bad id");
    fails += load_err(TINY_HEAD "\"model\": {\"vocab\": [], \"merges\": []}}", NULL,
                      "vocab is not an object");
    fails += load_err(TINY_HEAD "\"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"lstrip\": "
                                "true}], \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, "lstrip");
    fails += load_err(TINY_HEAD "\"added_tokens\": [{\"id\": 1}], \"model\": {\"vocab\": {\"a\": "
                                "0}, \"merges\": []}}",
                      NULL, "no content");
    fails += load_err("{\"normalizer\": {\"type\": \"NFC\"}, \"decoder\": {\"type\": "
                      "\"ByteLevel\"}, \"model\": {\"vocab\": {}, \"merges\": []}}",
                      NULL, "normalizer 'NFC'");
    fails += load_err("{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {}}", NULL,
                      "decoder 'WordPiece'");
    fails += load_err("{\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": "
                      "\"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, "
                      "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, "compile");
    fails += load_err("{\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": "
                      "\"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}, "
                      "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, "Removed");
    fails += load_err("{\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": "
                      "\"Whitespace\"}, \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, "step type 'Whitespace'");
    fails += load_err(ok, "{\"eos_token\": \"<｜end▁of▁sentence｜>\"}", "is not a token");
    fails += load_err(ok, "{\"bos_token\": 5}", "bos_token is not a string");
    fails += load_err(ok, "{broken", "tokenizer_config.json: line");
    TEST_ASSERT(fails == 0);

    /* a missing directory / file */
    TEST_ASSERT(dsi_bpe_open(&b, "/nonexistent/dsinfer", &err) == DSI_ERR_IO);
    TEST_ASSERT(strstr(err.msg, "tokenizer.json") && !b);
    (void)t;
    return 0;
}

/* Truncations of a small valid tokenizer.json at every length fail cleanly (or load). */
int test_tok_load_truncated(struct test_ctx *t) {
    const char *ok =
        TINY_HEAD "\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\"}], \"model\": "
                  "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
                  "[[\"a\", \"b\"]]}}";
    size_t n = strlen(ok);
    for (size_t k = 0; k < n; k++) {
        struct dsi_bpe *b;
        struct dsi_err err = {0};
        int rc = dsi_bpe_load(&b, ok, k, NULL, 0, 0, &err);
        TEST_ASSERTF(rc != 0 && !b && err.msg[0], "prefix %zu", k);
    }
    (void)t;
    return 0;
}

/* One tokenizer, several threads encoding at once: same results as one thread. */
struct thr_arg {
    const struct dsi_bpe *b;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    int rc;
};

static void *thr_encode(void *p) {
    struct thr_arg *a = p;
    for (int r = 0; r < 20 && !a->rc; r++) {
        free(a->ids);
        a->rc = dsi_bpe_encode(a->b, a->text, a->len, true, &a->ids, &a->n, NULL);
    }
    return NULL;
}

int test_tok_threads(struct test_ctx *t) {
    const struct dsi_bpe *b = tok_test_bpe(t);
    TEST_ASSERT(b);
    static const char text[] = "Threads share one tokenizer: 中文 😀 <think>x</think> 12345 \n\n"
                               "def f(x):\n    return [i for i in range(x)]\n";
    struct thr_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct thr_arg){b, text, strlen(text), NULL, 0, 0};
        TEST_ASSERT(pthread_create(&th[i], NULL, thr_encode, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        TEST_ASSERT(a[i].rc == 0 && a[i].n == a[0].n);
        TEST_ASSERT(!memcmp(a[i].ids, a[0].ids, a[0].n * sizeof(int32_t)));
    }
    for (int i = 0; i < 4; i++)
        free(a[i].ids);
    return 0;
}

/* UTF-8 helpers: maximal-subpart replacement as Python's "replace" does. */
int test_tok_utf8(struct test_ctx *t) {
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"a\xff"
         "b",
         "a\xef\xbf\xbd"
         "b"},
        {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe2\x82", "\xef\xbf\xbd"},
        {"\xf0\x9f\x98"
         "x",
         "\xef\xbf\xbdx"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"ok \xe4\xb8\xad", "ok \xe4\xb8\xad"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *o;
        size_t ol;
        TEST_ASSERT(dsi_utf8_lossy(cases[i].in, strlen(cases[i].in), &o, &ol, NULL) == 0);
        TEST_ASSERTF(ol == strlen(cases[i].out) && !memcmp(o, cases[i].out, ol), "case %zu", i);
        free(o);
    }
    for (unsigned c = 0; c < 256; c++)
        TEST_ASSERT(dsi_bytelevel_byte(dsi_bytelevel_char((uint8_t)c)) == (int)c);
    TEST_ASSERT(dsi_bytelevel_char(' ') == 0x120 && dsi_bytelevel_char('\n') == 0x10a);
    (void)t;
    return 0;
}

/* \s / \S outside classes become Oniguruma's White_Space; classes are left alone. */
int test_tok_pretok_rewrite(struct test_ctx *t) {
    static const char pat[] = "\\s+(?!\\S)|[\\s\\]x]\\\\s|\\S";
    size_t n;
    char *r = dsi_pretok_rewrite_space(pat, strlen(pat), &n);
    TEST_ASSERT(r && n == strlen(r));
    TEST_ASSERT(!strcmp(r, "[\\p{Z}\\x{09}-\\x{0D}\\x{85}]+(?![^\\p{Z}\\x{09}-\\x{0D}\\x{85}])|"
                           "[\\s\\]x]\\\\s|[^\\p{Z}\\x{09}-\\x{0D}\\x{85}]"));
    free(r);
    /* the worst case for the output size: nothing but \S */
    char many[64 + 1];
    for (int i = 0; i < 32; i++)
        memcpy(many + 2 * i, "\\S", 2);
    many[64] = 0;
    r = dsi_pretok_rewrite_space(many, 64, &n);
    TEST_ASSERT(r && n == 32 * 27);
    free(r);
    (void)t;
    return 0;
}
