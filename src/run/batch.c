/* batch.c - the serving API of include/dsinfer.h (dsi_batch_open, dsi_submit, dsi_cancel,
 * dsi_poll): an engine thread driving the scheduler (sched.h) and an output thread that
 * detokenises, matches stop strings and builds results (design 8, 13; techniques 7.2).
 *
 * Threads and what they own:
 *  - caller threads: validate, tokenize and render a request (the tokenizer is immutable),
 *    then post it on the inbound queue; dsi_poll takes events from the event queue.
 *  - engine thread: the scheduler, the cache pool, the backend and every struct dsi_sseq; it
 *    runs step N + 1 (schedule -> forward -> sample) while the output thread processes step
 *    N's record (async) or processes each record itself before the next step (sync).
 *  - output thread: the text side of each completion (stream decoder, text, stop strings,
 *    counts) and result assembly; it reports stop-string finishes and finished requests back
 *    in the record it was given. The engine waits for record N before posting record N + 1, so
 *    a request stopped by a stop string at step N runs at most one extra step (N + 1), whose
 *    token is discarded: outputs are the same with overlap on and off.
 * Records are double-buffered and preallocated; the step itself does not allocate (records
 * grow only when a burst of cancellations exceeds their capacity).
 *
 * Lifetime of a request: allocated by dsi_submit, owned by the engine thread once posted, read
 * by the output thread through the records; freed by the engine thread after the output
 * thread reported it finished (its result is a separate copy handed to the caller). */
#include "dsinfer.h"

#include "core/core.h"
#include "grammar/grammar.h"
#include "run/engine_impl.h"
#include "run/rformat.h"
#include "run/sched.h"
#include "tok/bpe.h"
#include "tok/chat.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_STOP     64
#define MAX_STOP_LEN 1024
#define MAX_N        256

/* ---- requests ------------------------------------------------------------------------------ */

struct req;

struct comp {
    struct dsi_sseq q; /* engine side */
    struct req *r;
    int index;
    /* output side */
    struct dsi_bpe_stream *ds;
    char *text;
    size_t len, cap;
    size_t streamed;  /* text bytes already sent in TOKENS events */
    int n_tok;        /* tokens accepted */
    int streamed_tok; /* tokens already sent in TOKENS events */
    bool done;
    int finish; /* enum dsi_finish */
    int stop_i; /* matched stop string, -1 */
    int32_t stop_token;
    double t_first, t_last;
    int n_preempt;
};

struct req {
    uint64_t id, tag;
    struct req *prev, *next; /* engine's live list */
    int32_t *prompt;
    int n_prompt;
    char **stop;
    size_t *stop_len;
    int n_stop;
    size_t max_stop;
    int32_t *stop_ids;
    int n_stop_ids;
    int n;
    struct comp *c;
    bool stream, logprobs;
    int n_top;
    uint64_t seed;
    double t_submit;
    struct dsi_rformat *rf; /* response_format's grammar (a reference into rfc), or NULL */
    struct dsi_rformat_cache *rfc;
    int n_open; /* output side: completions not finished */
    int status; /* engine side, before ERROR entries are posted */
    char err[512];
};

/* ---- messages ---------------------------------------------------------------------------------
 */

enum { ENT_TOKEN = 1, ENT_CANCEL, ENT_ERROR };

struct entry {
    struct comp *c;
    int kind;
    int32_t token;
    int index;
    int finish; /* enum dsi_sseq_finish */
    int n_preempt;
    double t;
};

struct rec {
    struct entry *e;
    int n, cap;
    struct comp **stopped; /* output -> engine: finished by a stop string */
    int n_stopped, cap_stopped;
    struct req **finished; /* output -> engine: every completion finished */
    int n_finished, cap_finished;
    bool acked;
};

enum { MSG_SUBMIT = 1, MSG_CANCEL };

struct msg {
    int kind;
    struct req *r;
    uint64_t id;
    struct msg *next;
};

struct ev_node {
    struct dsi_event ev;
    int32_t *tokens;
    char *text;
    struct ev_node *next;
};

struct dsi_serve {
    struct dsi_engine *e;
    struct dsi_batch_opts o;
    struct dsi_sched *sched;
    struct dsi_bpe *bpe;
    struct dsi_rformat_cache *rfc; /* compiled response formats (with a tokenizer) */
    int n_vocab;
    int32_t eos;
    float def_temp, def_top_p;
    int def_top_k;
    int64_t max_pos;
    /* inbound: caller -> engine */
    pthread_mutex_t mu_in;
    pthread_cond_t cv_in;
    struct msg *in_head, *in_tail;
    bool quit;
    uint64_t next_id;
    uint64_t seed_state;
    /* records: engine <-> output */
    struct rec rec[2];
    pthread_mutex_t mu_out;
    pthread_cond_t cv_out;
    struct rec *posted;
    bool out_quit;
    /* events: output -> caller */
    pthread_mutex_t mu_ev;
    pthread_cond_t cv_ev;
    struct ev_node *ev_head, *ev_tail, *ev_last;
    int n_inflight;
    struct dsi_batch_stats stats;
    /* engine-thread timing of decode-only steps (published into stats) */
    double fwd_s;           /* time inside the forward callback of the current step */
    double t_decode_start;  /* start of the last step if it was decode-only, else 0 */
    double decode_fwd_last; /* its time in the forward */
    double decode_period_s; /* sum over decode-only steps: start to the next step's start */
    double decode_fwd_s;    /* sum over decode-only steps: time in the forward */
    int64_t decode_steps, device_sampled_steps;
    /* engine thread state */
    struct req *live_head, *live_tail;
    int failed;
    char failed_msg[512];
    pthread_t th_engine, th_output;
    bool started_engine, started_output;
};

static struct dsi_serve *serve_of(struct dsi_engine *e) { return e ? e->serve : NULL; }

const char *dsi_finish_str(int f) {
    switch (f) {
    case DSI_FINISH_STOP:
        return "stop";
    case DSI_FINISH_LENGTH:
        return "length";
    case DSI_FINISH_CANCELLED:
        return "cancelled";
    case DSI_FINISH_ERROR:
        return "error";
    default:
        return "none";
    }
}

void dsi_request_init(struct dsi_request *r) {
    memset(r, 0, sizeof(*r));
    r->max_tokens = 16;
    r->temperature = -1.0f;
    r->top_p = -1.0f;
    r->top_k = -1;
    r->repetition_penalty = 1.0f;
    r->n = 1;
}

