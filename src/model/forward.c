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

#include <math.h>
#include <string.h>

struct dsi_fwd {
    const struct dsi_model *m;
    const struct dsi_config *c;
    struct dsi_backend *be;
    int max_rows;
    int64_t max_ctx, keys_ld;
    bool R; /* reference numerics */
    /* activations, [max_rows, ...] */
    float *X, *X2, *y, *x, *xq, *post, *comb, *f;
    float *qa, *qaq, *q, *kv, *o, *z;
    float *ca, *cb, *ia, *ib, *qI, *wI, *glog, *moe_w, *moe_work, *ent, *ient, *hd_buf;
    int32_t *moe_idx, *n_keys, *sel, *n_sel, *n_vis, *pos_tmp;
    const float **keys, **ikey_base;
};

static void *buf(int64_t n, size_t elem, bool *ok) {
    void *p = dsi_aligned_alloc((size_t)(n > 0 ? n : 1) * elem);
    if (!p) *ok = false;
    return p;
}

int dsi_fwd_new(struct dsi_fwd **out, const struct dsi_model *m, struct dsi_backend *be,
                int max_rows, int64_t max_ctx, enum dsi_numerics numerics, struct dsi_err *err) {
    *out = NULL;
    const struct dsi_config *c = &m->cfg;
    if (max_rows < 1 || max_ctx < 1)
        return dsi_errf(err, DSI_ERR_INVALID, "forward: max_rows and max_ctx must be >= 1");
    struct dsi_fwd *f = dsi_calloc(1, sizeof(*f));
    if (!f) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    f->m = m;
    f->c = c;
    f->be = be;
    f->max_rows = max_rows;
    f->max_ctx = max_ctx;
    f->R = numerics == DSI_NUMERICS_REFERENCE;
    int min_hca = 0;
    for (int il = 0; il < c->n_layers_total; il++)
        if (c->layers[il].kind == DSI_ATTN_HCA && (!min_hca || c->layers[il].ratio < min_hca))
            min_hca = c->layers[il].ratio;
    int64_t max_comp = c->index_topk;
    if (min_hca) max_comp = DSI_MAX(max_comp, max_ctx / min_hca + 1);
    f->keys_ld = c->sliding_window + max_comp;
    int64_t n = max_rows, D = c->hidden_size, HD = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t widest = DSI_MAX(DSI_MAX(D, c->q_lora_rank), DSI_MAX(c->wo_b_in, HD));
    bool ok = true;
    f->X = buf(n * c->hc_dim, 4, &ok);
    f->X2 = buf(n * c->hc_dim, 4, &ok);
    f->y = buf(n * D, 4, &ok);
    f->x = buf(n * D, 4, &ok);
    f->xq = buf(n * widest, 4, &ok);
    f->post = buf(n * c->hc_mult, 4, &ok);
    f->comb = buf(n * c->hc_mult * c->hc_mult, 4, &ok);
    f->f = buf(n * D, 4, &ok);
    f->qa = buf(n * c->q_lora_rank, 4, &ok);
    f->qaq = buf(n * c->q_lora_rank, 4, &ok);
    f->q = buf(n * HD, 4, &ok);
    f->kv = buf(n * c->head_dim, 4, &ok);
    f->o = buf(n * HD, 4, &ok);
    f->z = buf(n * c->wo_b_in, 4, &ok);
    f->ca = buf(n * 2 * c->head_dim, 4, &ok);
    f->cb = buf(n * 2 * c->head_dim, 4, &ok);
    f->ia = buf(n * 2 * c->index_head_dim, 4, &ok);
    f->ib = buf(n * 2 * c->index_head_dim, 4, &ok);
    f->qI = buf(n * c->index_n_heads * c->index_head_dim, 4, &ok);
    f->wI = buf(n * c->index_n_heads, 4, &ok);
    f->glog = buf(n * c->n_routed_experts, 4, &ok);
    f->moe_w = buf(n * c->num_experts_per_tok, 4, &ok);
    f->moe_idx = buf(n * c->num_experts_per_tok, 4, &ok);
    f->moe_work = buf(dsi_moe_work_floats(n, c->num_experts_per_tok, D, c->moe_intermediate_size),
                      4, &ok);
    f->ent = buf(c->head_dim, 4, &ok);
    f->ient = buf(c->index_head_dim, 4, &ok);
    f->n_keys = buf(n, 4, &ok);
    f->sel = buf(n * c->index_topk, 4, &ok);
    f->n_sel = buf(n, 4, &ok);
    f->n_vis = buf(n, 4, &ok);
    f->pos_tmp = buf(n, 4, &ok);
    f->keys = buf(n * f->keys_ld, sizeof(float *), &ok);
    f->ikey_base = buf(n, sizeof(float *), &ok);
    if (!ok) {
        dsi_fwd_free(f);
        return dsi_errf(err, DSI_ERR_NOMEM, "forward: out of memory for %d rows", max_rows);
    }
    /* Per-thread scratch: a decoded weight row, a flattened stream row, attention scores and
     * indexer scores. */
    int64_t kmax = DSI_MAX(DSI_MAX(widest, c->hc_dim), DSI_MAX(c->group_in_dim, c->moe_intermediate_size));
    int64_t need = DSI_MAX(kmax * 4, f->keys_ld * 4);
    need = DSI_MAX(need, (max_ctx / 4 + 2) * 8);
    int rc = be->ops->reserve(be, need, err);
    if (rc) {
        dsi_fwd_free(f);
        return rc;
    }
    *out = f;
    return DSI_OK;
}

