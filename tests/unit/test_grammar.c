/* test_grammar.c - the grammar engine (src/grammar): front ends, errors and limits, masks
 * against a brute-force oracle (every token tried on a scratch matcher), rollback, EOS and
 * termination, integer ranges and date formats checked value by value, thread sharing.
 * The real-vocabulary suites (JSON Schema corpus validated with jsonschema, regexes, EBNF
 * grammars, XGrammar mask equality) are CLI tests: tests/cli/t_grammar*.sh. */
#define _POSIX_C_SOURCE 200809L
#include "grammar/grammar.h"
#include "test.h"
#include "tok/bpe.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* helpers */

static uint64_t rnd(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A small vocabulary: EOS (id 0), a special token (id 1), the 256 single bytes, then extra
 * multi-byte tokens (partial UTF-8 included). */
static struct dsi_grammar_vocab *small_vocab(void) {
    static const char *const extra[] = {
        "{\"", "\":", "\",", "\"}", "},", "}}", "[\"", "\"]", "],", "]]", ", ", ": ", " \"", "\n ",
        "  ", "    ", "true", "false", "null", "nul", "tru", "123", "0.", ".5", "e+", "-1", "00",
        "abc", "name", "\"name\"", "\"age\":", "age", "\\\"", "\\n", "\\u00", "\\u", "é", "\xc3",
        "\xa9", "中", "\xe4\xb8", "\xad", "😀", "\xf0\x9f", "\x98\x80", "SELECT", " FROM", " WHERE",
        " ", "(", "))", "+(", "*-", "1+", "2*", "ab", "ba", "abb", "a\"", "\"a", "\"\"", "{}", "[]",
        "x", "xy", "yy", "2024", "-02-", "-29", "T12", ":00", "Z\"", "@", ".com", "\t\t", "\r\n",
        /* longer than VT_SHORT (12): walked separately by the mask cache */
        "                ", "\"description\":", "abcabcabcabcabc", "{\"name\": \"value\"}",
        "aaaaaaaaaaaaaaaaaaaa", "xxxxxxxxxxxxxxx", "1234567890123", "\"},{\"name\":\"",
        "\\u00e9\\u00e9\\u00e9", "))))))))))))))", NULL};
    int n_extra = 0;
    while (extra[n_extra])
        n_extra++;
    int n = 2 + 256 + n_extra;
    const char **tok = calloc((size_t)n, sizeof(*tok));
    uint32_t *len = calloc((size_t)n, sizeof(*len));
    uint8_t *flags = calloc((size_t)n, 1);
    static char bytes[256];
    tok[0] = "</s>", len[0] = 4;
    tok[1] = "<think>", len[1] = 7, flags[1] = DSI_GRAMMAR_TOKEN_SPECIAL;
    for (int b = 0; b < 256; b++) {
        bytes[b] = (char)b;
        tok[2 + b] = &bytes[b];
        len[2 + b] = 1;
    }
    for (int i = 0; i < n_extra; i++)
        tok[258 + i] = extra[i], len[258 + i] = (uint32_t)strlen(extra[i]);
    struct dsi_grammar_vocab *v = NULL;
    struct dsi_err err = {0};
    if (dsi_grammar_vocab_new(&v, tok, len, flags, n, 0, &err))
        fprintf(stderr, "vocab: %s\n", err.msg);
    free(tok);
    free(len);
    free(flags);
    return v;
}

static struct dsi_grammar_compiled *compile(enum dsi_grammar_kind kind,
                                            const char *src,
                                            const struct dsi_grammar_vocab *v,
                                            const struct dsi_grammar_opts *o) {
    struct dsi_grammar *g = NULL;
    struct dsi_grammar_compiled *cg = NULL;
    struct dsi_err err = {0};
    if (dsi_grammar_parse(&g, kind, src, strlen(src), o, &err) ||
        dsi_grammar_compile(&cg, g, v, o, &err))
        fprintf(stderr, "  compile '%.60s': %s\n", src, err.msg);
    dsi_grammar_free(g);
    return cg;
}

/* Expect a parse/compile failure with code and a message containing `want`. */
static int expect_error(enum dsi_grammar_kind kind,
                        const char *src,
                        int code,
                        const char *want,
                        const struct dsi_grammar_opts *o,
                        const struct dsi_grammar_vocab *v) {
    struct dsi_grammar *g = NULL;
    struct dsi_grammar_compiled *cg = NULL;
    struct dsi_err err = {0};
    int rc = dsi_grammar_parse(&g, kind, src, strlen(src), o, &err);
    if (!rc && v) rc = dsi_grammar_compile(&cg, g, v, o, &err);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_free(g);
    if (rc == 0) {
        fprintf(stderr, "  '%s' compiled, expected an error with '%s'\n", src, want);
        return 1;
    }
    if ((code && rc != code) || !strstr(err.msg, want)) {
        fprintf(stderr, "  '%s': got %d '%s', want %d '%s'\n", src, rc, err.msg, code, want);
        return 1;
    }
    return 0;
}

/* Brute force: token t is allowed iff the matcher accepts it (then it is rolled back). */
static int
check_mask(struct dsi_grammar_matcher *m, const struct dsi_grammar_vocab *v, const uint32_t *mask) {
    int32_t n = dsi_grammar_vocab_size(v), eos = dsi_grammar_vocab_eos(v);
    for (int32_t id = 0; id < n; id++) {
        bool in = mask[id >> 5] >> (id & 31) & 1;
        bool ok;
        if (id == eos) {
            ok = dsi_grammar_matcher_is_complete(m);
        } else {
            ok = dsi_grammar_matcher_accept_token(m, id, NULL) == 0;
            if (ok) dsi_grammar_matcher_rollback(m, 1, NULL);
        }
        if (in != ok) {
            uint32_t l;
            const char *b = dsi_grammar_vocab_token(v, id, &l);
            fprintf(stderr, "  token %d '%.*s': mask %d, brute force %d\n", id, (int)l, b, in, ok);
            return 1;
        }
    }
    return 0;
}

/* Random walks; every mask checked by brute force. Returns 0 on success. */
static int walks_bruteforce(const struct dsi_grammar_compiled *cg,
                            const struct dsi_grammar_vocab *v,
                            int n_walks,
                            int max_steps,
                            uint64_t seed) {
    struct dsi_grammar_matcher *m = NULL;
    struct dsi_err err = {0};
    if (dsi_grammar_matcher_new(&m, cg, &err)) return 1;
    int32_t n = dsi_grammar_vocab_size(v), eos = dsi_grammar_vocab_eos(v);
    uint32_t *mask = malloc(dsi_grammar_mask_words(n) * 4);
    int32_t *allowed = malloc((size_t)n * sizeof(int32_t));
    int rc = 0;
    for (int w = 0; w < n_walks && !rc; w++) {
        dsi_grammar_matcher_reset(m);
        for (int step = 0; step < max_steps && !rc; step++) {
            if (dsi_grammar_matcher_fill_mask(m, mask)) {
                fprintf(stderr, "  empty mask at walk %d step %d\n", w, step);
                rc = 1;
                break;
            }
            if ((rc = check_mask(m, v, mask))) {
                fprintf(stderr, "  (walk %d step %d)\n", w, step);
                break;
            }
            int na = 0;
            for (int32_t id = 0; id < n; id++)
                if (mask[id >> 5] >> (id & 31) & 1) allowed[na++] = id;
            int32_t pick = allowed[rnd(&seed) % (uint64_t)na];
            if (step > max_steps / 2 && (mask[eos >> 5] >> (eos & 31) & 1)) pick = eos;
            if (dsi_grammar_matcher_accept_token(m, pick, &err)) {
                fprintf(stderr, "  allowed token %d refused: %s\n", pick, err.msg);
                rc = 1;
            }
            if (pick == eos) break;
        }
    }
    free(mask);
    free(allowed);
    dsi_grammar_matcher_free(m);
    return rc;
}

static const char JSON_EBNF[] =
    "root ::= ws value ws\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws (member (ws \",\" ws member)* ws)? \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array ::= \"[\" ws (value (ws \",\" ws value)* ws)? \"]\"\n"
    "string ::= \"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
    "[0-9a-fA-F]{4}))* \"\\\"\"\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+-]? [0-9]+)?\n"
    "ws ::= [ \\t\\n\\r]{0,3}\n";

/* ---------------------------------------------------------------------------------------- */

int test_grammar_ebnf_roundtrip(struct test_ctx *t) {
    static const char *const srcs[] = {
        JSON_EBNF,
        "root ::= expr\nexpr ::= expr [+-] term | term\nterm ::= [0-9]+ | \"(\" expr \")\"\n",
        "# comment\nroot ::= a{2,5} b? c* (d | \"\")+ \"\\u00e9\\x41\" [^a-z\\]] .\n"
        "a ::= \"a\"\nb ::= 'b'\nc ::= [\\t-\\r]\nd ::= \"d\" (= [x])\n",
        "root ::= \"x\"{0,3} \"y\"{2} \"z\"{1,} \"w\"{1, -1}\n",
    };
    for (size_t i = 0; i < sizeof(srcs) / sizeof(srcs[0]); i++) {
        struct dsi_grammar *g = NULL, *g2 = NULL;
        struct dsi_err err = {0};
        TEST_ASSERTF(
            dsi_grammar_parse(&g, DSI_GRAMMAR_EBNF, srcs[i], strlen(srcs[i]), NULL, &err) == 0,
            "%s", err.msg);
        char *p1 = dsi_grammar_print(g);
        TEST_ASSERT(p1);
        TEST_ASSERTF(dsi_grammar_parse(&g2, DSI_GRAMMAR_EBNF, p1, strlen(p1), NULL, &err) == 0,
                     "%s in\n%s", err.msg, p1);
        char *p2 = dsi_grammar_print(g2);
        TEST_ASSERTF(p2 && !strcmp(p1, p2), "print is not a fixed point:\n%s\n---\n%s", p1, p2);
        free(p1);
        free(p2);
        dsi_grammar_free(g);
        dsi_grammar_free(g2);
    }
    return 0;
}

int test_grammar_errors(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    TEST_ASSERT(v);
    const int INV = DSI_ERR_INVALID, UNS = DSI_ERR_UNSUPPORTED;
    int bad = 0;
    /* EBNF: positions as line:col */
    bad +=
        expect_error(DSI_GRAMMAR_EBNF, "expr ::= \"a\"", INV, "no rule named 'root'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= a\n", INV,
                        "ebnf:1:10: rule 'a' is used but not defined", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= \"abc", INV, "unterminated string", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= \"a\"\nroot ::= \"b\"", INV,
                        "ebnf:2:1: rule 'root' defined twice", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= [z-a]", INV, "out of order", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= \"a\"{5,2}", INV, "n < m", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= (\"a\"", INV, "missing ')'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= \"a\" )", INV, "unexpected text", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= \"\\q\"", INV, "unknown escape", NULL, NULL);
    bad +=
        expect_error(DSI_GRAMMAR_EBNF, "root ::= \"a\"{99999}", UNS, "above the limit", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_EBNF, "root ::= a\na ::= \"x\" a", INV, "matches no string",
                        NULL, v);
    bad += expect_error(DSI_GRAMMAR_EBNF, "= \"a\"", INV, "expected a rule definition", NULL, NULL);
    /* regex: construct and offset */
    bad += expect_error(DSI_GRAMMAR_REGEX, "(a)\\1", UNS, "backreference unsupported at offset 3",
                        NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "a(?=b)", UNS, "lookaround", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "\\bword", UNS, "word boundary", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "a^b", UNS, "anchor", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "[abc", INV, "unterminated class", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "a{3,1}", INV, "n < m", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "*a", INV, "quantifier without an operand", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "a**", INV, "double quantifier", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "(ab", INV, "missing ')'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "ab)", INV, "unmatched ')'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "\\p{L}", UNS, "\\p", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_REGEX, "a{100001}", UNS, "above the limit", NULL, NULL);
    /* JSON schema: keyword and path */
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": ", INV, "not JSON", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"properties\": {\"a\": {\"not\": {}}}}", UNS,
                        "unsupported keyword 'not' at #/properties/a", NULL, NULL);
    bad +=
        expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\", \"patternProperties\": {}}",
                     UNS, "'patternProperties'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"array\", \"uniqueItems\": true}",
                        UNS, "'uniqueItems'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"number\", \"minimum\": 1.5}", UNS,
                        "'minimum'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"format\": \"hostname\"}",
                        UNS, "format 'hostname'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"$ref\": \"#/$defs/nope\"}", INV,
                        "does not resolve", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"$ref\": \"http://x/y.json\"}", UNS,
                        "remote $ref", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"strin\"}", INV,
                        "unknown type 'strin'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA,
                        "{\"type\": \"string\", \"minLength\": 5, \"maxLength\": 2}", INV,
                        "maxLength below minLength", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"(a\"}", INV,
                        "pattern at #", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "false", INV, "matches nothing", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA,
                        "{\"type\": \"object\", \"properties\": {}, \"required\": [\"x\"], "
                        "\"additionalProperties\": false}",
                        INV, "required property 'x'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA,
                        "{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}", INV,
                        "no integer", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA,
                        "{\"$ref\": \"#/$defs/a\", \"type\": \"string\", \"$defs\": {\"a\": {}}}",
                        UNS, "alongside 'type'", NULL, NULL);
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA,
                        "{\"type\": \"array\", \"maxItems\": 1, \"minItems\": 2}", INV,
                        "minItems above", NULL, NULL);
    dsi_grammar_vocab_free(v);
    TEST_ASSERTF(bad == 0, "%d error cases wrong", bad);
    return 0;
}

