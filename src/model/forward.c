/* forward.c - DeepSeek-V4 forward pass, written once against the backend op table.
 *
 * Per layer (spec 4.9): hc_pre -> attn_norm -> attention -> hc_post -> hc_pre -> ffn_norm ->
 * MoE -> hc_post. Attention (spec 4.5-4.7) projects all rows at once, then walks the rows in
 * batch order to update each sequence's state (window ring, compressor slots, compressed
 * entries, indexer keys), then attends for all rows at once. Every row's arithmetic depends
 * only on its own sequence, so prefill in any chunk size equals token-by-token decode bit for
 * bit, and a row's result does not depend on the other rows in the batch.
 *
 * Numerics: `plain` computes in fp32 from dequantised weights (what HF transformers does);
 * `reference` adds the official reference's [QAT] simulations and bf16 roundings. */
#include "forward.h"

#include "cache/kv.h"

#include <math.h>
#include <string.h>

#define MAX_RATIO_CLASSES 8

/* Per distinct compression ratio: which rows close a window this step and which rows go to
 * the token slots (backend copies of host-built lists). */
struct ratio_class {
    int ratio, n_slots, n_emit;
    int32_t *emit_rows, *emit_entry, *emit_pos; /* backend [max_rows] */
    uint8_t *store;                             /* backend [max_rows] */
};

struct dsi_fwd {
    const struct dsi_model *m;
    const struct dsi_config *c;
    struct dsi_backend *be;
    struct dsi_kv *kv;
    int max_rows;
    bool R; /* reference (or fast) numerics: the rounding points */
    bool F; /* fast numerics: GEMMs may take tensor cores */
    /* rmsq's quantised rows, for the next act() call only (which clears it): act(q_src, n,
       dim, q_dst) then returns q_dst without quantising again */
    const float *q_src;
    float *q_dst;
    int64_t q_n, q_dim;
    struct dsi_step st; /* arrays below, in backend memory */
    int32_t *d_tokens, *d_pos, *d_slot, *d_row0, *d_idx;
    struct ratio_class rc[MAX_RATIO_CLASSES];
    int n_rc;
    /* host staging */
    int32_t *h_row0, *h_emit_rows, *h_emit_entry, *h_emit_pos, *h_idx;
    uint8_t *h_store;
    /* activations in backend memory, [max_rows, ...] */
    float *X, *X2, *y, *x, *xq, *post, *comb, *f;
    /* a hc_post owed (hc_merge): X is still the old streams, the new ones to be made from f,
       post and comb into X2 by the next hc_site's op (post_first) or by hc_flush */
    bool merge_due;
    /* this step's X and X2 hold bf16 values (xbf16_step: half the bytes of the mHC passes) */
    bool xbf16;
    float *qa, *qaq, *q, *kv_rows, *o, *z;
    float *ca, *cb, *ia, *ib, *qI, *wI, *glog, *moe_w, *moe_work, *ent, *ient, *logits;
    int32_t *moe_idx, *sel, *n_sel;
    struct dsi_sample_row *d_srows; /* [max_rows] sample op parameters */
    int32_t *d_stok;                /* [max_rows] sampled tokens */
};

static void *dbuf(struct dsi_fwd *f, int64_t n, size_t elem, bool *ok) {
    void *p = f->be->ops->alloc(f->be, (size_t)(n > 0 ? n : 1) * elem);
    if (!p) *ok = false;
    return p;
}

static void *hbuf(int64_t n, size_t elem, bool *ok) {
    void *p = dsi_calloc((size_t)(n > 0 ? n : 1), elem);
    if (!p) *ok = false;
    return p;
}

static struct ratio_class *class_of(struct dsi_fwd *f, int ratio) {
    for (int i = 0; i < f->n_rc; i++)
        if (f->rc[i].ratio == ratio) return &f->rc[i];
    return NULL;
}

