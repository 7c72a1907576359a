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
#include <string.h>

struct dsi_backend;

/* y[i, o] = sum_k x[i, k] * W[row0 + o, k] for o < n_out (W: [rows, K], any weight type). */
struct dsi_gemm_args {
    const struct dsi_tensor *w;
    int64_t row0, n_out;
    const float *x; /* [n, ldx], K = w->ne[0] used */
    int64_t n, ldx;
    float *y; /* [n, ldy] */
    int64_t ldy;
    bool round_bf16;
    bool fast;  /* `fast` numerics: the sum may run in another order (tensor cores); the CPU
                   backend, the reference, ignores it */
    bool x_fp8; /* the x rows are act_quant's output (FP8 codes times power-of-two scales in
                   128-blocks along K): a backend may multiply them as FP8 (`fast` numerics) */
    /* x is the out of the attention op run just before this one, which had out_to_gemm set
       (nothing ran between them): a backend may read the rows from what it kept of them then */
    bool x_from_attn;
    /* y is read next as the q of an attention op with q_from_gemm, and by nothing else before
       it: a backend may hand the rows over in a form of its own instead of writing y */
    bool y_to_attn;
    /* groups > 1: a grouped GEMM (the grouped output projection): group g = 0..groups-1
     * multiplies rows row0 + g * n_out .. + n_out of w by the rows x + g * gx (same ldx) into
     * y + g * gy (same ldy); 0 or 1: one group */
    int groups;
    int64_t gx, gy;
    /* optional (w2 set, groups 0 or 1): a second GEMM on the same x rows in the same op,
     * y2 [n, ldy2] = x . rows 0 .. n_out2 of w2 (round_bf16 and x_fp8 as the first's): the
     * forward's projections of one input (a backend may run the two in one launch) */
    const struct dsi_tensor *w2;
    int64_t n_out2, ldy2;
    float *y2;
};

/* Group g of a grouped call as a call of its own (for backends that run the groups one by one). */
static inline struct dsi_gemm_args dsi_gemm_group(const struct dsi_gemm_args *a, int g) {
    struct dsi_gemm_args ga = *a;
    ga.groups = 1;
    ga.row0 = a->row0 + g * a->n_out;
    ga.x = a->x + g * a->gx;
    ga.y = a->y + g * a->gy;
    return ga;
}

/* A pair's two calls as calls of their own (w2 cleared; the second: w2's rows from 0 into y2). */
static inline struct dsi_gemm_args dsi_gemm_pair_part(const struct dsi_gemm_args *a, int second) {
    struct dsi_gemm_args b = *a;
    b.w2 = NULL;
    if (second) {
        b.w = a->w2;
        b.row0 = 0;
        b.n_out = a->n_out2;
        b.y = a->y2;
        b.ldy = a->ldy2;
    }
    return b;
}

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
    bool xbf16; /* out holds bf16 values (the residual streams in bf16: ops.xbf16_ok) */
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

/* y = x * rsqrt(mean(x^2) + eps) (* w), per row, or per group of `dim` when a row holds
 * n_groups groups (per-head norm). w may be NULL. May alias. */
struct dsi_rms_norm_args {
    const float *x;
    float *y;
    int64_t n, n_groups, dim, ldx, ldy; /* row r group g starts at x + r*ldx + g*dim */
    const struct dsi_tensor *w;
    float eps;
    bool round_bf16;
    /* optional (n_groups 1): also yq = act_quant(y) in 128-blocks, rows of dim floats
       (act_quant's numbers; one op where a norm feeds a quantised GEMM) */
    float *yq;
    /* optional (rope_dim > 0; not with yq): then y's groups get rope's RoPE (not inverse; width
       and head stride dim) at pos with freq, and then, with q_dim > 0 (n_groups 1), act_quant in
       place on each row's first q_dim values in blocks of q_block: the forward's q-head and KV
       norms with what follows them, in one op */
    int rope_dim;
    const int32_t *pos;
    const float *freq;
    int64_t q_dim;
    int q_block;
};

