/* sched.c - continuous batching, chunked prefill, preemption and sampling; see sched.h.
 *
 * Lists: `waiting` and `running` are doubly linked and sorted by arrival order (oldest at the
 * head). Invariant: running.tail is older than waiting.head, so "the youngest running" is
 * always running.tail, admission appends to running.tail and preemption moves running.tail
 * to waiting.head. */
#include "sched.h"

#include "grammar/grammar.h"

#include <math.h>
#include <string.h>

struct list {
    struct dsi_sseq *head, *tail;
    int n;
};

struct dsi_sched {
    struct dsi_kv *kv;
    struct dsi_sched_opts o;
    struct list waiting, running;
    int max_logit_rows;
    /* the step's batch */
    int32_t *tokens, *pos, *slot; /* [max_rows] */
    uint8_t *want;                /* [max_rows] */
    struct dsi_batch batch;
    float *logits;                /* [max_logit_rows, n_vocab] */
    struct dsi_sseq **sample_q;   /* [max_logit_rows] */
    struct dsi_sched_tok *toks;   /* [max_seqs] */
    struct dsi_sseq **fork_q;     /* [max_seqs] this step's forked followers */
    int *fork_row;                /* [max_seqs] their leader's logits row */
    struct dsi_sample_row *srows; /* [max_logit_rows] device-sampling parameters */
    int32_t *stoks;               /* [max_logit_rows] device-sampled tokens */
    struct dsi_sampler *sampler;
    struct dsi_sched_stats st;
};

/* ---- lists ---------------------------------------------------------------------------- */

static void list_unlink(struct list *l, struct dsi_sseq *q) {
    if (q->prev)
        q->prev->next = q->next;
    else
        l->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        l->tail = q->prev;
    q->prev = q->next = NULL;
    l->n--;
}

/* Insert keeping the list sorted by order; scans from the end given by `from_tail`. */
static void list_insert(struct list *l, struct dsi_sseq *q, bool from_tail) {
    struct dsi_sseq *after = NULL; /* insert after this one (NULL: at the head) */
    if (from_tail) {
        after = l->tail;
        while (after && after->order > q->order)
            after = after->prev;
    } else {
        for (struct dsi_sseq *p = l->head; p && p->order < q->order; p = p->next)
            after = p;
    }
    q->prev = after;
    q->next = after ? after->next : l->head;
    if (q->next)
        q->next->prev = q;
    else
        l->tail = q;
    if (after)
        after->next = q;
    else
        l->head = q;
    l->n++;
}

/* ---- helpers ---------------------------------------------------------------------------- */

static int64_t seq_len(const struct dsi_sseq *q) { return (int64_t)q->n_prompt + q->n_gen; }

static int32_t tok_at(const struct dsi_sseq *q, int64_t i) {
    return i < q->n_prompt ? q->prompt[i] : q->gen[i - q->n_prompt];
}

int64_t dsi_sched_max_positions(const struct dsi_sched *s) {
    return DSI_MIN(s->kv->max_ctx, s->kv->n_pages * (int64_t)s->kv->page_tokens);
}

/* Rows to ask for: what is left, within the budget, the chunk end aligned unless last. */
static int chunk_rows(const struct dsi_sched *s, const struct dsi_sseq *q, int budget) {
    int64_t rem = seq_len(q) - q->n_past;
    int64_t want = DSI_MIN(rem, (int64_t)budget);
    int a = s->o.chunk_align;
    if (want < rem && a > 1) {
        int64_t end = q->n_past + want, al = end - end % a;
        if (al > q->n_past) want = al - q->n_past;
    }
    return (int)want;
}

static void unplan(struct dsi_sseq *q, int *budget) {
    *budget += q->plan_rows;
    q->plan_rows = 0;
}

static void release_slot(struct dsi_sched *s, struct dsi_sseq *q) {
    if (q->slot >= 0) dsi_kv_seq_free(s->kv, q->slot);
    q->slot = -1;
    q->n_past = 0;
    q->plan_rows = 0;
}

