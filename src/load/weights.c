/* weights.c - bind checkpoint tensors to model slots by their official names (and the
 * HF-style aliases the reference's convert step accepts), with strict dtype and shape checks.
 * Weights stay in the mmap in their stored formats (FP8 128x128 blocks, FP4 per-32, or
 * unquantised BF16/F32 linears with no scale tensor). Missing and unexpected tensors are
 * reported together in one message. */
#include "model/dsv4.h"

#include <math.h>
#include <string.h>

enum kind { K_VEC, K_MAT, K_LINEAR, K_EXPERT, K_INT };

struct binder {
    struct dsi_model *m;
    char **names; /* normalised name per st tensor, sorted order kept in `order` */
    int *order;   /* st tensor indices sorted by normalised name */
    bool *used;
    int n;
    char missing[400];
    int n_missing;
    struct dsi_err *err;
    int rc;
};

static void normalise(const char *in, char *out, size_t cap) {
    static const char *from[] = {".self_attn.", ".mlp.", "weight_scale_inv",
                                 "e_score_correction_bias"};
    static const char *to[] = {".attn.", ".ffn.", "scale", "bias"};
    if (!strncmp(in, "model.", 6)) in += 6;
    size_t o = 0;
    while (*in && o + 1 < cap) {
        int hit = 0;
        for (int i = 0; i < 4 && !hit; i++) {
            size_t l = strlen(from[i]);
            if (!strncmp(in, from[i], l) && o + strlen(to[i]) + 1 < cap) {
                memcpy(out + o, to[i], strlen(to[i]));
                o += strlen(to[i]);
                in += l;
                hit = 1;
            }
        }
        if (!hit) out[o++] = *in++;
    }
    out[o] = 0;
}

static struct binder *g_sort_binder;
static int cmp_order(const void *a, const void *b) {
    return strcmp(g_sort_binder->names[*(const int *)a], g_sort_binder->names[*(const int *)b]);
}