int dsi_fwd_new(struct dsi_fwd **out,
                const struct dsi_model *m,
                struct dsi_backend *be,
                struct dsi_kv *kv,
                int max_rows,
                enum dsi_numerics numerics,
                struct dsi_err *err) {
    *out = NULL;
    const struct dsi_config *c = &m->cfg;
    if (max_rows < 1) return dsi_errf(err, DSI_ERR_INVALID, "forward: max_rows must be >= 1");
    struct dsi_fwd *f = dsi_calloc(1, sizeof(*f));
    if (!f) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    f->m = m;
    f->c = c;
    f->be = be;
    f->kv = kv;
    f->max_rows = max_rows;
    f->R = numerics == DSI_NUMERICS_REFERENCE || numerics == DSI_NUMERICS_FAST;
    f->F = numerics == DSI_NUMERICS_FAST;
    int64_t n = max_rows, D = c->hidden_size, HD = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t widest = DSI_MAX(DSI_MAX(D, c->q_lora_rank), DSI_MAX(c->wo_b_in, HD));
    bool ok = true;
    f->d_tokens = dbuf(f, n, 4, &ok);
    f->d_pos = dbuf(f, n, 4, &ok);
    f->d_slot = dbuf(f, n, 4, &ok);
    f->d_row0 = dbuf(f, n, 4, &ok);
    f->d_idx = dbuf(f, n, 4, &ok);
    f->h_row0 = hbuf(n, 4, &ok);
    f->h_emit_rows = hbuf(n, 4, &ok);
    f->h_emit_entry = hbuf(n, 4, &ok);
    f->h_emit_pos = hbuf(n, 4, &ok);
    f->h_idx = hbuf(n, 4, &ok);
    f->h_store = hbuf(n, 1, &ok);
    for (int il = 0; il < c->n_layers_total && ok; il++) {
        int r = c->layers[il].ratio;
        if (!r || class_of(f, r)) continue;
        if (f->n_rc == MAX_RATIO_CLASSES) {
            dsi_fwd_free(f);
            return dsi_errf(err, DSI_ERR_UNSUPPORTED, "forward: more than %d distinct ratios",
                            MAX_RATIO_CLASSES);
        }
        struct ratio_class *k = &f->rc[f->n_rc++];
        k->ratio = r;
        k->n_slots = c->layers[il].kind == DSI_ATTN_CSA ? 2 * r : r;
        k->emit_rows = dbuf(f, n, 4, &ok);
        k->emit_entry = dbuf(f, n, 4, &ok);
        k->emit_pos = dbuf(f, n, 4, &ok);
        k->store = dbuf(f, n, 1, &ok);
    }
    f->X = dbuf(f, n * c->hc_dim, 4, &ok);
    f->X2 = dbuf(f, n * c->hc_dim, 4, &ok);
    f->y = dbuf(f, n * D, 4, &ok);
    f->x = dbuf(f, n * D, 4, &ok);
    f->xq = dbuf(f, n * DSI_MAX(widest, c->hc_dim), 4, &ok);
    f->post = dbuf(f, n * c->hc_mult, 4, &ok);
    f->comb = dbuf(f, n * c->hc_mult * c->hc_mult, 4, &ok);
    f->f = dbuf(f, n * D, 4, &ok);
    f->qa = dbuf(f, n * c->q_lora_rank, 4, &ok);
    f->qaq = dbuf(f, n * c->q_lora_rank, 4, &ok);
    f->q = dbuf(f, n * HD, 4, &ok);
    f->kv_rows = dbuf(f, n * c->head_dim, 4, &ok);
    f->o = dbuf(f, n * HD, 4, &ok);
    f->z = dbuf(f, n * c->wo_b_in, 4, &ok);
    f->ca = dbuf(f, n * 2 * c->head_dim, 4, &ok);
    f->cb = dbuf(f, n * 2 * c->head_dim, 4, &ok);
    f->ia = dbuf(f, n * 2 * c->index_head_dim, 4, &ok);
    f->ib = dbuf(f, n * 2 * c->index_head_dim, 4, &ok);
    f->qI = dbuf(f, n * c->index_n_heads * c->index_head_dim, 4, &ok);
    f->wI = dbuf(f, n * c->index_n_heads, 4, &ok);
    f->glog = dbuf(f, n * c->n_routed_experts, 4, &ok);
    f->moe_w = dbuf(f, n * c->num_experts_per_tok, 4, &ok);
    f->moe_idx = dbuf(f, n * c->num_experts_per_tok, 4, &ok);
    f->moe_work = dbuf(
        f, dsi_moe_work_floats(n, c->num_experts_per_tok, D, c->moe_intermediate_size), 4, &ok);
    f->ent = dbuf(f, n * c->head_dim, 4, &ok);
    f->ient = dbuf(f, n * c->index_head_dim, 4, &ok);
    f->logits = dbuf(f, n * c->vocab_size, 4, &ok);
    f->sel = dbuf(f, n * c->index_topk, 4, &ok);
    f->n_sel = dbuf(f, n, 4, &ok);
    f->d_srows = dbuf(f, n, sizeof(struct dsi_sample_row), &ok);
    f->d_stok = dbuf(f, n, 4, &ok);
    if (!ok) {
        dsi_fwd_free(f);
        return dsi_errf(err, DSI_ERR_NOMEM, "forward: out of memory for %d rows", max_rows);
    }
    f->st = (struct dsi_step){.tokens = f->d_tokens,
                              .pos = f->d_pos,
                              .slot = f->d_slot,
                              .row0 = f->d_row0,
                              .page_table = kv->pt_dev,
                              .max_pages = kv->max_pages,
                              .page_tokens = kv->page_tokens,
                              .ring_cap = kv->ring_cap,
                              .window = c->sliding_window};
    /* Per-thread scratch: a decoded weight row or a flattened stream row; attention scores
     * and key pointers; indexer scores. */
    int64_t kmax =
        DSI_MAX(DSI_MAX(widest, c->hc_dim), DSI_MAX(c->group_in_dim, c->moe_intermediate_size));
    int64_t keys = c->sliding_window + DSI_MAX((int64_t)c->index_topk, kv->max_ctx);
    int64_t need = DSI_MAX(kmax * 4, keys * 16);
    if (kv->dtype == DSI_KV_FP8) { /* and a row's keys decoded: the window, then the top-k
                                      (CSA) or every entry (HCA) */
        int64_t ents = 0;
        for (int il = 0; il < c->n_layers_total; il++) {
            const struct dsi_layer_info *li = &c->layers[il];
            if (li->ratio)
                ents = DSI_MAX(ents, li->kind == DSI_ATTN_CSA ? (int64_t)c->index_topk
                                                              : kv->max_ctx / li->ratio);
        }
        int64_t k8 = c->sliding_window + ents;
        need = DSI_MAX(need, k8 * (16 + 4 * c->head_dim));
    }
    int rc = be->ops->reserve(be, need, err);
    if (rc) {
        dsi_fwd_free(f);
        return rc;
    }
    if (be->ops->graph_reset) be->ops->graph_reset(be);
    *out = f;
    return DSI_OK;
}

void dsi_fwd_free(struct dsi_fwd *f) {
    if (!f) return;
    if (f->be->ops->graph_reset) f->be->ops->graph_reset(f->be); /* they use these buffers */
    void *dev[] = {f->d_tokens, f->d_pos,  f->d_slot, f->d_row0,  f->d_idx,    f->X,
                   f->X2,       f->y,      f->x,      f->xq,      f->post,     f->comb,
                   f->f,        f->qa,     f->qaq,    f->q,       f->kv_rows,  f->o,
                   f->z,        f->ca,     f->cb,     f->ia,      f->ib,       f->qI,
                   f->wI,       f->glog,   f->moe_w,  f->moe_idx, f->moe_work, f->ent,
                   f->ient,     f->logits, f->sel,    f->n_sel,   f->d_srows,  f->d_stok};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i]) f->be->ops->mfree(f->be, dev[i]);
    for (int i = 0; i < f->n_rc; i++) {
        void *k[] = {f->rc[i].emit_rows, f->rc[i].emit_entry, f->rc[i].emit_pos, f->rc[i].store};
        for (size_t j = 0; j < 4; j++)
            if (k[j]) f->be->ops->mfree(f->be, k[j]);
    }
    void *host[] = {f->h_row0,     f->h_emit_rows, f->h_emit_entry,
                    f->h_emit_pos, f->h_idx,       f->h_store};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
    free(f);
}