/* Interleaved RoPE on the last rope_dim values of every head: pair i is (x[w-rd+2i],
 * x[w-rd+2i+1]) rotated by +-pos*freq[i] (angle as an fp32 product). */
struct dsi_rope_args {
    float *x; /* [n, n_heads, head_stride] row r at x + r*ldx */
    int64_t n, ldx, n_heads, head_stride;
    int width, rope_dim;
    const int32_t *pos; /* [n] */
    const float *freq;  /* [rope_dim/2] */
    bool inverse, round_bf16;
};

/* The RoPE a norm with rope_dim > 0 runs after it on y, as a rope call of its own. */
static inline struct dsi_rope_args dsi_rms_norm_rope(const struct dsi_rms_norm_args *a) {
    struct dsi_rope_args r;
    memset(&r, 0, sizeof(r));
    r.x = a->y;
    r.n = a->n;
    r.ldx = a->ldy;
    r.n_heads = a->n_groups;
    r.head_stride = a->dim;
    r.width = (int)a->dim;
    r.rope_dim = a->rope_dim;
    r.pos = a->pos;
    r.freq = a->freq;
    r.round_bf16 = a->round_bf16;
    return r;
}

/* mHC post: Xo[k] = post[k] * f + sum_j comb[j][k] * X[j] (Xo must not alias X). */
struct dsi_hc_post_args {
    const float *f, *X, *post, *comb;
    float *Xo;
    int64_t n, hc, dim;
    bool round_bf16;
    bool xbf16; /* X and Xo hold bf16 values ([n, hc, dim] of 2 bytes at those addresses; with
                   round_bf16 the values are the same): only where ops.xbf16_ok said so */
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
    bool fast; /* `fast` numerics: the mix's dot products may run in another order and on the
                  tensor cores (split TF32, close to fp32); the CPU ignores it */
    /* optional (norm_w set): the RMSNorm that follows every hc_pre in the forward, in the same
       op: z = RMSNorm(y) norm_w (eps z_eps, rms_norm's numbers) and, with zq, zq = act_quant(z)
       in 128-blocks (rms_norm's yq). z may not alias y or X. */
    const struct dsi_tensor *norm_w;
    float z_eps;
    float *z, *zq;
    /* optional: the hc_post that makes X (post_first->Xo == X), in the same op before the rest:
       the forward's hc_post is always followed by a hc_pre, so a backend may compute X's values
       where it reads them and skip a pass (the values are hc_post's). post_first->post and
       ->comb may be this op's post and comb (read before they are written). */
    const struct dsi_hc_post_args *post_first;
    bool xbf16; /* X holds bf16 values (as dsi_hc_post_args.xbf16; post_first's the same) */
};

/* The norm of a hc_pre with norm_w, as an rms_norm call of its own (y -> z, zq). */
static inline struct dsi_rms_norm_args dsi_hc_pre_norm(const struct dsi_hc_pre_args *a) {
    struct dsi_rms_norm_args r;
    memset(&r, 0, sizeof(r));
    r.x = a->y;
    r.y = a->z;
    r.n = a->n;
    r.n_groups = 1;
    r.dim = r.ldx = r.ldy = a->dim;
    r.w = a->norm_w;
    r.eps = a->z_eps;
    r.round_bf16 = a->round_bf16;
    r.yq = a->zq;
    return r;
}

/* Final collapse (spec 4.10): y = sum_k (sigmoid(m_k * scale + base_k) + eps) X_k. */
struct dsi_hc_head_args {
    const float *X;
    int64_t n, hc, dim;
    const struct dsi_tensor *fn, *base, *scale; /* [hc, hc*D], [hc], [1] */
    float norm_eps, hc_eps;
    float *y;
    bool round_bf16;
};

/* ---- per-step batch description and cache layout --------------------------------------
 * All arrays are backend memory, written once per step by the engine (dsi_step) or once at
 * start-up (page tables live in backend memory and are updated when pages are assigned).
 * Window rows live in per-sequence rings; compressed entries and indexer keys live in pages of
 * page_tokens positions (a page holds page_tokens / ratio entries of a layer); a sequence's
 * page table maps position / page_tokens to a page id shared by all layers. */
