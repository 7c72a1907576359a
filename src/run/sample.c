/* sample.c - the sampler; see sample.h for the pipeline and the keyed draw. */
#include "sample.h"

#include "core/core.h"
#include "core/draw.h"
#include "core/philox.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dsi_sampler {
    int n_vocab;
    float *x;                /* [n_vocab] penalised logits */
    struct dsi_draw_cand *c; /* [n_vocab] candidates */
    uint32_t *stamp;         /* [n_vocab] "seen in this pass" marks */
    uint32_t cur;
};

/* ---- Philox (core/philox.h) ------------------------------------------------------------- */

double dsi_sample_gumbel(uint64_t seed, uint32_t stream, int purpose, int64_t pos, int32_t v) {
    return dsi_philox_gumbel(seed, stream, purpose, pos, v);
}

/* ---- scratch ---------------------------------------------------------------------------- */

struct dsi_sampler *dsi_sampler_new(int n_vocab) {
    struct dsi_sampler *s = dsi_calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->n_vocab = n_vocab;
    s->x = dsi_malloc(sizeof(float) * (size_t)n_vocab);
    s->c = dsi_malloc(sizeof(struct dsi_draw_cand) * (size_t)n_vocab);
    s->stamp = dsi_calloc((size_t)n_vocab, sizeof(uint32_t));
    if (!s->x || !s->c || !s->stamp) {
        dsi_sampler_free(s);
        return NULL;
    }
    return s;
}

void dsi_sampler_free(struct dsi_sampler *s) {
    if (!s) return;
    free(s->x);
    free(s->c);
    free(s->stamp);
    free(s);
}

/* A fresh "seen" mark (stamps never need clearing except on wrap-around). */
static uint32_t next_stamp(struct dsi_sampler *s) {
    if (++s->cur == 0) {
        memset(s->stamp, 0, sizeof(uint32_t) * (size_t)s->n_vocab);
        s->cur = 1;
    }
    return s->cur;
}

/* ---- pipeline stages ---------------------------------------------------------------------- */

static bool has_penalty(const struct dsi_sample_params *p) {
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           (p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f);
}

/* Repetition (distinct tokens of prompt + generated), then frequency and presence (generated). */
static void apply_penalties(struct dsi_sampler *s,
                            float *x,
                            const struct dsi_sample_params *p,
                            const struct dsi_sample_hist *h) {
    int n = s->n_vocab;
    float r = p->repetition_penalty;
    if (r > 0.0f && r != 1.0f) {
        uint32_t st = next_stamp(s);
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *t = pass ? h->gen : h->prompt;
            int m = pass ? h->n_gen : h->n_prompt;
            for (int i = 0; i < m; i++) {
                int32_t v = t[i];
                if (v < 0 || v >= n || s->stamp[v] == st) continue;
                s->stamp[v] = st;
                x[v] = x[v] > 0.0f ? x[v] / r : x[v] * r;
            }
        }
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        uint32_t st = next_stamp(s);
        for (int i = 0; i < h->n_gen; i++) {
            int32_t v = h->gen[i];
            if (v < 0 || v >= n) continue;
            x[v] -= p->frequency_penalty;
            if (s->stamp[v] != st) {
                s->stamp[v] = st;
                x[v] -= p->presence_penalty;
            }
        }
    }
}

/* Temperature, top-k, top-p, min-p and the keyed Gumbel-max draw over x[n] (already
 * penalised): core/draw.c. c: scratch for n candidates. */
static int32_t draw(const float *x,
                    int n,
                    const struct dsi_sample_params *p,
                    int64_t pos,
                    struct dsi_draw_cand *c) {
    struct dsi_draw_params d = {.temperature = p->temperature,
                                .top_k = p->top_k,
                                .top_p = p->top_p,
                                .min_p = p->min_p,
                                .seed = p->seed,
                                .stream = p->stream,
                                .purpose = DSI_PURPOSE_SAMPLE};
    return dsi_draw(x, n, &d, pos, c);
}

/* ---- public ------------------------------------------------------------------------------- */

void dsi_sample_logprobs(const float *logits, int n, int32_t chosen, struct dsi_sample_lp *lp) {
    float mx = logits[dsi_draw_argmax(logits, n)];
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += exp((double)(logits[i] - mx));
    double lse = (double)mx + log(z);
    lp->chosen = (float)((double)logits[chosen] - lse);
    int k = DSI_MIN(DSI_MAX(lp->n_top, 0), DSI_MIN(n, DSI_SAMPLE_MAX_TOP));
    struct dsi_draw_cand top[DSI_SAMPLE_MAX_TOP];
    int m = 0;
    for (int i = 0; i < n && k > 0; i++) { /* insertion into a sorted list of the k best */
        struct dsi_draw_cand x = {logits[i], i};
        if (m == k && !dsi_draw_before(&x, &top[m - 1])) continue;
        int j = m < k ? m++ : m - 1;
        while (j > 0 && dsi_draw_before(&x, &top[j - 1])) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = x;
    }
    for (int i = 0; i < k; i++) {
        lp->top_id[i] = top[i].id;
        lp->top_lp[i] = (float)((double)top[i].s - lse);
    }
}

int32_t dsi_sampler_sample(struct dsi_sampler *s,
                           const float *logits,
                           const struct dsi_sample_params *p,
                           const struct dsi_sample_hist *hist,
                           int64_t pos,
                           struct dsi_sample_lp *lp) {
    const float *x = logits;
    if (hist && has_penalty(p)) {
        memcpy(s->x, logits, sizeof(float) * (size_t)s->n_vocab);
        apply_penalties(s, s->x, p, hist);
        x = s->x;
    }
    int32_t t = draw(x, s->n_vocab, p, pos, s->c);
    if (lp) dsi_sample_logprobs(logits, s->n_vocab, t, lp);
    return t;
}

int32_t dsi_sample(const float *logits,
                   int n,
                   float temperature,
                   float top_p,
                   int top_k,
                   uint64_t seed,
                   uint64_t step,
                   float *work) {
    struct dsi_sample_params p = {.temperature = temperature,
                                  .top_p = top_p,
                                  .top_k = top_k,
                                  .repetition_penalty = 1.0f,
                                  .seed = seed};
    /* work: 2n floats = n candidates (float + int32 each); malloc'd memory, so any type. */
    return draw(logits, n, &p, (int64_t)step, (struct dsi_draw_cand *)(void *)work);
}