static void preempt(struct dsi_sched *s, struct dsi_sseq *q, int *budget) {
    DSI_ASSERT(q->state == DSI_SSEQ_RUNNING);
    unplan(q, budget);
    release_slot(s, q);
    list_unlink(&s->running, q);
    q->state = DSI_SSEQ_WAITING;
    q->n_preempt++;
    s->st.preemptions++;
    list_insert(&s->waiting, q, false);
}

/* Pages for q's next *rows rows. Shrinks a chunk to the pages that can be had; when not even
 * one row fits, preempts the youngest running sequence and retries. Returns false when q itself
 * was the youngest and got preempted. */
static bool
reserve_rows(struct dsi_sched *s, struct dsi_sseq *q, int *rows, int *budget, bool *preempted) {
    struct dsi_kv *kv = s->kv;
    for (;;) {
        if (!dsi_kv_reserve(kv, q->slot, q->n_past + *rows, NULL)) return true;
        int64_t cap = ((int64_t)kv->seqs[q->slot].n_pages + kv->n_free) * kv->page_tokens;
        if (cap > q->n_past) { /* a shorter chunk fits (ends on a page boundary) */
            *rows = (int)DSI_MIN((int64_t)*rows, cap - q->n_past);
            DSI_ASSERT(!dsi_kv_reserve(kv, q->slot, q->n_past + *rows, NULL));
            return true;
        }
        struct dsi_sseq *victim = s->running.tail;
        *preempted = true;
        preempt(s, victim, budget);
        if (victim == q) return false;
    }
}

/* ---- n > 1: followers take their leader's prompt state ------------------------------------ */

/* The leader has not finished its prompt yet (waiting, or running without a generated token). */
static bool leader_pending(const struct dsi_sseq *q) {
    const struct dsi_sseq *l = q->leader;
    return l->state == DSI_SSEQ_WAITING || (l->state == DSI_SSEQ_RUNNING && l->n_gen == 0);
}

/* Whether a sampled sequence that is finishing its prompt this step has followers waiting. */
static bool forks_due(const struct dsi_sched *s, int ns) {
    for (int i = 0; i < ns; i++) {
        const struct dsi_sseq *l = s->sample_q[i];
        if (l->n_gen) continue;
        for (const struct dsi_sseq *q = s->waiting.head; q; q = q->next)
            if (q->leader == l) return true;
    }
    return false;
}

/* After the forward: followers of the leaders that just finished their prompt, while they are
 * at the head of the waiting list, get a slot, pages and a copy of the leader's state; the
 * others fall back to their own prefill. Fills fork_q / fork_row; returns their count. */
static int fork_followers(struct dsi_sched *s, int ns) {
    struct dsi_kv *kv = s->kv;
    int nf = 0;
    for (int i = 0; i < ns; i++) {
        struct dsi_sseq *l = s->sample_q[i];
        if (l->n_gen) continue;
        struct dsi_sseq *q = s->waiting.head;
        while (q && q->leader == l) {
            struct dsi_sseq *next = q->next;
            int slot;
            if (dsi_kv_seq_new(kv, &slot, NULL)) break;
            if (dsi_kv_reserve(kv, slot, l->n_past, NULL)) {
                dsi_kv_seq_free(kv, slot);
                break;
            }
            dsi_kv_fork(kv, l->slot, slot, l->n_past);
            q->slot = slot;
            q->n_past = l->n_past;
            q->leader = NULL;
            list_unlink(&s->waiting, q);
            q->state = DSI_SSEQ_RUNNING;
            if (q->t_admit == 0.0) q->t_admit = dsi_time_s();
            list_insert(&s->running, q, true);
            s->fork_q[nf] = q;
            s->fork_row[nf++] = i;
            s->st.forks++;
            q = next;
        }
        for (q = s->waiting.head; q; q = q->next) /* not forked: prefill as usual */
            if (q->leader == l) q->leader = NULL;
    }
    return nf;
}

/* ---- schedule ------------------------------------------------------------------------------- */