void dsi_fwd_free(struct dsi_fwd *f) {
    if (!f) return;
    void *bufs[] = {f->X, f->X2, f->y, f->x, f->xq, f->post, f->comb, f->f, f->qa, f->qaq, f->q,
                    f->kv, f->o, f->z, f->ca, f->cb, f->ia, f->ib, f->qI, f->wI, f->glog,
                    f->moe_w, f->moe_idx, f->moe_work, f->ent, f->ient, f->n_keys, f->sel,
                    f->n_sel, f->n_vis, f->pos_tmp, (void *)f->keys, (void *)f->ikey_base};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    free(f);
}

/* ---- helpers over the op table --------------------------------------------------------------- */

static void gemm(struct dsi_fwd *f, const struct dsi_tensor *w, const float *x, int64_t n,
                 int64_t ldx, float *y, int64_t ldy, bool round) {
    struct dsi_gemm_args a = {.w = w, .n_out = w->ne[1], .x = x, .n = n, .ldx = ldx, .y = y,
                              .ldy = ldy, .round_bf16 = round};
    f->be->ops->gemm(f->be, &a);
}

/* In reference numerics, quantise the activation rows (FP8, 128-blocks) into xq first. */
static const float *act(struct dsi_fwd *f, const float *x, int64_t n, int64_t dim, float *xq) {
    if (!f->R) return x;
    struct dsi_act_quant_args a = {x, xq, n, dim, dim, dim, 128};
    f->be->ops->act_quant(f->be, &a);
    return xq;
}

static void rms(struct dsi_fwd *f, const float *x, float *y, int64_t n, int64_t dim,
                const struct dsi_tensor *w) {
    struct dsi_rms_norm_args a = {.x = x, .y = y, .n = n, .n_groups = 1, .dim = dim, .ldx = dim,
                                  .ldy = dim, .w = w, .eps = (float)f->c->rms_norm_eps,
                                  .round_bf16 = f->R};
    f->be->ops->rms_norm(f->be, &a);
}

static void rope(struct dsi_fwd *f, float *x, int64_t n, int64_t ldx, int64_t heads,
                 int64_t width, const int32_t *pos, int table, bool inverse) {
    struct dsi_rope_args a = {.x = x, .n = n, .ldx = ldx, .n_heads = heads, .head_stride = width,
                              .width = (int)width, .rope_dim = f->c->qk_rope_head_dim, .pos = pos,
                              .freq = f->m->freq[table], .inverse = inverse, .round_bf16 = f->R};
    f->be->ops->rope(f->be, &a);
}