/* ---- helpers over the op table --------------------------------------------------------------- */

/* y = x W^T and, with w2, y2 = x W2^T in the same op (a pair: dsi_gemm_args.w2); round: bf16
 * outputs; x_fp8: x is act()'s output (FP8-quantised rows when f->R: dsi_gemm_args.x_fp8). */
static void gemm2(struct dsi_fwd *f,
                  const struct dsi_tensor *w,
                  const struct dsi_tensor *w2,
                  const float *x,
                  int64_t n,
                  int64_t ldx,
                  float *y,
                  int64_t ldy,
                  float *y2,
                  int64_t ldy2,
                  bool round,
                  bool x_fp8) {
    struct dsi_gemm_args a = {.w = w,
                              .n_out = w->ne[1],
                              .x = x,
                              .n = n,
                              .ldx = ldx,
                              .y = y,
                              .ldy = ldy,
                              .round_bf16 = round,
                              .fast = f->F,
                              .x_fp8 = x_fp8,
                              .w2 = w2,
                              .n_out2 = w2 ? w2->ne[1] : 0,
                              .ldy2 = ldy2,
                              .y2 = y2};
    f->be->ops->gemm(f->be, &a);
}

static void gemm(struct dsi_fwd *f,
                 const struct dsi_tensor *w,
                 const float *x,
                 int64_t n,
                 int64_t ldx,
                 float *y,
                 int64_t ldy,
                 bool round,
                 bool x_fp8) {
    gemm2(f, w, NULL, x, n, ldx, y, ldy, NULL, 0, round, x_fp8);
}

/* In reference numerics, quantise the activation rows (FP8, 128-blocks) into xq first (unless
 * the norm just before made them: rmsq). */
static const float *act(struct dsi_fwd *f, const float *x, int64_t n, int64_t dim, float *xq) {
    bool done = f->q_src == x && f->q_dst == xq && f->q_n == n && f->q_dim == dim;
    f->q_src = NULL;
    f->q_dst = NULL;
    if (!f->R) return x;
    if (done) return xq;
    struct dsi_act_quant_args a = {x, xq, n, dim, dim, dim, 128};
    f->be->ops->act_quant(f->be, &a);
    return xq;
}

/* yq (may be NULL) holds act_quant(y) of n rows of dim: the next act(y, n, dim, yq) returns it. */
static void mark_q(struct dsi_fwd *f, const float *y, float *yq, int64_t n, int64_t dim) {
    f->q_src = yq ? y : NULL;
    f->q_dst = yq;
    f->q_n = n;
    f->q_dim = dim;
}

/* y = RMSNorm(x) w; with yq (reference / fast numerics), also yq = act_quant(y) in the same op,
 * which the next act(y, n, dim, yq) call then returns. */
static void rmsq(struct dsi_fwd *f,
                 const float *x,
                 float *y,
                 int64_t n,
                 int64_t dim,
                 const struct dsi_tensor *w,
                 float *yq) {
    yq = f->R ? yq : NULL;
    struct dsi_rms_norm_args a = {.x = x,
                                  .y = y,
                                  .n = n,
                                  .n_groups = 1,
                                  .dim = dim,
                                  .ldx = dim,
                                  .ldy = dim,
                                  .w = w,
                                  .eps = (float)f->c->rms_norm_eps,
                                  .round_bf16 = f->R,
                                  .yq = yq};
    f->be->ops->rms_norm(f->be, &a);
    mark_q(f, y, yq, n, dim);
}

static void rms(struct dsi_fwd *f,
                const float *x,
                float *y,
                int64_t n,
                int64_t dim,
                const struct dsi_tensor *w) {
    rmsq(f, x, y, n, dim, w, NULL);
}

/* the rope op's arguments for heads of width values at pos (the layer's table) */
static struct dsi_rope_args rope_args(struct dsi_fwd *f,
                                      float *x,
                                      int64_t n,
                                      int64_t ldx,
                                      int64_t heads,
                                      int64_t width,
                                      const int32_t *pos,
                                      int table,
                                      bool inverse) {
    return (struct dsi_rope_args){.x = x,
                                  .n = n,
                                  .ldx = ldx,
                                  .n_heads = heads,
                                  .head_stride = width,
                                  .width = (int)width,
                                  .rope_dim = f->c->qk_rope_head_dim,
                                  .pos = pos,
                                  .freq = f->m->freq_dev[table],
                                  .inverse = inverse,
                                  .round_bf16 = f->R};
}

/* ---- compressors (spec 4.6) --------------------------------------------------------------------
 */

/* Pool the entries completed this step, finish them (RMSNorm(norm) with its input
 * bf16-rounded in reference numerics, RoPE at i*ratio, [QAT]) and store them in the pages;
 * then keep the step's last tokens in the slots. a/b: [n, slot_w] rows (b gets ape here). */