static void plan(struct dsi_sched *s) {
    int budget = s->o.max_rows;
    bool preempted = false;
    /* pass 0: decodes (one row left), pass 1: prefill chunks; oldest first */
    for (int pass = 0; pass < 2 && budget > 0; pass++) {
        struct dsi_sseq *q = s->running.head;
        while (q && budget > 0) {
            int64_t rem = seq_len(q) - q->n_past;
            if (q->plan_rows || (pass == 0) != (rem == 1)) {
                q = q->next;
                continue;
            }
            int rows = chunk_rows(s, q, budget);
            if (!reserve_rows(s, q, &rows, &budget, &preempted)) break; /* q was the youngest */
            q->plan_rows = rows;
            budget -= rows;
            q = q->next;
        }
    }
    /* admissions: not in a step that had to preempt (it would only thrash) */
    struct dsi_kv *kv = s->kv;
    while (!preempted && budget > 0 && s->waiting.head) {
        struct dsi_sseq *q = s->waiting.head;
        if (q->leader) {
            if (leader_pending(q)) break; /* head of line until the leader's prompt is done */
            q->leader = NULL;
        }
        int rows = chunk_rows(s, q, budget);
        int64_t cap = kv->n_free * kv->page_tokens;
        if (cap < rows) rows = (int)cap;
        if (rows <= 0) break; /* head of line: younger ones wait behind it */
        int slot;
        if (dsi_kv_seq_new(kv, &slot, NULL)) break;
        q->slot = slot;
        q->n_past = 0;
        DSI_ASSERT(!dsi_kv_reserve(kv, slot, rows, NULL));
        list_unlink(&s->waiting, q);
        q->state = DSI_SSEQ_RUNNING;
        if (q->t_admit == 0.0) q->t_admit = dsi_time_s();
        list_insert(&s->running, q, true);
        q->plan_rows = rows;
        budget -= rows;
    }
}

/* The flat batch of the planned chunks, in running-list order. Returns the row count. */
static int build_batch(struct dsi_sched *s, int *n_sample) {
    int n = 0, ns = 0;
    for (struct dsi_sseq *q = s->running.head; q; q = q->next) {
        if (!q->plan_rows) continue;
        q->plan_row0 = n;
        for (int k = 0; k < q->plan_rows; k++, n++) {
            int64_t p = q->n_past + k;
            s->tokens[n] = tok_at(q, p);
            s->pos[n] = (int32_t)p;
            s->slot[n] = q->slot;
            s->want[n] = 0;
        }
        if (q->n_past + q->plan_rows == seq_len(q)) {
            s->want[n - 1] = 1;
            s->sample_q[ns++] = q;
        }
        if (q->plan_rows == 1 && q->n_past + 1 == seq_len(q))
            s->st.decode_rows++;
        else
            s->st.prefill_rows += q->plan_rows;
    }
    *n_sample = ns;
    return n;
}

/* ---- sample and stop --------------------------------------------------------------------------
 */

static void finish(struct dsi_sched *s, struct dsi_sseq *q, int reason) {
    release_slot(s, q);
    list_unlink(&s->running, q);
    q->state = DSI_SSEQ_DONE;
    q->finish = reason;
}

static int token_stop(const struct dsi_sched *s, const struct dsi_sseq *q, int32_t t) {
    if (t == s->o.eos && s->o.eos >= 0 && !q->ignore_eos) return DSI_SSEQ_FIN_EOS;
    for (int i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == t) return DSI_SSEQ_FIN_STOP_ID;
    if (q->n_gen >= q->max_new) return DSI_SSEQ_FIN_LENGTH;
    if (seq_len(q) >= dsi_sched_max_positions(s)) return DSI_SSEQ_FIN_CONTEXT;
    return DSI_SSEQ_FIN_NONE;
}

/* Grammar mask on the host logits row: disallowed ids (and ids beyond the grammar's
 * vocabulary) -> -INFINITY. Returns false when no token at all is allowed. */