static const struct dsi_st_tensor *lookup(struct binder *b, const char *name, int *which) {
    int lo = 0, hi = b->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(b->names[b->order[mid]], name);
        if (!c) {
            *which = b->order[mid];
            return &b->m->st->tensors[b->order[mid]];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static bool is_float(enum dsi_dtype d) {
    return d == DSI_DT_F32 || d == DSI_DT_BF16 || d == DSI_DT_F16;
}

static enum dsi_type to_type(enum dsi_dtype d) {
    switch (d) {
    case DSI_DT_F32:
        return DSI_TYPE_F32;
    case DSI_DT_BF16:
        return DSI_TYPE_BF16;
    case DSI_DT_F16:
        return DSI_TYPE_F16;
    case DSI_DT_F8_E4M3:
        return DSI_TYPE_F8_E4M3;
    case DSI_DT_I8:
        return DSI_TYPE_FP4_E2M1;
    case DSI_DT_F8_E8M0:
        return DSI_TYPE_E8M0;
    case DSI_DT_I32:
        return DSI_TYPE_I32;
    default:
        return DSI_TYPE_I64;
    }
}

static void shape_str(const int64_t *s, int nd, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < nd && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

static bool shape_is(const struct dsi_st_tensor *t, int nd, int64_t d0, int64_t d1) {
    if (t->n_dims != nd) return false;
    return nd == 1 ? t->shape[0] == d0 : t->shape[0] == d0 && t->shape[1] == d1;
}

static void note_missing(struct binder *b, const char *name) {
    if (b->n_missing++ < 4) {
        size_t l = strlen(b->missing);
        snprintf(b->missing + l, sizeof(b->missing) - l, "%s%s", l ? ", " : "", name);
    }
}

/* Bind `name` (rows x cols; rows = 0 for a vector of cols) into *dst. Scale tensors go into
 * the caller's scale array. */
static void bind(struct binder *b,
                 struct dsi_tensor *dst,
                 const char *name,
                 enum kind k,
                 int64_t rows,
                 int64_t cols,
                 struct dsi_tensor *scale_slot) {
    if (b->rc) return;
    int wi;
    const struct dsi_st_tensor *t = lookup(b, name, &wi);
    if (!t) {
        note_missing(b, name);
        return;
    }
    b->used[wi] = true;
    const char *file = b->m->st->shards[t->shard].path;
    char got[96], want[96];
    shape_str(t->shape, t->n_dims, got, sizeof(got));
    memset(dst, 0, sizeof(*dst));
    dst->data = t->data;
    dst->type = to_type(t->dtype);
    dst->ne[0] = cols;
    dst->ne[1] = rows ? rows : 1;
    int nd = rows ? 2 : 1;
    int64_t want_cols = cols;
    bool ok_dtype;
    switch (k) {
    case K_VEC:
    case K_MAT:
        ok_dtype = is_float(t->dtype);
        break;
    case K_LINEAR:
        ok_dtype = is_float(t->dtype) || t->dtype == DSI_DT_F8_E4M3;
        break;
    case K_EXPERT:
        ok_dtype = is_float(t->dtype) || t->dtype == DSI_DT_F8_E4M3 || t->dtype == DSI_DT_I8;
        if (t->dtype == DSI_DT_I8) want_cols = cols / 2;
        break;
    default:
        ok_dtype = t->dtype == DSI_DT_I64 || t->dtype == DSI_DT_I32;
        break;
    }
    if (!ok_dtype) {
        b->rc = dsi_errf(b->err, DSI_ERR_FORMAT, "%s: tensor %s: dtype %s is not valid here", file,
                         name, dsi_dtype_name(t->dtype));
        return;
    }
    if (!shape_is(t, nd, rows ? rows : cols, want_cols)) {
        int64_t ws[2] = {rows ? rows : cols, want_cols};
        shape_str(ws, nd, want, sizeof(want));
        b->rc = dsi_errf(b->err, DSI_ERR_FORMAT, "%s: tensor %s: shape %s, want %s (dtype %s)",
                         file, name, got, want, dsi_dtype_name(t->dtype));
        return;
    }
    bool quant = t->dtype == DSI_DT_F8_E4M3 || t->dtype == DSI_DT_I8;
    char sname[512];
    snprintf(sname, sizeof(sname), "%.*s.scale",
             (int)(strlen(name) -
                   (strlen(name) > 7 && !strcmp(name + strlen(name) - 7, ".weight") ? 7 : 0)),
             name);
    int si;
    const struct dsi_st_tensor *s = lookup(b, sname, &si);
    if (!quant) {
        if (s) {
            b->rc = dsi_errf(b->err, DSI_ERR_FORMAT,
                             "%s: tensor %s: unquantised %s weight must not have a scale tensor",
                             file, sname, dsi_dtype_name(t->dtype));
        }
        return;
    }
    if (!s) {
        b->rc = dsi_errf(b->err, DSI_ERR_FORMAT, "%s: tensor %s (%s) needs its scale tensor %s",
                         file, name, dsi_dtype_name(t->dtype), sname);
        return;
    }
    b->used[si] = true;
    int64_t sr, sc;
    if (t->dtype == DSI_DT_I8) {
        sr = rows;
        sc = cols / 32;
        dst->scale_block[0] = 1;
        dst->scale_block[1] = 32;
    } else {
        sr = (rows + 127) / 128;
        sc = (cols + 127) / 128;
        dst->scale_block[0] = 128;
        dst->scale_block[1] = 128;
    }
    if (s->dtype != DSI_DT_F8_E8M0 || !shape_is(s, 2, sr, sc)) {
        int64_t ws[2] = {sr, sc};
        shape_str(ws, 2, want, sizeof(want));
        shape_str(s->shape, s->n_dims, got, sizeof(got));
        b->rc = dsi_errf(b->err, DSI_ERR_FORMAT, "%s: tensor %s: %s %s, want F8_E8M0 %s", file,
                         sname, dsi_dtype_name(s->dtype), got, want);
        return;
    }
    scale_slot->type = DSI_TYPE_E8M0;
    scale_slot->data = s->data;
    scale_slot->ne[0] = sc;
    scale_slot->ne[1] = sr;
    dst->scale = scale_slot;
    dst->scale_row_stride = sc;
}

#define NM(...) (snprintf(nm, sizeof(nm), __VA_ARGS__), nm)

static void bind_hc(struct binder *b,
                    struct dsi_hc_w *hc,
                    const char *prefix,
                    const char *site,
                    int n_mix,
                    int64_t hc_dim) {
    char nm[256];
    bind(b, &hc->fn, NM("%s%s_fn", prefix, site), K_MAT, n_mix, hc_dim, NULL);
    bind(b, &hc->base, NM("%s%s_base", prefix, site), K_VEC, 0, n_mix, NULL);
    bind(b, &hc->scale, NM("%s%s_scale", prefix, site), K_VEC, 0, !strcmp(site, "hc_head") ? 1 : 3,
         NULL);
}

static void bind_comp(struct binder *b,
                      struct dsi_compressor_w *c,
                      const char *prefix,
                      int ratio,
                      int width,
                      int coff,
                      int D) {
    char nm[256];
    bind(b, &c->ape, NM("%s.ape", prefix), K_MAT, ratio, (int64_t)coff * width, NULL);
    bind(b, &c->wkv, NM("%s.wkv.weight", prefix), K_MAT, (int64_t)coff * width, D, NULL);
    bind(b, &c->wgate, NM("%s.wgate.weight", prefix), K_MAT, (int64_t)coff * width, D, NULL);
    bind(b, &c->norm, NM("%s.norm.weight", prefix), K_VEC, 0, width, NULL);
}

static struct dsi_tensor *next_scale(struct dsi_layer_w *L) {
    DSI_ASSERT(L->n_scales < 16);
    return &L->scales[L->n_scales++];
}

static void bind_layer(struct binder *b, int il) {
    const struct dsi_config *c = &b->m->cfg;
    struct dsi_layer_w *L = &b->m->layers[il];
    bool mtp = il >= c->num_hidden_layers;
    char p[64], nm[256];
    if (mtp)
        snprintf(p, sizeof(p), "mtp.%d.", il - c->num_hidden_layers);
    else
        snprintf(p, sizeof(p), "layers.%d.", il);
    int D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim;
    const struct dsi_layer_info *li = &c->layers[il];
    bind_hc(b, &L->hc_attn, p, "hc_attn", c->hc_mix, c->hc_dim);
    bind_hc(b, &L->hc_ffn, p, "hc_ffn", c->hc_mix, c->hc_dim);
    bind(b, &L->attn_norm, NM("%sattn_norm.weight", p), K_VEC, 0, D, NULL);
    bind(b, &L->ffn_norm, NM("%sffn_norm.weight", p), K_VEC, 0, D, NULL);
    bind(b, &L->attn_sink, NM("%sattn.attn_sink", p), K_VEC, 0, H, NULL);
    bind(b, &L->wq_a, NM("%sattn.wq_a.weight", p), K_LINEAR, c->q_lora_rank, D, next_scale(L));
    bind(b, &L->q_norm, NM("%sattn.q_norm.weight", p), K_VEC, 0, c->q_lora_rank, NULL);
    bind(b, &L->wq_b, NM("%sattn.wq_b.weight", p), K_LINEAR, (int64_t)H * hd, c->q_lora_rank,
         next_scale(L));
    bind(b, &L->wkv, NM("%sattn.wkv.weight", p), K_LINEAR, hd, D, next_scale(L));
    bind(b, &L->kv_norm, NM("%sattn.kv_norm.weight", p), K_VEC, 0, hd, NULL);
    bind(b, &L->wo_a, NM("%sattn.wo_a.weight", p), K_LINEAR, c->wo_b_in, c->group_in_dim,
         next_scale(L));
    bind(b, &L->wo_b, NM("%sattn.wo_b.weight", p), K_LINEAR, D, c->wo_b_in, next_scale(L));
    if (li->kind == DSI_ATTN_CSA) {
        char cp[96];
        snprintf(cp, sizeof(cp), "%sattn.compressor", p);
        bind_comp(b, &L->comp, cp, li->ratio, hd, 2, D);
        snprintf(cp, sizeof(cp), "%sattn.indexer.compressor", p);
        bind_comp(b, &L->idx_comp, cp, li->ratio, c->index_head_dim, 2, D);
        bind(b, &L->idx_wq_b, NM("%sattn.indexer.wq_b.weight", p), K_LINEAR,
             (int64_t)c->index_n_heads * c->index_head_dim, c->q_lora_rank, next_scale(L));
        bind(b, &L->idx_weights_proj, NM("%sattn.indexer.weights_proj.weight", p), K_MAT,
             c->index_n_heads, D, NULL);
    } else if (li->kind == DSI_ATTN_HCA) {
        char cp[96];
        snprintf(cp, sizeof(cp), "%sattn.compressor", p);
        bind_comp(b, &L->comp, cp, li->ratio, hd, 1, D);
    }
    int E = c->n_routed_experts, I = c->moe_intermediate_size;
    bind(b, &L->gate_w, NM("%sffn.gate.weight", p), K_MAT, E, D, NULL);
    L->has_tid2eid = !mtp && li->hash_routed;
    L->has_bias = !L->has_tid2eid;
    if (L->has_tid2eid)
        bind(b, &L->tid2eid, NM("%sffn.gate.tid2eid", p), K_INT, c->vocab_size,
             c->num_experts_per_tok, NULL);
    else
        bind(b, &L->gate_bias, NM("%sffn.gate.bias", p), K_VEC, 0, E, NULL);
    bind(b, &L->sh_w1, NM("%sffn.shared_experts.w1.weight", p), K_LINEAR, I, D, next_scale(L));
    bind(b, &L->sh_w3, NM("%sffn.shared_experts.w3.weight", p), K_LINEAR, I, D, next_scale(L));
    bind(b, &L->sh_w2, NM("%sffn.shared_experts.w2.weight", p), K_LINEAR, D, I, next_scale(L));
    for (int e = 0; e < E && !b->rc; e++) {
        bind(b, &L->ew1[e], NM("%sffn.experts.%d.w1.weight", p, e), K_EXPERT, I, D,
             &L->escales[3 * e]);
        bind(b, &L->ew3[e], NM("%sffn.experts.%d.w3.weight", p, e), K_EXPERT, I, D,
             &L->escales[3 * e + 1]);
        bind(b, &L->ew2[e], NM("%sffn.experts.%d.w2.weight", p, e), K_EXPERT, D, I,
             &L->escales[3 * e + 2]);
        L->pw1[e] = &L->ew1[e];
        L->pw2[e] = &L->ew2[e];
        L->pw3[e] = &L->ew3[e];
    }
    if (mtp) {
        bind(b, &L->e_proj, NM("%se_proj.weight", p), K_LINEAR, D, D, next_scale(L));
        bind(b, &L->h_proj, NM("%sh_proj.weight", p), K_LINEAR, D, D, next_scale(L));
        bind(b, &L->enorm, NM("%senorm.weight", p), K_VEC, 0, D, NULL);
        bind(b, &L->hnorm, NM("%shnorm.weight", p), K_VEC, 0, D, NULL);
        bind(b, &L->norm, NM("%snorm.weight", p), K_VEC, 0, D, NULL);
        bind_hc(b, &L->hc_head, p, "hc_head", c->hc_mult, c->hc_dim);
    }
}

/* Hash tables must name valid, distinct experts: checked once at load. */
static int
check_tid2eid(const struct dsi_model *m, const struct dsi_layer_w *L, int il, struct dsi_err *err) {
    const struct dsi_config *c = &m->cfg;
    int K = c->num_experts_per_tok;
    for (int64_t t = 0; t < c->vocab_size; t++)
        for (int k = 0; k < K; k++) {
            int64_t v;
            const uint8_t *p = (const uint8_t *)L->tid2eid.data +
                               (t * K + k) * (L->tid2eid.type == DSI_TYPE_I64 ? 8 : 4);
            if (L->tid2eid.type == DSI_TYPE_I64)
                memcpy(&v, p, 8);
            else {
                int32_t v32;
                memcpy(&v32, p, 4);
                v = v32;
            }
            if (v < 0 || v >= c->n_routed_experts)
                return dsi_errf(err, DSI_ERR_FORMAT,
                                "tensor layers.%d.ffn.gate.tid2eid: row %lld holds expert %lld, "
                                "want 0..%d",
                                il, (long long)t, (long long)v, c->n_routed_experts - 1);
        }
    return DSI_OK;
}

void dsi_rope_freqs(const struct dsi_config *cfg, int table, float *freq) {
    int rd = cfg->qk_rope_head_dim, half = rd / 2;
    double theta = table ? cfg->compress_rope_theta : cfg->rope_theta;
    /* HF / reference order in fp32: 1 / (theta ** (2i / rd)), pow correctly rounded. */
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)rd;
        freq[i] = 1.0f / (float)pow((double)(float)theta, (double)e);
    }
    if (!table || cfg->yarn_factor <= 0) return;
    /* YaRN (spec 3): ramp between the correction dims of beta_fast and beta_slow. */
    double L0 = (double)cfg->yarn_original_max_pos, s = cfg->yarn_factor;
    double lo = floor(rd * log(L0 / (cfg->yarn_beta_fast * 2 * M_PI)) / (2 * log(theta)));
    double hi = ceil(rd * log(L0 / (cfg->yarn_beta_slow * 2 * M_PI)) / (2 * log(theta)));
    lo = fmax(lo, 0);
    hi = fmin(hi, rd - 1);
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float smooth = 1.0f - (float)ramp; /* extrapolation factor, as in HF's yarn */
        freq[i] = freq[i] / (float)s * (1.0f - smooth) + freq[i] * smooth;
    }
}

