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

/* plain: fp32 activations; reference: the released model's rounding points (FP8 activation
 * quantisation, bf16 roundings), bit for bit on every backend; fast: reference's rounding
 * points with GEMMs a backend may sum in another order (tensor cores): within 2e-2 of it. */
enum dsi_numerics_opt {
    DSI_OPT_NUMERICS_PLAIN = 0,
    DSI_OPT_NUMERICS_REFERENCE = 1,
    DSI_OPT_NUMERICS_FAST = 2
};

/* The cache's key rows (window rings, compressed entries): fp32, or FP8 (spec 5.5: e4m3 nope
 * dims with a UE8M0 scale per 64, bf16 RoPE dims; 584 bytes a row of 512 dims against 2048)
 * with the indexer keys in FP4 (e2m1 with a UE8M0 scale per 32; 68 bytes a key of 128 dims
 * against 512), which hold the values of the reference and fast profiles exactly (their [QAT]
 * steps round them to those grids) and so change no result. auto: FP8 where the numerics
 * profile has those steps and the backend stores FP8 rows, else fp32. fp8 with plain numerics
 * is an error. */
enum dsi_kv_cache_opt { DSI_OPT_KV_AUTO = 0, DSI_OPT_KV_F32 = 1, DSI_OPT_KV_FP8 = 2 };

struct dsi_engine_opts {
    const char *model_dir; /* checkpoint directory (config.json, safetensors) */
    int n_threads;         /* CPU worker threads; <= 0: all cores */
    int max_rows;          /* rows per forward step (chunked prefill size); <= 0: 256 */
    int64_t max_ctx;       /* positions per sequence; <= 0: 4096 */
    int max_seqs;          /* sequences in flight; <= 0: 16 */
    const char *backend;   /* "cpu" (default) or "cuda" (builds with CUDA=1) */
    int numerics;          /* enum dsi_numerics_opt */
    int kv_cache;          /* enum dsi_kv_cache_opt */
};

int dsi_engine_open(struct dsi_engine **out,
                    const struct dsi_engine_opts *opts,
                    struct dsi_err *err);
void dsi_engine_close(struct dsi_engine *e);
int dsi_engine_vocab_size(const struct dsi_engine *e);
int dsi_engine_eos_id(const struct dsi_engine *e);
/* Sampling defaults from generation_config.json. */
void dsi_engine_sampling_defaults(const struct dsi_engine *e,
                                  float *temperature,
                                  float *top_p,
                                  int *top_k);

/* Logits of every position of n_prompts prompts, run together as one batch stream: each
 * forward step takes up to `chunk` rows from every unfinished prompt (chunk <= 0: the whole
 * prompt at once). out: for each prompt in order, len rows of vocab_size floats (row i
 * predicts token i+1); the caller allocates it. mtp_out (optional): for each prompt, len - 1
 * rows of MTP logits (row t predicts token t+2 from position t and token t+1). */
int dsi_engine_prompt_logits(struct dsi_engine *e,
                             const int32_t *const *prompts,
                             const int *lens,
                             int n_prompts,
                             int chunk,
                             float *out,
                             float *mtp_out,
                             struct dsi_err *err);

struct dsi_sampling {
    float temperature; /* 0 = greedy */
    float top_p;       /* 1 = off */
    int top_k;         /* 0 = off */
    uint64_t seed;
};

/* Called for every generated token; return non-zero to stop. */
typedef int (*dsi_token_fn)(int32_t token, void *user);

/* Generate up to n_new tokens after the prompt (stops at EOS). */
int dsi_engine_generate(struct dsi_engine *e,
                        const int32_t *prompt,
                        int len,
                        int n_new,
                        const struct dsi_sampling *s,
                        dsi_token_fn fn,
                        void *user,
                        struct dsi_err *err);

/* ---- text ---------------------------------------------------------------------------------
 * The engine loads DIR/tokenizer.json when the model directory has one. */
bool dsi_engine_has_tokenizer(const struct dsi_engine *e);
/* Encode UTF-8 text (added/special tokens parsed when parse_special). *ids is malloc'd
 * (caller frees). */
int dsi_engine_encode(const struct dsi_engine *e,
                      const char *text,
                      size_t len,
                      bool parse_special,
                      int32_t **ids,
                      size_t *n,
                      struct dsi_err *err);
int32_t dsi_engine_bos_id(const struct dsi_engine *e);
/* Render `user_text` as one user turn with the DeepSeek-V4 chat encoding, ending with the
 * assistant prefix (thinking mode when think). *out is malloc'd (caller frees). */
int dsi_engine_chat_prompt(
    const struct dsi_engine *e, const char *user_text, bool think, char **out, struct dsi_err *err);

/* Streaming detokenizer: text that is always valid UTF-8, held back until characters are
 * complete. Owned by the caller (free with dsi_text_stream_free); borrows the engine. */
