/* engine.c - implements include/dsinfer.h on top of the model, the forward pass and the CPU
 * backend. Owns the backend, the model, the forward scratch and the sequence states. */
#include "dsinfer.h"

#include "cache/kv.h"
#include "model/forward.h"
#include "run/engine_impl.h"
#include "run/sample.h"
#include "tok/bpe.h"
#include "tok/chat.h"

#include <sys/stat.h>

#include <string.h>

static int
open_backend(struct dsi_backend **be, const struct dsi_engine_opts *o, struct dsi_err *err) {
    if (!o->backend || !strcmp(o->backend, "cpu"))
        return dsi_backend_cpu_new(be, o->n_threads, err);
    if (!strcmp(o->backend, "cuda")) {
#ifdef DSI_CUDA
        return dsi_backend_cuda_new(be, 0, err);
#else
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "backend cuda: this build has no CUDA (make CUDA=1)");
#endif
    }
    return dsi_errf(err, DSI_ERR_INVALID, "backend %s: want cpu or cuda", o->backend);
}

/* Headroom left free on a device for the backend's grow-only scratch (split-K chunk values,
 * attention scores, MoE tiles: a few hundred MB at 256 rows) and the runtime. */
#define DEVICE_HEADROOM(total) (((int64_t)1 << 30) + (int64_t)(total) / 50)

/* The cache pool and the forward. On a device backend the pool gets what is left after the
 * weights, the forward's buffers (measured: the forward is created first over a one-page pool)
 * and DEVICE_HEADROOM, up to every slot at max_ctx; on the host, every slot at max_ctx. */
static int open_cache(struct dsi_engine *e, struct dsi_kv_opts *ko, struct dsi_err *err) {
    struct dsi_backend *be = e->be;
    const struct dsi_config *c = &e->m->cfg;
    int rc;
    if (be->ops->mem_info) {
        struct dsi_kv_opts k1 = *ko;
        k1.n_pages = 1;
        rc = dsi_kv_new(&e->kv, c, be, &k1, err);
        if (!rc) rc = dsi_fwd_new(&e->fwd, e->m, be, e->kv, e->max_rows, e->numerics, err);
        if (!rc) rc = be->ops->sync(be, err);
        size_t fr = 0, tot = 0;
        if (!rc && be->ops->mem_info(be, &fr, &tot))
            rc = dsi_errf(err, DSI_ERR_DEVICE, "cache: cannot read the device's free memory");
        if (rc) return rc;
        int64_t pb = dsi_kv_page_bytes(c, ko->dtype), pt = dsi_kv_page_tokens(c);
        int64_t full = ko->max_seqs * ((ko->max_ctx + pt - 1) / pt);
        int64_t avail = (int64_t)fr + pb - DEVICE_HEADROOM(tot); /* + the one page held now */
        int64_t fit = pb > 0 ? avail / pb : full;
        int64_t one = (ko->max_ctx + pt - 1) / pt; /* one sequence at max_ctx */
        if (fit < one)
            return dsi_errf(err, DSI_ERR_NOMEM,
                            "cache: %lld bytes of device memory free after the weights and the "
                            "forward's buffers; one sequence of %lld positions needs %lld more "
                            "(plus %lld headroom)",
                            (long long)fr, (long long)ko->max_ctx, (long long)(one * pb),
                            (long long)DEVICE_HEADROOM(tot));
        ko->n_pages = DSI_MIN(fit, full);
        dsi_fwd_free(e->fwd);
        e->fwd = NULL;
        dsi_kv_free(e->kv);
        e->kv = NULL;
        if (ko->n_pages < full)
            dsi_log(DSI_LOG_INFO, "cache: %lld of %lld pages (%lld positions) fit in device memory",
                    (long long)ko->n_pages, (long long)full, (long long)(ko->n_pages * pt));
    }
    rc = dsi_kv_new(&e->kv, c, be, ko, err);
    if (!rc) rc = dsi_fwd_new(&e->fwd, e->m, be, e->kv, e->max_rows, e->numerics, err);
    return rc;
}