int dsi_model_load(struct dsi_model **out, const char *dir, struct dsi_err *err) {
    *out = NULL;
    struct dsi_model *m = dsi_calloc(1, sizeof(*m));
    if (!m) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    int rc = dsi_config_load(&m->cfg, dir, err);
    if (rc) goto fail;
    rc = dsi_st_open(&m->st, dir, err);
    if (rc) goto fail;
    const struct dsi_config *c = &m->cfg;
    struct binder b = {.m = m, .n = m->st->n_tensors, .err = err};
    b.names = dsi_calloc((size_t)b.n, sizeof(char *));
    b.order = dsi_calloc((size_t)b.n, sizeof(int));
    b.used = dsi_calloc((size_t)b.n, sizeof(bool));
    m->layers = dsi_calloc((size_t)c->n_layers_total, sizeof(*m->layers));
    for (int i = 0; i < c->n_layers_total && m->layers; i++) {
        struct dsi_layer_w *L = &m->layers[i];
        size_t E = (size_t)c->n_routed_experts;
        L->ew1 = dsi_calloc(E, sizeof(*L->ew1));
        L->ew2 = dsi_calloc(E, sizeof(*L->ew2));
        L->ew3 = dsi_calloc(E, sizeof(*L->ew3));
        L->pw1 = dsi_calloc(E, sizeof(*L->pw1));
        L->pw2 = dsi_calloc(E, sizeof(*L->pw2));
        L->pw3 = dsi_calloc(E, sizeof(*L->pw3));
        L->escales = dsi_calloc(3 * E, sizeof(*L->escales));
        if (!L->ew1 || !L->ew2 || !L->ew3 || !L->pw1 || !L->pw2 || !L->pw3 || !L->escales)
            b.rc = DSI_ERR_NOMEM;
    }
    m->freq[0] = dsi_calloc((size_t)c->qk_rope_head_dim / 2 + 1, sizeof(float));
    m->freq[1] = dsi_calloc((size_t)c->qk_rope_head_dim / 2 + 1, sizeof(float));
    if (!b.names || !b.order || !b.used || !m->layers || b.rc || !m->freq[0] || !m->freq[1]) {
        rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        goto out_binder;
    }
    for (int i = 0; i < b.n; i++) {
        char tmp[512];
        normalise(m->st->tensors[i].name, tmp, sizeof(tmp));
        b.names[i] = strdup(tmp);
        b.order[i] = i;
    }
    g_sort_binder = &b;
    qsort(b.order, (size_t)b.n, sizeof(int), cmp_order);
    g_sort_binder = NULL;
    for (int i = 1; i < b.n; i++)
        if (!strcmp(b.names[b.order[i - 1]], b.names[b.order[i]])) {
            rc =
                dsi_errf(err, DSI_ERR_FORMAT,
                         "%s: tensors %s and %s have the same name after "
                         "alias renaming",
                         dir, m->st->tensors[b.order[i - 1]].name, m->st->tensors[b.order[i]].name);
            goto out_binder;
        }
    int D = c->hidden_size;
    bind(&b, &m->embed, "embed.weight", K_MAT, c->vocab_size, D, NULL);
    bind(&b, &m->head, "head.weight", K_LINEAR, c->vocab_size, D, &m->top_scales[0]);
    bind(&b, &m->norm, "norm.weight", K_VEC, 0, D, NULL);
    bind_hc(&b, &m->hc_head, "", "hc_head", c->hc_mult, c->hc_dim);
    for (int il = 0; il < c->n_layers_total && !b.rc; il++)
        bind_layer(&b, il);
    if (!b.rc) { /* missing and unexpected tensors, reported together */
        int n_unexp = 0;
        char list[400] = "";
        for (int i = 0; i < b.n; i++) {
            const char *nm = b.names[i];
            /* the reference skips MTP embed/head copies if present */
            if (b.used[i] ||
                (!strncmp(nm, "mtp.", 4) && (strstr(nm, ".embed.") || strstr(nm, ".head."))))
                continue;
            if (n_unexp++ < 4) {
                size_t l = strlen(list);
                snprintf(list + l, sizeof(list) - l, "%s%s", l ? ", " : "", m->st->tensors[i].name);
            }
        }
        if (b.n_missing || n_unexp) {
            char ms[480] = "", us[480] = "";
            if (b.n_missing)
                snprintf(ms, sizeof(ms), "%d tensor%s missing: %s%s", b.n_missing,
                         b.n_missing > 1 ? "s" : "", b.missing, b.n_missing > 4 ? ", ..." : "");
            if (n_unexp)
                snprintf(us, sizeof(us), "%s%d unexpected tensor%s for this config.json: %s%s",
                         b.n_missing ? "; " : "", n_unexp, n_unexp > 1 ? "s" : "", list,
                         n_unexp > 4 ? ", ..." : "");
            b.rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: %s%s", dir, ms, us);
        }
    }
    for (int il = 0; il < c->num_hidden_layers && !b.rc; il++)
        if (m->layers[il].has_tid2eid) b.rc = check_tid2eid(m, &m->layers[il], il, err);
    rc = b.rc;
    if (!rc) {
        dsi_rope_freqs(c, 0, m->freq[0]);
        dsi_rope_freqs(c, 1, m->freq[1]);
        for (int i = 0; i < m->st->n_tensors; i++)
            if (m->st->tensors[i].dtype != DSI_DT_F8_E8M0)
                m->n_params +=
                    m->st->tensors[i].n_elem * (m->st->tensors[i].dtype == DSI_DT_I8 ? 2 : 1);
    }
out_binder:
    for (int i = 0; i < b.n && b.names; i++)
        free(b.names[i]);
    free(b.names);
    free(b.order);
    free(b.used);
    if (rc) goto fail;
    *out = m;
    return DSI_OK;
fail:
    dsi_model_free(m);
    return rc;
}

