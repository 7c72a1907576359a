/* sample.c - the sampler; see sample.h for the pipeline and the keyed draw. */
#include "sample.h"

#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    float s;
    int32_t id;
};

struct dsi_sampler {
    int n_vocab;
    float *x;        /* [n_vocab] penalised logits */
    struct cand *c;  /* [n_vocab] candidates */
    uint32_t *stamp; /* [n_vocab] "seen in this pass" marks */
    uint32_t cur;
};

/* ---- Philox4x32-10 -------------------------------------------------------------------- */

void dsi_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static void philox_block(
    uint64_t seed, uint32_t stream, int purpose, int64_t pos, int32_t blk, uint32_t out[4]) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)pos, (uint32_t)purpose << 16, stream};
    dsi_philox4x32(ctr, key, out);
}

static double gumbel_of(uint32_t w) {
    double u = ((double)w + 0.5) * (1.0 / 4294967296.0); /* never 0 or 1 */
    return -log(-log(u));
}

double dsi_sample_gumbel(uint64_t seed, uint32_t stream, int purpose, int64_t pos, int32_t v) {
    uint32_t w[4];
    philox_block(seed, stream, purpose, pos, v / 4, w);
    return gumbel_of(w[v % 4]);
}

/* ---- scratch ---------------------------------------------------------------------------- */

struct dsi_sampler *dsi_sampler_new(int n_vocab) {
    struct dsi_sampler *s = dsi_calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->n_vocab = n_vocab;
    s->x = dsi_malloc(sizeof(float) * (size_t)n_vocab);
    s->c = dsi_malloc(sizeof(struct cand) * (size_t)n_vocab);
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

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Larger first, then the lower id: a strict total order, so sorting is deterministic. */
static bool before(const struct cand *a, const struct cand *b) {
    return a->s > b->s || (a->s == b->s && a->id < b->id);
}

static int cmp_cand(const void *pa, const void *pb) {
    const struct cand *a = pa, *b = pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Min-heap on `before` (the root is the worst kept candidate). */
static void heap_down(struct cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(&h[w], &h[l])) w = l;
        if (r < n && before(&h[w], &h[r])) w = r;
        if (w == i) return;
        struct cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best of x[v] / t over v < n into c[0..k), sorted. */
static void select_top(const float *x, float t, int n, int k, struct cand *c) {
    for (int i = 0; i < k; i++)
        c[i] = (struct cand){x[i] / t, i};
    for (int i = k / 2 - 1; i >= 0; i--)
        heap_down(c, k, i);
    for (int i = k; i < n; i++) {
        struct cand y = {x[i] / t, i};
        if (before(&y, &c[0])) {
            c[0] = y;
            heap_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof(*c), cmp_cand);
}

/* Temperature, top-k, top-p, min-p and the keyed Gumbel-max draw over x[n] (already
 * penalised); the scaled logit of v is x[v] / T, recomputed where needed (the same float
 * every time). c: scratch for n candidates. */
static int32_t
draw(const float *x, int n, const struct dsi_sample_params *p, int64_t pos, struct cand *c) {
    int32_t amax = argmax(x, n);
    float t = p->temperature;
    if (!(t > 0.0f)) return amax;
    float smax = x[amax] / t; /* division by t > 0 is monotonic: this is the largest x[v] / t */
    double minp_th = p->min_p > 0.0f ? (double)smax + log((double)p->min_p) : -HUGE_VAL;
    bool topk = p->top_k > 0 && p->top_k < n;
    bool topp = p->top_p > 0.0f && p->top_p < 1.0f;
    int32_t best = -1;
    double best_v = -HUGE_VAL;
    if (!topk && !topp) { /* every token min-p allows: no sort needed, one Philox per block */
        uint32_t w[4];
        for (int v = 0; v < n; v++) {
            if (v % 4 == 0) philox_block(p->seed, p->stream, DSI_PURPOSE_SAMPLE, pos, v / 4, w);
            float sv = x[v] / t;
            if ((double)sv < minp_th) continue;
            double g = (double)sv + gumbel_of(w[v % 4]);
            if (g > best_v) { /* strict: ties keep the lower id */
                best_v = g;
                best = v;
            }
        }
        return best >= 0 ? best : amax;
    }
    int m = n;
    if (topk) {
        m = p->top_k;
        select_top(x, t, n, m, c);
    } else {
        for (int i = 0; i < n; i++)
            c[i] = (struct cand){x[i] / t, i};
        qsort(c, (size_t)n, sizeof(*c), cmp_cand);
    }
    if (topp) {
        double z = 0.0, cum = 0.0;
        for (int i = 0; i < m; i++)
            z += exp((double)(c[i].s - smax));
        for (int i = 0; i < m; i++) {
            cum += exp((double)(c[i].s - smax)) / z;
            if (cum >= (double)p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    for (int i = 0; i < m; i++) {
        if ((double)c[i].s < minp_th) break; /* sorted: the rest are below too */
        double g = (double)c[i].s +
                   dsi_sample_gumbel(p->seed, p->stream, DSI_PURPOSE_SAMPLE, pos, c[i].id);
        if (g > best_v || (g == best_v && c[i].id < best)) {
            best_v = g;
            best = c[i].id;
        }
    }
    return best >= 0 ? best : c[0].id;
}

/* ---- public ------------------------------------------------------------------------------- */

void dsi_sample_logprobs(const float *logits, int n, int32_t chosen, struct dsi_sample_lp *lp) {
    float mx = logits[argmax(logits, n)];
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += exp((double)(logits[i] - mx));
    double lse = (double)mx + log(z);
    lp->chosen = (float)((double)logits[chosen] - lse);
    int k = DSI_MIN(DSI_MAX(lp->n_top, 0), DSI_MIN(n, DSI_SAMPLE_MAX_TOP));
    struct cand top[DSI_SAMPLE_MAX_TOP];
    int m = 0;
    for (int i = 0; i < n && k > 0; i++) { /* insertion into a sorted list of the k best */
        struct cand x = {logits[i], i};
        if (m == k && !before(&x, &top[m - 1])) continue;
        int j = m < k ? m++ : m - 1;
        while (j > 0 && before(&x, &top[j - 1])) {
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
    return draw(logits, n, &p, (int64_t)step, (struct cand *)(void *)work);
}