struct dsi_step {
    int n;                     /* rows */
    const int32_t *tokens;     /* [n] */
    const int32_t *pos;        /* [n] absolute positions */
    const int32_t *slot;       /* [n] sequence slot of each row */
    const int32_t *row0;       /* [n] first row of the row's sequence in this step */
    const int32_t *page_table; /* [max_seqs, max_pages] */
    int max_pages, page_tokens;
    int ring_cap, window;
};

/* Key rows of the cache: the window rings and the compressed entries (spec 5.5).
 * DSI_KV_F32: rows of dim floats. DSI_KV_FP8, for the profiles with the [QAT] steps (spec 4.5
 * step 5, 4.6: the nope dims are Q8 values of 64-blocks, the RoPE dims bf16, so this holds the
 * reference's values exactly): a row is its dim - rope nope dims as e4m3 codes, then its rope
 * dims as bf16 (dsi_kv_row_bytes: 576 at V4-Flash's shapes, a multiple of 16 when rope is a
 * multiple of 8), and its UE8M0 scales (one byte per 64 nope dims, padded to a multiple of 8:
 * dsi_kv_sc_bytes) sit in a parallel array, row i's at sc + i * dsi_kv_sc_bytes. The spec's
 * paged layout keeps each page's scale rows after its data rows; one array beside the data
 * holds the same bytes (584 a row at V4-Flash's shapes) with one base pointer each. */
enum dsi_kv_dtype { DSI_KV_F32 = 0, DSI_KV_FP8 = 1, DSI_KV_FP4 = 2 };
/* DSI_KV_FP4 (the indexer keys beside FP8 rows; spec 5.4's "FP4 index keys", 4.6: they are
 * Q4(32) values after the Hadamard rotation): a row is its dims as e2m1 codes, two a byte (low
 * nibble first; 64 bytes at index_head_dim 128), its UE8M0 scales one byte per 32 dims (padded to
 * a multiple of 4: 68 bytes a row with them) in the parallel array. */
struct dsi_kv_rows {
    void
        *data; /* F32: float [rows][dim]; FP8 / FP4: uint8_t [rows][dsi_kv_row_bytes]; NULL: none */
    uint8_t *sc;          /* FP8 / FP4: [rows][dsi_kv_sc_bytes]; F32: NULL */
    int dtype, dim, rope; /* rope: FP8's trailing bf16 dims (0 otherwise) */
};
static inline int64_t dsi_kv_sc_bytes(int dtype, int dim, int rope) {
    return dtype == DSI_KV_FP8   ? ((dim - rope) / 64 + 7) / 8 * 8
           : dtype == DSI_KV_FP4 ? (dim / 32 + 3) / 4 * 4
                                 : 0;
}
static inline int64_t dsi_kv_row_bytes(int dtype, int dim, int rope) {
    return dtype == DSI_KV_FP8   ? (int64_t)(dim - rope) + 2 * (int64_t)rope
           : dtype == DSI_KV_FP4 ? (int64_t)dim / 2
                                 : 4 * (int64_t)dim;
}
/* Bytes per row with the scales (the pool's sizing). */
static inline int64_t dsi_kv_row_total(int dtype, int dim, int rope) {
    return dsi_kv_row_bytes(dtype, dim, rope) + dsi_kv_sc_bytes(dtype, dim, rope);
}
/* FP8 rows need: nope dims a positive multiple of 64, rope dims a multiple of 8. */
static inline bool dsi_kv_fp8_ok(int dim, int rope) {
    return rope >= 0 && rope % 8 == 0 && dim - rope >= 64 && (dim - rope) % 64 == 0;
}
/* FP4 rows need dims a positive multiple of 32. */
static inline bool dsi_kv_fp4_ok(int dim) { return dim >= 32 && dim % 32 == 0; }
static inline struct dsi_kv_rows dsi_kv_rows_f32(float *p, int dim) {
    struct dsi_kv_rows r = {p, NULL, DSI_KV_F32, dim, 0};
    return r;
}