/* Pathological inputs fail fast with an error instead of blowing up. */
int test_grammar_limits(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    TEST_ASSERT(v);
    double t0 = dsi_time_s();
    int bad = 0;
    bad += expect_error(DSI_GRAMMAR_REGEX, "(a|b)*a(a|b){24}", DSI_ERR_UNSUPPORTED,
                        "automaton states", NULL, v);
    bad += expect_error(DSI_GRAMMAR_REGEX, "((a{100}){100}){100}", DSI_ERR_UNSUPPORTED,
                        "grammar too complex", NULL, v);
    bad += expect_error(DSI_GRAMMAR_REGEX, "(((a{100}){100}){100}){100}", DSI_ERR_UNSUPPORTED,
                        "NFA states", NULL, v);
    struct dsi_grammar_opts o;
    dsi_grammar_opts_default(&o);
    o.max_states = 1000;
    bad += expect_error(DSI_GRAMMAR_REGEX, "[a-z]{2000}", DSI_ERR_UNSUPPORTED,
                        "grammar too complex", &o, v);
    o.max_repeat = 10;
    bad += expect_error(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"array\", \"maxItems\": 11}",
                        DSI_ERR_UNSUPPORTED, "'maxItems' 11 above the limit", &o, v);
    double dt = dsi_time_s() - t0;
    /* big but linear: compiles, and equivalent states share their mask sets */
    struct dsi_grammar_compiled *cg = compile(DSI_GRAMMAR_REGEX, "a{1,5000}b", v, NULL);
    TEST_ASSERT(cg);
    struct dsi_grammar_stats st;
    dsi_grammar_compiled_stats(cg, &st);
    TEST_ASSERTF(st.n_states > 5000 && st.n_mask_sets < 300, "states %d, mask sets %d", st.n_states,
                 st.n_mask_sets);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_vocab_free(v);
    TEST_ASSERTF(bad == 0, "%d limit cases wrong", bad);
    TEST_ASSERTF(dt < 5.0, "rejecting pathological input took %.1f s", dt);
    return 0;
}