static void free_req(struct req *r) {
    if (!r) return;
    for (int i = 0; r->c && i < r->n; i++) {
        struct comp *c = &r->c[i];
        free(c->q.gen);
        free(c->q.lp);
        free(c->q.top_id);
        free(c->q.top_lp);
        dsi_grammar_matcher_free(c->q.matcher);
        free(c->q.mask);
        dsi_bpe_stream_free(c->ds);
        free(c->text);
    }
    free(r->c);
    dsi_rformat_put(r->rfc, r->rf);
    for (int i = 0; r->stop && i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->stop_len);
    free(r->stop_ids);
    free(r->prompt);
    free(r);
}

void dsi_result_free(struct dsi_result *res) {
    if (!res) return;
    for (int i = 0; res->c && i < res->n; i++) {
        struct dsi_completion *c = &res->c[i];
        free(c->tokens);
        free(c->text);
        free(c->stop_str);
        free(c->logprobs);
        free(c->top_ids);
        free(c->top_logprobs);
    }
    free(res->c);
    free(res);
}

/* ---- records ------------------------------------------------------------------------------- */

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = DSI_MAX(need, 2 * *cap + 16);
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static void rec_push(struct rec *rc, struct entry en) {
    if (grow((void **)&rc->e, &rc->cap, rc->n + 1, sizeof(*rc->e)))
        DSI_ASSERT(!"out of memory growing a step record");
    rc->e[rc->n++] = en;
}

static void rec_reset(struct rec *rc) {
    rc->n = rc->n_stopped = rc->n_finished = 0;
    rc->acked = false;
}

/* ---- events -------------------------------------------------------------------------------- */

static void ev_push(struct dsi_serve *sv, struct ev_node *n) {
    pthread_mutex_lock(&sv->mu_ev);
    if (sv->ev_tail)
        sv->ev_tail->next = n;
    else
        sv->ev_head = n;
    sv->ev_tail = n;
    pthread_cond_broadcast(&sv->cv_ev);
    pthread_mutex_unlock(&sv->mu_ev);
}

static void ev_free_list(struct ev_node *n) {
    while (n) {
        struct ev_node *x = n->next;
        free(n->tokens);
        free(n->text);
        dsi_result_free(n->ev.result);
        free(n);
        n = x;
    }
}

/* ---- output side: text, stop strings, results -------------------------------------------------
 */

static void text_append(struct comp *c, const char *p, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t nc = DSI_MAX(c->len + n + 1, 2 * c->cap + 64);
        char *q = realloc(c->text, nc);
        DSI_ASSERT(q);
        c->text = q;
        c->cap = nc;
    }
    memcpy(c->text + c->len, p, n);
    c->len += n;
    c->text[c->len] = 0;
}

/* Earliest stop string that occurs in the text at or after byte `from`; -1 if none. */
static int find_stop(const struct req *r, const struct comp *c, size_t from, size_t *at) {
    int best = -1;
    size_t best_at = 0;
    for (int i = 0; i < r->n_stop; i++) {
        if (c->len < r->stop_len[i]) continue;
        const char *h = c->text + from;
        const char *m = memmem(h, c->len - from, r->stop[i], r->stop_len[i]);
        if (m && (best < 0 || (size_t)(m - c->text) < best_at)) {
            best = i;
            best_at = (size_t)(m - c->text);
        }
    }
    *at = best_at;
    return best;
}

/* Bytes at the end of the text that could be the start of a stop string. */
static size_t holdback(const struct req *r, const struct comp *c) {
    size_t hb = 0;
    for (int i = 0; i < r->n_stop; i++)
        for (size_t k = DSI_MIN(r->stop_len[i] - 1, c->len); k > hb; k--)
            if (!memcmp(c->text + c->len - k, r->stop[i], k)) {
                hb = k;
                break;
            }
    return hb;
}

/* Append text and look for a stop string in the part that could contain a new match. */
static int add_text(struct comp *c, const char *p, size_t n, size_t *cut) {
    const struct req *r = c->r;
    size_t old = c->len;
    text_append(c, p, n);
    if (!r->n_stop || !n) return -1;
    size_t from = old > r->max_stop - 1 ? old - (r->max_stop - 1) : 0;
    return find_stop(r, c, from, cut);
}

static void emit_tokens(struct dsi_serve *sv, struct comp *c, bool final) {
    struct req *r = c->r;
    size_t upto = final ? c->len : c->len - holdback(r, c);
    if (upto < c->streamed) upto = c->streamed;
    int nt = c->n_tok - c->streamed_tok;
    if (!nt && upto == c->streamed) return;
    struct ev_node *n = dsi_calloc(1, sizeof(*n));
    DSI_ASSERT(n);
    n->tokens = dsi_malloc(sizeof(int32_t) * (size_t)DSI_MAX(nt, 1));
    n->text = dsi_malloc(upto - c->streamed + 1);
    DSI_ASSERT(n->tokens && n->text);
    memcpy(n->tokens, c->q.gen + c->streamed_tok, sizeof(int32_t) * (size_t)nt);
    if (c->text) memcpy(n->text, c->text + c->streamed, upto - c->streamed);
    n->text[upto - c->streamed] = 0;
    n->ev = (struct dsi_event){.kind = DSI_EVENT_TOKENS,
                               .id = r->id,
                               .tag = r->tag,
                               .index = c->index,
                               .tokens = n->tokens,
                               .n_tokens = nt,
                               .text = n->text,
                               .text_len = upto - c->streamed};
    c->streamed = upto;
    c->streamed_tok = c->n_tok;
    ev_push(sv, n);
}

static void *dup_mem(const void *p, size_t n) {
    void *q = dsi_malloc(n ? n : 1);
    DSI_ASSERT(q);
    if (n) memcpy(q, p, n);
    return q;
}