/* Cache storage of one layer (backend memory, owned by the cache pool). */
struct dsi_layer_cache {
    struct dsi_kv_rows ring;    /* [max_seqs, ring_cap] rows of head_dim */
    float *slot_a, *slot_b;     /* [max_seqs, n_slots, comp_width] compressor token slots */
    struct dsi_kv_rows entries; /* [n_pages, page_tokens / ratio] rows of head_dim */
    float *islot_a, *islot_b;   /* [max_seqs, n_slots, 2 * index_head_dim] (CSA) */
    struct dsi_kv_rows ikeys;   /* [n_pages, page_tokens / ratio] rows of index_head_dim (CSA;
                                   FP4 beside FP8 key rows, else F32) */
    int ratio, n_slots, comp_width;
};

/* ring[slot[r]][pos[r] % ring_cap] = kv[r] for every row. */
struct dsi_kv_store_args {
    const struct dsi_step *st;
    const float *kv; /* [n, head_dim] (FP8 rows: values they hold exactly) */
    int64_t head_dim;
    struct dsi_kv_rows ring;
};

/* Compressor token rows: b[r] += ape[pos[r] % ratio] for every row (in place). */
struct dsi_comp_ape_args {
    const struct dsi_step *st;
    float *b; /* [n, width] */
    int64_t width;
    const struct dsi_tensor *ape; /* [ratio, width] */
    int ratio;
};

/* Pool the entries completed in this step (spec 4.6). For emitted row r (its token t closes
 * window i = (t+1)/ratio - 1), the slots of tokens u come from batch row r - (t - u) when
 * that row belongs to the same sequence in this step (u >= pos[row0[r]]), else from the
 * sequence's token slots. CSA (overlap): A-halves (dims [0, w)) of window i-1 and B-halves
 * (dims [w, 2w)) of window i; otherwise the `ratio` tokens of window i. out[e] = entry.
 * emit_rows[e] < 0 is padding (a fixed-size list for a captured step): out[e] = 0. */
struct dsi_compress_args {
    const struct dsi_step *st;
    const int32_t *emit_rows; /* [n_emit] */
    int n_emit;
    const float *a, *b;           /* [n, slot_w] this step's rows (b with ape added) */
    const float *slot_a, *slot_b; /* [max_seqs, n_slots, slot_w] */
    int n_slots, ratio, width;    /* width: entry width w; slot_w = (overlap ? 2 : 1) * w */
    bool overlap;
    float *out; /* [n_emit, width] */
};

/* Write the last n_slots rows of each sequence in this step into its token slots
 * (rows with store[r] != 0): slot_x[slot][pos % n_slots] = x[r]. */
struct dsi_comp_store_args {
    const struct dsi_step *st;
    const uint8_t *store; /* [n] */
    const float *a, *b;   /* [n, slot_w] */
    float *slot_a, *slot_b;
    int n_slots;
    int64_t slot_w;
};

/* Scatter finished entries into the paged pool: entry emit_entry[e] of the sequence of row
 * emit_rows[e] (< 0: padding, skipped). */
struct dsi_entry_store_args {
    const struct dsi_step *st;
    const int32_t *emit_rows, *emit_entry; /* [n_emit] */
    int n_emit, ratio;
    const float *src; /* [n_emit, width] (FP8 rows: values they hold exactly) */
    int64_t width;
    struct dsi_kv_rows pool; /* [n_pages, page_tokens / ratio] rows of width */
};

/* Attention with sinks (spec 4.5): row r attends to its window (positions
 * max(0, t-window+1) .. t from the ring) then, for ratio > 0, to compressed entries in index
 * order: all i < (t+1)/ratio, or the indexer's selection when sel is not NULL.
 * out[r, h] = sum_j softmax_j(q.k_j * scale | sink_h) k_j (K = V). */