static void compressor(struct dsi_fwd *f,
                       const struct dsi_compressor_w *w,
                       struct ratio_class *k,
                       float *a,
                       float *b,
                       int64_t width,
                       bool overlap,
                       float *slot_a,
                       float *slot_b,
                       struct dsi_kv_rows pool,
                       float *tmp,
                       bool index_key) {
    struct dsi_backend *be = f->be;
    int64_t slot_w = (overlap ? 2 : 1) * width;
    struct dsi_comp_ape_args ap = {&f->st, b, slot_w, &w->ape, k->ratio};
    be->ops->comp_ape(be, &ap);
    if (k->n_emit) {
        struct dsi_compress_args ca = {&f->st, k->emit_rows, k->n_emit, a,          b,       slot_a,
                                       slot_b, k->n_slots,   k->ratio,  (int)width, overlap, tmp};
        be->ops->compress(be, &ca);
        struct dsi_rms_norm_args nr = {.x = tmp,
                                       .y = tmp,
                                       .n = k->n_emit,
                                       .n_groups = 1,
                                       .dim = width,
                                       .ldx = width,
                                       .ldy = width,
                                       .w = &w->norm,
                                       .eps = (float)f->c->rms_norm_eps,
                                       .round_bf16 = f->R};
        be->ops->rms_norm(be, &nr);
        struct dsi_rope_args ra = {.x = tmp,
                                   .n = k->n_emit,
                                   .ldx = width,
                                   .n_heads = 1,
                                   .head_stride = width,
                                   .width = (int)width,
                                   .rope_dim = f->c->qk_rope_head_dim,
                                   .pos = k->emit_pos,
                                   .freq = f->m->freq_dev[1],
                                   .round_bf16 = f->R};
        be->ops->rope(be, &ra);
        if (f->R && index_key) {
            struct dsi_hadamard_q4_args h = {tmp, k->n_emit, 1, width, width};
            be->ops->hadamard_q4(be, &h);
        } else if (f->R) {
            struct dsi_act_quant_args q = {tmp, tmp, k->n_emit, f->c->nope_dim, width, width, 64};
            be->ops->act_quant(be, &q);
        }
        struct dsi_entry_store_args es = {&f->st,   k->emit_rows, k->emit_entry, k->n_emit,
                                          k->ratio, tmp,          width,         pool};
        be->ops->entry_store(be, &es);
    }
    struct dsi_comp_store_args cs = {&f->st, k->store, a, b, slot_a, slot_b, k->n_slots, slot_w};
    be->ops->comp_store(be, &cs);
}

/* The backend's prefetch hint (if it takes hints) for up to DSI_PREFETCH_MAX weights. */
static void prefetch(struct dsi_fwd *f,
                     const struct dsi_tensor *a,
                     const struct dsi_tensor *b,
                     const struct dsi_tensor *c,
                     const struct dsi_tensor *d) {
    if (!f->be->ops->prefetch) return;
    struct dsi_prefetch_args p = {{a, b, c, d}, f->st.n};
    f->be->ops->prefetch(f->be, &p);
}

/* ---- attention (spec 4.5)
 * ------------------------------------------------------------------------ */