static struct dsi_result *build_result(struct dsi_serve *sv, struct req *r, double now) {
    struct dsi_result *res = dsi_calloc(1, sizeof(*res));
    DSI_ASSERT(res);
    res->c = dsi_calloc((size_t)r->n, sizeof(*res->c));
    DSI_ASSERT(res->c);
    res->id = r->id;
    res->tag = r->tag;
    res->status = r->status;
    if (r->status) snprintf(res->error, sizeof(res->error), "%s", r->err);
    res->n_prompt_tokens = r->n_prompt;
    res->seed = r->seed;
    res->n = r->n;
    double t_admit = 0.0, t_first = 0.0;
    for (int i = 0; i < r->n; i++) {
        struct comp *c = &r->c[i];
        struct dsi_completion *o = &res->c[i];
        o->index = i;
        o->finish = c->finish;
        o->stop_token = c->stop_token;
        o->stop_str =
            c->stop_i >= 0 ? dup_mem(r->stop[c->stop_i], r->stop_len[c->stop_i] + 1) : NULL;
        o->n_tokens = c->n_tok;
        o->tokens = dup_mem(c->q.gen, sizeof(int32_t) * (size_t)c->n_tok);
        if (sv->bpe) {
            o->text = dup_mem(c->text ? c->text : "", c->len + 1);
            o->text_len = c->len;
        }
        if (r->logprobs) {
            o->logprobs = dup_mem(c->q.lp, sizeof(float) * (size_t)c->n_tok);
            o->n_top = r->n_top;
            if (r->n_top) {
                size_t k = (size_t)c->n_tok * (size_t)r->n_top;
                o->top_ids = dup_mem(c->q.top_id, sizeof(int32_t) * k);
                o->top_logprobs = dup_mem(c->q.top_lp, sizeof(float) * k);
            }
        }
        o->t_first = c->n_tok ? c->t_first - r->t_submit : 0.0;
        o->t_last = c->n_tok ? c->t_last - r->t_submit : 0.0;
        o->n_preemptions = c->n_preempt;
        res->n_completion_tokens += c->n_tok;
        /* t_admit is written once by the engine before any entry of this sequence */
        if (c->q.t_admit > 0.0 && (t_admit == 0.0 || c->q.t_admit < t_admit))
            t_admit = c->q.t_admit;
        if (c->n_tok && (t_first == 0.0 || c->t_first < t_first)) t_first = c->t_first;
    }
    res->t_queue = t_admit > 0.0 ? t_admit - r->t_submit : now - r->t_submit;
    res->t_first_token = t_first > 0.0 ? t_first - r->t_submit : 0.0;
    res->t_total = now - r->t_submit;
    return res;
}

static void
finish_comp(struct dsi_serve *sv, struct rec *rc, struct comp *c, int finish, double now) {
    struct req *r = c->r;
    c->done = true;
    c->finish = finish;
    if (r->stream && finish != DSI_FINISH_ERROR) emit_tokens(sv, c, true);
    if (--r->n_open > 0) return;
    struct ev_node *n = dsi_calloc(1, sizeof(*n));
    DSI_ASSERT(n);
    n->ev = (struct dsi_event){
        .kind = DSI_EVENT_DONE, .id = r->id, .tag = r->tag, .result = build_result(sv, r, now)};
    ev_push(sv, n);
    if (grow((void **)&rc->finished, &rc->cap_finished, rc->n_finished + 1, sizeof(void *)))
        DSI_ASSERT(!"out of memory");
    rc->finished[rc->n_finished++] = r;
}

static void flush_text(struct comp *c, int *stop_i, size_t *cut) {
    if (!c->ds) return;
    const char *p;
    size_t n;
    dsi_bpe_stream_flush(c->ds, &p, &n);
    int s = add_text(c, p, n, cut);
    if (s >= 0 && *stop_i < 0) *stop_i = s;
}

static void handle_token(struct dsi_serve *sv, struct rec *rc, const struct entry *en) {
    struct comp *c = en->c;
    struct req *r = c->r;
    DSI_ASSERT(en->index == c->n_tok);
    c->n_tok++;
    if (c->n_tok == 1) c->t_first = en->t;
    c->t_last = en->t;
    c->n_preempt = en->n_preempt;
    int stop_i = -1;
    size_t cut = 0;
    if (c->ds) {
        const char *p;
        size_t n;
        if (!dsi_bpe_stream_feed(c->ds, en->token, &p, &n, NULL)) stop_i = add_text(c, p, n, &cut);
        if (stop_i < 0 && en->finish) flush_text(c, &stop_i, &cut);
    }
    if (stop_i >= 0) { /* stop string: cut the text before it */
        c->len = cut;
        c->text[cut] = 0;
        c->stop_i = stop_i;
        if (!en->finish) { /* the engine still runs it: tell it */
            if (grow((void **)&rc->stopped, &rc->cap_stopped, rc->n_stopped + 1, sizeof(void *)))
                DSI_ASSERT(!"out of memory");
            rc->stopped[rc->n_stopped++] = c;
        }
        finish_comp(sv, rc, c, DSI_FINISH_STOP, en->t);
        return;
    }
    switch (en->finish) {
    case DSI_SSEQ_FIN_NONE:
        if (r->stream) emit_tokens(sv, c, false);
        return;
    case DSI_SSEQ_FIN_EOS:
    case DSI_SSEQ_FIN_STOP_ID:
        c->stop_token = en->token;
        finish_comp(sv, rc, c, DSI_FINISH_STOP, en->t);
        return;
    case DSI_SSEQ_FIN_GRAMMAR: /* the constrained output is complete */
        finish_comp(sv, rc, c, DSI_FINISH_STOP, en->t);
        return;
    default:
        finish_comp(sv, rc, c, DSI_FINISH_LENGTH, en->t);
        return;
    }
}

/* Process one step record (output thread, or the engine thread when sync). */
static void process(struct dsi_serve *sv, struct rec *rc) {
    int64_t kept = 0;
    for (int i = 0; i < rc->n; i++) {
        const struct entry *en = &rc->e[i];
        struct comp *c = en->c;
        if (c->done) continue; /* e.g. the extra step after a stop string */
        if (en->kind == ENT_TOKEN) {
            handle_token(sv, rc, en);
            kept++;
            continue;
        }
        if (c->ds) { /* cancelled / failed: keep the text so far */
            int si = -1;
            size_t cut = 0;
            flush_text(c, &si, &cut);
            if (si >= 0) {
                c->len = cut;
                c->text[cut] = 0;
            }
        }
        finish_comp(sv, rc, c, en->kind == ENT_CANCEL ? DSI_FINISH_CANCELLED : DSI_FINISH_ERROR,
                    en->t);
    }
    pthread_mutex_lock(&sv->mu_ev);
    sv->stats.generated_tokens += kept;
    pthread_mutex_unlock(&sv->mu_ev);
}

static void *output_main(void *arg) {
    struct dsi_serve *sv = arg;
    pthread_mutex_lock(&sv->mu_out);
    for (;;) {
        while (!sv->posted && !sv->out_quit)
            pthread_cond_wait(&sv->cv_out, &sv->mu_out);
        if (!sv->posted) break;
        struct rec *rc = sv->posted;
        sv->posted = NULL;
        pthread_mutex_unlock(&sv->mu_out);
        process(sv, rc);
        pthread_mutex_lock(&sv->mu_out);
        rc->acked = true;
        pthread_cond_broadcast(&sv->cv_out);
    }
    pthread_mutex_unlock(&sv->mu_out);
    return NULL;
}

