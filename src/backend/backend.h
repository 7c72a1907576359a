/* backend.h - the op table the forward pass is written against. The CPU backend
 * (backend/cpu) is the numerical reference; a CUDA backend implements the same table.
 *
 * Every op takes (struct dsi_backend *, const struct dsi_<op>_args *). Pointers in the args
 * are backend memory; shapes are given in comments, outermost first. Activations are fp32.
 * `round_bf16` asks for the output to be rounded to bfloat16 (the `reference` numerics
 * profile); ops never allocate. */
#ifndef DSI_BACKEND_H
#define DSI_BACKEND_H

#include "backend/tensor.h"
#include "core/core.h"

#include <stdbool.h>

struct dsi_backend;

/* y[i, o] = sum_k x[i, k] * W[row0 + o, k] for o < n_out (W: [rows, K], any weight type). */
struct dsi_gemm_args {
    const struct dsi_tensor *w;
    int64_t row0, n_out;
    const float *x; /* [n, ldx], K = w->ne[0] used */
    int64_t n, ldx;
    float *y;       /* [n, ldy] */
    int64_t ldy;
    bool round_bf16;
};

/* Activation quantisation (spec 4.1, act_quant): FP8 round trip in blocks of 128 along each
 * row, x -> y (may alias). */
struct dsi_act_quant_args {
    const float *x;
    float *y;
    int64_t n, dim, ldx, ldy;
    int block; /* 0 means 128 */
};

/* [QAT] indexer rotation: per group of `dim` values, Hadamard (bf16 in/out) then FP4 round
 * trip in blocks of 32. In place. */
struct dsi_hadamard_q4_args {
    float *x;
    int64_t n, n_groups, dim, ldx;
};

/* Embedding: out[r, c, :] = table[tokens[r]] for c < copies (rows of copies * D). */
struct dsi_embed_args {
    const struct dsi_tensor *table; /* [vocab, D] */
    const int32_t *tokens;          /* [n] */
    int64_t n, copies;
    float *out;
};

/* y[r] = a[r] + b[r] (rows of dim; ld per operand); may alias. */
struct dsi_add_args {
    const float *a, *b;
    float *y;
    int64_t n, dim, lda, ldb, ldy;
    bool round_bf16;
};

/* Copy rows: dst[r] = src[r] (dim floats each). */
struct dsi_copy_args {
    const float *src;
    float *dst;
    int64_t n, dim, lds, ldd;
};

/* Compressor slot write for one token: sa = a; sb = b + ape[pos % ratio]. */
struct dsi_slot_write_args {
    const float *a, *b;    /* [width] */
    float *sa, *sb;        /* [width] */
    const struct dsi_tensor *ape; /* [ratio, width] */
    int64_t pos, width;
    int ratio;
};

/* y = x * rsqrt(mean(x^2) + eps) (* w), per row, or per group of `dim` when a row holds
 * n_groups groups (per-head norm). w may be NULL. May alias. */
struct dsi_rms_norm_args {
    const float *x;
    float *y;
    int64_t n, n_groups, dim, ldx, ldy; /* row r group g starts at x + r*ldx + g*dim */
    const struct dsi_tensor *w;
    float eps;
    bool round_bf16;
};

/* Interleaved RoPE on the last rope_dim values of every head: pair i is (x[w-rd+2i],
 * x[w-rd+2i+1]) rotated by +-pos*freq[i] (angle as an fp32 product). */
struct dsi_rope_args {
    float *x;       /* [n, n_heads, head_stride] row r at x + r*ldx */
    int64_t n, ldx, n_heads, head_stride;
    int width, rope_dim;
    const int32_t *pos;  /* [n] */
    const float *freq;   /* [rope_dim/2] */
    bool inverse, round_bf16;
};

/* mHC pre (spec 4.4): X [n, hc, D] -> y [n, D], post [n, hc], comb [n, hc, hc]. */
struct dsi_hc_pre_args {
    const float *X;
    int64_t n, hc, dim;
    const struct dsi_tensor *fn, *base, *scale; /* [mix, hc*D], [mix], [3] */
    int iters;
    float norm_eps, hc_eps;
    float *y, *post, *comb;
    bool round_bf16;
};

/* mHC post: Xo[k] = post[k] * f + sum_j comb[j][k] * X[j] (Xo must not alias X). */
struct dsi_hc_post_args {
    const float *f, *X, *post, *comb;
    float *Xo;
    int64_t n, hc, dim;
    bool round_bf16;
};

/* Final collapse (spec 4.10): y = sum_k (sigmoid(m_k * scale + base_k) + eps) X_k. */
struct dsi_hc_head_args {
    const float *X;
    int64_t n, hc, dim;
    const struct dsi_tensor *fn, *base, *scale; /* [hc, hc*D], [hc], [1] */
    float norm_eps, hc_eps;
    float *y;
    bool round_bf16;
};

/* Attention with sinks over an explicit key list per row (K = V, head_dim values):
 * out[r, h] = sum_j softmax_j(q[r,h].k_j * scale | sink_h) k_j. */