static void attention(struct dsi_fwd *f, int il) {
    const struct dsi_config *c = f->c;
    const struct dsi_layer_w *L = &f->m->layers[il];
    const struct dsi_layer_info *li = &c->layers[il];
    struct dsi_layer_cache *S = &f->kv->layers[il];
    struct dsi_backend *be = f->be;
    int64_t n = f->st.n, D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim;
    int64_t HD = H * hd, ql = c->q_lora_rank;
    int64_t ihd = c->index_head_dim, nih = c->index_n_heads;
    const int32_t *pos = f->st.pos;
    int tab = li->rope;

    const float *xq = act(f, f->x, n, D, f->xq);
    gemm2(f, &L->wq_a, &L->wkv, xq, n, D, f->qa, ql, f->kv_rows, hd, f->R,
          f->R); /* q and kv from x */
    rmsq(f, f->qa, f->qa, n, ql, &L->q_norm, f->qaq);
    const float *qaq = act(f, f->qa, n, ql, f->qaq);
    /* (q goes only to the attention op below: y_to_attn / q_from_gemm) */
    struct dsi_gemm_args qb = {.w = &L->wq_b,
                               .n_out = L->wq_b.ne[1],
                               .x = qaq,
                               .n = n,
                               .ldx = ql,
                               .y = f->q,
                               .ldy = HD,
                               .round_bf16 = f->R,
                               .fast = f->F,
                               .x_fp8 = f->R,
                               .y_to_attn = true};
    be->ops->gemm(be, &qb);
    /* the output projection's weights, read after the cache stores, compressors and attention */
    prefetch(f, &L->wo_a, NULL, NULL, NULL);
    /* the per-head q norm, then RoPE: applied by the attention op to q (aa.q_norm), which may
       fuse it into its reads of q */
    struct dsi_rms_norm_args qn = {.x = f->q,
                                   .y = f->q,
                                   .n = n,
                                   .n_groups = H,
                                   .dim = hd,
                                   .ldx = HD,
                                   .ldy = HD,
                                   .w = NULL,
                                   .eps = (float)c->rms_norm_eps,
                                   .round_bf16 = f->R,
                                   .rope_dim = c->qk_rope_head_dim,
                                   .pos = pos,
                                   .freq = f->m->freq_dev[tab]};
    /* the KV norm, RoPE and [QAT] quantisation of the nope dims (kv_quant): one op */
    struct dsi_rms_norm_args kn = qn;
    kn.x = kn.y = f->kv_rows;
    kn.n_groups = 1;
    kn.ldx = kn.ldy = hd;
    kn.w = &L->kv_norm;
    kn.q_dim = f->R ? c->nope_dim : 0;
    kn.q_block = 64; /* [QAT] KV nope dims */
    be->ops->rms_norm(be, &kn);
    struct dsi_kv_store_args ks = {&f->st, f->kv_rows, hd, S->ring};
    be->ops->kv_store(be, &ks);

    int ratio = li->ratio;
    bool csa = li->kind == DSI_ATTN_CSA;
    if (ratio) {
        struct ratio_class *k = class_of(f, ratio);
        int64_t cw = (csa ? 2 : 1) * hd;
        gemm2(f, &L->comp.wkv, &L->comp.wgate, f->x, n, D, f->ca, cw, f->cb, cw, false, false);
        compressor(f, &L->comp, k, f->ca, f->cb, hd, csa, S->slot_a, S->slot_b, S->entries, f->ent,
                   false);
        if (csa) {
            gemm2(f, &L->idx_comp.wkv, &L->idx_comp.wgate, f->x, n, D, f->ia, 2 * ihd, f->ib,
                  2 * ihd, false, false);
            compressor(f, &L->idx_comp, k, f->ia, f->ib, ihd, true, S->islot_a, S->islot_b,
                       S->ikeys, f->ient, true);
            gemm(f, &L->idx_wq_b, qaq, n, ql, f->qI, nih * ihd, f->R, f->R);
            struct dsi_rope_args qr = rope_args(f, f->qI, n, nih * ihd, nih, ihd, pos, tab, false);
            be->ops->rope(be, &qr);
            if (f->R) {
                struct dsi_hadamard_q4_args h = {f->qI, n, nih, ihd, nih * ihd};
                be->ops->hadamard_q4(be, &h);
            }
            gemm(f, &L->idx_weights_proj, f->x, n, D, f->wI, nih, f->R, false);
            struct dsi_indexer_args ia = {.st = &f->st,
                                          .q = f->qI,
                                          .w = f->wI,
                                          .n_heads = nih,
                                          .head_dim = ihd,
                                          .keys = S->ikeys,
                                          .ratio = ratio,
                                          .score_scale = 1.0f / sqrtf((float)ihd),
                                          .w_scale = 1.0f / sqrtf((float)nih),
                                          .topk = c->index_topk,
                                          .sel = f->sel,
                                          .n_sel = f->n_sel,
                                          .fast = f->F};
            be->ops->indexer(be, &ia);
        }
    }
    /* the inverse RoPE on the output: applied by the attention op (aa.out_rope), which may fuse
       it into its writes */
    struct dsi_rope_args orope = rope_args(f, f->o, n, HD, H, hd, pos, tab, true);
    /* Grouped output projection: z_g = wo_a[g] o_g, then out = wo_b z. */
    struct dsi_gemm_args ga = {.w = &L->wo_a,
                               .n_out = c->o_lora_rank,
                               .x = f->o,
                               .n = n,
                               .ldx = HD,
                               .y = f->z,
                               .ldy = c->wo_b_in,
                               .round_bf16 = f->R,
                               .fast = f->F,
                               .groups = c->o_groups,
                               .gx = c->group_in_dim,
                               .gy = c->o_lora_rank,
                               .x_from_attn = true};
    struct dsi_attn_args aa = {.st = &f->st,
                               .q = f->q,
                               .out = f->o,
                               .n_heads = H,
                               .head_dim = hd,
                               .ring = S->ring,
                               .entries = ratio ? S->entries : (struct dsi_kv_rows){0},
                               .ratio = ratio,
                               .sel = csa ? f->sel : NULL,
                               .n_sel = csa ? f->n_sel : NULL,
                               .topk = c->index_topk,
                               .sinks = &L->attn_sink,
                               .scale = 1.0f / sqrtf((float)hd),
                               .round_probs = f->R,
                               .round_bf16 = f->R,
                               .fast = f->F,
                               .q_norm = &qn,
                               .out_rope = &orope,
                               .out_to_gemm = true,
                               .q_from_gemm = true,
                               .out_gemm = &ga};
    be->ops->attn(be, &aa);
    be->ops->gemm(be, &ga);
    const float *zq = act(f, f->z, n, c->wo_b_in, f->xq);
    gemm(f, &L->wo_b, zq, n, c->wo_b_in, f->f, D, f->R, f->R);
}

/* ---- MoE (spec 4.8)
 * -------------------------------------------------------------------------------- */

static void moe(struct dsi_fwd *f, int il) {
    const struct dsi_config *c = f->c;
    const struct dsi_layer_w *L = &f->m->layers[il];
    int64_t n = f->st.n, D = c->hidden_size;
    gemm(f, &L->gate_w, f->x, n, D, f->glog, c->n_routed_experts, false, false);
    struct dsi_moe_route_args ra = {.logits = f->glog,
                                    .n = n,
                                    .n_experts = c->n_routed_experts,
                                    .topk = c->num_experts_per_tok,
                                    .bias = L->has_bias ? &L->gate_bias : NULL,
                                    .tid2eid = L->has_tid2eid ? &L->tid2eid : NULL,
                                    .tokens = f->st.tokens,
                                    .route_scale = (float)c->routed_scaling_factor,
                                    .eps = f->R ? 0.0f : 1e-20f,
                                    .idx = f->moe_idx,
                                    .weight = f->moe_w};
    f->be->ops->moe_route(f->be, &ra);
    const float *xq = act(f, f->x, n, D, f->xq);
    struct dsi_moe_args ma = {.x = xq,
                              .n = n,
                              .dim = D,
                              .inter = c->moe_intermediate_size,
                              .topk = c->num_experts_per_tok,
                              .idx = f->moe_idx,
                              .weight = f->moe_w,
                              .w1 = L->pw1,
                              .w2 = L->pw2,
                              .w3 = L->pw3,
                              .sw1 = &L->sh_w1,
                              .sw2 = &L->sh_w2,
                              .sw3 = &L->sh_w3,
                              .n_experts = c->n_routed_experts,
                              .limit = (float)c->swiglu_limit,
                              .act_quant = f->R,
                              .round_bf16 = f->R,
                              .fast = f->F,
                              .y = f->f,
                              .work = f->moe_work};
    f->be->ops->moe(f->be, &ma);
}

/* ---- one block
 * ----------------------------------------------------------------------------------- */

/* hc_pre, then x = RMSNorm(y) norm (and xq = act_quant(x) in reference / fast numerics) in the
 * same op, as rmsq(f, f->y, f->x, n, D, norm, f->xq) would. */