static bool apply_mask(const struct dsi_sched *s, const struct dsi_sseq *q, float *logits) {
    if (dsi_grammar_matcher_fill_mask(q->matcher, q->mask)) return false;
    int n = s->o.n_vocab, nm = DSI_MIN(q->n_mask, n);
    for (int base = 0; base < nm; base += 32) { /* the clear bits of each word */
        uint32_t z = ~q->mask[base >> 5];
        if (z == 0xffffffffu && nm - base >= 32) { /* nothing allowed: a plain (vector) store */
            for (int k = 0; k < 32; k++)
                logits[base + k] = -INFINITY;
            continue;
        }
        if (nm - base < 32) z &= (1u << (nm - base)) - 1u;
        for (; z; z &= z - 1u)
            logits[base + __builtin_ctz(z)] = -INFINITY;
    }
    for (int v = nm; v < n; v++)
        logits[v] = -INFINITY;
    return true;
}

/* Finish reason of a constrained sequence after it took token t: EOS ends it whatever
 * ignore_eos says (the grammar cannot go on), a complete output with nothing but EOS left ends
 * it before max_new or the context would. */
static int grammar_stop(const struct dsi_sseq *q, int fin) {
    if (dsi_grammar_matcher_is_terminated(q->matcher)) return DSI_SSEQ_FIN_EOS;
    if (fin == DSI_SSEQ_FIN_EOS || fin == DSI_SSEQ_FIN_STOP_ID) return fin;
    if (dsi_grammar_matcher_is_final(q->matcher)) return DSI_SSEQ_FIN_GRAMMAR;
    return fin;
}

static void
sample_one(struct dsi_sched *s, struct dsi_sseq *q, float *logits, struct dsi_sched_tok *out) {
    int idx = q->n_gen;
    if (q->matcher && !apply_mask(s, q, logits)) {
        *out = (struct dsi_sched_tok){q, -1, idx, DSI_SSEQ_FIN_GRAMMAR_ERROR};
        finish(s, q, out->finish);
        return;
    }
    struct dsi_sample_hist h = {q->prompt, q->n_prompt, q->gen, q->n_gen};
    struct dsi_sample_lp lp = {0}, *plp = NULL;
    if (q->lp) {
        lp.n_top = q->n_top;
        lp.top_id = q->top_id ? q->top_id + (int64_t)idx * q->n_top : NULL;
        lp.top_lp = q->top_lp ? q->top_lp + (int64_t)idx * q->n_top : NULL;
        if (!lp.top_id || !lp.top_lp) lp.n_top = 0;
        plp = &lp;
    }
    int32_t t = dsi_sampler_sample(s->sampler, logits, &q->sp, &h, seq_len(q), plp);
    if (q->matcher && dsi_grammar_matcher_accept_token(q->matcher, t, NULL)) {
        *out = (struct dsi_sched_tok){q, -1, idx, DSI_SSEQ_FIN_GRAMMAR_ERROR};
        finish(s, q, out->finish);
        return;
    }
    if (plp) q->lp[idx] = lp.chosen;
    q->gen[q->n_gen++] = t;
    int fin = token_stop(s, q, t);
    if (q->matcher) fin = grammar_stop(q, fin);
    *out = (struct dsi_sched_tok){q, t, idx, fin};
    if (out->finish) finish(s, q, out->finish);
}

/* Commit a token sampled on the device (the tail of sample_one for a sequence with no
 * logprobs, penalties or mask). */
static void
take_token(struct dsi_sched *s, struct dsi_sseq *q, int32_t t, struct dsi_sched_tok *out) {
    int idx = q->n_gen;
    q->gen[q->n_gen++] = t;
    *out = (struct dsi_sched_tok){q, t, idx, token_stop(s, q, t)};
    if (out->finish) finish(s, q, out->finish);
}

/* A grammar-constrained sequence (its mask is applied on the host). */
static bool sseq_constrained(const struct dsi_sseq *q) { return q->matcher != NULL; }

/* Whether this step's sampled sequences can all be drawn by the device's sample op; fills
 * s->srows. Penalties, logprobs and grammar masks need the logits on the host. */