/* The cache's key-row format for the kv_cache option (enum dsi_kv_cache_opt). */
static int kv_dtype(const struct dsi_engine *e, int opt, int *dtype, struct dsi_err *err) {
    const struct dsi_config *c = &e->m->cfg;
    bool qat = e->numerics != DSI_NUMERICS_PLAIN;
    bool fits = dsi_kv_fp8_ok((int)c->head_dim, (int)c->qk_rope_head_dim);
    *dtype = DSI_KV_F32;
    if (opt == DSI_OPT_KV_AUTO || opt == DSI_OPT_KV_F32) {
        if (opt == DSI_OPT_KV_AUTO && qat && fits && e->be->kv_fp8) *dtype = DSI_KV_FP8;
        return DSI_OK;
    }
    if (opt != DSI_OPT_KV_FP8)
        return dsi_errf(err, DSI_ERR_INVALID, "kv_cache: unknown option %d (want auto, f32, fp8)",
                        opt);
    if (!qat)
        return dsi_errf(err, DSI_ERR_INVALID,
                        "kv cache fp8: numerics plain keeps the cache's values in fp32 (they are "
                        "not FP8 values); use --numerics reference or fast, or the f32 cache");
    if (!fits)
        return dsi_errf(err, DSI_ERR_INVALID,
                        "kv cache fp8: config.json's head_dim - qk_rope_head_dim (%lld) must be a "
                        "positive multiple of 64 and qk_rope_head_dim (%lld) a multiple of 8",
                        (long long)(c->head_dim - c->qk_rope_head_dim),
                        (long long)c->qk_rope_head_dim);
    if (!e->be->kv_fp8)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "kv cache fp8: the %s backend stores fp32 rows only", e->be->name);
    *dtype = DSI_KV_FP8;
    return DSI_OK;
}

int dsi_engine_open(struct dsi_engine **out, const struct dsi_engine_opts *o, struct dsi_err *err) {
    *out = NULL;
    struct dsi_engine *e = dsi_calloc(1, sizeof(*e));
    if (!e) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    e->max_rows = o->max_rows > 0 ? o->max_rows : 256;
    e->max_ctx = o->max_ctx > 0 ? o->max_ctx : 4096;
    e->numerics = o->numerics == DSI_OPT_NUMERICS_REFERENCE ? DSI_NUMERICS_REFERENCE
                  : o->numerics == DSI_OPT_NUMERICS_FAST    ? DSI_NUMERICS_FAST
                                                            : DSI_NUMERICS_PLAIN;
    int rc = dsi_model_load(&e->m, o->model_dir, err);
    if (!rc) rc = open_backend(&e->be, o, err);
    if (!rc) rc = dsi_model_import(e->m, e->be, err);
    char tp[4096];
    struct stat sb;
    snprintf(tp, sizeof(tp), "%s/tokenizer.json", o->model_dir);
    if (!rc && stat(tp, &sb) == 0) rc = dsi_bpe_open(&e->tok, o->model_dir, err);
    struct dsi_kv_opts ko = {.max_seqs = o->max_seqs > 0 ? o->max_seqs : 16,
                             .max_ctx = e->max_ctx,
                             .max_rows = e->max_rows};
    if (!rc) rc = kv_dtype(e, o->kv_cache, &ko.dtype, err);
    if (!rc) rc = open_cache(e, &ko, err);
    if (rc) {
        dsi_engine_close(e);
        return rc;
    }
    *out = e;
    return DSI_OK;
}

void dsi_engine_close(struct dsi_engine *e) {
    if (!e) return;
    if (e->serve) { /* a serving engine: stop its threads first (dsi_batch_close frees all) */
        dsi_batch_close(e);
        return;
    }
    dsi_fwd_free(e->fwd);
    dsi_kv_free(e->kv);
    dsi_backend_free(e->be);
    dsi_model_free(e->m);
    dsi_bpe_free(e->tok);
    free(e);
}

bool dsi_engine_has_tokenizer(const struct dsi_engine *e) { return e->tok != NULL; }

int dsi_engine_encode(const struct dsi_engine *e,
                      const char *text,
                      size_t len,
                      bool parse_special,
                      int32_t **ids,
                      size_t *n,
                      struct dsi_err *err) {
    if (!e->tok) return dsi_errf(err, DSI_ERR_UNSUPPORTED, "model has no tokenizer.json");
    return dsi_bpe_encode(e->tok, text, len, parse_special, ids, n, err);
}

int32_t dsi_engine_bos_id(const struct dsi_engine *e) {
    int32_t b = e->tok ? dsi_bpe_bos_id(e->tok) : -1;
    return b >= 0 ? b : e->m->cfg.bos_token_id;
}

struct dsi_text_stream {
    struct dsi_bpe_stream *s;
};

int dsi_text_stream_new(struct dsi_text_stream **out,
                        const struct dsi_engine *e,
                        struct dsi_err *err) {
    *out = NULL;
    if (!e->tok) return dsi_errf(err, DSI_ERR_UNSUPPORTED, "model has no tokenizer.json");
    struct dsi_text_stream *t = dsi_calloc(1, sizeof(*t));
    if (!t) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    int rc = dsi_bpe_stream_new(&t->s, e->tok, DSI_DECODE_SKIP_SPECIAL, err);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    return DSI_OK;
}

void dsi_text_stream_free(struct dsi_text_stream *s) {
    if (!s) return;
    dsi_bpe_stream_free(s->s);
    free(s);
}

int dsi_text_stream_feed(
    struct dsi_text_stream *s, int32_t id, const char **text, size_t *len, struct dsi_err *err) {
    return dsi_bpe_stream_feed(s->s, id, text, len, err);
}