static struct dsi_hc_post_args merge_args(const struct dsi_fwd *f, int64_t n) {
    const struct dsi_config *c = f->c;
    return (struct dsi_hc_post_args){.f = f->f,
                                     .X = f->X,
                                     .post = f->post,
                                     .comb = f->comb,
                                     .Xo = f->X2,
                                     .n = n,
                                     .hc = c->hc_mult,
                                     .dim = c->hidden_size,
                                     .round_bf16 = f->R,
                                     .xbf16 = f->xbf16};
}

/* X and X2 swapped: the streams hc_post wrote are X now */
static void merge_swap(struct dsi_fwd *f) {
    float *t = f->X;
    f->X = f->X2;
    f->X2 = t;
    f->merge_due = false;
}

static void
hc_site(struct dsi_fwd *f, const struct dsi_hc_w *hc, int64_t n, const struct dsi_tensor *norm) {
    const struct dsi_config *c = f->c;
    float *zq = f->R ? f->xq : NULL;
    /* the hc_post owed by the last sublayer, as this op's first part */
    struct dsi_hc_post_args pa = merge_args(f, n);
    bool due = f->merge_due;
    if (due) merge_swap(f);
    struct dsi_hc_pre_args a = {.X = f->X,
                                .n = n,
                                .hc = c->hc_mult,
                                .dim = c->hidden_size,
                                .fn = &hc->fn,
                                .base = &hc->base,
                                .scale = &hc->scale,
                                .iters = c->hc_sinkhorn_iters,
                                .norm_eps = (float)c->rms_norm_eps,
                                .hc_eps = (float)c->hc_eps,
                                .y = f->y,
                                .post = f->post,
                                .comb = f->comb,
                                .round_bf16 = f->R,
                                .fast = f->F,
                                .norm_w = norm,
                                .z_eps = (float)c->rms_norm_eps,
                                .z = f->x,
                                .zq = zq,
                                .post_first = due ? &pa : NULL,
                                .xbf16 = f->xbf16};
    f->be->ops->hc_pre(f->be, &a);
    mark_q(f, f->x, zq, n, c->hidden_size);
}

/* The sublayer's output f merged into the streams (spec 4.4's hc_post): owed to the next
 * hc_site, which runs it as its op's first part (post_first), or to hc_flush. */
static void hc_merge(struct dsi_fwd *f) { f->merge_due = true; }

/* The owed hc_post as an op of its own (before anything but a hc_site reads X). */
static void hc_flush(struct dsi_fwd *f) {
    if (!f->merge_due) return;
    struct dsi_hc_post_args a = merge_args(f, f->st.n);
    f->be->ops->hc_post(f->be, &a);
    merge_swap(f);
}

static void block(struct dsi_fwd *f, int il) {
    const struct dsi_layer_w *L = &f->m->layers[il];
    int64_t n = f->st.n;
    /* the q up-projection's weight, read after hc_pre, the norm and the q / kv projection */
    prefetch(f, &L->wq_b, NULL, NULL, NULL);
    hc_site(f, &L->hc_attn, n, &L->attn_norm); /* and attention's first act() */
    attention(f, il);
    hc_merge(f);
    /* the router's and the shared expert's weights, read after hc_pre and the norm */
    prefetch(f, &L->gate_w, &L->sh_w1, &L->sh_w3, &L->sh_w2);
    hc_site(f, &L->hc_ffn, n, &L->ffn_norm); /* and moe's act() after the routing */
    moe(f, il);
    hc_merge(f);
}

/* The rows that want logits: their indices uploaded to d_idx; returns their count m. */
static int64_t logit_rows(struct dsi_fwd *f, const struct dsi_batch *b) {
    int64_t m = 0;
    for (int r = 0; r < b->n; r++)
        if (!b->want_logits || b->want_logits[r]) f->h_idx[m++] = r;
    if (m) f->be->ops->upload(f->be, f->d_idx, f->h_idx, sizeof(int32_t) * (size_t)m);
    return m;
}

/* Final collapse + norm + head for the m rows of d_idx (logit_rows), into f->logits (backend
 * memory, [m, vocab]). */
static void
head(struct dsi_fwd *f, int64_t m, const struct dsi_hc_w *hc, const struct dsi_tensor *norm) {
    const struct dsi_config *c = f->c;
    int64_t D = c->hidden_size;
    if (!m) return;
    struct dsi_gather_args g = {f->X, f->d_idx, f->X2, m, c->hc_dim, f->xbf16};
    f->be->ops->gather(f->be, &g);
    struct dsi_hc_head_args a = {.X = f->X2,
                                 .n = m,
                                 .hc = c->hc_mult,
                                 .dim = D,
                                 .fn = &hc->fn,
                                 .base = &hc->base,
                                 .scale = &hc->scale,
                                 .norm_eps = (float)c->rms_norm_eps,
                                 .hc_eps = (float)c->hc_eps,
                                 .y = f->y,
                                 .round_bf16 = f->R};
    f->be->ops->hc_head(f->be, &a);
    rms(f, f->y, f->x, m, D, norm);
    gemm(f, &f->m->head, f->x, m, D, f->logits, c->vocab_size, false, false);
}

/* head() and the logits to host memory (an eager step: the MTP layer). */
static void head_logits(struct dsi_fwd *f,
                        const struct dsi_batch *b,
                        const struct dsi_hc_w *hc,
                        const struct dsi_tensor *norm,
                        float *logits) {
    int64_t m = logit_rows(f, b);
    head(f, m, hc, norm);
    if (m)
        f->be->ops->download(f->be, logits, f->logits,
                             sizeof(float) * (size_t)(m * f->c->vocab_size));
}

/* ---- the step's batch description
 * ----------------------------------------------------------------- */

/* Validate the batch and upload its description: rows of a sequence contiguous, in order,
 * continuing the sequence, within its reserved pages and the ring's room. pad: the
 * compressors' emit lists get an entry for every row (-1: padding), as a recorded step needs. */
