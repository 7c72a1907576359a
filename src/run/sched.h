/* sched.h - the serving core's step machine: continuous batching with chunked prefill under a
 * per-step token budget, decode of every running sequence, preemption by recompute when cache
 * pages run out, and sampling with token-level stops (design 8, spec/techniques.md 7.1).
 *
 * One step (dsi_sched_step) = schedule -> forward -> sample:
 *  - schedule: running sequences first, oldest first, decodes (one row) before prefill
 *    chunks; then waiting sequences in arrival order while a cache slot, the token budget and
 *    pages allow (head of line: a waiting sequence that does not fit blocks younger ones).
 *    A sequence's rows [n_past, n_past + k) are one contiguous chunk; chunk ends are aligned
 *    to `chunk_align` positions except the last. When a running sequence cannot get its pages,
 *    a prefill chunk first shrinks to what fits; otherwise the youngest running sequence is
 *    preempted (slot and pages freed, back to the waiting list in arrival order; recomputed
 *    later from its prompt and the tokens it already generated). The oldest running sequence
 *    is never preempted for a younger one, so the oldest always progresses: no livelock.
 *    Invariant: every running sequence is older than every waiting one.
 *  - forward: a flat struct dsi_batch through the forward callback (the real forward, or a
 *    fake one in tests); logits only for rows that complete a sequence's known tokens.
 *  - sample: one token per such sequence (sample.h; grammar-constrained sequences first mask
 *    the logits and then advance their matcher), logprobs if asked, then the token-level
 *    stops: EOS (unless ignore_eos), stop token ids, a finished grammar, max_new, the context.
 *    A sequence that stops is removed at once (slot and pages freed) and reported with its
 *    finish reason.
 * Text-level stops (stop strings) and cancellation are decided by the owner, which removes the
 * sequence with dsi_sched_remove.
 *
 * Threads: a struct dsi_sched belongs to one thread (the engine thread). It allocates nothing
 * after dsi_sched_new: the step is malloc-free.
 *
 * Ownership: the owner allocates every struct dsi_sseq and its buffers and keeps them alive
 * while the sequence is in the scheduler (from dsi_sched_add until it is reported finished
 * or removed). The scheduler borrows the cache pool, which must outlive it. */
#ifndef DSI_SCHED_H
#define DSI_SCHED_H

#include "cache/kv.h"
#include "model/forward.h"
#include "run/sample.h"

enum dsi_sseq_state { DSI_SSEQ_NEW = 0, DSI_SSEQ_WAITING, DSI_SSEQ_RUNNING, DSI_SSEQ_DONE };

/* Token-level finish reasons (0 = still running). */
enum dsi_sseq_finish {
    DSI_SSEQ_FIN_NONE = 0,
    DSI_SSEQ_FIN_EOS,           /* the EOS token (kept as the last generated token) */
    DSI_SSEQ_FIN_STOP_ID,       /* a stop token id (kept as the last generated token) */
    DSI_SSEQ_FIN_LENGTH,        /* max_new tokens generated */
    DSI_SSEQ_FIN_CONTEXT,       /* the sequence filled the context */
    DSI_SSEQ_FIN_GRAMMAR,       /* constrained: the output is complete and nothing but EOS may
                                   follow (the last token is kept; no EOS is sampled) */
    DSI_SSEQ_FIN_GRAMMAR_ERROR, /* constrained: no token of the vocabulary can continue the
                                   output, or the matcher refused the sampled token (a bug);
                                   nothing was added to gen, the sched_tok's token is -1 */
};

struct dsi_grammar_matcher;

/* One sequence (one completion of a request). */
struct dsi_sseq {
    /* ---- set by the owner before dsi_sched_add, then read-only ---- */
    uint64_t order;        /* arrival order: lower = older = higher priority; unique */
    const int32_t *prompt; /* [n_prompt] (borrowed) */
    int n_prompt;
    int32_t *gen; /* [max_new] generated tokens (owner-allocated; sched writes) */
    int max_new;  /* >= 1 */
    struct dsi_sample_params sp;
    bool ignore_eos;
    const int32_t *stop_ids; /* [n_stop_ids] (borrowed) */
    int n_stop_ids;
    /* logprobs (optional): lp[max_new]; top_id/top_lp[max_new * n_top] */
    float *lp;
    int n_top;
    int32_t *top_id;
    float *top_lp;
    void *user;
    /* structured output (optional; grammar/grammar.h): a constrained sequence has a matcher
     * (fresh, or holding exactly the tokens in gen) and a mask buffer of
     * dsi_grammar_mask_words(n_mask) words, both owner-allocated. Each sample: the allowed-token
     * mask is applied to the logits row (disallowed -> -INFINITY; ids >= n_mask never allowed;
     * EOS only where the output may end) before penalties and the draw, then the matcher
     * advances on the token. The sequence ends with FIN_GRAMMAR when only EOS may follow, and
     * with FIN_EOS when EOS is drawn (even with ignore_eos). Preemption keeps gen, so the
     * matcher is never rewound. Constrained sequences are always sampled on the host. */
    struct dsi_grammar_matcher *matcher; /* NULL: unconstrained */
    uint32_t *mask;
    int32_t n_mask;
    /* n > 1 completions of one prompt (optional): leader = completion 0 of the same prompt
     * (older, added first), set on the others. Such a follower waits (head of line) while its
     * leader has not finished the prompt; in the step where the leader's last prompt row runs,
     * the follower, if it is then at the head of the waiting list and a slot and pages are free,
     * takes a copy of the leader's cache state (dsi_kv_fork) and samples its first token from
     * the leader's logits (the same logits its own prefill would give: the forward is
     * chunk-invariant), so the prompt is computed once. Otherwise it prefills as usual. The
     * scheduler clears leader once it is decided. */
    struct dsi_sseq *leader;
    /* ---- scheduler state (read-only for the owner) ---- */
    int state;                    /* enum dsi_sseq_state */
    int finish;                   /* enum dsi_sseq_finish once DONE by a token-level stop */
    int n_gen;                    /* tokens in gen */
    int slot;                     /* cache slot while running, else -1 */
    int64_t n_past;               /* positions in the cache */
    int n_preempt;                /* times preempted */
    double t_admit;               /* dsi_time_s() when first admitted (0: never) */
    struct dsi_sseq *prev, *next; /* the waiting or running list */
    /* this step's plan */
    int plan_rows; /* rows this step (0: not scheduled) */
    int plan_row0; /* first row in the batch */
};