struct dsi_text_stream;
int dsi_text_stream_new(struct dsi_text_stream **out,
                        const struct dsi_engine *e,
                        struct dsi_err *err);
void dsi_text_stream_free(struct dsi_text_stream *s);
/* *text (valid until the next call) receives the text that became final. */
int dsi_text_stream_feed(
    struct dsi_text_stream *s, int32_t id, const char **text, size_t *len, struct dsi_err *err);
void dsi_text_stream_flush(struct dsi_text_stream *s, const char **text, size_t *len);

/* Print the config summary, layer table, tensor counts and bytes by dtype to f. */
int dsi_inspect(const char *model_dir, void *file, struct dsi_err *err);

/* ==== Serving: continuous batching, submit / poll (src/run/batch.c, issue #5) ==============
 *
 * An engine opened with dsi_batch_open runs an engine thread: every step it admits waiting
 * requests, runs prefill chunks and the decode of every running request in one forward, samples,
 * and preempts (recomputes later) when cache pages run out. With asynchronous scheduling (the
 * default) a second thread detokenises, matches stop strings and builds results for step N
 * while the engine thread runs step N + 1; outputs are identical with it on and off.
 *
 *     dsi_batch_open -> dsi_submit ... -> dsi_poll (events, results) -> dsi_batch_close
 *
 * dsi_submit, dsi_cancel, dsi_poll and dsi_batch_get_stats may be called from any thread
 * (one dsi_poll caller at a time). The engine thread owns the forward: do not call
 * dsi_engine_generate / dsi_engine_prompt_logits on an engine opened with dsi_batch_open.
 * Requests never fail the batch: a bad request is refused by dsi_submit (status + message); a
 * request that fails later ends with a result whose status is set. Seeded requests give the
 * same tokens whatever else runs (keyed sampling); n > 1 completions use the seed with
 * Philox stream 0, 1, ... (completion 0 equals the n = 1 output); their prompt is computed once
 * (the other completions copy completion 0's cache state), with the same outputs. */

struct dsi_batch_opts {
    bool sync;                 /* true: asynchronous scheduling off (no overlap) */
    int64_t kv_bytes;          /* cache page pool budget in bytes; 0: every slot at max_ctx */
    int64_t kv_pages;          /* exact page count instead (tests); 0: from kv_bytes */
    int max_batch_tokens;      /* token budget per step (rows); <= 0: the engine's max_rows */
    int chunk_align;           /* prefill chunk ends aligned to this many positions; 0: 128 */
    const char *tokenizer_dir; /* NULL: the model directory (no tokenizer.json: ids only) */
    int sampling;              /* enum dsi_batch_sampling: where tokens are drawn */
    bool no_prefill_share;     /* n > 1: prefill the prompt once per completion (tests, A/B);
                                  default: once, the others copy its cache state */
};
/* DSI_BATCH_SAMPLE_AUTO: on the device for a device backend (CUDA: a step copies back token
 * ids only) when every sequence of the step can be (no penalties, logprobs or grammar, top-k
 * <= 1024 or no top-p), else on the host; the same tokens either way. */
enum dsi_batch_sampling {
    DSI_BATCH_SAMPLE_AUTO = 0,
    DSI_BATCH_SAMPLE_HOST = 1,
    DSI_BATCH_SAMPLE_DEVICE = 2
};

/* Open an engine (as dsi_engine_open) and start serving. Close with dsi_batch_close. */
int dsi_batch_open(struct dsi_engine **out,
                   const struct dsi_engine_opts *eo,
                   const struct dsi_batch_opts *bo,
                   struct dsi_err *err);
/* Stop the threads, drop unfinished requests and undelivered events, close the engine. */
void dsi_batch_close(struct dsi_engine *e);

