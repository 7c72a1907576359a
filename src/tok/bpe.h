/* bpe.h - byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (DeepSeek-V3/V4).
 *
 * What it reproduces (HF `tokenizers` semantics, checked id for id against it):
 *   - added tokens (special or not) are cut out of the raw text first, leftmost-longest, those
 *     flagged "normalized": false before those flagged true (HF's two passes);
 *   - the rest goes through the pre-tokenizer (pretok.h: DeepSeek's split sequence in PCRE2),
 *     then BPE merges by rank inside each piece over the GPT-2 byte alphabet;
 *   - decoding maps ids back to bytes (added tokens to their content).
 *
 * Text in and out is bytes. Encoding requires valid UTF-8 (dsi_bpe_encode refuses anything
 * else with the byte offset); dsi_bpe_encode_lossy first replaces every ill-formed subpart
 * with U+FFFD, which is what HF computes for Python's bytes.decode("utf-8", "replace").
 * Decoding returns the exact bytes of the tokens (possibly not valid UTF-8 for arbitrary id
 * sequences) unless DSI_DECODE_LOSSY asks for HF's from_utf8_lossy form.
 *
 * Every id is checked against the vocabulary limit: the model's vocab_size (config.json in the
 * model directory, when present), else one past the largest id of the tokenizer.
 *
 * Thread safety: a struct dsi_bpe is immutable after dsi_bpe_open and may be shared by any
 * number of threads; a struct dsi_bpe_stream belongs to one thread at a time. */
#ifndef DSI_TOK_BPE_H
#define DSI_TOK_BPE_H

#include "core/core.h"

struct dsi_bpe;

/* Load DIR/tokenizer.json and DIR/tokenizer_config.json (optional) and, for the id limit,
 * DIR/config.json's vocab_size (optional). On success *out owns everything (free with
 * dsi_bpe_free); on error *out is NULL and err says what is wrong with which file. */
int dsi_bpe_open(struct dsi_bpe **out, const char *model_dir, struct dsi_err *err);

/* Same with an explicit id limit (0 = as dsi_bpe_open decides). */
int dsi_bpe_open_limit(struct dsi_bpe **out,
                       const char *model_dir,
                       int64_t vocab_limit,
                       struct dsi_err *err);

/* Load from memory: tokenizer.json text (required) and tokenizer_config.json text (may be
 * NULL). The buffers are not kept. */
int dsi_bpe_load(struct dsi_bpe **out,
                 const char *tokenizer_json,
                 size_t tokenizer_len,
                 const char *config_json,
                 size_t config_len,
                 int64_t vocab_limit,
                 struct dsi_err *err);

void dsi_bpe_free(struct dsi_bpe *bpe);

/* Encode text[0..len). parse_special: cut added/special tokens such as <｜User｜> out of the
 * text (HF behaviour); false: encode the text literally, added-token strings included (safe
 * for untrusted user text). On success *ids is a malloc'd array of *n ids (caller frees;
 * non-NULL even when *n == 0). */
int dsi_bpe_encode(const struct dsi_bpe *bpe,
                   const char *text,
                   size_t len,
                   bool parse_special,
                   int32_t **ids,
                   size_t *n,
                   struct dsi_err *err);

/* As dsi_bpe_encode after replacing ill-formed UTF-8 with U+FFFD (Python "replace"). */
int dsi_bpe_encode_lossy(const struct dsi_bpe *bpe,
                         const char *text,
                         size_t len,
                         bool parse_special,
                         int32_t **ids,
                         size_t *n,
                         struct dsi_err *err);

enum dsi_decode_flags {
    DSI_DECODE_SKIP_SPECIAL = 1 << 0, /* drop tokens flagged "special" (BOS, EOS, pad, ...) */
    DSI_DECODE_LOSSY = 1 << 1,        /* ill-formed UTF-8 -> U+FFFD (HF decode output) */
};

