/* fuzz_grammar.c - libFuzzer target for the grammar front ends (EBNF, regex, JSON Schema) and
 * the engine behind them. The first input byte picks the front end and whitespace policy; the
 * rest is the source. Whatever parses is compiled against a small vocabulary (tight limits so
 * each input stays fast), printed and re-parsed (EBNF must round-trip), then walked for a few
 * steps: every mask must be non-empty and every token in it accepted. */
#include "grammar/grammar.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct dsi_grammar_vocab *g_vocab;

static struct dsi_grammar_vocab *vocab(void) {
    if (g_vocab) return g_vocab;
    static const char *const extra[] = {
        "{\"", "\":", "\",",      "\"}",  "true", "null", "123",
        "ab",  "é",   "\xe4\xb8", "\xad", "  ",   "\\\"", "aaaaaaaaaaaaaaaa",
        NULL};
    static char bytes[256];
    const char *tok[2 + 256 + 16];
    uint32_t len[2 + 256 + 16];
    uint8_t flags[2 + 256 + 16] = {0};
    int n = 0;
    tok[n] = "</s>", len[n++] = 4;
    tok[n] = "<x>", len[n] = 3, flags[n++] = DSI_GRAMMAR_TOKEN_SPECIAL;
    for (int b = 0; b < 256; b++)
        bytes[b] = (char)b, tok[n] = &bytes[b], len[n++] = 1;
    for (int i = 0; extra[i]; i++)
        tok[n] = extra[i], len[n++] = (uint32_t)strlen(extra[i]);
    if (dsi_grammar_vocab_new(&g_vocab, tok, len, flags, n, 0, NULL)) __builtin_trap();
    return g_vocab;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    static const enum dsi_grammar_kind kinds[] = {DSI_GRAMMAR_EBNF, DSI_GRAMMAR_REGEX,
                                                  DSI_GRAMMAR_JSON_SCHEMA, DSI_GRAMMAR_JSON_SCHEMA};
    enum dsi_grammar_kind kind = kinds[data[0] & 3];
    struct dsi_grammar_opts o;
    dsi_grammar_opts_default(&o);
    o.ws = (data[0] & 3) == 3 ? DSI_GRAMMAR_WS_COMPACT : DSI_GRAMMAR_WS_FLEXIBLE;
    o.max_ws = data[0] >> 4 & 3;
    o.max_repeat = 300;
    o.max_states = 3000;
    const char *src = (const char *)data + 1;
    size_t n = size - 1;
    struct dsi_grammar *g = NULL, *g2 = NULL;
    struct dsi_grammar_compiled *cg = NULL;
    struct dsi_grammar_matcher *m = NULL;
    struct dsi_err err = {0};
    if (dsi_grammar_parse(&g, kind, src, n, &o, &err)) {
        if (!err.msg[0]) __builtin_trap(); /* every failure explains itself */
        return 0;
    }
    char *text = dsi_grammar_print(g);
    if (!text) __builtin_trap();
    if (kind == DSI_GRAMMAR_EBNF &&
        dsi_grammar_parse(&g2, DSI_GRAMMAR_EBNF, text, strlen(text), &o, &err))
        __builtin_trap(); /* the printer's output must parse */
    free(text);
    dsi_grammar_free(g2);
    const struct dsi_grammar_vocab *v = vocab();
    if (dsi_grammar_compile(&cg, g, v, &o, &err) == 0 &&
        dsi_grammar_matcher_new(&m, cg, &err) == 0) {
        uint32_t mask[16];
        int32_t nv = dsi_grammar_vocab_size(v);
        unsigned pick = 0;
        for (int step = 0; step < 8; step++) {
            if (dsi_grammar_matcher_fill_mask(m, mask) != 0) __builtin_trap(); /* soundness */
            int32_t id = -1;
            for (int32_t k = 0; k < nv; k++) { /* a deterministic allowed token */
                int32_t t = (int32_t)((pick + (unsigned)k * 7u) % (unsigned)nv);
                if (mask[t >> 5] >> (t & 31) & 1) {
                    id = t;
                    break;
                }
            }
            if (id < 0) __builtin_trap();
            if (dsi_grammar_matcher_accept_token(m, id, &err))
                __builtin_trap(); /* mask == accept */
            if (id == dsi_grammar_vocab_eos(v)) break;
            pick = pick * 31u + (unsigned)id + 1u;
        }
        if (dsi_grammar_matcher_rollback(m, dsi_grammar_matcher_n_tokens(m), &err))
            __builtin_trap();
    }
    dsi_grammar_matcher_free(m);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_free(g);
    return 0;
}