void dsi_text_stream_flush(struct dsi_text_stream *s, const char **text, size_t *len) {
    dsi_bpe_stream_flush(s->s, text, len);
}

int dsi_engine_vocab_size(const struct dsi_engine *e) { return e->m->cfg.vocab_size; }
int dsi_engine_eos_id(const struct dsi_engine *e) { return e->m->cfg.eos_token_id; }

void dsi_engine_sampling_defaults(const struct dsi_engine *e,
                                  float *temperature,
                                  float *top_p,
                                  int *top_k) {
    *temperature = (float)e->m->cfg.gen_temperature;
    *top_p = (float)e->m->cfg.gen_top_p;
    *top_k = e->m->cfg.gen_top_k;
}

int dsi_engine_prompt_logits(struct dsi_engine *e,
                             const int32_t *const *prompts,
                             const int *lens,
                             int n_prompts,
                             int chunk,
                             float *out,
                             float *mtp_out,
                             struct dsi_err *err) {
    const struct dsi_config *c = &e->m->cfg;
    int64_t V = c->vocab_size, HC = c->hc_dim;
    int rc = DSI_OK;
    if (n_prompts < 1 || n_prompts > e->kv->max_seqs)
        return dsi_errf(err, DSI_ERR_INVALID, "%d prompts, want 1..%d", n_prompts, e->kv->max_seqs);
    if (chunk <= 0) chunk = e->max_rows;
    if ((int64_t)chunk * n_prompts > e->max_rows) chunk = e->max_rows / n_prompts;
    if (chunk < 1)
        return dsi_errf(err, DSI_ERR_INVALID, "%d prompts do not fit in %d rows per step",
                        n_prompts, e->max_rows);
    for (int p = 0; p < n_prompts; p++) {
        if (lens[p] < 1) return dsi_errf(err, DSI_ERR_INVALID, "prompt %d is empty", p);
        if (lens[p] > e->max_ctx)
            return dsi_errf(err, DSI_ERR_CONTEXT_FULL, "prompt %d: %d tokens, context is %lld", p,
                            lens[p], (long long)e->max_ctx);
        for (int i = 0; i < lens[p]; i++)
            if (prompts[p][i] < 0 || prompts[p][i] >= V)
                return dsi_errf(err, DSI_ERR_INVALID,
                                "prompt %d: token id %d at position %d is out of range 0..%lld", p,
                                prompts[p][i], i, (long long)V - 1);
    }
    int *slots = dsi_calloc((size_t)n_prompts, sizeof(int));
    int32_t *tok = dsi_malloc(sizeof(int32_t) * (size_t)e->max_rows);
    int32_t *pos = dsi_malloc(sizeof(int32_t) * (size_t)e->max_rows);
    int32_t *slot = dsi_malloc(sizeof(int32_t) * (size_t)e->max_rows);
    int *owner = dsi_malloc(sizeof(int) * (size_t)e->max_rows);
    float *lg = dsi_malloc(sizeof(float) * (size_t)(e->max_rows * V));
    float *st = mtp_out ? dsi_malloc(sizeof(float) * (size_t)(e->max_rows * HC)) : NULL;
    int64_t total = 0;
    for (int p = 0; p < n_prompts; p++)
        total += lens[p];
    /* streams of every position, kept for the MTP pass */
    float *all_st = mtp_out ? dsi_malloc(sizeof(float) * (size_t)(total * HC)) : NULL;
    int64_t *off = dsi_calloc((size_t)n_prompts + 1, sizeof(int64_t));
    int n_open = 0;
    if (!slots || !tok || !pos || !slot || !owner || !lg || (mtp_out && (!st || !all_st)) || !off) {
        rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < n_prompts; p++)
        off[p + 1] = off[p] + lens[p];
    for (int p = 0; p < n_prompts && !rc; p++) {
        rc = dsi_kv_seq_new(e->kv, &slots[p], err);
        if (!rc) n_open++;
        if (!rc) rc = dsi_kv_reserve(e->kv, slots[p], lens[p], err);
    }
    /* Main model: every step takes up to `chunk` rows from each prompt. */
    for (int pass = 0; pass < (mtp_out ? 2 : 1) && !rc; pass++) {
        bool mtp = pass == 1;
        for (;;) {
            int n = 0;
            for (int p = 0; p < n_prompts; p++) {
                const struct dsi_kv_seq_info *si = &e->kv->seqs[slots[p]];
                int64_t at = mtp ? si->mtp_n_past : si->n_past, end = mtp ? lens[p] - 1 : lens[p];
                for (int k = 0; k < chunk && at + k < end; k++) {
                    tok[n] = prompts[p][at + k + (mtp ? 1 : 0)];
                    pos[n] = (int32_t)(at + k);
                    slot[n] = slots[p];
                    owner[n] = p;
                    if (mtp)
                        memcpy(st + (int64_t)n * HC, all_st + (off[p] + at + k) * HC,
                               sizeof(float) * (size_t)HC);
                    n++;
                }
            }
            if (!n || rc) break;
            struct dsi_batch b = {n, tok, pos, slot, NULL};
            rc = mtp ? dsi_mtp_forward(e->fwd, &b, st, lg, err)
                     : dsi_forward(e->fwd, &b, lg, st, err);
            for (int r = 0; r < n && !rc; r++) {
                int p = owner[r];
                float *dst =
                    mtp ? mtp_out + (off[p] - p + pos[r]) * V : out + (off[p] + pos[r]) * V;
                memcpy(dst, lg + r * V, sizeof(float) * (size_t)V);
                if (all_st && !mtp)
                    memcpy(all_st + (off[p] + pos[r]) * HC, st + r * HC,
                           sizeof(float) * (size_t)HC);
            }
        }
    }
out:
    for (int p = 0; p < n_open; p++)
        dsi_kv_seq_free(e->kv, slots[p]);
    free(slots);
    free(tok);
    free(pos);
    free(slot);
    free(owner);
    free(lg);
    free(st);
    free(all_st);
    free(off);
    return rc;
}