static bool device_sampling(struct dsi_sched *s, int ns) {
    if (!s->o.fwd_sample) return false;
    for (int i = 0; i < ns; i++) {
        const struct dsi_sseq *q = s->sample_q[i];
        const struct dsi_sample_params *p = &q->sp;
        bool pen = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
                   (p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f);
        if (pen || q->lp || sseq_constrained(q)) return false;
        s->srows[i] = (struct dsi_sample_row){.temperature = p->temperature,
                                              .top_p = p->top_p,
                                              .min_p = p->min_p,
                                              .top_k = p->top_k,
                                              .seed = p->seed,
                                              .pos = seq_len(q),
                                              .stream = p->stream};
        if (!dsi_sample_op_takes(&s->srows[i], s->o.n_vocab)) return false;
    }
    return true;
}

/* ---- public ------------------------------------------------------------------------------- */

int dsi_sched_new(struct dsi_sched **out,
                  struct dsi_kv *kv,
                  const struct dsi_sched_opts *o,
                  struct dsi_err *err) {
    *out = NULL;
    if (o->max_rows < 1 || o->n_vocab < 1 || !o->fwd)
        return dsi_errf(err, DSI_ERR_INVALID, "sched: max_rows, n_vocab and fwd are required");
    struct dsi_sched *s = dsi_calloc(1, sizeof(*s));
    if (!s) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    s->kv = kv;
    s->o = *o;
    s->max_logit_rows = DSI_MIN(o->max_rows, kv->max_seqs);
    size_t R = (size_t)o->max_rows, L = (size_t)s->max_logit_rows;
    s->tokens = dsi_malloc(R * sizeof(int32_t));
    s->pos = dsi_malloc(R * sizeof(int32_t));
    s->slot = dsi_malloc(R * sizeof(int32_t));
    s->want = dsi_malloc(R);
    s->logits = dsi_malloc(L * (size_t)o->n_vocab * sizeof(float));
    s->sample_q = dsi_malloc(L * sizeof(*s->sample_q));
    s->toks = dsi_malloc((size_t)kv->max_seqs * sizeof(*s->toks)); /* forks sample too */
    s->fork_q = dsi_malloc((size_t)kv->max_seqs * sizeof(*s->fork_q));
    s->fork_row = dsi_malloc((size_t)kv->max_seqs * sizeof(*s->fork_row));
    s->srows = dsi_calloc(L, sizeof(*s->srows));
    s->stoks = dsi_calloc(L, sizeof(*s->stoks));
    s->sampler = dsi_sampler_new(o->n_vocab);
    if (!s->tokens || !s->pos || !s->slot || !s->want || !s->logits || !s->sample_q || !s->toks ||
        !s->sampler || !s->srows || !s->stoks || !s->fork_q || !s->fork_row) {
        dsi_sched_free(s);
        return dsi_errf(err, DSI_ERR_NOMEM, "sched: out of memory for %d rows", o->max_rows);
    }
    *out = s;
    return DSI_OK;
}

void dsi_sched_free(struct dsi_sched *s) {
    if (!s) return;
    while (s->running.head) {
        struct dsi_sseq *q = s->running.head;
        release_slot(s, q);
        list_unlink(&s->running, q);
        q->state = DSI_SSEQ_DONE;
    }
    while (s->waiting.head) {
        struct dsi_sseq *q = s->waiting.head;
        list_unlink(&s->waiting, q);
        q->state = DSI_SSEQ_DONE;
    }
    free(s->tokens);
    free(s->pos);
    free(s->slot);
    free(s->want);
    free(s->logits);
    free(s->sample_q);
    free(s->srows);
    free(s->stoks);
    free(s->fork_q);
    free(s->fork_row);
    free(s->toks);
    dsi_sampler_free(s->sampler);
    free(s);
}