struct dsi_attn_args {
    const struct dsi_step *st;
    const float *q; /* [n, n_heads, head_dim] */
    float *out;     /* [n, n_heads, head_dim] */
    int64_t n_heads, head_dim;
    struct dsi_kv_rows ring;    /* [max_seqs, ring_cap] rows (read only) */
    struct dsi_kv_rows entries; /* paged pool, or data NULL (read only) */
    int ratio;
    const int32_t *sel, *n_sel; /* [n, topk], [n] or NULL */
    int topk;
    const struct dsi_tensor *sinks; /* [n_heads] */
    float scale;
    bool round_probs, round_bf16;
    bool fast; /* as dsi_gemm_args.fast: the products may run on tensor cores */
    /* optional (NULL: q as it is): the per-head q norm (and its RoPE) the op applies to q
       first, as rms_norm would (x == y == q, n_groups n_heads, dim head_dim, no yq or q_dim).
       A backend may fuse it into the attention's reads of q, so q's contents after the op are
       unspecified (normalised or not). The caller keeps what it points at alive over the op. */
    const struct dsi_rms_norm_args *q_norm;
    /* optional (NULL: none): the RoPE the op applies to out afterwards, as rope would (x ==
       out, n_heads heads of head_stride head_dim, ldx n_heads * head_dim); a backend may fuse
       it into the attention's writes of out */
    const struct dsi_rope_args *out_rope;
    /* the next op is a gemm of x = out with x_from_attn set: a backend may keep the rows in a
       form of its own for it too (out is still written, unless out_gemm allows otherwise) */
    bool out_to_gemm;
    /* optional (NULL: none), with out_to_gemm: that gemm's arguments, as it will be called (x ==
       out); a backend that knows the gemm will read only the rows it kept may leave out
       unwritten: out's contents after the two ops are then unspecified. The caller keeps what it
       points at alive over the op. */
    const struct dsi_gemm_args *out_gemm;
    /* q is the y of a gemm op with y_to_attn (run before this op, nothing reading y between) */
    bool q_from_gemm;
};

/* Lightning indexer: score[r, i] = sum_h (w[r,h] * w_scale) * relu(q[r,h] . k_i) * score_scale
 * over the row's visible keys i < (t+1)/ratio (paged), then the min(topk, visible) largest
 * (ties: lower index first), written in ascending index order. */
struct dsi_indexer_args {
    const struct dsi_step *st;
    const float *q; /* [n, n_heads, head_dim] */
    const float *w; /* [n, n_heads] */
    int64_t n_heads, head_dim;
    struct dsi_kv_rows keys; /* paged pool [n_pages, page_tokens / ratio] rows (read only) */
    int ratio;
    float score_scale, w_scale;
    int topk;
    int32_t *sel;   /* [n, topk] */
    int32_t *n_sel; /* [n] */
    bool fast;      /* as dsi_gemm_args.fast: the products may run on tensor cores */
};

/* dst[i] = src[idx[i]] (rows of dim floats). */
struct dsi_gather_args {
    const float *src;
    const int32_t *idx; /* [n] */
    float *dst;
    int64_t n, dim;
    bool xbf16; /* src's rows hold dim bf16 values, widened into dst's floats */
};

/* MoE routing (spec 4.8): scores = sqrtsoftplus(logits); selection by tid2eid (hash) or
 * top-k of scores + bias; weights normalised and scaled. */
struct dsi_moe_route_args {
    const float *logits; /* [n, n_experts] */
    int64_t n, n_experts;
    int topk;
    const struct dsi_tensor *bias;    /* [n_experts] or NULL */
    const struct dsi_tensor *tid2eid; /* [vocab, topk] or NULL */
    const int32_t *tokens;            /* [n] */
    float route_scale;
    float eps;     /* added to the normalising sum */
    int32_t *idx;  /* [n, topk] */
    float *weight; /* [n, topk] */
};

/* Routed experts + shared expert: y[r] = sum_k W2_e (w_rk * swiglu(W1_e x, W3_e x)) + shared,
 * summed in slot order then shared last. */
