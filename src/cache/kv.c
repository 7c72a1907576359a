/* kv.c - per-sequence state allocation and reset; see kv.h. */
#include "kv.h"

#include <string.h>

static float *falloc(int64_t n, int64_t *bytes) {
    *bytes += n * (int64_t)sizeof(float);
    return n ? dsi_aligned_alloc((size_t)n * sizeof(float)) : NULL;
}

static int64_t g_bytes_unused;

int dsi_kv_seq_new(struct dsi_kv_seq **out, const struct dsi_config *cfg, int64_t max_ctx,
                   int max_rows, struct dsi_err *err) {
    *out = NULL;
    struct dsi_kv_seq *s = dsi_calloc(1, sizeof(*s));
    if (!s) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    s->max_ctx = max_ctx;
    s->ring_cap = cfg->sliding_window - 1 + max_rows;
    s->n_layers = cfg->n_layers_total;
    s->layers = dsi_calloc((size_t)s->n_layers, sizeof(*s->layers));
    if (!s->layers) goto fail;
    int64_t *bytes = &g_bytes_unused;
    for (int il = 0; il < s->n_layers; il++) {
        struct dsi_kv_layer *L = &s->layers[il];
        const struct dsi_layer_info *li = &cfg->layers[il];
        L->ring = falloc((int64_t)s->ring_cap * cfg->head_dim, bytes);
        if (!L->ring) goto fail;
        if (li->ratio == 0) continue;
        int csa = li->kind == DSI_ATTN_CSA;
        L->n_slots = csa ? 2 * li->ratio : li->ratio;
        L->comp_width = (csa ? 2 : 1) * cfg->head_dim;
        L->max_entries = max_ctx / li->ratio + 1;
        L->slot_a = falloc((int64_t)L->n_slots * L->comp_width, bytes);
        L->slot_b = falloc((int64_t)L->n_slots * L->comp_width, bytes);
        L->entries = falloc(L->max_entries * cfg->head_dim, bytes);
        if (!L->slot_a || !L->slot_b || !L->entries) goto fail;
        if (!csa) continue;
        L->islot_a = falloc((int64_t)L->n_slots * 2 * cfg->index_head_dim, bytes);
        L->islot_b = falloc((int64_t)L->n_slots * 2 * cfg->index_head_dim, bytes);
        L->ikeys = falloc(L->max_entries * cfg->index_head_dim, bytes);
        if (!L->islot_a || !L->islot_b || !L->ikeys) goto fail;
    }
    *out = s;
    return DSI_OK;
fail:
    dsi_kv_seq_free(s);
    return dsi_errf(err, DSI_ERR_NOMEM, "kv: out of memory for a sequence of %lld positions",
                    (long long)max_ctx);
}

void dsi_kv_seq_free(struct dsi_kv_seq *s) {
    if (!s) return;
    for (int il = 0; s->layers && il < s->n_layers; il++) {
        struct dsi_kv_layer *L = &s->layers[il];
        free(L->ring);
        free(L->slot_a);
        free(L->slot_b);
        free(L->entries);
        free(L->islot_a);
        free(L->islot_b);
        free(L->ikeys);
    }
    free(s->layers);
    free(s);
}

void dsi_kv_seq_reset(struct dsi_kv_seq *s) {
    /* Slots are always written before they are read (token t writes slot t % n_slots before
     * any window containing t is pooled), so resetting the counters is a full reset: no state
     * of a previous sequence can leak (spec pitfall 13). */
    s->n_past = 0;
    s->mtp_n_past = 0;
    for (int il = 0; il < s->n_layers; il++) {
        s->layers[il].n_entries = 0;
        s->layers[il].n_ikeys = 0;
    }
}

int64_t dsi_kv_seq_bytes(const struct dsi_kv_seq *s) {
    (void)s;
    return 0;
}