static void kv_quant(struct dsi_fwd *f, float *x, int64_t n, int64_t ld) {
    if (!f->R) return;
    struct dsi_act_quant_args a = {x, x, n, f->c->nope_dim, ld, ld, 64}; /* [QAT] KV nope dims */
    f->be->ops->act_quant(f->be, &a);
}

/* ---- compressors (spec 4.6) -------------------------------------------------------------------- */

/* Pool entry i of a compressor whose token slots hold width-`w` halves (CSA: c = 2 halves). */
static void pool_entry(struct dsi_fwd *f, const float *sa, const float *sb, int n_slots,
                       int64_t slot_w, int ratio, bool csa, int64_t i, int64_t w, float *out) {
    const float *pa[512], *pb[512];
    int ns = 0;
    if (csa) {
        for (int64_t t = ratio * i - ratio; t < ratio * i; t++) /* A-halves of window i-1 */
            if (t >= 0) {
                pa[ns] = sa + (t % n_slots) * slot_w;
                pb[ns++] = sb + (t % n_slots) * slot_w;
            }
        for (int64_t t = ratio * i; t < ratio * (i + 1); t++) { /* B-halves of window i */
            pa[ns] = sa + (t % n_slots) * slot_w + w;
            pb[ns++] = sb + (t % n_slots) * slot_w + w;
        }
    } else {
        for (int64_t t = ratio * i; t < ratio * (i + 1); t++) {
            pa[ns] = sa + (t % n_slots) * slot_w;
            pb[ns++] = sb + (t % n_slots) * slot_w;
        }
    }
    struct dsi_compress_args a = {pa, pb, ns, (int)w, out};
    f->be->ops->compress(f->be, &a);
}

/* Finish entry i: RMSNorm(norm) (its input bf16-rounded in reference numerics), RoPE at i*ratio, [QAT]. */
static void finish_entry(struct dsi_fwd *f, float *e, int64_t w, const struct dsi_tensor *norm,
                         int ratio, int64_t i, bool index_key) {
    struct dsi_rms_norm_args a = {.x = e, .y = e, .n = 1, .n_groups = 1, .dim = w, .ldx = w,
                                  .ldy = w, .w = norm, .eps = (float)f->c->rms_norm_eps,
                                  .round_bf16 = f->R};
    f->be->ops->rms_norm(f->be, &a);
    int32_t p = (int32_t)(i * ratio);
    rope(f, e, 1, w, 1, w, &p, 1, false);
    if (!f->R) return;
    if (index_key) {
        struct dsi_hadamard_q4_args h = {e, 1, 1, w, w};
        f->be->ops->hadamard_q4(f->be, &h);
    } else kv_quant(f, e, 1, w);
}

/* ---- attention (spec 4.5) ------------------------------------------------------------------------ */