struct dsi_moe_args {
    const float *x; /* [n, D] */
    int64_t n, dim, inter;
    int topk;
    const int32_t *idx;                                         /* [n, topk] */
    const float *weight;                                        /* [n, topk] */
    const struct dsi_tensor *const *w1, *const *w2, *const *w3; /* [n_experts] */
    const struct dsi_tensor *sw1, *sw2, *sw3;                   /* shared expert */
    int n_experts;
    float limit;
    bool act_quant, round_bf16; /* act_quant: x must already be quantised by the caller */
    bool fast;                  /* as dsi_gemm_args.fast */
    float *y;                   /* [n, D] */
    float *work;                /* dsi_moe_work_floats(n, topk, D, inter) floats */
};
int64_t dsi_moe_work_floats(int64_t n, int64_t topk, int64_t dim, int64_t inter);

/* Sampling (design 7 `sample`; the draw of run/sample.h without penalties, masks or logprobs):
 * per row, temperature -> top-k -> top-p -> min-p -> keyed Gumbel-max draw, with the draws of
 * core/philox.h, so a token sampled by the op equals the one run/sample.c's sampler picks from
 * the same logits. temperature <= 0 is greedy (argmax, ties to the lower id). The op takes rows
 * with top_k <= DSI_SAMPLE_OP_MAX_TOPK, or top_k off and top_p off (see dsi_sample_op_takes);
 * the caller samples other rows on the host (a row the op does not take gets token -1: the
 * rows are backend memory, so a device backend cannot report it as an error). */
#define DSI_SAMPLE_OP_MAX_TOPK 1024
struct dsi_sample_row {
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed;
    int64_t pos;     /* absolute position of the sampled token (the Philox counter) */
    uint32_t stream; /* completion index */
    uint32_t pad;
};
struct dsi_sample_args {
    const float *logits; /* [n, ld], n_vocab used */
    int64_t n, n_vocab, ld;
    const struct dsi_sample_row *rows; /* [n] (backend memory) */
    int32_t *out;                      /* [n] (backend memory) */
};
static inline bool dsi_sample_op_takes(const struct dsi_sample_row *r, int64_t n_vocab) {
    if (!(r->temperature > 0.0f)) return true;
    bool topk = r->top_k > 0 && r->top_k < n_vocab;
    bool topp = r->top_p > 0.0f && r->top_p < 1.0f;
    return topk ? r->top_k <= DSI_SAMPLE_OP_MAX_TOPK : !topp;
}

/* A hint (backend ops' prefetch): weights the ops issued next will read, each with its scale
 * tensor. A device backend may start bringing them into its cache beside the ops issued in
 * between; no op's result depends on it. rows: the step's rows (a backend may take the hint only
 * for few). NULL entries are skipped. */
#define DSI_PREFETCH_MAX 4
struct dsi_prefetch_args {
    const struct dsi_tensor *w[DSI_PREFETCH_MAX];
    int64_t rows;
};