int test_grammar_masks_bruteforce(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    TEST_ASSERT(v);
    struct {
        enum dsi_grammar_kind kind;
        const char *src;
    } cases[] = {
        {DSI_GRAMMAR_EBNF, JSON_EBNF},
        {DSI_GRAMMAR_EBNF,
         "root ::= e\ne ::= e ws [+*-] ws t | t\nt ::= [0-9]+ | \"(\" e \")\"\nws ::= \" \"?\n"},
        {DSI_GRAMMAR_EBNF,
         "root ::= a a\na ::= \"x\" a | \"\" | b\nb ::= \"y\"*\n"},       /* ambiguous, nullable */
        {DSI_GRAMMAR_EBNF, "root ::= s\ns ::= \"(\" s \")\" s | \"\"\n"}, /* balanced parens */
        {DSI_GRAMMAR_REGEX, "[a-c]+(x|yy)*\\d{2,3}"},
        {DSI_GRAMMAR_REGEX, "[é中😀]{1,3}[^a-z\"]{0,2}"},
        {DSI_GRAMMAR_REGEX, "(a|b)*abb"},
        {DSI_GRAMMAR_JSON_OBJECT, ""},
        {DSI_GRAMMAR_JSON_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":4},"
         "\"age\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120},\"tags\":{\"type\":"
         "\"array\","
         "\"items\":{\"enum\":[\"a\",\"ab\",null]},\"maxItems\":3}},\"required\":[\"age\"],"
         "\"additionalProperties\":true}"},
        {DSI_GRAMMAR_JSON_SCHEMA, "{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":"
                                  "\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}]}},"
                                  "\"$ref\":\"#/$defs/n\"}"},
        {DSI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date-time\"}"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int ws = 0; ws < 2; ws++) {
            struct dsi_grammar_opts o;
            dsi_grammar_opts_default(&o);
            o.ws = ws ? DSI_GRAMMAR_WS_COMPACT : DSI_GRAMMAR_WS_FLEXIBLE;
            o.max_ws = ws ? 0 : 3;
            if (ws && cases[i].kind != DSI_GRAMMAR_JSON_SCHEMA &&
                cases[i].kind != DSI_GRAMMAR_JSON_OBJECT)
                continue;
            struct dsi_grammar_compiled *cg = compile(cases[i].kind, cases[i].src, v, &o);
            TEST_ASSERTF(cg, "case %zu", i);
            int rc = walks_bruteforce(cg, v, t->slow ? 40 : 10, 60, t->seed + i * 7 + (uint64_t)ws);
            dsi_grammar_compiled_free(cg);
            TEST_ASSERTF(rc == 0, "case %zu (%.50s) ws %d", i, cases[i].src, ws);
        }
    }
    dsi_grammar_vocab_free(v);
    return 0;
}