/* The forward the scheduler drives: run the batch, write logits of the rows that want them
 * ([rows wanting logits, n_vocab], row order). The real one wraps dsi_forward. */
typedef int (*dsi_sched_fwd_fn)(void *user,
                                const struct dsi_batch *b,
                                float *logits,
                                struct dsi_err *err);

/* Optional: run the batch and sample on the device; tokens[i] for the i-th row wanting logits,
 * drawn with rows[i] (dsi_forward_sample). The scheduler uses it for a step when every
 * sampled sequence passes dsi_sample_op_takes and needs no penalties, logprobs or grammar
 * mask (the same tokens as the host sampler: the draws are keyed). */
typedef int (*dsi_sched_fwd_sample_fn)(void *user,
                                       const struct dsi_batch *b,
                                       const struct dsi_sample_row *rows,
                                       int32_t *tokens,
                                       struct dsi_err *err);

struct dsi_sched_opts {
    int max_rows;    /* token budget per step (rows); <= the forward's and the cache's max_rows */
    int chunk_align; /* prefill chunk ends aligned to this many positions (<= 1: none) */
    int n_vocab;
    int32_t eos; /* -1: none */
    dsi_sched_fwd_fn fwd;
    dsi_sched_fwd_sample_fn fwd_sample; /* NULL: always sample on the host */
    void *fwd_user;
};

/* One sampled token of a step. */
struct dsi_sched_tok {
    struct dsi_sseq *q;
    int32_t token;
    int index;  /* index of the token in q->gen */
    int finish; /* enum dsi_sseq_finish: non-zero when this token ended the sequence */
};

struct dsi_sched_stats {
    int64_t steps, rows, prefill_rows, decode_rows, preemptions;
    int64_t device_sampled_steps; /* steps sampled by fwd_sample */
    int64_t forks;                /* followers that took their leader's prompt state */
    int n_waiting, n_running;
};

struct dsi_sched;

/* Borrows kv (must outlive the scheduler). */
int dsi_sched_new(struct dsi_sched **out,
                  struct dsi_kv *kv,
                  const struct dsi_sched_opts *o,
                  struct dsi_err *err);
/* Frees the scheduler; sequences still inside lose their slots (nothing else is freed). */
void dsi_sched_free(struct dsi_sched *s);

/* Enqueue a sequence (state NEW -> WAITING). DSI_ERR_INVALID if it can never fit: empty
 * prompt, prompt beyond the context or the whole pool, max_new < 1. */
int dsi_sched_add(struct dsi_sched *s, struct dsi_sseq *q, struct dsi_err *err);

/* Take a sequence out (cancel, stop string): frees its slot and pages; state -> DONE.
 * A no-op for a sequence already DONE. */
void dsi_sched_remove(struct dsi_sched *s, struct dsi_sseq *q);

/* One step. *toks receives the sampled tokens (valid until the next step; *n_toks of them;
 * 0 when nothing was runnable). Sequences that finished are no longer in the scheduler
 * when this returns. A forward error is returned as is (the sequences stay where they were
 * only as far as the cache allows; the owner should fail them). */
int dsi_sched_step(struct dsi_sched *s,
                   const struct dsi_sched_tok **toks,
                   int *n_toks,
                   struct dsi_err *err);

/* The batch of the last step (valid until the next step), for tests and tracing. */
const struct dsi_batch *dsi_sched_last_batch(const struct dsi_sched *s);

bool dsi_sched_idle(const struct dsi_sched *s); /* nothing waiting or running */
void dsi_sched_get_stats(const struct dsi_sched *s, struct dsi_sched_stats *st);

/* Positions a single sequence may reach: min(kv max_ctx, the whole pool). */
int64_t dsi_sched_max_positions(const struct dsi_sched *s);

/* Check the scheduler's invariants against the cache pool (tests): page accounting, slots,
 * list order, running older than waiting. Returns 0 or fills err. */
int dsi_sched_check(const struct dsi_sched *s, struct dsi_err *err);

#endif