void dsi_model_free(struct dsi_model *m) {
    if (!m) return;
    for (int i = 0; m->layers && i < m->cfg.n_layers_total; i++) {
        struct dsi_layer_w *L = &m->layers[i];
        free(L->ew1);
        free(L->ew2);
        free(L->ew3);
        free(L->pw1);
        free(L->pw2);
        free(L->pw3);
        free(L->escales);
    }
    free(m->layers);
    free(m->freq[0]);
    free(m->freq[1]);
    dsi_st_close(m->st);
    free(m);
}

/* ---- moving weights to a backend ------------------------------------------------------------- */

static int import_one(struct dsi_backend *be, struct dsi_tensor *t, struct dsi_err *err) {
    if (!t->data) return DSI_OK;
    size_t bytes = (size_t)(dsi_tensor_row_bytes(t) * t->ne[1] * (t->ne[2] ? t->ne[2] : 1) *
                            (t->ne[3] ? t->ne[3] : 1));
    const void *p = be->ops->import(be, t->data, bytes);
    if (!p)
        return dsi_errf(err, DSI_ERR_NOMEM, "%s: cannot place %zu bytes of weights", be->name,
                        bytes);
    t->data = p;
    return DSI_OK;
}

static int import_hc(struct dsi_backend *be, struct dsi_hc_w *h, struct dsi_err *err) {
    int rc = import_one(be, &h->fn, err);
    if (!rc) rc = import_one(be, &h->base, err);
    if (!rc) rc = import_one(be, &h->scale, err);
    return rc;
}