/* The tiny model's real tokenizer (8,000 BPE tokens): brute-force masks on JSON. */
int test_grammar_tiny_tokenizer(struct test_ctx *t) {
    struct dsi_bpe *bpe = NULL;
    struct dsi_err err = {0};
    TEST_ASSERTF(dsi_bpe_open(&bpe, test_path(t, "models/dsv4-tiny"), &err) == 0, "%s", err.msg);
    int32_t n = (int32_t)dsi_bpe_vocab_size(bpe);
    const char **tok = calloc((size_t)n, sizeof(*tok));
    uint32_t *len = calloc((size_t)n, sizeof(*len));
    uint8_t *flags = calloc((size_t)n, 1);
    for (int32_t i = 0; i < n; i++) {
        const char *b;
        size_t l;
        if (dsi_bpe_token_bytes(bpe, i, &b, &l, NULL) == 0) tok[i] = b, len[i] = (uint32_t)l;
        if (dsi_bpe_is_special(bpe, i)) flags[i] = DSI_GRAMMAR_TOKEN_SPECIAL;
    }
    struct dsi_grammar_vocab *v = NULL;
    int rc = dsi_grammar_vocab_new(&v, tok, len, flags, n, dsi_bpe_eos_id(bpe), &err);
    free(tok);
    free(len);
    free(flags);
    dsi_bpe_free(bpe);
    TEST_ASSERTF(rc == 0, "%s", err.msg);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                         "\"n\":{\"type\":\"number\"},"
                         "\"ok\":{\"type\":\"boolean\"},\"list\":{\"type\":\"array\",\"items\":{"
                         "\"type\":\"integer\"}}},"
                         "\"required\":[\"city\",\"n\"]}";
    struct dsi_grammar_compiled *cg = compile(DSI_GRAMMAR_JSON_SCHEMA, schema, v, NULL);
    TEST_ASSERT(cg);
    rc = walks_bruteforce(cg, v, t->slow ? 8 : 2, 30, t->seed);
    dsi_grammar_compiled_free(cg);
    cg = compile(DSI_GRAMMAR_JSON_OBJECT, "", v, NULL);
    TEST_ASSERT(cg);
    if (!rc) rc = walks_bruteforce(cg, v, t->slow ? 8 : 2, 30, t->seed + 1);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_vocab_free(v);
    TEST_ASSERT(rc == 0);
    return 0;
}

