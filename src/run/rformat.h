/* rformat.h - structured outputs for the serving API: a request's response_format (OpenAI's
 * JSON object, include/dsinfer.h) -> a compiled grammar (src/grammar) over the engine's
 * tokenizer, cached per engine by its source, shared by the matchers of every completion that
 * uses it.
 *
 *   {"type": "text"}                                    no constraint (*out = NULL)
 *   {"type": "json_object"}                             any JSON object
 *   {"type": "json_schema", "json_schema": {"name": ..., "description": ..., "schema": {...},
 *                                           "strict": ...}}
 *   {"type": "regex", "regex": "..."}                   the whole output matches the regex
 *   {"type": "grammar", "grammar": "..."}               EBNF (docs/grammar.md), start rule root
 * json_object and json_schema also take "whitespace": "flexible" (default: any run of JSON
 * whitespace between tokens, none around the value) or "compact" (none at all), and
 * "max_whitespace": N (flexible: runs of at most N characters; 0 = unbounded, the default).
 * Anything else (an unknown type or field, a wrong type, an invalid or unsupported schema,
 * regex or grammar) is an error whose one-line message starts with "response_format" and
 * names the problem.
 *
 * The grammar vocabulary (every id's bytes and the token trie) is built on the first
 * constrained request: added tokens (<｜User｜>, <think>, ...) are control tokens, never
 * allowed; EOS is the engine's EOS id (the tokenizer's when the model has none).
 *
 * Threads: dsi_rformat_get / _put may be called from any thread (a mutex guards the cache;
 * compilation runs outside it, in the caller's thread). A struct dsi_rformat is immutable and
 * stays valid until it is put back; the cache keeps up to max_idle unused ones (least recently
 * used first out). */
#ifndef DSI_RFORMAT_H
#define DSI_RFORMAT_H

#include "core/core.h"

struct dsi_bpe;
struct dsi_grammar_compiled;
struct dsi_rformat_cache;
struct dsi_rformat;

/* Borrows bpe (must outlive the cache). eos: the engine's EOS id (< 0: the tokenizer's).
 * max_idle <= 0: 64. */
int dsi_rformat_cache_new(struct dsi_rformat_cache **out,
                          const struct dsi_bpe *bpe,
                          int32_t eos,
                          int max_idle,
                          struct dsi_err *err);
/* Every struct dsi_rformat must have been put back. NULL is a no-op. */
void dsi_rformat_cache_free(struct dsi_rformat_cache *c);

/* Parse response_format (JSON text, len bytes) and compile its grammar, or take it from the
 * cache. *out = NULL (and DSI_OK) for {"type": "text"}. c may be NULL (no tokenizer): then
 * anything but "text" is DSI_ERR_UNSUPPORTED. */
int dsi_rformat_get(struct dsi_rformat_cache *c,
                    const char *json,
                    size_t len,
                    struct dsi_rformat **out,
                    struct dsi_err *err);
/* Release a reference taken by dsi_rformat_get. NULL is a no-op. */
void dsi_rformat_put(struct dsi_rformat_cache *c, struct dsi_rformat *f);

/* The compiled grammar (valid until the reference is put back). */
const struct dsi_grammar_compiled *dsi_rformat_grammar(const struct dsi_rformat *f);
/* Ids the grammar vocabulary covers (masks have dsi_grammar_mask_words(this) words). */
int32_t dsi_rformat_vocab_size(const struct dsi_rformat *f);

struct dsi_rformat_stats {
    int64_t hits, compiles; /* dsi_rformat_get answered from the cache / by compiling */
    int n_entries;          /* compiled grammars held (in use or idle) */
    double compile_s;       /* time spent compiling (and building the vocabulary) */
};
void dsi_rformat_cache_stats(struct dsi_rformat_cache *c, struct dsi_rformat_stats *st);

#endif
