/* forward.h - the one forward pass of DeepSeek-V4 (spec 4.9) over a flat batch of rows from
 * any number of sequences, plus the MTP layer (spec 4.11). Prefill, chunked prefill and decode
 * are the same call: rows are rows.
 *
 * struct dsi_fwd owns the step scratch (sized once for max_rows rows and max_ctx positions);
 * it borrows the model and the backend, which must outlive it. */
#ifndef DSI_FORWARD_H
#define DSI_FORWARD_H

#include "cache/kv.h"
#include "model/dsv4.h"

/* The flat per-step input (host memory; the forward uploads it once per step). */
struct dsi_batch {
    int n;                      /* rows */
    const int32_t *tokens;      /* [n] */
    const int32_t *pos;         /* [n] absolute positions */
    const int32_t *slot;        /* [n] cache slot (sequence) of each row */
    const uint8_t *want_logits; /* [n] 1 = produce logits for this row; NULL = every row */
};

struct dsi_fwd;

/* Borrows m, be and kv (they must outlive the forward). */
int dsi_fwd_new(struct dsi_fwd **out,
                const struct dsi_model *m,
                struct dsi_backend *be,
                struct dsi_kv *kv,
                int max_rows,
                enum dsi_numerics numerics,
                struct dsi_err *err);
void dsi_fwd_free(struct dsi_fwd *f);

/* Run the main model. Rows of one sequence must be contiguous, in position order and continue
 * it (pos == n_past, n_past + 1, ...), with pages reserved for them (dsi_kv_reserve).
 * logits (host memory): [rows wanting logits, vocab_size] in row order.
 * streams (optional, host memory): [n, hc_mult * hidden_size] final residual streams before hc_head
 * (the MTP layer's input). Advances each sequence's n_past. */
int dsi_forward(struct dsi_fwd *f,
                const struct dsi_batch *b,
                float *logits,
                float *streams,
                struct dsi_err *err);

/* dsi_forward, then the backend's sample op on the rows that want logits: tokens (host
 * memory, [rows wanting logits]) receives one token per such row, drawn with rows[i] (host
 * memory, same order; every row must pass dsi_sample_op_takes). Only the token ids come back
 * to the host. */
int dsi_forward_sample(struct dsi_fwd *f,
                       const struct dsi_batch *b,
                       const struct dsi_sample_row *rows,
                       int32_t *tokens,
                       struct dsi_err *err);

/* Run the MTP layer: row r takes the main model's streams at position pos[r] and the token
 * tokens[r] = the token at pos[r] + 1; logits predict the token at pos[r] + 2. Rows of a
 * sequence continue its MTP positions (mtp_n_past). */
int dsi_mtp_forward(struct dsi_fwd *f,
                    const struct dsi_batch *b,
                    const float *streams,
                    float *logits,
                    struct dsi_err *err);

#endif