int dsi_sched_add(struct dsi_sched *s, struct dsi_sseq *q, struct dsi_err *err) {
    int64_t maxp = dsi_sched_max_positions(s);
    if (q->n_prompt < 1) return dsi_errf(err, DSI_ERR_INVALID, "empty prompt");
    if (q->n_prompt > maxp)
        return dsi_errf(err, DSI_ERR_CONTEXT_FULL,
                        "prompt of %d tokens is longer than the context (%lld positions)",
                        q->n_prompt, (long long)maxp);
    if (q->max_new < 1 || !q->gen)
        return dsi_errf(err, DSI_ERR_INVALID, "max_new %d: want >= 1 and a token buffer",
                        q->max_new);
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= s->o.n_vocab)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "prompt token id %d at position %d is out of range 0..%d", q->prompt[i],
                            i, s->o.n_vocab - 1);
    q->state = DSI_SSEQ_WAITING;
    q->finish = DSI_SSEQ_FIN_NONE;
    q->n_gen = 0;
    q->slot = -1;
    q->n_past = 0;
    q->n_preempt = 0;
    q->t_admit = 0.0;
    q->plan_rows = 0;
    q->prev = q->next = NULL;
    const struct dsi_sseq *l = q->leader;
    if (l && (l->state != DSI_SSEQ_WAITING && l->state != DSI_SSEQ_RUNNING))
        q->leader = NULL; /* the leader is not in the scheduler: prefill as usual */
    if (l && (l->n_prompt != q->n_prompt ||
              memcmp(l->prompt, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt)))
        q->leader = NULL;
    list_insert(&s->waiting, q, true);
    return DSI_OK;
}

void dsi_sched_remove(struct dsi_sched *s, struct dsi_sseq *q) {
    for (struct dsi_sseq *f = s->waiting.head; f; f = f->next) /* its followers prefill */
        if (f->leader == q) f->leader = NULL;
    if (q->state == DSI_SSEQ_RUNNING) {
        release_slot(s, q);
        list_unlink(&s->running, q);
    } else if (q->state == DSI_SSEQ_WAITING) {
        list_unlink(&s->waiting, q);
    }
    q->state = DSI_SSEQ_DONE;
}

int dsi_sched_step(struct dsi_sched *s,
                   const struct dsi_sched_tok **toks,
                   int *n_toks,
                   struct dsi_err *err) {
    *toks = s->toks;
    *n_toks = 0;
    plan(s);
    int ns = 0, n = build_batch(s, &ns);
    s->batch = (struct dsi_batch){n, s->tokens, s->pos, s->slot, s->want};
    if (!n) return DSI_OK;
    s->st.steps++;
    s->st.rows += n;
    bool forking = ns > 0 && forks_due(s, ns);
    bool dev = ns > 0 && !forking && device_sampling(s, ns);
    int rc = dev ? s->o.fwd_sample(s->o.fwd_user, &s->batch, s->srows, s->stoks, err)
                 : s->o.fwd(s->o.fwd_user, &s->batch, s->logits, err);
    if (rc) return rc;
    for (struct dsi_sseq *q = s->running.head; q; q = q->next) {
        q->n_past += q->plan_rows;
        q->plan_rows = 0;
    }
    /* sample in row order; finished sequences leave the running list as they go */
    if (dev) {
        for (int i = 0; i < ns; i++)
            if (s->stoks[i] < 0 || s->stoks[i] >= s->o.n_vocab)
                return dsi_errf(err, DSI_ERR_DEVICE,
                                "device sampling returned token %d for row %d (vocab %d)",
                                s->stoks[i], i, s->o.n_vocab);
        s->st.device_sampled_steps++;
        for (int i = 0; i < ns; i++)
            take_token(s, s->sample_q[i], s->stoks[i], &s->toks[i]);
    } else {
        int nf = forking ? fork_followers(s, ns) : 0; /* before a leader may finish */
        for (int i = 0; i < ns; i++)
            sample_one(s, s->sample_q[i], s->logits + (int64_t)i * s->o.n_vocab, &s->toks[i]);
        for (int j = 0; j < nf; j++)
            sample_one(s, s->fork_q[j], s->logits + (int64_t)s->fork_row[j] * s->o.n_vocab,
                       &s->toks[ns + j]);
        ns += nf;
    }
    *n_toks = ns;
    return DSI_OK;
}

const struct dsi_batch *dsi_sched_last_batch(const struct dsi_sched *s) { return &s->batch; }

bool dsi_sched_idle(const struct dsi_sched *s) { return !s->waiting.head && !s->running.head; }