static void attention(struct dsi_fwd *f, int il, const struct dsi_batch *b, bool mtp_rows) {
    const struct dsi_config *c = f->c;
    const struct dsi_layer_w *L = &f->m->layers[il];
    const struct dsi_layer_info *li = &c->layers[il];
    struct dsi_backend *be = f->be;
    int64_t n = b->n, D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim;
    int64_t HD = H * hd, ql = c->q_lora_rank, W = c->sliding_window;
    int64_t ihd = c->index_head_dim, nih = c->index_n_heads;
    const int32_t *pos = b->pos;
    int tab = li->rope;

    const float *xq = act(f, f->x, n, D, f->xq);
    gemm(f, &L->wq_a, xq, n, D, f->qa, ql, f->R);
    rms(f, f->qa, f->qa, n, ql, &L->q_norm);
    const float *qaq = act(f, f->qa, n, ql, f->qaq);
    gemm(f, &L->wq_b, qaq, n, ql, f->q, HD, f->R);
    struct dsi_rms_norm_args qn = {.x = f->q, .y = f->q, .n = n, .n_groups = H, .dim = hd,
                                   .ldx = HD, .ldy = HD, .w = NULL,
                                   .eps = (float)c->rms_norm_eps, .round_bf16 = f->R};
    be->ops->rms_norm(be, &qn);
    rope(f, f->q, n, HD, H, hd, pos, tab, false);
    gemm(f, &L->wkv, xq, n, D, f->kv, hd, f->R);
    rms(f, f->kv, f->kv, n, hd, &L->kv_norm);
    rope(f, f->kv, n, hd, 1, hd, pos, tab, false);
    kv_quant(f, f->kv, n, hd);

    int ratio = li->ratio;
    bool csa = li->kind == DSI_ATTN_CSA;
    int64_t cw = (csa ? 2 : 1) * hd;
    if (ratio) {
        gemm(f, &L->comp.wkv, f->x, n, D, f->ca, cw, false);
        gemm(f, &L->comp.wgate, f->x, n, D, f->cb, cw, false);
    }
    if (csa) {
        gemm(f, &L->idx_comp.wkv, f->x, n, D, f->ia, 2 * ihd, false);
        gemm(f, &L->idx_comp.wgate, f->x, n, D, f->ib, 2 * ihd, false);
        gemm(f, &L->idx_wq_b, qaq, n, ql, f->qI, nih * ihd, f->R);
        rope(f, f->qI, n, nih * ihd, nih, ihd, pos, tab, false);
        if (f->R) {
            struct dsi_hadamard_q4_args h = {f->qI, n, nih, ihd, nih * ihd};
            be->ops->hadamard_q4(be, &h);
        }
        gemm(f, &L->idx_weights_proj, f->x, n, D, f->wI, nih, f->R);
    }

    /* Sequential part: state updates in row order. */
    for (int64_t r = 0; r < n; r++) {
        struct dsi_kv_seq *s = b->seq[r];
        struct dsi_kv_layer *S = &s->layers[il];
        int64_t t = pos[r];
        struct dsi_copy_args cp = {f->kv + r * hd, S->ring + (t % s->ring_cap) * hd, 1, hd, hd, hd};
        be->ops->copy(be, &cp);
        if (!ratio) continue;
        struct dsi_slot_write_args sw = {f->ca + r * cw, f->cb + r * cw,
                                         S->slot_a + (t % S->n_slots) * cw,
                                         S->slot_b + (t % S->n_slots) * cw, &L->comp.ape, t, cw,
                                         ratio};
        be->ops->slot_write(be, &sw);
        if (csa) {
            struct dsi_slot_write_args iw = {f->ia + r * 2 * ihd, f->ib + r * 2 * ihd,
                                             S->islot_a + (t % S->n_slots) * 2 * ihd,
                                             S->islot_b + (t % S->n_slots) * 2 * ihd,
                                             &L->idx_comp.ape, t, 2 * ihd, ratio};
            be->ops->slot_write(be, &iw);
        }
        if ((t + 1) % ratio == 0) {
            int64_t i = (t + 1) / ratio - 1;
            float *e = S->entries + i * hd;
            pool_entry(f, S->slot_a, S->slot_b, S->n_slots, cw, ratio, csa, i, hd, e);
            finish_entry(f, e, hd, &L->comp.norm, ratio, i, false);
            S->n_entries = i + 1;
            if (csa) {
                float *k = S->ikeys + i * ihd;
                pool_entry(f, S->islot_a, S->islot_b, S->n_slots, 2 * ihd, ratio, true, i, ihd, k);
                finish_entry(f, k, ihd, &L->idx_comp.norm, ratio, i, true);
                S->n_ikeys = i + 1;
            }
        }
        f->n_vis[r] = (int32_t)((t + 1) / ratio);
        f->ikey_base[r] = S->ikeys;
    }
    if (csa) {
        struct dsi_indexer_args ia = {.q = f->qI, .w = f->wI, .n = n, .n_heads = nih,
                                      .head_dim = ihd, .keys = f->ikey_base,
                                      .n_visible = f->n_vis,
                                      .score_scale = 1.0f / sqrtf((float)ihd),
                                      .w_scale = 1.0f / sqrtf((float)nih),
                                      .topk = c->index_topk, .sel = f->sel, .n_sel = f->n_sel};
        be->ops->indexer(be, &ia);
    }
    /* Key lists: the window (oldest first), then compressed entries in index order. */
    for (int64_t r = 0; r < n; r++) {
        struct dsi_kv_seq *s = b->seq[r];
        struct dsi_kv_layer *S = &s->layers[il];
        const float **kl = f->keys + r * f->keys_ld;
        int64_t t = pos[r], nk = 0;
        for (int64_t p = DSI_MAX(0, t - W + 1); p <= t; p++)
            kl[nk++] = S->ring + (p % s->ring_cap) * hd;
        if (csa)
            for (int i = 0; i < f->n_sel[r]; i++) kl[nk++] = S->entries + (int64_t)f->sel[r * c->index_topk + i] * hd;
        else if (ratio)
            for (int64_t i = 0; i < f->n_vis[r]; i++) kl[nk++] = S->entries + i * hd;
        f->n_keys[r] = (int32_t)nk;
    }
    (void)mtp_rows;
    struct dsi_attn_args aa = {.q = f->q, .out = f->o, .n = n, .n_heads = H, .head_dim = hd,
                               .keys = f->keys, .n_keys = f->n_keys, .keys_ld = f->keys_ld,
                               .sinks = &L->attn_sink, .scale = 1.0f / sqrtf((float)hd),
                               .round_probs = f->R, .round_bf16 = f->R};
    be->ops->attn(be, &aa);
    rope(f, f->o, n, HD, H, hd, pos, tab, true);
    /* Grouped output projection: z_g = wo_a[g] o_g, then out = wo_b z. */
    for (int g = 0; g < c->o_groups; g++) {
        struct dsi_gemm_args ga = {.w = &L->wo_a, .row0 = (int64_t)g * c->o_lora_rank,
                                   .n_out = c->o_lora_rank, .x = f->o + g * c->group_in_dim,
                                   .n = n, .ldx = HD, .y = f->z + g * c->o_lora_rank,
                                   .ldy = c->wo_b_in, .round_bf16 = f->R};
        be->ops->gemm(be, &ga);
    }
    const float *zq = act(f, f->z, n, c->wo_b_in, f->xq);
    gemm(f, &L->wo_b, zq, n, c->wo_b_in, f->f, D, f->R);
}