struct dsi_request {
    /* the prompt: exactly one of */
    const char *prompt; /* UTF-8 text; prompt_len bytes (0: strlen) */
    size_t prompt_len;
    const int32_t *prompt_ids; /* token ids */
    int n_prompt_ids;
    const char *messages_json; /* chat: JSON array of OpenAI-style messages (src/tok/chat.h) */
    /* sampling; dsi_request_init sets the defaults shown */
    int max_tokens;           /* tokens per completion, >= 1 (16) */
    float temperature;        /* 0: greedy; < 0: the model's generation_config (-1) */
    float top_p;              /* (0, 1]; < 0: generation_config (-1) */
    int top_k;                /* 0: off; < 0: generation_config (-1) */
    float min_p;              /* [0, 1] (0) */
    float presence_penalty;   /* [-2, 2] (0) */
    float frequency_penalty;  /* [-2, 2] (0) */
    float repetition_penalty; /* > 0; 1: off (1) */
    const char *const *stop;  /* n_stop stop strings, matched on the output text */
    int n_stop;
    const int32_t *stop_token_ids;
    int n_stop_token_ids;
    bool ignore_eos;
    bool has_seed; /* false: a random seed, reported in the result */
    uint64_t seed;
    int n;            /* completions of the prompt (1) */
    bool logprobs;    /* logprob of every chosen token */
    int top_logprobs; /* 0..20 alternatives per token (implies logprobs) */
    bool stream;      /* DSI_EVENT_TOKENS events as tokens are produced */
    uint64_t tag;     /* opaque, copied to events and the result */
    /* Structured output (NULL: none): OpenAI's response_format object as NUL-terminated JSON
     * text (docs/grammar.md, "Serving"):
     *   {"type": "text"}                                   no constraint
     *   {"type": "json_object"}                            any JSON object
     *   {"type": "json_schema", "json_schema": {"name": "x", "schema": {...}, "strict": true}}
     *   {"type": "regex", "regex": "[a-z]+@[a-z]+\\.com"}  a full match of the regex
     *   {"type": "grammar", "grammar": "root ::= ..."}     EBNF
     * json_object / json_schema also take "whitespace": "flexible" (default) | "compact" and
     * "max_whitespace": N (longest whitespace run; 0: unbounded, the default). Compiled by
     * dsi_submit against the tokenizer (cached per engine by source); a malformed, invalid or
     * unsupported one is refused there with a message naming the problem. Every completion
     * then follows the grammar: disallowed tokens are masked before sampling, EOS is allowed
     * only where the output may end, and a completion whose output is complete with nothing
     * but EOS left finishes with DSI_FINISH_STOP (stop_token -1) without sampling EOS. A drawn
     * EOS ends it even with ignore_eos. max_tokens, stop strings and stop ids still apply (the
     * output is then a prefix). Needs a tokenizer. Copied: nothing is kept. */
    const char *response_format;
};

void dsi_request_init(struct dsi_request *r);

/* Queue a request; *id identifies it in events and dsi_cancel. Nothing of req is kept (strings
 * and arrays are copied). Refuses (DSI_ERR_INVALID, DSI_ERR_CONTEXT_FULL, DSI_ERR_UNSUPPORTED)
 * a malformed request, a prompt longer than the context, text or a response_format without a
 * tokenizer, a response_format that does not compile. Compiling a response_format not seen
 * before takes milliseconds (up to seconds for huge schemas) in the calling thread. */
int dsi_submit(struct dsi_engine *e,
               const struct dsi_request *req,
               uint64_t *id,
               struct dsi_err *err);

/* Ask to stop a request; its result comes with DSI_FINISH_CANCELLED on the completions that
 * were not finished. Unknown or finished ids are ignored. */
int dsi_cancel(struct dsi_engine *e, uint64_t id);

enum dsi_finish {
    DSI_FINISH_NONE = 0,
    DSI_FINISH_STOP = 1,   /* EOS, a stop token id or a stop string */
    DSI_FINISH_LENGTH = 2, /* max_tokens or the context */
    DSI_FINISH_CANCELLED = 3,
    DSI_FINISH_ERROR = 4, /* the request failed: see dsi_result.status */
};
const char *dsi_finish_str(int finish); /* "stop", "length", "cancelled", "error" */

struct dsi_completion {
    int index;
    int finish;         /* enum dsi_finish */
    char *stop_str;     /* the stop string that matched, or NULL */
    int32_t stop_token; /* the EOS / stop token id that matched, or -1 */
    int32_t *tokens;    /* [n_tokens] generated ids; a matched EOS / stop id included */
    int n_tokens;
    char *text; /* NUL-terminated output text: special tokens skipped, cut before
                   a matched stop string; NULL without a tokenizer */
    size_t text_len;
    float *logprobs;     /* [n_tokens] log-softmax of the logits the sampler saw (after a
                            response_format mask: -INFINITY for masked ids), or NULL */
    int32_t *top_ids;    /* [n_tokens, n_top], largest first, or NULL */
    float *top_logprobs; /* [n_tokens, n_top] */
    int n_top;
    double t_first, t_last; /* seconds after submission: first and last token */
    int n_preemptions;
};

/* Everything a result points to is owned by the result (dsi_result_free). */
struct dsi_result {
    uint64_t id, tag;
    int status;      /* 0, or the DSI_ERR_* that failed the request */
    char error[512]; /* the message when status != 0 */
    int n_prompt_tokens;
    int n_completion_tokens; /* over all completions */
    uint64_t seed;           /* the seed used (the request's or the random one) */
    int n;
    struct dsi_completion *c; /* [n] */
    double t_queue;           /* seconds from submission to the first scheduled step */
    double t_first_token;     /* seconds from submission to the first token (TTFT) */
    double t_total;           /* seconds from submission to the end */
};
/* Free a result and everything it points to. NULL is a no-op. */
void dsi_result_free(struct dsi_result *r);