/* ---- engine side ------------------------------------------------------------------------------
 */

static void live_unlink(struct dsi_serve *sv, struct req *r) {
    if (r->prev)
        r->prev->next = r->next;
    else
        sv->live_head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        sv->live_tail = r->prev;
    r->prev = r->next = NULL;
}

/* End every unfinished completion of r with an entry of `kind`. */
static void end_req(struct dsi_serve *sv, struct rec *cur, struct req *r, int kind, double t) {
    for (int i = 0; i < r->n; i++) {
        struct comp *c = &r->c[i];
        if (c->q.state == DSI_SSEQ_DONE) continue;
        dsi_sched_remove(sv->sched, &c->q);
        rec_push(cur, (struct entry){.c = c, .kind = kind, .index = -1, .t = t});
    }
}

static void engine_fail(struct dsi_serve *sv, struct rec *cur, int rc, const char *msg) {
    double t = dsi_time_s();
    sv->failed = rc;
    snprintf(sv->failed_msg, sizeof(sv->failed_msg), "%s", msg);
    for (struct req *r = sv->live_head; r; r = r->next) {
        if (!r->status) {
            r->status = rc;
            snprintf(r->err, sizeof(r->err), "%s", msg);
        }
        end_req(sv, cur, r, ENT_ERROR, t);
    }
}

/* Take the inbound messages; wait for one if `block`. Returns false on quit. */
static bool drain_inbound(struct dsi_serve *sv, struct rec *cur, bool block) {
    pthread_mutex_lock(&sv->mu_in);
    while (block && !sv->in_head && !sv->quit)
        pthread_cond_wait(&sv->cv_in, &sv->mu_in);
    struct msg *m = sv->in_head;
    sv->in_head = sv->in_tail = NULL;
    bool quit = sv->quit;
    pthread_mutex_unlock(&sv->mu_in);
    double t = dsi_time_s();
    while (m) {
        struct msg *next = m->next;
        if (m->kind == MSG_SUBMIT) {
            struct req *r = m->r;
            r->prev = sv->live_tail;
            if (sv->live_tail)
                sv->live_tail->next = r;
            else
                sv->live_head = r;
            sv->live_tail = r;
            struct dsi_err err = {0};
            int rc = sv->failed;
            if (rc) snprintf(err.msg, sizeof(err.msg), "%s", sv->failed_msg);
            for (int i = 0; i < r->n && !rc; i++)
                rc = dsi_sched_add(sv->sched, &r->c[i].q, &err);
            if (rc) {
                r->status = rc;
                snprintf(r->err, sizeof(r->err), "%s", err.msg);
                end_req(sv, cur, r, ENT_ERROR, t);
            }
        } else {
            for (struct req *r = sv->live_head; r; r = r->next)
                if (r->id == m->id) {
                    end_req(sv, cur, r, ENT_CANCEL, t);
                    break;
                }
        }
        free(m);
        m = next;
    }
    return !quit;
}

/* After the output side processed `done`: stop the sequences it ended, free finished requests
 * (dropping their entries from `next`, the record not yet posted). */
static void apply_done(struct dsi_serve *sv, struct rec *done, struct rec *next) {
    for (int i = 0; i < done->n_stopped; i++)
        dsi_sched_remove(sv->sched, &done->stopped[i]->q);
    for (int i = 0; i < done->n_finished; i++) {
        struct req *r = done->finished[i];
        if (next) {
            int k = 0;
            for (int j = 0; j < next->n; j++)
                if (next->e[j].c->r != r) next->e[k++] = next->e[j];
            next->n = k;
        }
        live_unlink(sv, r);
        free_req(r);
    }
}

static void wait_ack(struct dsi_serve *sv, struct rec *rc) {
    pthread_mutex_lock(&sv->mu_out);
    while (!rc->acked)
        pthread_cond_wait(&sv->cv_out, &sv->mu_out);
    pthread_mutex_unlock(&sv->mu_out);
}

static void post(struct dsi_serve *sv, struct rec *rc) {
    pthread_mutex_lock(&sv->mu_out);
    rc->acked = false;
    sv->posted = rc;
    pthread_cond_broadcast(&sv->cv_out);
    pthread_mutex_unlock(&sv->mu_out);
}

static void publish_stats(struct dsi_serve *sv) {
    struct dsi_sched_stats st;
    dsi_sched_get_stats(sv->sched, &st);
    struct dsi_kv *kv = sv->e->kv;
    pthread_mutex_lock(&sv->mu_ev);
    struct dsi_batch_stats *o = &sv->stats;
    o->steps = st.steps;
    o->rows = st.rows;
    o->prefill_rows = st.prefill_rows;
    o->decode_rows = st.decode_rows;
    o->preemptions = st.preemptions;
    o->prompt_forks = st.forks;
    o->n_waiting = st.n_waiting;
    o->n_running = st.n_running;
    o->pages_free = kv->n_free;
    o->decode_steps = sv->decode_steps;
    o->decode_period_s = sv->decode_period_s;
    o->decode_fwd_s = sv->decode_fwd_s;
    o->device_sampled_steps = st.device_sampled_steps;
    pthread_mutex_unlock(&sv->mu_ev);
}

static void collect(struct rec *cur, const struct dsi_sched_tok *tk, int nt, double t) {
    for (int i = 0; i < nt; i++) {
        struct dsi_sseq *q = tk[i].q;
        if (tk[i].finish == DSI_SSEQ_FIN_GRAMMAR_ERROR) { /* no token: fail the request */
            struct comp *c = q->user;
            struct req *r = c->r;
            if (!r->status) {
                r->status = DSI_ERR_INVALID;
                snprintf(r->err, sizeof(r->err),
                         "response_format: no token of the vocabulary can continue completion %d "
                         "after %d tokens",
                         c->index, q->n_gen);
            }
            rec_push(cur, (struct entry){.c = c, .kind = ENT_ERROR, .index = -1, .t = t});
            continue;
        }
        rec_push(cur, (struct entry){.c = q->user,
                                     .kind = ENT_TOKEN,
                                     .token = tk[i].token,
                                     .index = tk[i].index,
                                     .finish = tk[i].finish,
                                     .n_preempt = q->n_preempt,
                                     .t = t});
    }
}