void dsi_sched_get_stats(const struct dsi_sched *s, struct dsi_sched_stats *st) {
    *st = s->st;
    st->n_waiting = s->waiting.n;
    st->n_running = s->running.n;
}

static int check_list(const struct list *l, int state, struct dsi_err *err) {
    int n = 0;
    for (struct dsi_sseq *q = l->head; q; q = q->next, n++) {
        if (q->state != state)
            return dsi_errf(err, DSI_ERR_INVALID, "sched: state %d in list %d", q->state, state);
        if (q->next && q->next->order <= q->order)
            return dsi_errf(err, DSI_ERR_INVALID, "sched: list %d not sorted", state);
        if ((q->next ? q->next->prev : l->tail) != q)
            return dsi_errf(err, DSI_ERR_INVALID, "sched: list %d links broken", state);
    }
    if (n != l->n)
        return dsi_errf(err, DSI_ERR_INVALID, "sched: list %d count %d != %d", state, n, l->n);
    return DSI_OK;
}

int dsi_sched_check(const struct dsi_sched *s, struct dsi_err *err) {
    const struct dsi_kv *kv = s->kv;
    int rc = check_list(&s->running, DSI_SSEQ_RUNNING, err);
    if (!rc) rc = check_list(&s->waiting, DSI_SSEQ_WAITING, err);
    if (rc) return rc;
    if (s->running.tail && s->waiting.head && s->running.tail->order > s->waiting.head->order)
        return dsi_errf(err, DSI_ERR_INVALID,
                        "sched: a waiting sequence is older than a running one");
    int used = 0;
    int64_t pages = 0;
    for (int i = 0; i < kv->max_seqs; i++)
        if (kv->seqs[i].used) {
            used++;
            pages += kv->seqs[i].n_pages;
        }
    if (used != s->running.n)
        return dsi_errf(err, DSI_ERR_INVALID, "sched: %d slots used, %d running", used,
                        s->running.n);
    if (pages + kv->n_free != kv->n_pages)
        return dsi_errf(err, DSI_ERR_INVALID, "sched: %lld pages assigned + %lld free != %lld",
                        (long long)pages, (long long)kv->n_free, (long long)kv->n_pages);
    for (const struct dsi_sseq *q = s->running.head; q; q = q->next) {
        if (q->slot < 0 || !kv->seqs[q->slot].used)
            return dsi_errf(err, DSI_ERR_INVALID, "sched: running sequence without a slot");
        for (const struct dsi_sseq *r = q->next; r; r = r->next)
            if (r->slot == q->slot) return dsi_errf(err, DSI_ERR_INVALID, "sched: slot shared");
        if (q->n_past > seq_len(q) ||
            q->n_past > (int64_t)kv->seqs[q->slot].n_pages * kv->page_tokens)
            return dsi_errf(err, DSI_ERR_INVALID, "sched: n_past %lld beyond tokens or pages",
                            (long long)q->n_past);
    }
    for (const struct dsi_sseq *q = s->waiting.head; q; q = q->next)
        if (q->slot >= 0 || q->n_past)
            return dsi_errf(err, DSI_ERR_INVALID, "sched: waiting sequence holds a slot");
    /* every page id once among the free list and the page tables */
    uint8_t *seen = dsi_calloc((size_t)kv->n_pages, 1);
    if (!seen) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    rc = DSI_OK;
    for (int64_t i = 0; i < kv->n_free && !rc; i++) {
        int32_t p = kv->free_pages[i];
        if (p < 0 || p >= kv->n_pages || seen[p]++)
            rc = dsi_errf(err, DSI_ERR_INVALID, "sched: page %d twice", p);
    }
    for (int i = 0; i < kv->max_seqs && !rc; i++)
        for (int k = 0; kv->seqs[i].used && k < kv->seqs[i].n_pages && !rc; k++) {
            int32_t p = kv->pt_host[(int64_t)i * kv->max_pages + k];
            if (p < 0 || p >= kv->n_pages || seen[p]++)
                rc = dsi_errf(err, DSI_ERR_INVALID, "sched: page %d twice", p);
        }
    free(seen);
    return rc;
}
