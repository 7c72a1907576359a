/* kv.c - the cache pool; see kv.h. */
#include "kv.h"

#include <string.h>

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

static float *kalloc(struct dsi_kv *kv, int64_t n_floats, bool *ok) {
    if (n_floats <= 0) return NULL;
    kv->bytes += n_floats * 4;
    float *p = kv->be->ops->alloc(kv->be, (size_t)n_floats * 4);
    if (!p) *ok = false;
    return p;
}

/* rows of dim values in the pool's key-row format (dsi_kv_rows; FP8: data and scales) */
static struct dsi_kv_rows
rows_alloc(struct dsi_kv *kv, int64_t rows, int dtype, int dim, int rope, bool *ok) {
    struct dsi_kv_rows r = {NULL, NULL, dtype, dim, rope};
    r.data = kalloc(kv, rows * dsi_kv_row_bytes(dtype, dim, rope) / 4, ok);
    if (dtype != DSI_KV_F32)
        r.sc = (uint8_t *)kalloc(kv, rows * dsi_kv_sc_bytes(dtype, dim, rope) / 4, ok);
    return r;
}

/* The indexer keys' format beside key rows of format dtype: FP4 beside FP8 (where the width
 * is made of 32-blocks: the [QAT] Q4 blocks), else F32. */
int dsi_kv_ikey_dtype(const struct dsi_config *cfg, int dtype) {
    return dtype == DSI_KV_FP8 && dsi_kv_fp4_ok((int)cfg->index_head_dim) ? DSI_KV_FP4 : DSI_KV_F32;
}

int64_t dsi_kv_pages_for(const struct dsi_kv *kv, int64_t n) {
    return (n + kv->page_tokens - 1) / kv->page_tokens;
}

/* Pages of >= 256 positions aligned with every compression window. */
int dsi_kv_page_tokens(const struct dsi_config *cfg) {
    int64_t l = 1;
    for (int il = 0; il < cfg->n_layers_total; il++)
        if (cfg->layers[il].ratio) l = l / gcd64(l, cfg->layers[il].ratio) * cfg->layers[il].ratio;
    return (int)(l * ((256 + l - 1) / l));
}

int64_t dsi_kv_page_bytes(const struct dsi_config *cfg, int dtype) {
    int64_t b = 0, pt = dsi_kv_page_tokens(cfg);
    for (int il = 0; il < cfg->n_layers_total; il++) {
        const struct dsi_layer_info *li = &cfg->layers[il];
        if (!li->ratio) continue;
        int64_t per = pt / li->ratio;
        b += per * dsi_kv_row_total(dtype, (int)cfg->head_dim, (int)cfg->qk_rope_head_dim);
        if (li->kind == DSI_ATTN_CSA)
            b += per * dsi_kv_row_total(dsi_kv_ikey_dtype(cfg, dtype), (int)cfg->index_head_dim, 0);
    }
    return b;
}

