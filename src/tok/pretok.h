/* pretok.h - the pre-tokenizer of a byte-level BPE tokenizer.json: a sequence of regex Split
 * steps (behaviour "Isolated": matches and the gaps between them both become pieces; every
 * step splits each piece of the step before, and its regex sees only that piece), then the
 * ByteLevel step (the byte mapping itself happens in the BPE model).
 *
 * Regexes are compiled with PCRE2 in UTF + UCP mode and JIT-compiled when the JIT is there.
 * HF tokenizers uses Oniguruma, whose \s is the Unicode White_Space property; PCRE2's UCP \s
 * also matches U+180E (a space before Unicode 6.3). Each \s / \S outside a character class is
 * therefore rewritten to the White_Space property spelled with \p{Z} (see pretok.c).
 *
 * Immutable after dsi_pretok_init; dsi_pretok_split may run on many threads at once, each with
 * its own struct dsi_pretok_scratch. */
#ifndef DSI_TOK_PRETOK_H
#define DSI_TOK_PRETOK_H

#include "core/core.h"

#include <jansson.h>

#define DSI_PRETOK_MAX_STEPS 8

struct dsi_pretok {
    int n_steps;
    void *re[DSI_PRETOK_MAX_STEPS]; /* pcre2_code_8 * */
    bool jit[DSI_PRETOK_MAX_STEPS]; /* JIT-compiled */
    bool ds_fast;                   /* the patterns are DeepSeek's: ASCII shortcuts allowed */
};

struct dsi_pretok_scratch {
    void *md[DSI_PRETOK_MAX_STEPS]; /* pcre2_match_data_8 * */
};

/* Build from tokenizer.json's "pre_tokenizer" value. On error nothing needs freeing. */
int dsi_pretok_init(struct dsi_pretok *p, const json_t *pre, struct dsi_err *err);
void dsi_pretok_free(struct dsi_pretok *p);

int dsi_pretok_scratch_init(const struct dsi_pretok *p,
                            struct dsi_pretok_scratch *s,
                            struct dsi_err *err);
void dsi_pretok_scratch_free(struct dsi_pretok_scratch *s);

/* Called for every final piece in order; a non-zero return stops the split and is returned. */
typedef int (*dsi_pretok_fn)(void *user, const char *piece, size_t len);

/* Split text[0..len) (valid UTF-8, not checked again). Returns 0, the callback's non-zero
 * value, or DSI_ERR_INVALID if a regex match fails (e.g. a resource limit). */
int dsi_pretok_split(const struct dsi_pretok *p,
                     struct dsi_pretok_scratch *s,
                     const char *text,
                     size_t len,
                     dsi_pretok_fn fn,
                     void *user,
                     struct dsi_err *err);

/* Rewrite \s and \S outside character classes to Oniguruma's meaning (exposed for tests).
 * Returns a malloc'd string or NULL on out of memory. */
char *dsi_pretok_rewrite_space(const char *pat, size_t len, size_t *out_len);

#endif