struct dsi_attn_args {
    const float *q;              /* [n, n_heads, head_dim] */
    float *out;                  /* [n, n_heads, head_dim] */
    int64_t n, n_heads, head_dim;
    const float *const *keys;    /* [n, keys_ld] pointers to head_dim floats */
    const int32_t *n_keys;       /* [n] */
    int64_t keys_ld;
    const struct dsi_tensor *sinks; /* [n_heads] */
    float scale;
    bool round_probs, round_bf16;
};

/* Lightning indexer: score[r, i] = sum_h w[r,h] * relu(q[r,h] . k_i) over the row's visible
 * keys, then the indices of the min(topk, n_visible) largest (ties: lower index first). */
struct dsi_indexer_args {
    const float *q;             /* [n, n_heads, head_dim] */
    const float *w;             /* [n, n_heads] */
    int64_t n, n_heads, head_dim;
    const float *const *keys;   /* [n] base of the row's sequence's keys, [n_visible, head_dim] */
    const int32_t *n_visible;   /* [n] */
    float score_scale;          /* relu(q.k) is multiplied by this before the weight */
    float w_scale;              /* and the weight by this */
    int topk;
    int32_t *sel;               /* [n, topk], ascending index order */
    int32_t *n_sel;             /* [n] */
};

/* One compressed entry: out[d] = sum_s softmax_s(b_s[d]) a_s[d] over n_slots slots. */
struct dsi_compress_args {
    const float *const *a, *const *b; /* [n_slots] pointers to width floats */
    int n_slots, width;
    float *out;
};

/* MoE routing (spec 4.8): scores = sqrtsoftplus(logits); selection by tid2eid (hash) or
 * top-k of scores + bias; weights normalised and scaled. */
struct dsi_moe_route_args {
    const float *logits;              /* [n, n_experts] */
    int64_t n, n_experts;
    int topk;
    const struct dsi_tensor *bias;    /* [n_experts] or NULL */
    const struct dsi_tensor *tid2eid; /* [vocab, topk] or NULL */
    const int32_t *tokens;            /* [n] */
    float route_scale;
    float eps;                        /* added to the normalising sum */
    int32_t *idx;                     /* [n, topk] */
    float *weight;                    /* [n, topk] */
};

/* Routed experts + shared expert: y[r] = sum_k W2_e (w_rk * swiglu(W1_e x, W3_e x)) + shared,
 * summed in slot order then shared last. */
struct dsi_moe_args {
    const float *x;            /* [n, D] */
    int64_t n, dim, inter;
    int topk;
    const int32_t *idx;        /* [n, topk] */
    const float *weight;       /* [n, topk] */
    const struct dsi_tensor *const *w1, *const *w2, *const *w3; /* [n_experts] */
    const struct dsi_tensor *sw1, *sw2, *sw3;                   /* shared expert */
    int n_experts;
    float limit;
    bool act_quant, round_bf16; /* act_quant: x must already be quantised by the caller */
    float *y;                  /* [n, D] */
    float *work;               /* dsi_moe_work_floats(n, topk, D, inter) floats */
};
int64_t dsi_moe_work_floats(int64_t n, int64_t topk, int64_t dim, int64_t inter);

struct dsi_backend_ops {
    /* Reserve per-thread scratch for the largest step (called at model init). */
    int (*reserve)(struct dsi_backend *, int64_t bytes_per_thread, struct dsi_err *);
    void (*free)(struct dsi_backend *);
    void (*gemm)(struct dsi_backend *, const struct dsi_gemm_args *);
    void (*act_quant)(struct dsi_backend *, const struct dsi_act_quant_args *);
    void (*hadamard_q4)(struct dsi_backend *, const struct dsi_hadamard_q4_args *);
    void (*embed)(struct dsi_backend *, const struct dsi_embed_args *);
    void (*add)(struct dsi_backend *, const struct dsi_add_args *);
    void (*copy)(struct dsi_backend *, const struct dsi_copy_args *);
    void (*slot_write)(struct dsi_backend *, const struct dsi_slot_write_args *);
    void (*rms_norm)(struct dsi_backend *, const struct dsi_rms_norm_args *);
    void (*rope)(struct dsi_backend *, const struct dsi_rope_args *);
    void (*hc_pre)(struct dsi_backend *, const struct dsi_hc_pre_args *);
    void (*hc_post)(struct dsi_backend *, const struct dsi_hc_post_args *);
    void (*hc_head)(struct dsi_backend *, const struct dsi_hc_head_args *);
    void (*attn)(struct dsi_backend *, const struct dsi_attn_args *);
    void (*indexer)(struct dsi_backend *, const struct dsi_indexer_args *);
    void (*compress)(struct dsi_backend *, const struct dsi_compress_args *);
    void (*moe_route)(struct dsi_backend *, const struct dsi_moe_route_args *);
    void (*moe)(struct dsi_backend *, const struct dsi_moe_args *);
};

struct dsi_backend {
    const struct dsi_backend_ops *ops;
    void *ctx;
    const char *name;
};

/* The CPU backend with n_threads workers (<= 0: all cores). */
int dsi_backend_cpu_new(struct dsi_backend **out, int n_threads, struct dsi_err *err);
void dsi_backend_free(struct dsi_backend *be);

#endif