int dsi_kv_new(struct dsi_kv **out,
               const struct dsi_config *cfg,
               struct dsi_backend *be,
               const struct dsi_kv_opts *o,
               struct dsi_err *err) {
    *out = NULL;
    if (o->max_seqs < 1 || o->max_ctx < 1 || o->max_rows < 1)
        return dsi_errf(err, DSI_ERR_INVALID, "kv: max_seqs, max_ctx and max_rows must be >= 1");
    if (o->dtype == DSI_KV_FP8 && !dsi_kv_fp8_ok((int)cfg->head_dim, (int)cfg->qk_rope_head_dim))
        return dsi_errf(
            err, DSI_ERR_INVALID,
            "kv: the FP8 cache needs head_dim - qk_rope_head_dim a positive multiple of "
            "64 and qk_rope_head_dim a multiple of 8 (config: %lld, %lld)",
            (long long)cfg->head_dim, (long long)cfg->qk_rope_head_dim);
    if (o->dtype != DSI_KV_F32 && o->dtype != DSI_KV_FP8)
        return dsi_errf(err, DSI_ERR_INVALID, "kv: unknown cache dtype %d", o->dtype);
    struct dsi_kv *kv = dsi_calloc(1, sizeof(*kv));
    if (!kv) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    kv->cfg = cfg;
    kv->be = be;
    kv->dtype = o->dtype;
    kv->max_seqs = o->max_seqs;
    kv->max_ctx = o->max_ctx;
    kv->ring_cap = cfg->sliding_window - 1 + o->max_rows;
    kv->page_tokens = dsi_kv_page_tokens(cfg);
    kv->max_pages = (int)dsi_kv_pages_for(kv, o->max_ctx);
    kv->n_pages = o->n_pages > 0 ? o->n_pages : (int64_t)kv->max_pages * o->max_seqs;
    kv->layers = dsi_calloc((size_t)cfg->n_layers_total, sizeof(*kv->layers));
    kv->seqs = dsi_calloc((size_t)kv->max_seqs, sizeof(*kv->seqs));
    kv->pt_host = dsi_calloc((size_t)kv->max_seqs * (size_t)kv->max_pages, sizeof(int32_t));
    kv->free_pages = dsi_calloc((size_t)kv->n_pages, sizeof(int32_t));
    bool ok = kv->layers && kv->seqs && kv->pt_host && kv->free_pages;
    kv->pt_dev = ok ? be->ops->alloc(be, (size_t)kv->max_seqs * (size_t)kv->max_pages * 4) : NULL;
    ok = ok && kv->pt_dev;
    int64_t S = kv->max_seqs, hd = cfg->head_dim, ihd = cfg->index_head_dim;
    int rope = kv->dtype == DSI_KV_FP8 ? (int)cfg->qk_rope_head_dim : 0;
    for (int il = 0; ok && il < cfg->n_layers_total; il++) {
        struct dsi_layer_cache *L = &kv->layers[il];
        const struct dsi_layer_info *li = &cfg->layers[il];
        L->ring = rows_alloc(kv, S * kv->ring_cap, kv->dtype, (int)hd, rope, &ok);
        L->ratio = li->ratio;
        if (!li->ratio) continue;
        bool csa = li->kind == DSI_ATTN_CSA;
        L->n_slots = csa ? 2 * li->ratio : li->ratio;
        L->comp_width = (int)((csa ? 2 : 1) * hd);
        int64_t per_page = kv->page_tokens / li->ratio;
        L->slot_a = kalloc(kv, S * L->n_slots * L->comp_width, &ok);
        L->slot_b = kalloc(kv, S * L->n_slots * L->comp_width, &ok);
        L->entries = rows_alloc(kv, kv->n_pages * per_page, kv->dtype, (int)hd, rope, &ok);
        if (!csa) continue;
        L->islot_a = kalloc(kv, S * L->n_slots * 2 * ihd, &ok);
        L->islot_b = kalloc(kv, S * L->n_slots * 2 * ihd, &ok);
        L->ikeys = rows_alloc(kv, kv->n_pages * per_page, dsi_kv_ikey_dtype(cfg, kv->dtype),
                              (int)ihd, 0, &ok);
    }
    if (!ok) {
        int64_t b = kv->bytes;
        dsi_kv_free(kv);
        return dsi_errf(err, DSI_ERR_NOMEM,
                        "kv: cannot allocate the cache pool (%lld bytes for %d sequences of %lld "
                        "positions)",
                        (long long)b, o->max_seqs, (long long)o->max_ctx);
    }
    for (int64_t i = 0; i < kv->n_pages; i++)
        kv->free_pages[i] = (int32_t)(kv->n_pages - 1 - i);
    kv->n_free = kv->n_pages;
    *out = kv;
    return DSI_OK;
}

void dsi_kv_free(struct dsi_kv *kv) {
    if (!kv) return;
    struct dsi_backend *be = kv->be;
    for (int il = 0; kv->layers && il < kv->cfg->n_layers_total; il++) {
        struct dsi_layer_cache *L = &kv->layers[il];
        void *ps[] = {L->ring.data,  L->ring.sc, L->slot_a,  L->slot_b,     L->entries.data,
                      L->entries.sc, L->islot_a, L->islot_b, L->ikeys.data, L->ikeys.sc};
        for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
            if (ps[i]) be->ops->mfree(be, ps[i]);
    }
    if (kv->pt_dev) be->ops->mfree(be, kv->pt_dev);
    free(kv->layers);
    free(kv->seqs);
    free(kv->pt_host);
    free(kv->free_pages);
    free(kv);
}

int dsi_kv_seq_new(struct dsi_kv *kv, int *slot, struct dsi_err *err) {
    for (int s = 0; s < kv->max_seqs; s++)
        if (!kv->seqs[s].used) {
            /* Token slots and rings are always written before they are read (token t writes
             * its slot before any window containing t is pooled), so resetting the counters
             * is a full reset: no state of an earlier sequence can leak (spec pitfall 13). */
            memset(&kv->seqs[s], 0, sizeof(kv->seqs[s]));
            kv->seqs[s].used = true;
            *slot = s;
            return DSI_OK;
        }
    return dsi_errf(err, DSI_ERR_BUSY, "kv: all %d sequence slots are in use", kv->max_seqs);
}