int dsi_model_import(struct dsi_model *m, struct dsi_backend *be, struct dsi_err *err) {
    const struct dsi_config *c = &m->cfg;
    int rc = DSI_OK;
    for (int t = 0; t < 2; t++) { /* RoPE frequency tables */
        size_t bytes = sizeof(float) * (size_t)(c->qk_rope_head_dim / 2 + 1);
        const void *p = be->ops->import(be, m->freq[t], bytes);
        if (!p) return dsi_errf(err, DSI_ERR_NOMEM, "%s: cannot place the RoPE tables", be->name);
        m->freq_dev[t] = p;
    }
    struct dsi_tensor *top[] = {&m->embed, &m->head, &m->norm, &m->top_scales[0]};
    for (size_t i = 0; i < 4 && !rc; i++)
        rc = import_one(be, top[i], err);
    if (!rc) rc = import_hc(be, &m->hc_head, err);
    for (int il = 0; il < c->n_layers_total && !rc; il++) {
        struct dsi_layer_w *L = &m->layers[il];
        struct dsi_tensor *ts[] = {
            &L->attn_norm,    &L->ffn_norm,       &L->attn_sink,    &L->wq_a,
            &L->q_norm,       &L->wq_b,           &L->wkv,          &L->kv_norm,
            &L->wo_a,         &L->wo_b,           &L->comp.wkv,     &L->comp.wgate,
            &L->comp.ape,     &L->comp.norm,      &L->idx_wq_b,     &L->idx_weights_proj,
            &L->idx_comp.wkv, &L->idx_comp.wgate, &L->idx_comp.ape, &L->idx_comp.norm,
            &L->gate_w,       &L->gate_bias,      &L->tid2eid,      &L->sh_w1,
            &L->sh_w2,        &L->sh_w3,          &L->e_proj,       &L->h_proj,
            &L->enorm,        &L->hnorm,          &L->norm};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]) && !rc; i++)
            rc = import_one(be, ts[i], err);
        for (int i = 0; i < L->n_scales && !rc; i++)
            rc = import_one(be, &L->scales[i], err);
        for (int e = 0; e < c->n_routed_experts && !rc; e++) {
            rc = import_one(be, &L->ew1[e], err);
            if (!rc) rc = import_one(be, &L->ew2[e], err);
            if (!rc) rc = import_one(be, &L->ew3[e], err);
        }
        for (int i = 0; i < 3 * c->n_routed_experts && !rc; i++)
            rc = import_one(be, &L->escales[i], err);
        if (!rc) rc = import_hc(be, &L->hc_attn, err);
        if (!rc) rc = import_hc(be, &L->hc_ffn, err);
        if (!rc && il >= c->num_hidden_layers) rc = import_hc(be, &L->hc_head, err);
    }
    return rc;
}
