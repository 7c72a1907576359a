/* dsinfer.h - the public API of dsinfer, an inference engine for DeepSeek-V4.
 *
 * Opaque handles; every function that can fail returns 0 or a negative status and fills the
 * optional struct dsi_err (code + one-line message naming the object and the expectation).
 * Ownership: the engine owns everything it returns unless a comment says otherwise. */
#ifndef DSINFER_H
#define DSINFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dsi_err;
struct dsi_engine;

enum dsi_numerics_opt { DSI_OPT_NUMERICS_PLAIN = 0, DSI_OPT_NUMERICS_REFERENCE = 1 };

struct dsi_engine_opts {
    const char *model_dir; /* checkpoint directory (config.json, safetensors) */
    int n_threads;         /* CPU worker threads; <= 0: all cores */
    int max_rows;          /* rows per forward step (chunked prefill size); <= 0: 256 */
    int64_t max_ctx;       /* positions per sequence; <= 0: 4096 */
    int max_seqs;          /* sequences in flight; <= 0: 16 */
    const char *backend;   /* "cpu" (default) or "cuda" (builds with CUDA=1) */
    int numerics;          /* enum dsi_numerics_opt */
};

int dsi_engine_open(struct dsi_engine **out, const struct dsi_engine_opts *opts,
                    struct dsi_err *err);
void dsi_engine_close(struct dsi_engine *e);
int dsi_engine_vocab_size(const struct dsi_engine *e);
int dsi_engine_eos_id(const struct dsi_engine *e);
/* Sampling defaults from generation_config.json. */
void dsi_engine_sampling_defaults(const struct dsi_engine *e, float *temperature, float *top_p,
                                  int *top_k);

/* Logits of every position of n_prompts prompts, run together as one batch stream: each
 * forward step takes up to `chunk` rows from every unfinished prompt (chunk <= 0: the whole
 * prompt at once). out: for each prompt in order, len rows of vocab_size floats (row i
 * predicts token i+1); the caller allocates it. mtp_out (optional): for each prompt, len - 1
 * rows of MTP logits (row t predicts token t+2 from position t and token t+1). */
int dsi_engine_prompt_logits(struct dsi_engine *e, const int32_t *const *prompts,
                             const int *lens, int n_prompts, int chunk, float *out,
                             float *mtp_out, struct dsi_err *err);

struct dsi_sampling {
    float temperature; /* 0 = greedy */
    float top_p;       /* 1 = off */
    int top_k;         /* 0 = off */
    uint64_t seed;
};

/* Called for every generated token; return non-zero to stop. */
typedef int (*dsi_token_fn)(int32_t token, void *user);

/* Generate up to n_new tokens after the prompt (stops at EOS). */
int dsi_engine_generate(struct dsi_engine *e, const int32_t *prompt, int len, int n_new,
                        const struct dsi_sampling *s, dsi_token_fn fn, void *user,
                        struct dsi_err *err);

/* ---- text ---------------------------------------------------------------------------------
 * The engine loads DIR/tokenizer.json when the model directory has one. */
bool dsi_engine_has_tokenizer(const struct dsi_engine *e);
/* Encode UTF-8 text (added/special tokens parsed when parse_special). *ids is malloc'd
 * (caller frees). */
int dsi_engine_encode(const struct dsi_engine *e, const char *text, size_t len,
                      bool parse_special, int32_t **ids, size_t *n, struct dsi_err *err);
int32_t dsi_engine_bos_id(const struct dsi_engine *e);
/* Render `user_text` as one user turn with the DeepSeek-V4 chat encoding, ending with the
 * assistant prefix (thinking mode when think). *out is malloc'd (caller frees). */
int dsi_engine_chat_prompt(const struct dsi_engine *e, const char *user_text, bool think,
                           char **out, struct dsi_err *err);

/* Streaming detokenizer: text that is always valid UTF-8, held back until characters are
 * complete. Owned by the caller (free with dsi_text_stream_free); borrows the engine. */
struct dsi_text_stream;
int dsi_text_stream_new(struct dsi_text_stream **out, const struct dsi_engine *e,
                        struct dsi_err *err);
void dsi_text_stream_free(struct dsi_text_stream *s);
/* *text (valid until the next call) receives the text that became final. */
int dsi_text_stream_feed(struct dsi_text_stream *s, int32_t id, const char **text, size_t *len,
                         struct dsi_err *err);
void dsi_text_stream_flush(struct dsi_text_stream *s, const char **text, size_t *len);

/* Print the config summary, layer table, tensor counts and bytes by dtype to f. */
int dsi_inspect(const char *model_dir, void *file, struct dsi_err *err);

#endif