void dsi_kv_seq_free(struct dsi_kv *kv, int slot) {
    struct dsi_kv_seq_info *s = &kv->seqs[slot];
    DSI_ASSERT(s->used);
    for (int p = s->n_pages - 1; p >= 0; p--)
        kv->free_pages[kv->n_free++] = kv->pt_host[(int64_t)slot * kv->max_pages + p];
    memset(s, 0, sizeof(*s));
}

int dsi_kv_reserve(struct dsi_kv *kv, int slot, int64_t n, struct dsi_err *err) {
    struct dsi_kv_seq_info *s = &kv->seqs[slot];
    if (n > kv->max_ctx)
        return dsi_errf(err, DSI_ERR_CONTEXT_FULL, "kv: %lld positions exceed the context of %lld",
                        (long long)n, (long long)kv->max_ctx);
    int64_t need = dsi_kv_pages_for(kv, n) - s->n_pages;
    if (need <= 0) return DSI_OK;
    if (need > kv->n_free)
        return dsi_errf(err, DSI_ERR_NOMEM, "kv: %lld pages needed, %lld free", (long long)need,
                        (long long)kv->n_free);
    int32_t *row = kv->pt_host + (int64_t)slot * kv->max_pages;
    int first = s->n_pages;
    while (need--)
        row[s->n_pages++] = kv->free_pages[--kv->n_free];
    kv->be->ops->upload(kv->be, kv->pt_dev + (int64_t)slot * kv->max_pages + first, row + first,
                        sizeof(int32_t) * (size_t)(s->n_pages - first));
    return DSI_OK;
}

/* dst[0..n) = src[0..n) (floats) through the backend's copy op (rows of up to 2^20 floats). */
static void copy_floats(struct dsi_backend *be, float *dst, const float *src, int64_t n) {
    const int64_t row = 1 << 20;
    while (n > 0) {
        int64_t k = DSI_MIN(n, row);
        struct dsi_copy_args a = {.src = src, .dst = dst, .n = 1, .dim = k, .lds = k, .ldd = k};
        be->ops->copy(be, &a);
        src += k;
        dst += k;
        n -= k;
    }
}

/* rows [d, d + n) = rows [s, s + n) of a key-row store (data and scales) */
static void
copy_rows(struct dsi_backend *be, const struct dsi_kv_rows *r, int64_t d, int64_t s, int64_t n) {
    int64_t rb = dsi_kv_row_bytes(r->dtype, r->dim, r->rope),
            sb = dsi_kv_sc_bytes(r->dtype, r->dim, r->rope);
    copy_floats(be, (float *)((char *)r->data + d * rb), (const float *)((char *)r->data + s * rb),
                n * rb / 4);
    if (r->sc)
        copy_floats(be, (float *)(r->sc + d * sb), (const float *)(r->sc + s * sb), n * sb / 4);
}

void dsi_kv_fork(struct dsi_kv *kv, int src, int dst, int64_t n_positions) {
    const struct dsi_config *c = kv->cfg;
    struct dsi_backend *be = kv->be;
    int64_t ihd = c->index_head_dim, np = dsi_kv_pages_for(kv, n_positions);
    DSI_ASSERT(kv->seqs[src].n_past == n_positions && kv->seqs[dst].n_pages >= np);
    for (int il = 0; il < c->n_layers_total; il++) {
        struct dsi_layer_cache *L = &kv->layers[il];
        copy_rows(be, &L->ring, (int64_t)dst * kv->ring_cap, (int64_t)src * kv->ring_cap,
                  kv->ring_cap);
        if (!L->ratio) continue;
        int64_t ss = (int64_t)L->n_slots * L->comp_width, per_page = kv->page_tokens / L->ratio;
        copy_floats(be, L->slot_a + dst * ss, L->slot_a + src * ss, ss);
        copy_floats(be, L->slot_b + dst * ss, L->slot_b + src * ss, ss);
        bool csa = L->islot_a != NULL;
        int64_t is = (int64_t)L->n_slots * 2 * ihd;
        if (csa) {
            copy_floats(be, L->islot_a + dst * is, L->islot_a + src * is, is);
            copy_floats(be, L->islot_b + dst * is, L->islot_b + src * is, is);
        }
        for (int64_t j = 0; j < np; j++) {
            int64_t ps = kv->pt_host[(int64_t)src * kv->max_pages + j];
            int64_t pd = kv->pt_host[(int64_t)dst * kv->max_pages + j];
            copy_rows(be, &L->entries, pd * per_page, ps * per_page, per_page);
            if (csa) copy_rows(be, &L->ikeys, pd * per_page, ps * per_page, per_page);
        }
    }
    kv->seqs[dst].n_past = n_positions;
}