enum dsi_event_kind {
    DSI_EVENT_TOKENS = 1, /* new tokens of one completion (requests with stream = true) */
    DSI_EVENT_DONE = 2,   /* the request is finished: result attached */
};

struct dsi_event {
    int kind;
    uint64_t id, tag;
    /* TOKENS (borrowed, valid until the next dsi_poll on this engine) */
    int index; /* completion */
    const int32_t *tokens;
    int n_tokens;
    const char *text; /* new text, valid UTF-8; text that may start a stop string is held
                         back until decided */
    size_t text_len;
    /* DONE: owned by the caller from now on (dsi_result_free) */
    struct dsi_result *result;
};

/* Wait up to timeout_ms (< 0: forever, 0: do not wait) for events; returns how many were
 * written to ev[0..max_events), 0 on timeout or when nothing is in flight and nothing is
 * queued (so a loop `while (in flight) dsi_poll(...)` cannot hang), negative on error. */
int dsi_poll(struct dsi_engine *e, struct dsi_event *ev, int max_events, int timeout_ms);

struct dsi_batch_stats {
    int64_t steps, rows, prefill_rows, decode_rows, preemptions;
    int64_t generated_tokens; /* tokens sampled and kept */
    int n_waiting, n_running; /* sequences (completions) */
    int n_inflight;           /* requests submitted and not yet delivered as DONE */
    int64_t pages_free, pages_total, page_tokens;
    int64_t kv_bytes;      /* backend memory of the cache pool (slots + pages) */
    int64_t max_positions; /* longest sequence (prompt + output) the pool holds */
    int max_seqs;
    bool has_tokenizer;
    /* Decode-only steps (no prefill rows): how many, the sum of their periods (a step's start
     * to the next step's start: the forward plus everything the engine thread does between
     * steps) and the sum of the time inside the forward (device work + its host launches);
     * period / forward - 1 is the scheduler's visible overhead. */
    int64_t decode_steps;
    double decode_period_s, decode_fwd_s;
    int64_t device_sampled_steps; /* steps whose tokens were drawn by the backend's sample op */
    int64_t prompt_forks; /* n > 1 completions that copied completion 0's prompt cache state */
};
void dsi_batch_get_stats(struct dsi_engine *e, struct dsi_batch_stats *st);

/* Tokenize text with the engine's tokenizer (special tokens parsed; thread-safe). *ids is
 * malloc'd (caller frees). DSI_ERR_UNSUPPORTED without a tokenizer. */
int dsi_batch_tokenize(
    struct dsi_engine *e, const char *text, size_t len, int32_t **ids, int *n, struct dsi_err *err);

/* ---- JSONL requests and results (src/run/jsonl.c; `dsinfer run`, usable by a server) ----
 * A request is one JSON object with OpenAI / vLLM names: the prompt as "prompt" (a string or
 * a list of token ids), "prompt_token_ids" or "messages" (chat); "max_tokens" (or
 * "max_completion_tokens"), "temperature", "top_p", "top_k" (-1 or 0: off), "min_p", "stop"
 * (a string or a list), "stop_token_ids", "seed", "n", "logprobs" (true, or an int N = the
 * number of alternatives), "top_logprobs", "presence_penalty", "frequency_penalty",
 * "repetition_penalty", "ignore_eos", "response_format" (an object, as in struct dsi_request;
 * checked by dsi_submit). "id" and "custom_id" are echoed in the output line;
 * "model" is accepted and ignored. Anything else is an error naming the field. */
struct dsi_jsonl_req;

/* Parse one line. *out is set whenever the line was a JSON object, even when a field is bad
 * (so an error line can echo the ids); free it with dsi_jsonl_req_free. */
int dsi_jsonl_parse(struct dsi_jsonl_req **out, const char *line, size_t len, struct dsi_err *err);
void dsi_jsonl_req_free(struct dsi_jsonl_req *r);
/* The parsed request (points into r: valid until dsi_jsonl_req_free). */
const struct dsi_request *dsi_jsonl_request(const struct dsi_jsonl_req *r);

/* The output line (no newline) for a finished request read from line `line_no` (1-based):
 * ids echoed, "choices" (text, token_ids, finish_reason, stop_reason, logprobs), "usage",
 * "timings", "seed"; or an "error" object when res->status != 0. malloc'd (caller frees). */
char *dsi_jsonl_result(const struct dsi_jsonl_req *r, long line_no, const struct dsi_result *res);
/* An error line: {"line", ids, "error": {"code", "message"}}; r may be NULL. */
char *dsi_jsonl_error(const struct dsi_jsonl_req *r, long line_no, int status, const char *msg);

#endif
