/* kv.h - the cache pool (spec 5.3, design 7): per sequence slot, a window ring per layer and the
 * compressor token slots; compressed entries and indexer keys in pages of page_tokens positions
 * (one page id covers those positions in every layer), with a free list. All storage is backend
 * memory allocated once at creation; page tables are mirrored on the host and uploaded when a
 * page is assigned. Knows positions and pages, no maths. Only the engine (scheduler) mutates it.
 *
 * Ownership: struct dsi_kv owns its backend allocations; it borrows the config and the backend,
 * which must outlive it. */
#ifndef DSI_KV_H
#define DSI_KV_H

#include "backend/backend.h"
#include "load/config.h"

struct dsi_kv_opts {
    int max_seqs;    /* sequence slots */
    int64_t max_ctx; /* positions per sequence */
    int max_rows;    /* rows of one sequence per step (sizes the rings) */
    int64_t n_pages; /* pages in the pool; 0 = enough for every slot at max_ctx */
    int dtype;       /* the key rows' format (enum dsi_kv_dtype; FP8 only where the forward
                        applies the [QAT] steps: its values are then exact) */
};

struct dsi_kv_seq_info {
    bool used;
    int64_t n_past;     /* main-model positions processed */
    int64_t mtp_n_past; /* MTP-layer positions processed */
    int n_pages;        /* pages assigned (cover positions < n_pages * page_tokens) */
};

struct dsi_kv {
    const struct dsi_config *cfg;
    struct dsi_backend *be;
    int max_seqs, ring_cap, page_tokens, max_pages, dtype;
    int64_t n_pages, max_ctx, bytes;
    struct dsi_layer_cache *layers; /* [n_layers_total] */
    int32_t *pt_host;               /* [max_seqs, max_pages] host mirror of the page tables */
    int32_t *pt_dev;                /* backend copy */
    int32_t *free_pages;            /* stack of free page ids */
    int64_t n_free;
    struct dsi_kv_seq_info *seqs; /* [max_seqs] */
};

int dsi_kv_new(struct dsi_kv **out,
               const struct dsi_config *cfg,
               struct dsi_backend *be,
               const struct dsi_kv_opts *opts,
               struct dsi_err *err);
void dsi_kv_free(struct dsi_kv *kv);
/* Take a free sequence slot (state reset: position 0). DSI_ERR_BUSY when none is free. */
int dsi_kv_seq_new(struct dsi_kv *kv, int *slot, struct dsi_err *err);
/* Release a slot and its pages. */
void dsi_kv_seq_free(struct dsi_kv *kv, int slot);
/* Make sure positions < n_positions of the slot have pages. DSI_ERR_CONTEXT_FULL beyond
 * max_ctx, DSI_ERR_NOMEM when the pool has no free page (nothing is assigned then). */
int dsi_kv_reserve(struct dsi_kv *kv, int slot, int64_t n_positions, struct dsi_err *err);
/* Copy the cache state of slot src (its window ring, compressor slots and the pages of its
 * first n_positions positions) into slot dst, which must hold pages for n_positions; dst's
 * n_past becomes n_positions. src must have processed exactly n_positions positions (the
 * compressor slots hold the last tokens). Stream-ordered backend copies: the next forward sees
 * them. */
void dsi_kv_fork(struct dsi_kv *kv, int src, int dst, int64_t n_positions);
/* Backend bytes one page adds to the pool (compressed entries in the key-row format dtype and
 * indexer keys of every layer), and the positions per page, for a config (before a pool
 * exists). */
int64_t dsi_kv_page_bytes(const struct dsi_config *cfg, int dtype);
/* The indexer keys' row format beside key rows of format dtype (FP4 beside FP8). */
int dsi_kv_ikey_dtype(const struct dsi_config *cfg, int dtype);
int dsi_kv_page_tokens(const struct dsi_config *cfg);
/* Pages needed to hold n_positions. */
int64_t dsi_kv_pages_for(const struct dsi_kv *kv, int64_t n_positions);

#endif