static void *engine_main(void *arg) {
    struct dsi_serve *sv = arg;
    struct rec *cur = &sv->rec[0], *pending = NULL;
    bool async = !sv->o.sync;
    for (;;) {
        bool idle = dsi_sched_idle(sv->sched) && cur->n == 0;
        if (idle && pending) { /* nothing to overlap with: finish the record in flight */
            wait_ack(sv, pending);
            apply_done(sv, pending, NULL);
            rec_reset(pending);
            pending = NULL;
            publish_stats(sv);
            continue;
        }
        if (idle) sv->t_decode_start = 0.0; /* waiting for work is not a step's period */
        if (!drain_inbound(sv, cur, idle)) break;
        const struct dsi_sched_tok *tk = NULL;
        int nt = 0;
        struct dsi_err err = {0};
        struct dsi_sched_stats s0, s1;
        dsi_sched_get_stats(sv->sched, &s0);
        double t_start = dsi_time_s();
        sv->fwd_s = 0.0;
        int rc = sv->failed ? 0 : dsi_sched_step(sv->sched, &tk, &nt, &err);
        double t = dsi_time_s();
        dsi_sched_get_stats(sv->sched, &s1);
        if (sv->t_decode_start > 0.0) { /* the previous step was decode-only: close its period */
            sv->decode_period_s += t_start - sv->t_decode_start;
            sv->decode_fwd_s += sv->decode_fwd_last;
            sv->decode_steps++;
        }
        sv->t_decode_start = 0.0;
        if (!rc && s1.steps > s0.steps && s1.prefill_rows == s0.prefill_rows) {
            sv->t_decode_start = t_start;
            sv->decode_fwd_last = sv->fwd_s;
        }
        if (rc)
            engine_fail(sv, cur, rc, err.msg);
        else
            collect(cur, tk, nt, t);
        if (!cur->n) continue;
        if (!async) {
            process(sv, cur);
            apply_done(sv, cur, NULL);
            rec_reset(cur);
        } else {
            if (pending) {
                wait_ack(sv, pending);
                apply_done(sv, pending, cur);
                rec_reset(pending);
            }
            post(sv, cur);
            pending = cur;
            cur = cur == &sv->rec[0] ? &sv->rec[1] : &sv->rec[0];
        }
        publish_stats(sv);
    }
    if (pending) wait_ack(sv, pending);
    return NULL;
}

/* ---- open / close ------------------------------------------------------------------------------
 */

static int real_fwd(void *user, const struct dsi_batch *b, float *logits, struct dsi_err *err) {
    struct dsi_engine *e = user;
    double t0 = dsi_time_s();
    int rc = dsi_forward(e->fwd, b, logits, NULL, err);
    e->serve->fwd_s += dsi_time_s() - t0;
    return rc;
}

static int real_fwd_sample(void *user,
                           const struct dsi_batch *b,
                           const struct dsi_sample_row *rows,
                           int32_t *tokens,
                           struct dsi_err *err) {
    struct dsi_engine *e = user;
    double t0 = dsi_time_s();
    int rc = dsi_forward_sample(e->fwd, b, rows, tokens, err);
    e->serve->fwd_s += dsi_time_s() - t0;
    return rc;
}

/* Re-create the cache pool (and the forward that borrows it) with the page count the options
 * ask for. The engine opened its pool with every slot at max_ctx. */
static int resize_pool(struct dsi_engine *e, const struct dsi_batch_opts *bo, struct dsi_err *err) {
    struct dsi_kv *kv = e->kv;
    int64_t full = kv->n_pages, want = full;
    if (bo->kv_pages > 0) {
        want = bo->kv_pages;
    } else if (bo->kv_bytes > 0) {
        int64_t pb = dsi_kv_page_bytes(&e->m->cfg, kv->dtype);
        int64_t fixed = kv->bytes - pb * kv->n_pages;
        if (pb > 0) {
            if (bo->kv_bytes < fixed + pb)
                return dsi_errf(err, DSI_ERR_NOMEM,
                                "kv budget %lld bytes: the sequence slots alone take %lld, one "
                                "page %lld more",
                                (long long)bo->kv_bytes, (long long)fixed, (long long)pb);
            want = (bo->kv_bytes - fixed) / pb;
        }
    }
    want = DSI_MIN(want, full);
    if (want == kv->n_pages) return DSI_OK;
    struct dsi_kv_opts ko = {.max_seqs = kv->max_seqs,
                             .max_ctx = kv->max_ctx,
                             .max_rows = e->max_rows,
                             .n_pages = want,
                             .dtype = kv->dtype};
    dsi_fwd_free(e->fwd);
    e->fwd = NULL;
    dsi_kv_free(e->kv);
    e->kv = NULL;
    int rc = dsi_kv_new(&e->kv, &e->m->cfg, e->be, &ko, err);
    if (!rc) rc = dsi_fwd_new(&e->fwd, e->m, e->be, e->kv, e->max_rows, e->numerics, err);
    return rc;
}

/* Sampling on the device pays off where the logits live on a device (only token ids come
 * back); the CPU backend samples on the host. DSI_BATCH_SAMPLE_HOST / _DEVICE force it. */
static bool device_sampling_on(const struct dsi_engine *e, const struct dsi_batch_opts *bo) {
    if (!e->be->ops->sample || bo->sampling == DSI_BATCH_SAMPLE_HOST) return false;
    return bo->sampling == DSI_BATCH_SAMPLE_DEVICE || strcmp(e->be->name, "cpu") != 0;
}

static bool file_exists(const char *dir, const char *name) {
    char p[4096];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, R_OK) == 0;
}

static void serve_free(struct dsi_serve *sv);