static int
prepare(struct dsi_fwd *f, const struct dsi_batch *b, bool mtp, bool pad, struct dsi_err *err) {
    const struct dsi_config *c = f->c;
    struct dsi_kv *kv = f->kv;
    f->q_src = NULL; /* no rmsq result crosses a step */
    f->q_dst = NULL;
    if (b->n < 1 || b->n > f->max_rows)
        return dsi_errf(err, DSI_ERR_INVALID, "batch: %d rows, want 1..%d", b->n, f->max_rows);
    for (int r = 0; r < b->n; r++) {
        int s = b->slot[r];
        if (s < 0 || s >= kv->max_seqs || !kv->seqs[s].used)
            return dsi_errf(err, DSI_ERR_INVALID, "batch row %d: slot %d is not an open sequence",
                            r, s);
        if (b->tokens[r] < 0 || b->tokens[r] >= c->vocab_size)
            return dsi_errf(err, DSI_ERR_INVALID, "batch row %d: token id %d out of range 0..%d", r,
                            b->tokens[r], c->vocab_size - 1);
        bool first = r == 0 || b->slot[r - 1] != s;
        f->h_row0[r] = first ? r : f->h_row0[r - 1];
        int64_t want =
            first ? (mtp ? kv->seqs[s].mtp_n_past : kv->seqs[s].n_past) : b->pos[r - 1] + 1;
        if (first)
            for (int q = 0; q < r; q++)
                if (b->slot[q] == s)
                    return dsi_errf(err, DSI_ERR_INVALID,
                                    "batch row %d: rows of slot %d are not contiguous", r, s);
        if (b->pos[r] != want)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "batch row %d: position %d, want %lld (rows of a sequence continue "
                            "it in order)",
                            r, b->pos[r], (long long)want);
        if (b->pos[r] >= (int64_t)kv->seqs[s].n_pages * kv->page_tokens)
            return dsi_errf(err, DSI_ERR_CONTEXT_FULL,
                            "batch row %d: position %d has no cache page reserved", r, b->pos[r]);
        if (r - f->h_row0[r] + c->sliding_window > kv->ring_cap)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "batch: more rows of one sequence than the cache rings hold (%d)",
                            kv->ring_cap - c->sliding_window + 1);
    }
    struct dsi_backend *be = f->be;
    size_t bytes = sizeof(int32_t) * (size_t)b->n;
    be->ops->upload(be, f->d_tokens, b->tokens, bytes);
    be->ops->upload(be, f->d_pos, b->pos, bytes);
    be->ops->upload(be, f->d_slot, b->slot, bytes);
    be->ops->upload(be, f->d_row0, f->h_row0, bytes);
    f->st.n = b->n;
    for (int i = 0; i < f->n_rc && !mtp; i++) {
        struct ratio_class *k = &f->rc[i];
        int ne = 0;
        /* rows backwards, so that the last row of each sequence is known (one pass: a scan
           forward from every row was quadratic in a prefill chunk's rows) */
        for (int r = b->n - 1, last = r; r >= 0; r--) {
            if (r + 1 == b->n || b->slot[r + 1] != b->slot[r]) last = r;
            f->h_store[r] = b->pos[r] > b->pos[last] - k->n_slots;
        }
        for (int r = 0; r < b->n; r++) {
            if ((b->pos[r] + 1) % k->ratio == 0) {
                f->h_emit_rows[ne] = r;
                f->h_emit_entry[ne] = (b->pos[r] + 1) / k->ratio - 1;
                f->h_emit_pos[ne++] = (b->pos[r] + 1 - k->ratio);
            }
        }
        if (pad) /* a recorded step: launches over every row, padding rows skipped */
            for (; ne < b->n; ne++) {
                f->h_emit_rows[ne] = -1;
                f->h_emit_entry[ne] = 0;
                f->h_emit_pos[ne] = 0;
            }
        k->n_emit = ne;
        be->ops->upload(be, k->store, f->h_store, (size_t)b->n);
        if (ne) {
            be->ops->upload(be, k->emit_rows, f->h_emit_rows, sizeof(int32_t) * (size_t)ne);
            be->ops->upload(be, k->emit_entry, f->h_emit_entry, sizeof(int32_t) * (size_t)ne);
            be->ops->upload(be, k->emit_pos, f->h_emit_pos, sizeof(int32_t) * (size_t)ne);
        }
    }
    return DSI_OK;
}

static void advance(struct dsi_fwd *f, const struct dsi_batch *b, bool mtp) {
    for (int r = 0; r < b->n; r++) {
        struct dsi_kv_seq_info *s = &f->kv->seqs[b->slot[r]];
        int64_t *np = mtp ? &s->mtp_n_past : &s->n_past;
        if (b->pos[r] + 1 > *np) *np = b->pos[r] + 1;
    }
}

/* A step the backend may record and replay (graph_begin): one row per sequence (decode), so
 * that its launches depend only on the row and logit-row counts (the compressors' emit lists
 * are padded to every row, see prepare). */
static bool graph_step(const struct dsi_fwd *f, const struct dsi_batch *b) {
    if (!f->be->ops->graph_begin) return false;
    for (int r = 1; r < b->n; r++)
        if (b->slot[r] == b->slot[r - 1]) return false;
    return true;
}

/* Whether a main step of n rows holds the streams X in bf16 (the backend's xbf16_ok): their
 * values are bf16 wherever the rounding points are on (the embedding's rows of a BF16 table,
 * hc_post's rounded outputs), so only the bytes change; in `fast` numerics, where the backend's
 * mHC passes are the ones that gain. Not with the streams wanted back (dsi_forward's streams:
 * floats) nor in the MTP step (its X is made by a GEMM and adds on floats). */