/* ---- MoE (spec 4.8) -------------------------------------------------------------------------------- */

static void moe(struct dsi_fwd *f, int il, const struct dsi_batch *b) {
    const struct dsi_config *c = f->c;
    const struct dsi_layer_w *L = &f->m->layers[il];
    int64_t n = b->n, D = c->hidden_size;
    gemm(f, &L->gate_w, f->x, n, D, f->glog, c->n_routed_experts, false);
    struct dsi_moe_route_args ra = {.logits = f->glog, .n = n, .n_experts = c->n_routed_experts,
                                    .topk = c->num_experts_per_tok,
                                    .bias = L->has_bias ? &L->gate_bias : NULL,
                                    .tid2eid = L->has_tid2eid ? &L->tid2eid : NULL,
                                    .tokens = b->tokens,
                                    .route_scale = (float)c->routed_scaling_factor,
                                    .eps = f->R ? 0.0f : 1e-20f, .idx = f->moe_idx,
                                    .weight = f->moe_w};
    f->be->ops->moe_route(f->be, &ra);
    const float *xq = act(f, f->x, n, D, f->xq);
    struct dsi_moe_args ma = {.x = xq, .n = n, .dim = D, .inter = c->moe_intermediate_size,
                              .topk = c->num_experts_per_tok, .idx = f->moe_idx,
                              .weight = f->moe_w, .w1 = L->pw1, .w2 = L->pw2, .w3 = L->pw3,
                              .sw1 = &L->sh_w1, .sw2 = &L->sh_w2, .sw3 = &L->sh_w3,
                              .n_experts = c->n_routed_experts, .limit = (float)c->swiglu_limit,
                              .act_quant = f->R, .round_bf16 = f->R, .y = f->f,
                              .work = f->moe_work};
    f->be->ops->moe(f->be, &ma);
}

/* ---- one block ----------------------------------------------------------------------------------- */