int dsi_batch_open(struct dsi_engine **out,
                   const struct dsi_engine_opts *eo,
                   const struct dsi_batch_opts *bo,
                   struct dsi_err *err) {
    *out = NULL;
    struct dsi_batch_opts def = {0};
    if (!bo) bo = &def;
    struct dsi_engine *e = NULL;
    int rc = dsi_engine_open(&e, eo, err);
    if (rc) return rc;
    struct dsi_serve *sv = dsi_calloc(1, sizeof(*sv));
    if (!sv) {
        dsi_engine_close(e);
        return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    e->serve = sv;
    sv->e = e;
    sv->o = *bo;
    sv->n_vocab = dsi_engine_vocab_size(e);
    sv->eos = dsi_engine_eos_id(e);
    dsi_engine_sampling_defaults(e, &sv->def_temp, &sv->def_top_p, &sv->def_top_k);
    pthread_mutex_init(&sv->mu_in, NULL);
    pthread_cond_init(&sv->cv_in, NULL);
    pthread_mutex_init(&sv->mu_out, NULL);
    pthread_cond_init(&sv->cv_out, NULL);
    pthread_mutex_init(&sv->mu_ev, NULL);
    pthread_cond_init(&sv->cv_ev, NULL);
    sv->seed_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)sv;
    rc = resize_pool(e, bo, err);
    const char *tdir = bo->tokenizer_dir ? bo->tokenizer_dir : eo->model_dir;
    if (!rc && tdir && *tdir && file_exists(tdir, "tokenizer.json"))
        rc = dsi_bpe_open_limit(&sv->bpe, tdir, sv->n_vocab, err);
    if (!rc && sv->bpe) rc = dsi_rformat_cache_new(&sv->rfc, sv->bpe, sv->eos, 0, err);
    int budget =
        bo->max_batch_tokens > 0 ? DSI_MIN(bo->max_batch_tokens, e->max_rows) : e->max_rows;
    struct dsi_sched_opts so = {.max_rows = budget,
                                .chunk_align = bo->chunk_align > 0 ? bo->chunk_align : 128,
                                .n_vocab = sv->n_vocab,
                                .eos = sv->eos,
                                .fwd = real_fwd,
                                .fwd_sample = device_sampling_on(e, bo) ? real_fwd_sample : NULL,
                                .fwd_user = e};
    if (!rc) rc = dsi_sched_new(&sv->sched, e->kv, &so, err);
    if (!rc) {
        sv->max_pos = dsi_sched_max_positions(sv->sched);
        int cap = e->kv->max_seqs * 2 + 16;
        for (int i = 0; i < 2 && !rc; i++)
            if (grow((void **)&sv->rec[i].e, &sv->rec[i].cap, cap, sizeof(struct entry)))
                rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    struct dsi_batch_stats *st = &sv->stats;
    if (!rc) {
        st->pages_total = e->kv->n_pages;
        st->pages_free = e->kv->n_free;
        st->page_tokens = e->kv->page_tokens;
        st->kv_bytes = e->kv->bytes;
        st->max_positions = sv->max_pos;
        st->max_seqs = e->kv->max_seqs;
        st->has_tokenizer = sv->bpe != NULL;
    }
    if (!rc && pthread_create(&sv->th_engine, NULL, engine_main, sv) == 0)
        sv->started_engine = true;
    else if (!rc)
        rc = dsi_errf(err, DSI_ERR_NOMEM, "cannot start the engine thread");
    if (!rc && !bo->sync) {
        if (pthread_create(&sv->th_output, NULL, output_main, sv) == 0)
            sv->started_output = true;
        else
            rc = dsi_errf(err, DSI_ERR_NOMEM, "cannot start the output thread");
    }
    if (rc) {
        dsi_batch_close(e);
        return rc;
    }
    *out = e;
    return DSI_OK;
}

static void serve_free(struct dsi_serve *sv) {
    if (!sv) return;
    if (sv->started_engine) {
        pthread_mutex_lock(&sv->mu_in);
        sv->quit = true;
        pthread_cond_broadcast(&sv->cv_in);
        pthread_mutex_unlock(&sv->mu_in);
        pthread_join(sv->th_engine, NULL);
    }
    if (sv->started_output) {
        pthread_mutex_lock(&sv->mu_out);
        sv->out_quit = true;
        pthread_cond_broadcast(&sv->cv_out);
        pthread_mutex_unlock(&sv->mu_out);
        pthread_join(sv->th_output, NULL);
    }
    for (struct msg *m = sv->in_head; m;) {
        struct msg *x = m->next;
        free_req(m->r);
        free(m);
        m = x;
    }
    dsi_sched_free(sv->sched);
    for (struct req *r = sv->live_head; r;) {
        struct req *x = r->next;
        free_req(r);
        r = x;
    }
    ev_free_list(sv->ev_head);
    ev_free_list(sv->ev_last);
    for (int i = 0; i < 2; i++) {
        free(sv->rec[i].e);
        free(sv->rec[i].stopped);
        free(sv->rec[i].finished);
    }
    dsi_rformat_cache_free(sv->rfc); /* after every request: they hold references */
    dsi_bpe_free(sv->bpe);
    pthread_mutex_destroy(&sv->mu_in);
    pthread_cond_destroy(&sv->cv_in);
    pthread_mutex_destroy(&sv->mu_out);
    pthread_cond_destroy(&sv->cv_out);
    pthread_mutex_destroy(&sv->mu_ev);
    pthread_cond_destroy(&sv->cv_ev);
    free(sv);
}

void dsi_batch_close(struct dsi_engine *e) {
    if (!e) return;
    serve_free(e->serve);
    e->serve = NULL;
    dsi_engine_close(e);
}

/* ---- submit --------------------------------------------------------------------------------- */

static uint64_t next_seed(struct dsi_serve *sv) {
    uint64_t x = (sv->seed_state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (x ^ (x >> 31)) & ((1ull << 53) - 1); /* exact in a JSON number */
}

static int check_params(const struct dsi_request *q, struct dsi_err *err) {
    if (q->max_tokens < 0)
        return dsi_errf(err, DSI_ERR_INVALID, "max_tokens %d: want >= 1", q->max_tokens);
    if (q->n < 1 || q->n > MAX_N)
        return dsi_errf(err, DSI_ERR_INVALID, "n %d: want 1..%d", q->n, MAX_N);
    if (!(q->temperature <= 100.0f) || (q->temperature < 0.0f && q->temperature != -1.0f))
        return dsi_errf(err, DSI_ERR_INVALID, "temperature %g: want 0..100",
                        (double)q->temperature);
    if (!(q->top_p <= 1.0f) || (q->top_p <= 0.0f && q->top_p != -1.0f))
        return dsi_errf(err, DSI_ERR_INVALID, "top_p %g: want (0, 1]", (double)q->top_p);
    if (q->top_k < -1)
        return dsi_errf(err, DSI_ERR_INVALID, "top_k %d: want >= 0 (or -1)", q->top_k);
    if (!(q->min_p >= 0.0f && q->min_p <= 1.0f))
        return dsi_errf(err, DSI_ERR_INVALID, "min_p %g: want 0..1", (double)q->min_p);
    if (!(q->presence_penalty >= -2.0f && q->presence_penalty <= 2.0f))
        return dsi_errf(err, DSI_ERR_INVALID, "presence_penalty %g: want -2..2",
                        (double)q->presence_penalty);
    if (!(q->frequency_penalty >= -2.0f && q->frequency_penalty <= 2.0f))
        return dsi_errf(err, DSI_ERR_INVALID, "frequency_penalty %g: want -2..2",
                        (double)q->frequency_penalty);
    if (!(q->repetition_penalty > 0.0f && q->repetition_penalty <= 100.0f))
        return dsi_errf(err, DSI_ERR_INVALID, "repetition_penalty %g: want > 0",
                        (double)q->repetition_penalty);
    if (q->top_logprobs < 0 || q->top_logprobs > DSI_SAMPLE_MAX_TOP)
        return dsi_errf(err, DSI_ERR_INVALID, "top_logprobs %d: want 0..%d", q->top_logprobs,
                        DSI_SAMPLE_MAX_TOP);
    if (q->n_stop < 0 || q->n_stop > MAX_STOP || (q->n_stop && !q->stop))
        return dsi_errf(err, DSI_ERR_INVALID, "stop: want at most %d strings", MAX_STOP);
    for (int i = 0; i < q->n_stop; i++) {
        size_t l = q->stop[i] ? strlen(q->stop[i]) : 0;
        if (l < 1 || l > MAX_STOP_LEN)
            return dsi_errf(err, DSI_ERR_INVALID, "stop string %d: want 1..%d bytes", i,
                            MAX_STOP_LEN);
    }
    if (q->n_stop_token_ids < 0 || (q->n_stop_token_ids && !q->stop_token_ids))
        return dsi_errf(err, DSI_ERR_INVALID, "stop_token_ids: bad list");
    int kinds = (q->prompt != NULL) + (q->prompt_ids != NULL) + (q->messages_json != NULL);
    if (kinds != 1)
        return dsi_errf(err, DSI_ERR_INVALID,
                        "give exactly one of prompt, prompt token ids, messages (got %d)", kinds);
    return DSI_OK;
}

static int
render_chat(struct dsi_serve *sv, const char *js, int32_t **ids, int *n, struct dsi_err *err) {
    json_error_t je;
    json_t *m = json_loads(js, 0, &je);
    if (!m) return dsi_errf(err, DSI_ERR_INVALID, "messages: malformed JSON: %s", je.text);
    if (!json_is_array(m) || !json_array_size(m)) {
        json_decref(m);
        return dsi_errf(err, DSI_ERR_INVALID, "messages: want a non-empty array");
    }
    struct dsi_chat_opts co = dsi_chat_opts_default();
    char *text = NULL;
    size_t len = 0;
    int rc = dsi_chat_render(m, &co, &text, &len, err);
    json_decref(m);
    size_t nn = 0;
    if (!rc) rc = dsi_bpe_encode(sv->bpe, text, len, true, ids, &nn, err);
    free(text);
    *n = (int)nn;
    return rc;
}

/* Tokenize / render the prompt into r->prompt. */
static int
make_prompt(struct dsi_serve *sv, const struct dsi_request *q, struct req *r, struct dsi_err *err) {
    if (q->prompt_ids) {
        if (q->n_prompt_ids < 1) return dsi_errf(err, DSI_ERR_INVALID, "empty prompt");
        r->prompt = dup_mem(q->prompt_ids, sizeof(int32_t) * (size_t)q->n_prompt_ids);
        r->n_prompt = q->n_prompt_ids;
        return DSI_OK;
    }
    if (!sv->bpe)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "the model has no tokenizer.json: give the prompt as token ids");
    if (q->messages_json) return render_chat(sv, q->messages_json, &r->prompt, &r->n_prompt, err);
    size_t len = q->prompt_len ? q->prompt_len : strlen(q->prompt), n = 0;
    int rc = dsi_bpe_encode(sv->bpe, q->prompt, len, true, &r->prompt, &n, err);
    r->n_prompt = (int)n;
    if (!rc && !n) rc = dsi_errf(err, DSI_ERR_INVALID, "empty prompt");
    return rc;
}

static int
build_req(struct dsi_serve *sv, const struct dsi_request *q, struct req *r, struct dsi_err *err) {
    int rc = check_params(q, err);
    if (!rc) rc = make_prompt(sv, q, r, err);
    if (rc) return rc;
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= sv->n_vocab)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "prompt token id %d at position %d is out of range 0..%d", r->prompt[i],
                            i, sv->n_vocab - 1);
    if (r->n_prompt > sv->max_pos)
        return dsi_errf(err, DSI_ERR_CONTEXT_FULL,
                        "prompt of %d tokens is longer than the context (%lld positions)",
                        r->n_prompt, (long long)sv->max_pos);
    if (q->n_stop && !sv->bpe)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "stop strings need a tokenizer (the model has no tokenizer.json)");
    if (q->response_format) { /* compiled here, in the caller's thread (cached per engine) */
        rc = dsi_rformat_get(sv->rfc, q->response_format, strlen(q->response_format), &r->rf, err);
        if (rc) return rc;
        r->rfc = sv->rfc;
    }
    r->tag = q->tag;
    r->n = q->n;
    r->stream = q->stream;
    r->logprobs = q->logprobs || q->top_logprobs > 0;
    r->n_top = q->top_logprobs;
    r->seed = q->has_seed ? q->seed : next_seed(sv);
    r->n_stop = q->n_stop;
    r->stop = dsi_calloc((size_t)DSI_MAX(q->n_stop, 1), sizeof(char *));
    r->stop_len = dsi_calloc((size_t)DSI_MAX(q->n_stop, 1), sizeof(size_t));
    if (!r->stop || !r->stop_len) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < q->n_stop; i++) {
        r->stop_len[i] = strlen(q->stop[i]);
        r->stop[i] = dup_mem(q->stop[i], r->stop_len[i] + 1);
        r->max_stop = DSI_MAX(r->max_stop, r->stop_len[i]);
    }
    r->n_stop_ids = q->n_stop_token_ids;
    r->stop_ids = dup_mem(q->stop_token_ids, sizeof(int32_t) * (size_t)q->n_stop_token_ids);
    int max_new = q->max_tokens ? q->max_tokens : 16;
    max_new = (int)DSI_MIN((int64_t)max_new, DSI_MAX(1, sv->max_pos - r->n_prompt));
    struct dsi_sample_params sp = {.temperature =
                                       q->temperature >= 0.0f ? q->temperature : sv->def_temp,
                                   .top_p = q->top_p > 0.0f ? q->top_p : sv->def_top_p,
                                   .top_k = q->top_k >= 0 ? q->top_k : sv->def_top_k,
                                   .min_p = q->min_p,
                                   .presence_penalty = q->presence_penalty,
                                   .frequency_penalty = q->frequency_penalty,
                                   .repetition_penalty = q->repetition_penalty,
                                   .seed = r->seed};
    r->c = dsi_calloc((size_t)r->n, sizeof(*r->c));
    if (!r->c) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    r->n_open = r->n;
    for (int i = 0; i < r->n; i++) {
        struct comp *c = &r->c[i];
        c->r = r;
        c->index = i;
        c->stop_i = -1;
        c->stop_token = -1;
        struct dsi_sseq *s = &c->q;
        s->prompt = r->prompt;
        s->n_prompt = r->n_prompt;
        s->max_new = max_new;
        s->gen = dsi_malloc(sizeof(int32_t) * (size_t)max_new);
        s->sp = sp;
        s->sp.stream = (uint32_t)i;
        s->ignore_eos = q->ignore_eos;
        s->stop_ids = r->stop_ids;
        s->n_stop_ids = r->n_stop_ids;
        s->user = c;
        s->slot = -1;
        s->leader = i > 0 && !sv->o.no_prefill_share ? &r->c[0].q : NULL;
        if (!s->gen) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        if (r->rf) { /* one matcher per completion; its mask buffer */
            rc = dsi_grammar_matcher_new(&s->matcher, dsi_rformat_grammar(r->rf), err);
            if (rc) return rc;
            s->n_mask = dsi_rformat_vocab_size(r->rf);
            s->mask = dsi_malloc(sizeof(uint32_t) * dsi_grammar_mask_words(s->n_mask));
            if (!s->mask) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        }
        if (r->logprobs) {
            s->lp = dsi_malloc(sizeof(float) * (size_t)max_new);
            s->n_top = r->n_top;
            if (r->n_top) {
                s->top_id = dsi_malloc(sizeof(int32_t) * (size_t)max_new * (size_t)r->n_top);
                s->top_lp = dsi_malloc(sizeof(float) * (size_t)max_new * (size_t)r->n_top);
            }
            if (!s->lp || (r->n_top && (!s->top_id || !s->top_lp)))
                return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        }
        if (sv->bpe) {
            rc = dsi_bpe_stream_new(&c->ds, sv->bpe, DSI_DECODE_SKIP_SPECIAL, err);
            if (rc) return rc;
            text_append(c, "", 0);
        }
    }
    return DSI_OK;
}