static bool xbf16_step(const struct dsi_fwd *f, int64_t n, bool streams) {
    const struct dsi_config *c = f->c;
    return f->be->ops->xbf16_ok && f->R && f->F && !streams && f->m->embed.type == DSI_TYPE_BF16 &&
           f->be->ops->xbf16_ok(f->be, n, c->hc_mult, c->hidden_size);
}

/* The main model for one step: embedding, every layer, the head for the m rows of d_idx
 * (m > 0), the sample op (sample: d_srows uploaded). Recorded and replayed as one graph when
 * the backend can (key: rows, logit rows, sampling, the streams' type). streams: X is
 * downloaded after the step (as floats). */
static int main_step(struct dsi_fwd *f,
                     const struct dsi_batch *b,
                     int64_t m,
                     bool sample,
                     bool graph,
                     bool streams) {
    const struct dsi_config *c = f->c;
    struct dsi_backend *be = f->be;
    f->xbf16 = xbf16_step(f, b->n, streams);
    uint64_t key =
        (uint64_t)b->n | (uint64_t)m << 20 | (uint64_t)sample << 40 | (uint64_t)f->xbf16 << 41;
    int mode = graph ? be->ops->graph_begin(be, key) : DSI_GRAPH_EAGER;
    for (;;) {
        if (mode != DSI_GRAPH_REPLAY) {
            f->merge_due = false; /* (an op that failed may have left one owed) */
            struct dsi_embed_args ea = {&f->m->embed, f->st.tokens, b->n,
                                        c->hc_mult,   f->X,         f->xbf16};
            be->ops->embed(be, &ea);
            for (int il = 0; il < c->num_hidden_layers; il++)
                block(f, il);
            hc_flush(f);
            head(f, m, &f->m->hc_head, &f->m->norm);
            if (sample && m) {
                struct dsi_sample_args sa = {.logits = f->logits,
                                             .n = m,
                                             .n_vocab = c->vocab_size,
                                             .ld = c->vocab_size,
                                             .rows = f->d_srows,
                                             .out = f->d_stok};
                be->ops->sample(be, &sa);
            }
        }
        if (mode == DSI_GRAPH_EAGER) {
            if (graph) be->ops->graph_end(be); /* nothing to launch: closes the bracket */
            break;
        }
        if (be->ops->graph_end(be) != DSI_GRAPH_RETRY) break;
        mode = DSI_GRAPH_EAGER;
    }
    advance(f, b, false);
    return DSI_OK;
}

int dsi_forward_sample(struct dsi_fwd *f,
                       const struct dsi_batch *b,
                       const struct dsi_sample_row *rows,
                       int32_t *tokens,
                       struct dsi_err *err) {
    struct dsi_backend *be = f->be;
    if (!be->ops->sample)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED, "backend %s has no sample op", be->name);
    bool graph = graph_step(f, b);
    int rc = prepare(f, b, false, graph, err);
    if (rc) return rc;
    int64_t m = logit_rows(f, b);
    if (m) be->ops->upload(be, f->d_srows, rows, sizeof(*rows) * (size_t)m);
    main_step(f, b, m, true, graph, false);
    if (m) be->ops->download(be, tokens, f->d_stok, sizeof(int32_t) * (size_t)m);
    return be->ops->sync(be, err);
}

int dsi_forward(struct dsi_fwd *f,
                const struct dsi_batch *b,
                float *logits,
                float *streams,
                struct dsi_err *err) {
    struct dsi_backend *be = f->be;
    bool graph = graph_step(f, b);
    int rc = prepare(f, b, false, graph, err);
    if (rc) return rc;
    const struct dsi_config *c = f->c;
    int64_t m = logits ? logit_rows(f, b) : 0;
    main_step(f, b, m, false, graph, streams != NULL);
    if (streams) be->ops->download(be, streams, f->X, sizeof(float) * (size_t)(b->n * c->hc_dim));
    if (m) be->ops->download(be, logits, f->logits, sizeof(float) * (size_t)(m * c->vocab_size));
    return be->ops->sync(be, err);
}

int dsi_mtp_forward(struct dsi_fwd *f,
                    const struct dsi_batch *b,
                    const float *streams,
                    float *logits,
                    struct dsi_err *err) {
    const struct dsi_config *c = f->c;
    if (c->num_nextn_predict_layers < 1)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED, "model has no MTP layer");
    int rc = prepare(f, b, true, false, err);
    if (rc) return rc;
    int il = c->num_hidden_layers;
    const struct dsi_layer_w *L = &f->m->layers[il];
    int64_t n = b->n, D = c->hidden_size, hc = c->hc_mult;
    struct dsi_backend *be = f->be;
    f->merge_due = false;
    f->xbf16 = false; /* (X made by h_proj and adds on floats) */
    /* e = enorm(embed[next]); X_in[k] = e_proj e + h_proj hnorm(X_t[k]) */
    struct dsi_embed_args ea = {&f->m->embed, f->st.tokens, n, 1, f->y, false};
    be->ops->embed(be, &ea);
    rms(f, f->y, f->y, n, D, &L->enorm);
    const float *eq = act(f, f->y, n, D, f->xq);
    gemm(f, &L->e_proj, eq, n, D, f->f, D, f->R, f->R);
    be->ops->upload(be, f->X2, streams, sizeof(float) * (size_t)(n * c->hc_dim));
    rms(f, f->X2, f->X2, n * hc, D, &L->hnorm);
    const float *hq = act(f, f->X2, n * hc, D, f->xq);
    gemm(f, &L->h_proj, hq, n * hc, D, f->X, D, f->R, f->R);
    for (int64_t k = 0; k < hc; k++) { /* every stream gets e_proj e */
        struct dsi_add_args ad = {f->X + k * D, f->f, f->X + k * D, n, D, hc * D, D, hc * D, f->R};
        be->ops->add(be, &ad);
    }
    block(f, il);
    hc_flush(f);
    advance(f, b, true);
    if (logits) head_logits(f, b, &L->hc_head, &L->norm, logits);
    return be->ops->sync(be, err);
}
