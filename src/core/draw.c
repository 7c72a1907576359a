/* draw.c - the draw pipeline over one row; see draw.h. */
#include "draw.h"

#include "philox.h"

#include <math.h>
#include <stdlib.h>

int32_t dsi_draw_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int cmp_cand(const void *pa, const void *pb) {
    const struct dsi_draw_cand *a = pa, *b = pb;
    return dsi_draw_before(a, b) ? -1 : dsi_draw_before(b, a) ? 1 : 0;
}

/* Min-heap on `before` (the root is the worst kept candidate). */
static void heap_down(struct dsi_draw_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && dsi_draw_before(&h[w], &h[l])) w = l;
        if (r < n && dsi_draw_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        struct dsi_draw_cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best of x[v] / t over v < n into c[0..k), sorted. */
static void select_top(const float *x, float t, int n, int k, struct dsi_draw_cand *c) {
    for (int i = 0; i < k; i++)
        c[i] = (struct dsi_draw_cand){x[i] / t, i};
    for (int i = k / 2 - 1; i >= 0; i--)
        heap_down(c, k, i);
    for (int i = k; i < n; i++) {
        struct dsi_draw_cand y = {x[i] / t, i};
        if (dsi_draw_before(&y, &c[0])) {
            c[0] = y;
            heap_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof(*c), cmp_cand);
}

int dsi_draw_scratch(int n, const struct dsi_draw_params *p) {
    if (!(p->temperature > 0.0f)) return 0;
    if (p->top_k > 0 && p->top_k < n) return p->top_k;
    return p->top_p > 0.0f && p->top_p < 1.0f ? n : 0;
}

/* The scaled logit of v is x[v] / T, recomputed where needed (the same float every time). */
int32_t dsi_draw(
    const float *x, int n, const struct dsi_draw_params *p, int64_t pos, struct dsi_draw_cand *c) {
    int32_t amax = dsi_draw_argmax(x, n);
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
            if (v % 4 == 0) dsi_philox_block(p->seed, p->stream, p->purpose, pos, v / 4, w);
            float sv = x[v] / t;
            if ((double)sv < minp_th) continue;
            double g = (double)sv + dsi_gumbel_of(w[v % 4]);
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
            c[i] = (struct dsi_draw_cand){x[i] / t, i};
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
        double g = (double)c[i].s + dsi_philox_gumbel(p->seed, p->stream, p->purpose, pos, c[i].id);
        if (g > best_v || (g == best_v && c[i].id < best)) {
            best_v = g;
            best = c[i].id;
        }
    }
    return best >= 0 ? best : c[0].id;
}