/* Advancing k tokens then rolling back gives the masks from before; random accept/rollback
 * sequences give the masks of a fresh matcher fed the committed tokens. */
int test_grammar_rollback(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    struct dsi_grammar_compiled *cg = compile(DSI_GRAMMAR_EBNF, JSON_EBNF, v, NULL);
    TEST_ASSERT(v && cg);
    struct dsi_grammar_matcher *m = NULL, *f = NULL;
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_grammar_matcher_new(&m, cg, &err) == 0 &&
                dsi_grammar_matcher_new(&f, cg, &err) == 0);
    int32_t n = dsi_grammar_vocab_size(v);
    size_t words = dsi_grammar_mask_words(n);
    uint32_t *a = malloc(words * 4), *b = malloc(words * 4);
    int32_t hist[512];
    int nh = 0;
    uint64_t s = t->seed;
    for (int it = 0; it < 400; it++) {
        TEST_ASSERT(dsi_grammar_matcher_fill_mask(m, a) == 0);
        int r = (int)(rnd(&s) % 4);
        if (r == 0 && nh > 0) { /* roll back k and compare with a fresh replay */
            int k = 1 + (int)(rnd(&s) % (uint64_t)(nh < 6 ? nh : 6));
            TEST_ASSERT(dsi_grammar_matcher_rollback(m, k, &err) == 0);
            nh -= k;
            dsi_grammar_matcher_reset(f);
            for (int i = 0; i < nh; i++)
                TEST_ASSERT(dsi_grammar_matcher_accept_token(f, hist[i], &err) == 0);
            TEST_ASSERT(dsi_grammar_matcher_fill_mask(m, a) == 0 &&
                        dsi_grammar_matcher_fill_mask(f, b) == 0);
            TEST_ASSERTF(!memcmp(a, b, words * 4),
                         "masks differ after rolling back %d to %d tokens", k, nh);
            TEST_ASSERT(dsi_grammar_matcher_n_tokens(m) == nh);
            continue;
        }
        /* advance k tokens, roll back, same mask */
        int k = 1 + (int)(rnd(&s) % 5), done = 0;
        for (; done < k; done++) {
            uint32_t mk[16];
            (void)mk;
            TEST_ASSERT(dsi_grammar_matcher_fill_mask(m, b) == 0);
            int32_t cand[64];
            int nc = 0;
            for (int32_t id = 0; id < n && nc < 64; id++)
                if ((b[id >> 5] >> (id & 31) & 1) && id != dsi_grammar_vocab_eos(v) &&
                    rnd(&s) % 3 == 0)
                    cand[nc++] = id;
            if (!nc) break;
            TEST_ASSERT(dsi_grammar_matcher_accept_token(m, cand[rnd(&s) % (uint64_t)nc], &err) ==
                        0);
        }
        TEST_ASSERT(dsi_grammar_matcher_rollback(m, done, &err) == 0);
        TEST_ASSERT(dsi_grammar_matcher_fill_mask(m, b) == 0);
        TEST_ASSERTF(!memcmp(a, b, words * 4), "mask changed after advancing %d and rolling back",
                     done);
        /* then commit one token */
        int32_t pick = -1;
        for (int tries = 0; tries < 1000 && pick < 0; tries++) {
            int32_t id = (int32_t)(rnd(&s) % (uint64_t)n);
            if ((a[id >> 5] >> (id & 31) & 1) && id != dsi_grammar_vocab_eos(v)) pick = id;
        }
        if (pick >= 0 && nh < 500) {
            TEST_ASSERT(dsi_grammar_matcher_accept_token(m, pick, &err) == 0);
            hist[nh++] = pick;
        }
    }
    TEST_ASSERT(dsi_grammar_matcher_rollback(m, nh + 1, &err) == DSI_ERR_INVALID);
    free(a);
    free(b);
    dsi_grammar_matcher_free(m);
    dsi_grammar_matcher_free(f);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_vocab_free(v);
    return 0;
}