int dsi_engine_generate(struct dsi_engine *e,
                        const int32_t *prompt,
                        int len,
                        int n_new,
                        const struct dsi_sampling *s,
                        dsi_token_fn fn,
                        void *user,
                        struct dsi_err *err) {
    const struct dsi_config *c = &e->m->cfg;
    int64_t V = c->vocab_size;
    if (len < 1) return dsi_errf(err, DSI_ERR_INVALID, "empty prompt");
    if (len + n_new > e->max_ctx)
        return dsi_errf(err, DSI_ERR_CONTEXT_FULL,
                        "prompt (%d tokens) + %d new tokens exceed the context of %lld", len, n_new,
                        (long long)e->max_ctx);
    for (int i = 0; i < len; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "prompt token id %d at position %d is out of range 0..%lld", prompt[i],
                            i, (long long)V - 1);
    int seq = 0;
    int rc = dsi_kv_seq_new(e->kv, &seq, err);
    if (rc) return rc;
    rc = dsi_kv_reserve(e->kv, seq, len + n_new, err);
    int32_t *tok = dsi_malloc(sizeof(int32_t) * (size_t)e->max_rows);
    int32_t *pos = dsi_malloc(sizeof(int32_t) * (size_t)e->max_rows);
    int32_t *rs = dsi_malloc(sizeof(int32_t) * (size_t)e->max_rows);
    uint8_t *want = dsi_calloc((size_t)e->max_rows, 1);
    float *lg = dsi_malloc(sizeof(float) * (size_t)V);
    float *work = dsi_malloc(sizeof(float) * (size_t)(2 * V));
    if (!rc && (!tok || !pos || !rs || !want || !lg || !work)) {
        rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int at = 0; at < len && !rc;) { /* chunked prefill; logits for the last row only */
        int n = DSI_MIN(e->max_rows, len - at);
        for (int k = 0; k < n; k++) {
            tok[k] = prompt[at + k];
            pos[k] = at + k;
            rs[k] = seq;
            want[k] = at + k == len - 1;
        }
        struct dsi_batch b = {n, tok, pos, rs, want};
        rc = dsi_forward(e->fwd, &b, lg, NULL, err);
        at += n;
    }
    for (int i = 0; i < n_new && !rc; i++) {
        int32_t t = dsi_sample(lg, (int)V, s->temperature, s->top_p, s->top_k, s->seed,
                               (uint64_t)(len + i), work);
        if (fn && fn(t, user)) break;
        if (t == c->eos_token_id || i + 1 == n_new) break;
        tok[0] = t;
        pos[0] = len + i;
        rs[0] = seq;
        want[0] = 1;
        struct dsi_batch b = {1, tok, pos, rs, want};
        rc = dsi_forward(e->fwd, &b, lg, NULL, err);
    }
out:
    dsi_kv_seq_free(e->kv, seq);
    free(tok);
    free(pos);
    free(rs);
    free(want);
    free(lg);
    free(work);
    return rc;
}

/* One user turn through the DeepSeek-V4 chat encoder (src/tok/chat.c, spec 9). */
int dsi_engine_chat_prompt(const struct dsi_engine *e,
                           const char *user_text,
                           bool think,
                           char **out,
                           struct dsi_err *err) {
    (void)e;
    return dsi_chat_render_prompt(NULL, user_text,
                                  think ? DSI_CHAT_MODE_THINKING : DSI_CHAT_MODE_CHAT,
                                  DSI_CHAT_EFFORT_NONE, out, NULL, err);
}