struct dsi_backend_ops {
    /* ---- memory: backend memory is what ops read and write ---- */
    void *(*alloc)(struct dsi_backend *, size_t bytes); /* zeroed; NULL on failure */
    void (*mfree)(struct dsi_backend *, void *p);
    void (*upload)(struct dsi_backend *, void *dst, const void *src, size_t bytes);
    void (*download)(struct dsi_backend *, void *dst, const void *src, size_t bytes);
    /* Make read-only host data (a weight in the mmap) usable by ops: the CPU backend returns
     * it as is; a device backend copies it once. NULL on failure. */
    const void *(*import)(struct dsi_backend *, const void *host, size_t bytes);
    int (*sync)(struct dsi_backend *, struct dsi_err *); /* wait; report a sticky error */
    /* Reserve per-thread scratch for the largest step (called at model init). */
    int (*reserve)(struct dsi_backend *, int64_t bytes_per_thread, struct dsi_err *);
    void (*free)(struct dsi_backend *);
    void (*gemm)(struct dsi_backend *, const struct dsi_gemm_args *);
    void (*act_quant)(struct dsi_backend *, const struct dsi_act_quant_args *);
    void (*hadamard_q4)(struct dsi_backend *, const struct dsi_hadamard_q4_args *);
    void (*embed)(struct dsi_backend *, const struct dsi_embed_args *);
    void (*add)(struct dsi_backend *, const struct dsi_add_args *);
    void (*copy)(struct dsi_backend *, const struct dsi_copy_args *);
    void (*rms_norm)(struct dsi_backend *, const struct dsi_rms_norm_args *);
    void (*rope)(struct dsi_backend *, const struct dsi_rope_args *);
    void (*hc_pre)(struct dsi_backend *, const struct dsi_hc_pre_args *);
    void (*hc_post)(struct dsi_backend *, const struct dsi_hc_post_args *);
    void (*hc_head)(struct dsi_backend *, const struct dsi_hc_head_args *);
    void (*attn)(struct dsi_backend *, const struct dsi_attn_args *);
    void (*indexer)(struct dsi_backend *, const struct dsi_indexer_args *);
    void (*kv_store)(struct dsi_backend *, const struct dsi_kv_store_args *);
    void (*comp_ape)(struct dsi_backend *, const struct dsi_comp_ape_args *);
    void (*compress)(struct dsi_backend *, const struct dsi_compress_args *);
    void (*comp_store)(struct dsi_backend *, const struct dsi_comp_store_args *);
    void (*entry_store)(struct dsi_backend *, const struct dsi_entry_store_args *);
    void (*gather)(struct dsi_backend *, const struct dsi_gather_args *);
    void (*moe_route)(struct dsi_backend *, const struct dsi_moe_route_args *);
    void (*moe)(struct dsi_backend *, const struct dsi_moe_args *);
    void (*sample)(struct dsi_backend *, const struct dsi_sample_args *);
    /* Optional (NULL: host memory, no budget): free and total bytes of backend memory. */
    int (*mem_info)(struct dsi_backend *, size_t *free_bytes, size_t *total_bytes);
    /* Optional (NULL: every step runs op by op): whole steps recorded and replayed (CUDA
     * graphs). The caller brackets a step's ops, after its uploads and before its downloads,
     * with graph_begin(key) and graph_end (also after an eager step); key names everything
     * that shapes the step's launches, its low 20 bits the step's rows. graph_begin answers
     * DSI_GRAPH_EAGER or DSI_GRAPH_CAPTURE (issue the ops) or DSI_GRAPH_REPLAY (do not issue them);
     * graph_end launches what was captured or replayed and answers DSI_GRAPH_RETRY when the capture
     * failed (issue the ops again, eagerly). graph_reset drops every recorded step (the caller's
     * buffers changed). */
    int (*graph_begin)(struct dsi_backend *, uint64_t key);
    int (*graph_end)(struct dsi_backend *);
    void (*graph_reset)(struct dsi_backend *);
    /* Optional (NULL: no hints taken): dsi_prefetch_args. */
    void (*prefetch)(struct dsi_backend *, const struct dsi_prefetch_args *);
    /* Optional (NULL: never): whether a step of n rows may hold the residual streams X
     * ([n, hc, dim]) as bf16 values (the xbf16 fields of embed, hc_post, hc_pre and gather: half
     * the bytes of the mHC ops' passes). Asked only where X's values are bf16 anyway: `fast`
     * numerics with bf16 rounding and a BF16 embedding table. */
    bool (*xbf16_ok)(struct dsi_backend *, int64_t n, int64_t hc, int64_t dim);
};
enum { DSI_GRAPH_EAGER = 0, DSI_GRAPH_CAPTURE = 1, DSI_GRAPH_REPLAY = 2, DSI_GRAPH_RETRY = 3 };

struct dsi_backend {
    const struct dsi_backend_ops *ops;
    void *ctx;
    const char *name;
    bool kv_fp8; /* its ops read and write DSI_KV_FP8 key rows */
};

/* The CPU backend with n_threads workers (<= 0: all cores). */
int dsi_backend_cpu_new(struct dsi_backend **out, int n_threads, struct dsi_err *err);
/* The CUDA backend on device `device` (only in builds with CUDA=1; src/backend/cuda). */
int dsi_backend_cuda_new(struct dsi_backend **out, int device, struct dsi_err *err);
void dsi_backend_free(struct dsi_backend *be);

#endif