static int32_t find_token(const struct dsi_grammar_vocab *v, const char *s) {
    for (int32_t id = 0; id < dsi_grammar_vocab_size(v); id++) {
        uint32_t l;
        const char *b = dsi_grammar_vocab_token(v, id, &l);
        if (l == strlen(s) && !memcmp(b, s, l) && id != dsi_grammar_vocab_eos(v)) return id;
    }
    return -1;
}

int test_grammar_accept_eos(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    struct dsi_grammar_compiled *cg = compile(DSI_GRAMMAR_EBNF, "root ::= \"ab\" \"c\"?", v, NULL);
    TEST_ASSERT(v && cg);
    struct dsi_grammar_matcher *m = NULL;
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_grammar_matcher_new(&m, cg, &err) == 0);
    int32_t eos = dsi_grammar_vocab_eos(v), ab = find_token(v, "ab"), c = find_token(v, "c"),
            x = find_token(v, "x");
    size_t words = dsi_grammar_mask_words(dsi_grammar_vocab_size(v));
    uint32_t *mask = malloc(words * 4);
    TEST_ASSERT(!dsi_grammar_matcher_is_complete(m));
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, eos, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, x, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(strstr(err.msg, "not allowed"));
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, 1, &err) == DSI_ERR_INVALID); /* special */
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, 1 << 20, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(dsi_grammar_matcher_n_tokens(m) == 0);
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, ab, &err) == 0);
    TEST_ASSERT(dsi_grammar_matcher_is_complete(m) && !dsi_grammar_matcher_is_final(m));
    TEST_ASSERT(dsi_grammar_matcher_fill_mask(m, mask) == 0);
    TEST_ASSERT((mask[eos >> 5] >> (eos & 31) & 1) && (mask[c >> 5] >> (c & 31) & 1));
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, c, &err) == 0);
    TEST_ASSERT(dsi_grammar_matcher_is_final(m));
    TEST_ASSERT(dsi_grammar_matcher_fill_mask(m, mask) == 0);
    for (size_t w = 0; w < words; w++)
        TEST_ASSERT(mask[w] == (w == (size_t)(eos >> 5) ? 1u << (eos & 31) : 0));
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, eos, &err) == 0);
    TEST_ASSERT(dsi_grammar_matcher_is_terminated(m));
    TEST_ASSERT(dsi_grammar_matcher_fill_mask(m, mask) == 0);
    for (size_t w = 0; w < words; w++)
        TEST_ASSERT(mask[w] == 0);
    TEST_ASSERT(dsi_grammar_matcher_accept_token(m, c, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(dsi_grammar_matcher_rollback(m, 1, &err) == 0 &&
                !dsi_grammar_matcher_is_terminated(m));
    TEST_ASSERT(dsi_grammar_matcher_rollback(m, 2, &err) == 0 &&
                dsi_grammar_matcher_n_tokens(m) == 0);
    /* forced bytes */
    TEST_ASSERT(dsi_grammar_matcher_accept_bytes(m, "abd", 3, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(dsi_grammar_matcher_accept_bytes(m, "abc", 3, &err) == 0 &&
                dsi_grammar_matcher_is_final(m));
    free(mask);
    dsi_grammar_matcher_free(m);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_vocab_free(v);
    return 0;
}

/* Bytes through a matcher: accepted as a whole output? */
static bool accepts(const struct dsi_grammar_compiled *cg, const char *s) {
    struct dsi_grammar_matcher *m = NULL;
    if (dsi_grammar_matcher_new(&m, cg, NULL)) return false;
    bool ok = dsi_grammar_matcher_accept_bytes(m, s, strlen(s), NULL) == 0 &&
              dsi_grammar_matcher_is_complete(m);
    dsi_grammar_matcher_free(m);
    return ok;
}

int test_grammar_int_ranges(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    TEST_ASSERT(v);
    static const struct {
        const char *schema;
        long long lo, hi;
    } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", -37, 1234},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":-1,\"exclusiveMaximum\":100}", 0, 99},
        {"{\"type\":\"integer\",\"minimum\":99}", 99, 1LL << 60},
        {"{\"type\":\"integer\",\"maximum\":-10}", -(1LL << 60), -10},
        {"{\"type\":\"integer\",\"minimum\":7,\"maximum\":7}", 7, 7},
        {"{\"type\":\"integer\",\"minimum\":-100,\"maximum\":-20}", -100, -20},
        {"{\"type\":\"integer\",\"minimum\":0.5,\"maximum\":20.5}", 1, 20},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct dsi_grammar_compiled *cg =
            compile(DSI_GRAMMAR_JSON_SCHEMA, cases[i].schema, v, NULL);
        TEST_ASSERT(cg);
        for (long long x = -2100; x <= 2100; x++) {
            char buf[32];
            snprintf(buf, sizeof(buf), "%lld", x);
            bool want = x >= cases[i].lo && x <= cases[i].hi;
            TEST_ASSERTF(accepts(cg, buf) == want, "%s: %lld", cases[i].schema, x);
        }
        static const char *const big[] = {"123456789012", "-123456789012", "00", "-0", "01",
                                          "+1",           "1.0",           "1e3"};
        for (size_t k = 0; k < sizeof(big) / sizeof(big[0]); k++) {
            long long x = strtoll(big[k], NULL, 10);
            bool canon = k < 2;
            bool want = canon && x >= cases[i].lo && x <= cases[i].hi;
            TEST_ASSERTF(accepts(cg, big[k]) == want, "%s: %s", cases[i].schema, big[k]);
        }
        dsi_grammar_compiled_free(cg);
    }
    dsi_grammar_vocab_free(v);
    return 0;
}

int test_grammar_formats(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    struct dsi_grammar_compiled *cg =
        compile(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}", v, NULL);
    TEST_ASSERT(v && cg);
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    static const int years[] = {1, 1900, 1996, 1999, 2000, 2023, 2024, 2100, 2400, 9999};
    for (size_t yi = 0; yi < sizeof(years) / sizeof(years[0]); yi++) {
        int y = years[yi];
        bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        for (int mo = 0; mo <= 13; mo++)
            for (int d = 0; d <= 32; d++) {
                char buf[32];
                snprintf(buf, sizeof(buf), "\"%04d-%02d-%02d\"", y, mo, d);
                int md = mo >= 1 && mo <= 12 ? mdays[mo - 1] + (mo == 2 && leap) : 0;
                bool want = d >= 1 && d <= md;
                TEST_ASSERTF(accepts(cg, buf) == want, "date %s", buf);
            }
    }
    TEST_ASSERT(!accepts(cg, "\"0000-01-01\""));
    dsi_grammar_compiled_free(cg);
    cg =
        compile(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date-time\"}", v, NULL);
    TEST_ASSERT(cg);
    TEST_ASSERT(accepts(cg, "\"2024-02-29T23:59:59Z\""));
    TEST_ASSERT(accepts(cg, "\"2024-02-29T00:00:00.123+05:30\""));
    TEST_ASSERT(!accepts(cg, "\"2023-02-29T00:00:00Z\""));
    TEST_ASSERT(!accepts(cg, "\"2024-01-01T24:00:00Z\""));
    TEST_ASSERT(!accepts(cg, "\"2024-01-01 00:00:00Z\""));
    dsi_grammar_compiled_free(cg);
    cg = compile(DSI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uuid\"}", v, NULL);
    TEST_ASSERT(cg && accepts(cg, "\"123e4567-e89b-12d3-a456-426614174000\""));
    TEST_ASSERT(!accepts(cg, "\"123e4567e89b-12d3-a456-426614174000\""));
    dsi_grammar_compiled_free(cg);
    cg = compile(DSI_GRAMMAR_JSON_SCHEMA,
                 "{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c\\\\n$\"}", v, NULL);
    TEST_ASSERT(cg); /* the value a"b\c<newline>, JSON-encoded */
    TEST_ASSERT(accepts(cg, "\"a\\\"b\\\\c\\n\""));
    TEST_ASSERT(!accepts(cg, "\"a\"b\\\\c\\n\""));
    dsi_grammar_compiled_free(cg);
    dsi_grammar_vocab_free(v);
    return 0;
}

/* The compiled grammar is shared read-only by threads, each with its own matcher. */
struct thr {
    const struct dsi_grammar_compiled *cg;
    const struct dsi_grammar_vocab *v;
    uint64_t seed;
    int rc;
};

static void *thr_main(void *p) {
    struct thr *a = p;
    a->rc = walks_bruteforce(a->cg, a->v, 3, 30, a->seed);
    return NULL;
}

int test_grammar_threads(struct test_ctx *t) {
    struct dsi_grammar_vocab *v = small_vocab();
    struct dsi_grammar_compiled *cg = compile(DSI_GRAMMAR_JSON_OBJECT, "", v, NULL);
    TEST_ASSERT(v && cg);
    pthread_t th[4];
    struct thr a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct thr){cg, v, t->seed + (uint64_t)i * 101, -1};
        TEST_ASSERT(pthread_create(&th[i], NULL, thr_main, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        TEST_ASSERTF(a[i].rc == 0, "thread %d", i);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_vocab_free(v);
    return 0;
}
