/* draw.h - one token from one row of logits: temperature -> top-k -> top-p -> min-p -> keyed
 * Gumbel-max draw (the sampler's pipeline after penalties, run/sample.h; the backends' sample
 * op, backend.h). Pure: the result depends only on the row and the parameters.
 *
 *   temperature <= 0: greedy, argmax with ties to the lower id (a leading NaN wins, as in a
 *       sequential scan with `>`).
 *   Otherwise s[v] = x[v] / T (float). top-k keeps the k best by (s desc, id asc), sorted that
 *   way; without top-k but with top-p every token is sorted. top-p keeps the shortest prefix
 *   whose cumulative probability reaches top_p: exp(double(s - s_max)) summed in double in
 *   sorted order for the normaliser, then the running sum of exp(...) / z in the same order.
 *   min-p keeps double(s) >= double(s_max) + log(double(min_p)). The draw picks the kept token
 *   with the largest double(s) + Gumbel(v) (core/philox.h), ties to the lower id; if none has a
 *   value above -inf, the argmax (no top-k / top-p) or the first sorted candidate.
 *
 * Ownership: the caller provides the candidate scratch (dsi_draw_scratch entries). */
#ifndef DSI_DRAW_H
#define DSI_DRAW_H

#include <stdbool.h>
#include <stdint.h>

struct dsi_draw_params {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0 or >= n: off */
    float top_p;       /* >= 1 or <= 0: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;     /* Philox key */
    uint32_t stream;   /* completion index */
    int purpose;       /* enum dsi_sample_purpose (core/philox.h) */
};

/* A candidate: scaled logit and token id. */
struct dsi_draw_cand {
    float s;
    int32_t id;
};

/* Larger first, then the lower id: a strict total order (without NaN). */
static inline bool dsi_draw_before(const struct dsi_draw_cand *a, const struct dsi_draw_cand *b) {
    return a->s > b->s || (a->s == b->s && a->id < b->id);
}

/* Index of the largest x[i] (the first of equal ones) for n >= 1. */
int32_t dsi_draw_argmax(const float *x, int n);

/* Candidates of scratch dsi_draw needs for n tokens and these parameters (0, top_k or n). */
int dsi_draw_scratch(int n, const struct dsi_draw_params *p);

/* The token drawn from x[n] (n >= 1) at absolute position pos. c: dsi_draw_scratch(n, p)
 * candidates (may be NULL when that is 0). */
int32_t dsi_draw(
    const float *x, int n, const struct dsi_draw_params *p, int64_t pos, struct dsi_draw_cand *c);

#endif