int dsi_submit(struct dsi_engine *e,
               const struct dsi_request *q,
               uint64_t *id,
               struct dsi_err *err) {
    struct dsi_serve *sv = serve_of(e);
    if (id) *id = 0;
    if (!sv) return dsi_errf(err, DSI_ERR_INVALID, "engine not opened with dsi_batch_open");
    struct req *r = dsi_calloc(1, sizeof(*r));
    struct msg *m = dsi_calloc(1, sizeof(*m));
    if (!r || !m) {
        free(r);
        free(m);
        return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    int rc = build_req(sv, q, r, err);
    if (rc) {
        free_req(r);
        free(m);
        return rc;
    }
    r->t_submit = dsi_time_s();
    m->kind = MSG_SUBMIT;
    m->r = r;
    pthread_mutex_lock(&sv->mu_ev);
    sv->n_inflight++;
    pthread_mutex_unlock(&sv->mu_ev);
    pthread_mutex_lock(&sv->mu_in);
    r->id = ++sv->next_id;
    if (id) *id = r->id;
    if (sv->in_tail)
        sv->in_tail->next = m;
    else
        sv->in_head = m;
    sv->in_tail = m;
    pthread_cond_broadcast(&sv->cv_in);
    pthread_mutex_unlock(&sv->mu_in);
    return DSI_OK;
}

int dsi_cancel(struct dsi_engine *e, uint64_t id) {
    struct dsi_serve *sv = serve_of(e);
    if (!sv) return DSI_ERR_INVALID;
    struct msg *m = dsi_calloc(1, sizeof(*m));
    if (!m) return DSI_ERR_NOMEM;
    m->kind = MSG_CANCEL;
    m->id = id;
    pthread_mutex_lock(&sv->mu_in);
    if (sv->in_tail)
        sv->in_tail->next = m;
    else
        sv->in_head = m;
    sv->in_tail = m;
    pthread_cond_broadcast(&sv->cv_in);
    pthread_mutex_unlock(&sv->mu_in);
    return DSI_OK;
}

/* ---- poll ------------------------------------------------------------------------------------ */

int dsi_poll(struct dsi_engine *e, struct dsi_event *ev, int max_events, int timeout_ms) {
    struct dsi_serve *sv = serve_of(e);
    if (!sv || max_events < 1) return DSI_ERR_INVALID;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms > 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&sv->mu_ev);
    struct ev_node *old = sv->ev_last;
    sv->ev_last = NULL;
    while (!sv->ev_head && sv->n_inflight > 0 && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&sv->cv_ev, &sv->mu_ev);
        else if (pthread_cond_timedwait(&sv->cv_ev, &sv->mu_ev, &dl) == ETIMEDOUT)
            break;
    }
    int n = 0;
    struct ev_node *last_tail = NULL;
    while (n < max_events && sv->ev_head) {
        struct ev_node *x = sv->ev_head;
        sv->ev_head = x->next;
        if (!sv->ev_head) sv->ev_tail = NULL;
        x->next = NULL;
        ev[n++] = x->ev;
        if (x->ev.kind == DSI_EVENT_DONE) {
            sv->n_inflight--;
            x->ev.result = NULL; /* handed to the caller */
        }
        if (last_tail)
            last_tail->next = x;
        else
            sv->ev_last = x;
        last_tail = x;
    }
    pthread_mutex_unlock(&sv->mu_ev);
    ev_free_list(old);
    return n;
}

void dsi_batch_get_stats(struct dsi_engine *e, struct dsi_batch_stats *st) {
    struct dsi_serve *sv = serve_of(e);
    memset(st, 0, sizeof(*st));
    if (!sv) return;
    pthread_mutex_lock(&sv->mu_ev);
    *st = sv->stats;
    st->n_inflight = sv->n_inflight;
    pthread_mutex_unlock(&sv->mu_ev);
}

int dsi_batch_tokenize(struct dsi_engine *e,
                       const char *text,
                       size_t len,
                       int32_t **ids,
                       int *n,
                       struct dsi_err *err) {
    struct dsi_serve *sv = serve_of(e);
    *ids = NULL;
    *n = 0;
    if (!sv || !sv->bpe) return dsi_errf(err, DSI_ERR_UNSUPPORTED, "no tokenizer");
    size_t nn = 0;
    int rc = dsi_bpe_encode(sv->bpe, text, len, true, ids, &nn, err);
    *n = (int)nn;
    return rc;
}
