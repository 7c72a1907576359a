/* kv.h - per-sequence decode state (spec 5.3): per layer a window ring of raw KV rows, the
 * compressor's token slots (a and b rows of the open windows), the compressed entries and the
 * indexer keys. Sized at creation for max_ctx positions and max_rows rows per step; reset for
 * every new sequence. Knows positions and storage, no maths.
 * (Paged pools shared across sequences replace the contiguous entry arrays in the serving
 * core; the interface below is what the forward pass needs.) */
#ifndef DSI_KV_H
#define DSI_KV_H

#include "load/config.h"

struct dsi_kv_layer {
    float *ring;        /* [ring_cap, head_dim]; position t at row t % ring_cap */
    float *slot_a, *slot_b; /* [n_slots, comp_width]; token t at slot t % n_slots */
    float *entries;     /* [max_entries, head_dim] compressed KV */
    float *islot_a, *islot_b; /* indexer compressor slots [n_slots, 2*index_head_dim] */
    float *ikeys;       /* [max_entries, index_head_dim] indexer keys */
    int n_slots, comp_width;
    int64_t max_entries, n_entries, n_ikeys;
};

struct dsi_kv_seq {
    int64_t n_past;     /* main model positions processed */
    int64_t mtp_n_past; /* MTP layer positions processed */
    int64_t max_ctx;
    int ring_cap;
    int n_layers;       /* layers incl. MTP */
    struct dsi_kv_layer *layers;
};

/* Allocate state for one sequence (max_ctx positions, at most max_rows rows per step). */
int dsi_kv_seq_new(struct dsi_kv_seq **out, const struct dsi_config *cfg, int64_t max_ctx,
                   int max_rows, struct dsi_err *err);
void dsi_kv_seq_free(struct dsi_kv_seq *s);
/* Forget everything (a new sequence starts at position 0). */
void dsi_kv_seq_reset(struct dsi_kv_seq *s);
int64_t dsi_kv_seq_bytes(const struct dsi_kv_seq *s);

#endif