static void hc_site(struct dsi_fwd *f, const struct dsi_hc_w *hc, int64_t n) {
    const struct dsi_config *c = f->c;
    struct dsi_hc_pre_args a = {.X = f->X, .n = n, .hc = c->hc_mult, .dim = c->hidden_size,
                                .fn = &hc->fn, .base = &hc->base, .scale = &hc->scale,
                                .iters = c->hc_sinkhorn_iters, .norm_eps = (float)c->rms_norm_eps,
                                .hc_eps = (float)c->hc_eps, .y = f->y, .post = f->post,
                                .comb = f->comb, .round_bf16 = f->R};
    f->be->ops->hc_pre(f->be, &a);
}

static void hc_merge(struct dsi_fwd *f, int64_t n) {
    const struct dsi_config *c = f->c;
    struct dsi_hc_post_args a = {.f = f->f, .X = f->X, .post = f->post, .comb = f->comb,
                                 .Xo = f->X2, .n = n, .hc = c->hc_mult, .dim = c->hidden_size,
                                 .round_bf16 = f->R};
    f->be->ops->hc_post(f->be, &a);
    float *t = f->X;
    f->X = f->X2;
    f->X2 = t;
}

static void block(struct dsi_fwd *f, int il, const struct dsi_batch *b) {
    const struct dsi_layer_w *L = &f->m->layers[il];
    int64_t n = b->n, D = f->c->hidden_size;
    hc_site(f, &L->hc_attn, n);
    rms(f, f->y, f->x, n, D, &L->attn_norm);
    attention(f, il, b, false);
    hc_merge(f, n);
    hc_site(f, &L->hc_ffn, n);
    rms(f, f->y, f->x, n, D, &L->ffn_norm);
    moe(f, il, b);
    hc_merge(f, n);
}

/* Final collapse + norm + head for the rows that want logits. */
static void head(struct dsi_fwd *f, const struct dsi_batch *b, const struct dsi_hc_w *hc,
                 const struct dsi_tensor *norm, float *logits) {
    const struct dsi_config *c = f->c;
    int64_t n = b->n, D = c->hidden_size, m = 0;
    for (int64_t r = 0; r < n; r++) {
        if (b->want_logits && !b->want_logits[r]) continue;
        struct dsi_copy_args cp = {f->X + r * c->hc_dim, f->X2 + m * c->hc_dim, 1, c->hc_dim,
                                   c->hc_dim, c->hc_dim};
        f->be->ops->copy(f->be, &cp);
        m++;
    }
    if (!m) return;
    struct dsi_hc_head_args a = {.X = f->X2, .n = m, .hc = c->hc_mult, .dim = D, .fn = &hc->fn,
                                 .base = &hc->base, .scale = &hc->scale,
                                 .norm_eps = (float)c->rms_norm_eps, .hc_eps = (float)c->hc_eps,
                                 .y = f->y, .round_bf16 = f->R};
    f->be->ops->hc_head(f->be, &a);
    rms(f, f->y, f->x, m, D, norm);
    gemm(f, &f->m->head, f->x, m, D, logits, c->vocab_size, false);
}

static int check_batch(struct dsi_fwd *f, const struct dsi_batch *b, bool mtp,
                       struct dsi_err *err) {
    if (b->n < 1 || b->n > f->max_rows)
        return dsi_errf(err, DSI_ERR_INVALID, "batch: %d rows, want 1..%d", b->n, f->max_rows);
    for (int r = 0; r < b->n; r++) {
        if (b->tokens[r] < 0 || b->tokens[r] >= f->c->vocab_size)
            return dsi_errf(err, DSI_ERR_INVALID, "batch row %d: token id %d out of range 0..%d",
                            r, b->tokens[r], f->c->vocab_size - 1);
        if (b->pos[r] < 0 || b->pos[r] >= b->seq[r]->max_ctx)
            return dsi_errf(err, DSI_ERR_CONTEXT_FULL,
                            "batch row %d: position %d beyond the context of %lld", r, b->pos[r],
                            (long long)b->seq[r]->max_ctx);
    }
    /* Rows of a sequence continue it in order; count them against the ring's room. */
    for (int r = 0; r < b->n; r++) {
        int64_t expect = mtp ? b->seq[r]->mtp_n_past : b->seq[r]->n_past, cnt = 0;
        for (int q = 0; q < r; q++) cnt += b->seq[q] == b->seq[r];
        if (b->pos[r] != expect + cnt)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "batch row %d: position %d, want %lld (rows of a sequence must "
                            "continue it in order)",
                            r, b->pos[r], (long long)(expect + cnt));
        if (cnt + 1 > b->seq[r]->ring_cap - f->c->sliding_window + 1)
            return dsi_errf(err, DSI_ERR_INVALID, "batch: more rows of one sequence than the "
                            "state was sized for");
    }
    return DSI_OK;
}

