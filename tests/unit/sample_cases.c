/* sample_cases.c - batches for the sample op tests; see sample_cases.h. */
#include "unit/sample_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct crng {
    uint64_t s;
};

static uint64_t cnext(struct crng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double cunif(struct crng *r) {
    return (double)(cnext(r) >> 11) * (1.0 / 9007199254740992.0);
}
static int cbelow(struct crng *r, int n) { return (int)(cnext(r) % (uint64_t)n); }

static float cnorm(struct crng *r) {
    double u = cunif(r), v = cunif(r);
    if (u < 1e-300) u = 1e-300;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

enum { N_KINDS = 9 };

/* One row of logits of the given kind. */
static void fill_row(float *x, int64_t V, int kind, struct crng *r) {
    switch (kind) {
    case 0: /* normal */
        for (int64_t i = 0; i < V; i++)
            x[i] = 3.0f * cnorm(r);
        break;
    case 1: /* a grammar mask: 30% -inf */
        for (int64_t i = 0; i < V; i++)
            x[i] = cunif(r) < 0.3 ? -INFINITY : 3.0f * cnorm(r);
        break;
    case 2: /* integers: ties everywhere, the maximum included */
        for (int64_t i = 0; i < V; i++)
            x[i] = rintf(2.0f * cnorm(r));
        break;
    case 3: /* all but one -inf */
        for (int64_t i = 0; i < V; i++)
            x[i] = -INFINITY;
        x[cbelow(r, (int)V)] = cnorm(r);
        break;
    case 4: /* all -inf */
        for (int64_t i = 0; i < V; i++)
            x[i] = -INFINITY;
        break;
    case 5: { /* signed zeros and a few values */
        static const float vals[5] = {-0.0f, 0.0f, -1.0f, 1.0f, 0.5f};
        for (int64_t i = 0; i < V; i++)
            x[i] = vals[cbelow(r, 5)];
        break;
    }
    case 6: /* huge: x / T overflows to inf for T < 1 */
        for (int64_t i = 0; i < V; i++)
            x[i] = 1e37f * cnorm(r);
        break;
    case 7: /* subnormal */
        for (int64_t i = 0; i < V; i++)
            x[i] = 1e-41f * cnorm(r);
        break;
    default: /* steps of 1/64: ties near every top-k boundary */
        for (int64_t i = 0; i < V; i++)
            x[i] = rintf(64.0f * cnorm(r)) / 64.0f;
        break;
    }
}

struct pset {
    float temperature, top_p, min_p;
    int top_k;
};

static const struct pset g_psets[] = {
    {0.0f, 1.0f, 0.0f, 0},       /* greedy */
    {-1.0f, 0.5f, 0.1f, 50},     /* greedy (temperature < 0; the rest ignored) */
    {1.0f, 1.0f, 0.0f, 0},       /* temperature only */
    {0.7f, 0.0f, 0.0f, 0},       /* temperature only (top_p 0: off) */
    {1.5f, 1.0f, 0.05f, 0},      /* min-p */
    {1.0f, 1.0f, 0.5f, 0},       /* min-p, strong */
    {1.0f, 1.0f, 1.5f, 0},       /* min-p > 1: nothing kept, the argmax */
    {1.0f, 1.0f, 0.0f, 1},       /* top-k 1 */
    {1.0f, 1.0f, 0.0f, 2},       /* top-k 2 */
    {0.8f, 1.0f, 0.0f, 50},      /* top-k 50 */
    {1.0f, 1.0f, 0.0f, 1024},    /* top-k 1024 */
    {1.1f, 1.0f, 0.0f, 1023},    /* top-k 1023 */
    {1.0f, 0.1f, 0.0f, 50},      /* top-k + top-p 0.1 */
    {1.0f, 0.9f, 0.0f, 50},      /* top-k + top-p 0.9 */
    {1.0f, 0.9f, 0.01f, 1024},   /* top-k + top-p + min-p */
    {1.2f, 0.9f, 0.2f, 2},       /* top-k 2 + top-p + min-p */
    {1.0f, 1e-9f, 0.0f, 50},     /* top-p keeps one */
    {1.0f, 0.9f, 0.0f, 0},       /* top-p without top-k: not taken (unless greedy) */
    {1.0f, 1.0f, 0.0f, 1025},    /* top-k > 1024: not taken where < n_vocab */
    {1.0f, 0.95f, 0.0f, 200000}, /* top-k >= n_vocab: off; top-p: not taken */
    {1e-30f, 1.0f, 0.0f, 0},     /* tiny temperature: x / T overflows */
    {1e-30f, 0.5f, 0.0f, 50},    /* the same with top-k + top-p */
    {3.0f, 1.0f, 0.0f, 7},       /* top-k = 7: off at n_vocab 7 */
};
enum { N_PSETS = sizeof(g_psets) / sizeof(g_psets[0]) };

static void row_params(struct dsi_sample_row *row, const struct pset *ps, struct crng *r) {
    memset(row, 0, sizeof(*row));
    row->temperature = ps->temperature;
    row->top_p = ps->top_p;
    row->min_p = ps->min_p;
    row->top_k = ps->top_k;
    row->seed = cnext(r);
    row->stream = (uint32_t)cbelow(r, 4);
    row->pos = cbelow(r, 5) == 0 ? (int64_t)(cnext(r) % ((uint64_t)1 << 40)) : cbelow(r, 100000);
}

static int alloc_case(struct sample_case *c, int64_t n, int64_t V, int64_t ld) {
    memset(c, 0, sizeof(*c));
    c->n = n;
    c->n_vocab = V;
    c->ld = ld;
    c->logits = malloc(sizeof(float) * (size_t)(n * ld));
    c->rows = malloc(sizeof(*c->rows) * (size_t)n);
    if (!c->logits || !c->rows) {
        sample_case_free(c);
        return -1;
    }
    for (int64_t i = 0; i < n * ld; i++)
        c->logits[i] = 1e30f; /* padding: wins everything if read */
    return 0;
}

static const struct {
    int64_t V, pad, rows; /* rows 0: every parameter set with every kind of logits */
} g_cases[] = {
    {1, 0, 0},    {1, 3, 0},    {7, 0, 0},    {7, 3, 0},       {1000, 0, 0},
    {1000, 5, 0}, {1025, 0, 0}, {1024, 1, 0}, {129280, 3, 48},
};

int sample_cases_count(void) { return (int)(sizeof(g_cases) / sizeof(g_cases[0])); }

int sample_case_make(struct sample_case *c, int i, uint64_t seed) {
    int64_t V = g_cases[i].V, ld = V + g_cases[i].pad;
    int64_t n = g_cases[i].rows ? g_cases[i].rows : (int64_t)N_PSETS * N_KINDS;
    if (alloc_case(c, n, V, ld)) return -1;
    snprintf(c->name, sizeof(c->name), "n_vocab %lld, ld %lld, %lld rows", (long long)V,
             (long long)ld, (long long)n);
    struct crng r = {seed * 0x2545f4914f6cdd1dull + (uint64_t)i};
    for (int64_t k = 0; k < n; k++) {
        int p = (int)(k % N_PSETS);
        int kind = g_cases[i].rows ? (int)((k * 5 + k / N_PSETS) % N_KINDS) : (int)(k / N_PSETS);
        fill_row(c->logits + k * ld, V, kind, &r);
        row_params(&c->rows[k], &g_psets[p], &r);
    }
    return 0;
}

int sample_case_serving(struct sample_case *c, int64_t n, int64_t V, uint64_t seed) {
    if (alloc_case(c, n, V, V)) return -1;
    snprintf(c->name, sizeof(c->name), "serving mix: n_vocab %lld, %lld rows", (long long)V,
             (long long)n);
    struct crng r = {seed * 0x9e3779b97f4a7c15ull + 77};
    for (int64_t k = 0; k < n; k++) {
        float *x = c->logits + k * V;
        for (int64_t i = 0; i < V; i++)
            x[i] = 2.5f * cnorm(&r);
        if (k % 4 == 1) x[cbelow(&r, (int)V)] += 15.0f; /* a confident row */
        if (k % 10 == 3)                                /* a grammar mask */
            for (int64_t i = 0; i < V; i++)
                if (cbelow(&r, 8)) x[i] = -INFINITY;
        struct pset ps = {0.0f, 1.0f, 0.0f, 0};
        int kind = cbelow(&r, 20);
        if (kind >= 4) ps.temperature = 0.6f + 0.6f * (float)cunif(&r);
        if (kind >= 8 && kind < 15) {
            ps.top_k = 20 + cbelow(&r, 81);
            ps.top_p = 0.8f + 0.15f * (float)cunif(&r);
        } else if (kind >= 15 && kind < 18) {
            ps.min_p = 0.05f;
        } else if (kind >= 18) {
            ps.top_k = 1 + cbelow(&r, DSI_SAMPLE_OP_MAX_TOPK);
            ps.top_p = 0.9f;
            ps.min_p = 0.02f;
        }
        row_params(&c->rows[k], &ps, &r);
    }
    return 0;
}

void sample_case_free(struct sample_case *c) {
    free(c->logits);
    free(c->rows);
    c->logits = NULL;
    c->rows = NULL;
}
