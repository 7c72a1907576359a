/* attn.c - CPU attention with sinks over the window ring and the compressed entries, and the
 * lightning indexer's scores and top-k. Parallel over (row, head) pairs / rows; every sum is
 * in a fixed order (window oldest first, then entries in index order). */
#include "cpu_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct attn_job {
    struct dsi_backend *be;
    const struct dsi_attn_args *a;
    int64_t max_keys;
};

/* Fill keys[] with the row's keys (F32 rows in place; FP8 rows decoded into dec, one row of
 * head_dim floats per key); returns the count. */
static int row_keys(const struct dsi_attn_args *a, int r, const float **keys, float *dec) {
    const struct dsi_step *st = a->st;
    int64_t t = st->pos[r], hd = a->head_dim;
    int slot = st->slot[r], nk = 0;
    for (int64_t p = t - st->window + 1 > 0 ? t - st->window + 1 : 0; p <= t; p++, nk++)
        keys[nk] = cpu_kv_row_get(&a->ring, (int64_t)slot * st->ring_cap + p % st->ring_cap,
                                  dec + nk * hd);
    if (!a->entries.data) return nk;
    int64_t ne = a->sel ? a->n_sel[r] : (t + 1) / a->ratio;
    for (int64_t i = 0; i < ne; i++, nk++) {
        int64_t e = a->sel ? a->sel[(int64_t)r * a->topk + i] : i;
        keys[nk] = cpu_kv_row_get(&a->entries, cpu_paged(st, slot, e, a->ratio, 1), dec + nk * hd);
    }
    return nk;
}

/* Decoded key rows a thread needs (FP8 rows), floats. */
static int64_t dec_floats(const struct dsi_attn_args *a, int64_t max_keys) {
    bool f8 = a->ring.dtype == DSI_KV_FP8 || (a->entries.data && a->entries.dtype == DSI_KV_FP8);
    return f8 ? max_keys * a->head_dim : 0;
}

static void attn_part(void *ctx, int64_t t0, int64_t t1, int tid) {
    struct attn_job *j = ctx;
    const struct dsi_attn_args *a = j->a;
    int64_t hd = a->head_dim;
    char *scr = cpu_scratch(j->be, tid,
                            j->max_keys * (int64_t)(sizeof(float) + sizeof(float *)) +
                                dec_floats(a, j->max_keys) * (int64_t)sizeof(float));
    const float **keys = (const float **)scr; /* pointers first: aligned */
    float *s = (float *)(scr + j->max_keys * (int64_t)sizeof(float *));
    float *dec = s + j->max_keys;
    int last_r = -1, nk = 0;
    for (int64_t t = t0; t < t1; t++) {
        int r = (int)(t / a->n_heads);
        int64_t h = t % a->n_heads;
        if (r != last_r) {
            nk = row_keys(a, r, keys, dec);
            last_r = r;
        }
        const float *q = a->q + (r * a->n_heads + h) * hd;
        float sink = cpu_vec_get(a->sinks, h);
        float mx = sink;
        for (int i = 0; i < nk; i++) {
            s[i] = cpu_dot(q, keys[i], hd) * a->scale;
            mx = fmaxf(mx, s[i]);
        }
        float z = 0.0f;
        for (int i = 0; i < nk; i++)
            z += (s[i] = cpu_expf(s[i] - mx));
        z += cpu_expf(sink - mx);
        float *o = a->out + (r * a->n_heads + h) * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int i = 0; i < nk; i++) {
            float p = s[i] / z;
            if (a->round_probs) p = dsi_bf16_round(p);
            const float *k = keys[i];
            for (int64_t d = 0; d < hd; d++)
                o[d] += p * k[d];
        }
        if (a->round_bf16)
            for (int64_t d = 0; d < hd; d++)
                o[d] = dsi_bf16_round(o[d]);
    }
}

void cpu_attn(struct dsi_backend *be, const struct dsi_attn_args *a) {
    if (a->q_norm) cpu_rms_norm(be, a->q_norm); /* in place on q: x == y == q */
    int64_t max_keys = a->st->window;
    if (a->entries.data) {
        if (a->sel)
            max_keys += a->topk;
        else
            for (int r = 0; r < a->st->n; r++)
                max_keys = DSI_MAX(max_keys, a->st->window + (a->st->pos[r] + 1) / a->ratio);
    }
    struct attn_job j = {be, a, max_keys};
    dsi_pool_run(cpu_ctx(be)->pool, a->st->n * a->n_heads, 1, attn_part, &j);
    if (a->out_rope) cpu_rope(be, a->out_rope); /* in place on out */
}

struct scored {
    float v;
    int32_t i;
};

static int cmp_scored(const void *x, const void *y) {
    const struct scored *a = x, *b = y;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

struct idx_job {
    struct dsi_backend *be;
    const struct dsi_indexer_args *a;
};

static void indexer_part(void *ctx, int64_t r0, int64_t r1, int tid) {
    struct idx_job *j = ctx;
    const struct dsi_indexer_args *a = j->a;
    const struct dsi_step *st = a->st;
    int64_t hd = a->head_dim, nh = a->n_heads;
    for (int64_t r = r0; r < r1; r++) {
        int nv = (int)((st->pos[r] + 1) / a->ratio);
        struct scored *sc = cpu_scratch(
            j->be, tid, (int64_t)nv * (int64_t)sizeof(*sc) + hd * (int64_t)sizeof(float));
        float *kbuf = (float *)(sc + nv); /* a decoded key (FP4 rows) */
        const float *q = a->q + r * nh * hd, *w = a->w + r * nh;
        for (int i = 0; i < nv; i++) {
            const float *k =
                cpu_kv_row_get(&a->keys, cpu_paged(st, st->slot[r], i, a->ratio, 1), kbuf);
            float acc = 0.0f;
            for (int64_t h = 0; h < nh; h++) {
                float d = cpu_dot(q + h * hd, k, hd);
                acc += (d > 0.0f ? d * a->score_scale : 0.0f) * (w[h] * a->w_scale);
            }
            sc[i].v = acc;
            sc[i].i = i;
        }
        int k = DSI_MIN(a->topk, nv);
        qsort(sc, (size_t)nv, sizeof(*sc), cmp_scored);
        int32_t *sel = a->sel + r * a->topk;
        for (int i = 0; i < k; i++)
            sel[i] = sc[i].i;
        qsort(sel, (size_t)k, sizeof(*sel), cmp_i32); /* attend in index order */
        a->n_sel[r] = k;
    }
}

void cpu_indexer(struct dsi_backend *be, const struct dsi_indexer_args *a) {
    struct idx_job j = {be, a};
    dsi_pool_run(cpu_ctx(be)->pool, a->st->n, 1, indexer_part, &j);
}