static void advance(const struct dsi_batch *b, bool mtp) {
    for (int r = 0; r < b->n; r++) {
        int64_t *np = mtp ? &b->seq[r]->mtp_n_past : &b->seq[r]->n_past;
        if (b->pos[r] + 1 > *np) *np = b->pos[r] + 1;
    }
}

int dsi_forward(struct dsi_fwd *f, const struct dsi_batch *b, float *logits, float *streams,
                struct dsi_err *err) {
    int rc = check_batch(f, b, false, err);
    if (rc) return rc;
    const struct dsi_config *c = f->c;
    struct dsi_embed_args ea = {&f->m->embed, b->tokens, b->n, c->hc_mult, f->X};
    f->be->ops->embed(f->be, &ea);
    for (int il = 0; il < c->num_hidden_layers; il++) block(f, il, b);
    advance(b, false);
    if (streams) {
        struct dsi_copy_args cp = {f->X, streams, b->n, c->hc_dim, c->hc_dim, c->hc_dim};
        f->be->ops->copy(f->be, &cp);
    }
    if (logits) head(f, b, &f->m->hc_head, &f->m->norm, logits);
    return DSI_OK;
}

int dsi_mtp_forward(struct dsi_fwd *f, const struct dsi_batch *b, const float *streams,
                    float *logits, struct dsi_err *err) {
    const struct dsi_config *c = f->c;
    if (c->num_nextn_predict_layers < 1)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED, "model has no MTP layer");
    int rc = check_batch(f, b, true, err);
    if (rc) return rc;
    int il = c->num_hidden_layers;
    const struct dsi_layer_w *L = &f->m->layers[il];
    int64_t n = b->n, D = c->hidden_size, hc = c->hc_mult;
    struct dsi_backend *be = f->be;
    /* e = enorm(embed[next]); X_in[k] = e_proj e + h_proj hnorm(X_t[k]) */
    struct dsi_embed_args ea = {&f->m->embed, b->tokens, n, 1, f->y};
    be->ops->embed(be, &ea);
    rms(f, f->y, f->y, n, D, &L->enorm);
    const float *eq = act(f, f->y, n, D, f->xq);
    gemm(f, &L->e_proj, eq, n, D, f->f, D, f->R);
    rms(f, streams, f->X2, n * hc, D, &L->hnorm);
    const float *hq = f->X2;
    if (f->R) {
        struct dsi_act_quant_args q = {f->X2, f->X2, n * hc, D, D, D, 128};
        be->ops->act_quant(be, &q);
    }
    gemm(f, &L->h_proj, hq, n * hc, D, f->X, D, f->R);
    struct dsi_add_args ad = {f->X, f->f, f->X, n * hc, D, D, 0, D, f->R};
    for (int64_t k = 0; k < hc; k++) { /* add e_proj e to each stream */
        for (int64_t r = 0; r < n; r++) {
            struct dsi_add_args a1 = ad;
            a1.a = f->X + (r * hc + k) * D;
            a1.b = f->f + r * D;
            a1.y = f->X + (r * hc + k) * D;
            a1.n = 1;
            be->ops->add(be, &a1);
        }
    }
    block(f, il, b);
    advance(b, true);
    if (logits) head(f, b, &L->hc_head, &L->norm, logits);
    return DSI_OK;
}