/* Decode ids into buf (capacity cap, may be 0/NULL): writes min(needed, cap) bytes, adds a NUL
 * when it fits, and sets *len to the full length needed (without NUL) like snprintf. Fails on
 * an id that is negative, >= the id limit, or has no token. */
int dsi_bpe_decode(const struct dsi_bpe *bpe,
                   const int32_t *ids,
                   size_t n,
                   unsigned flags,
                   char *buf,
                   size_t cap,
                   size_t *len,
                   struct dsi_err *err);

/* The bytes of one token (valid until dsi_bpe_free; not NUL-terminated). */
int dsi_bpe_token_bytes(
    const struct dsi_bpe *bpe, int32_t id, const char **bytes, size_t *len, struct dsi_err *err);

/* Id of a token by its text: an added token's content ("<｜User｜>", "<think>") or a
 * vocabulary entry as written in tokenizer.json ("Ġthe"). Returns the id, or -1 after filling
 * err with "unknown token". */
int32_t dsi_bpe_token_id(const struct dsi_bpe *bpe, const char *name, struct dsi_err *err);

bool dsi_bpe_is_special(const struct dsi_bpe *bpe, int32_t id);
/* An added token (special or not: <｜User｜>, <think>, ...): control markup, not text. */
bool dsi_bpe_is_added(const struct dsi_bpe *bpe, int32_t id);

/* Ids from tokenizer_config.json (bos_token, eos_token, pad_token); -1 when not set. */
int32_t dsi_bpe_bos_id(const struct dsi_bpe *bpe);
int32_t dsi_bpe_eos_id(const struct dsi_bpe *bpe);
int32_t dsi_bpe_pad_id(const struct dsi_bpe *bpe);

/* The id limit: ids in [0, vocab_size) may be fed and sampled. */
int64_t dsi_bpe_vocab_size(const struct dsi_bpe *bpe);

struct dsi_bpe_info {
    int64_t n_ids;     /* one past the largest id of the tokenizer */
    int64_t n_model;   /* BPE vocabulary entries */
    int64_t n_merges;  /* merge rules */
    int64_t n_added;   /* added tokens */
    int64_t n_special; /* added tokens flagged special */
    int n_split_steps; /* regex split steps of the pre-tokenizer */
    bool jit;          /* every split regex is JIT-compiled */
};
void dsi_bpe_get_info(const struct dsi_bpe *bpe, struct dsi_bpe_info *info);

/* ---------------------------------------------------------------------------------------- */
/* Streaming decoder: feed ids one at a time, get text that is always valid UTF-8. Bytes of an
 * unfinished character are held back until the next id completes them; ill-formed bytes come
 * out as U+FFFD. Feeding ids one by one and then flushing yields exactly
 * dsi_bpe_decode(..., DSI_DECODE_LOSSY | flags) of the whole sequence. */
struct dsi_bpe_stream;

/* The stream keeps a pointer to bpe, which must outlive it. */
int dsi_bpe_stream_new(struct dsi_bpe_stream **out,
                       const struct dsi_bpe *bpe,
                       unsigned flags,
                       struct dsi_err *err);
void dsi_bpe_stream_free(struct dsi_bpe_stream *s);

/* Feed one id. *text and *len receive the text that became final (possibly empty); the pointer
 * stays valid until the next call on this stream. On error the stream is unchanged. */
int dsi_bpe_stream_feed(
    struct dsi_bpe_stream *s, int32_t id, const char **text, size_t *len, struct dsi_err *err);

/* End of sequence: returns what was held back (an unfinished character becomes U+FFFD) and
 * resets the stream for a new sequence. */
void dsi_bpe_stream_flush(struct dsi_bpe_stream *s, const char **text, size_t *len);

/* Forget any held-back bytes (e.g. after a rollback) without emitting them. */
void dsi_bpe_stream_reset(struct dsi_bpe_stream *s);

#endif
