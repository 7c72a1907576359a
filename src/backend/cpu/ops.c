/* ops.c - CPU element-wise and per-token ops: RMSNorm, RoPE, mHC pre/post/head, compressor
 * pooling, MoE routing. Parallel over rows; each row's arithmetic is in a fixed order. */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

static float rb(float x, bool on) { return on ? dsi_bf16_round(x) : x; }
static float sigmoidf(float x) { return 1.0f / (1.0f + cpu_expf(-x)); }

/* ---- RMSNorm ---------------------------------------------------------------------------- */

struct rows_job {
    const void *a;
};

static void rms_part(void *ctx, int64_t r0, int64_t r1, int tid) {
    const struct dsi_rms_norm_args *a = ((const struct rows_job *)ctx)->a;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t g = 0; g < a->n_groups; g++) {
            float *y = a->y + r * a->ldy + g * a->dim;
            const float *x = a->x + r * a->ldx + g * a->dim;
            if (a->round_bf16) { /* reference: the input is a bf16 tensor */
                for (int64_t i = 0; i < a->dim; i++)
                    y[i] = dsi_bf16_round(x[i]);
                x = y;
            }
            double ss = 0.0;
            for (int64_t i = 0; i < a->dim; i++)
                ss += (double)x[i] * (double)x[i];
            float ms = (float)(ss / (double)a->dim);
            float inv;
            if (a->round_bf16 && !a->w) /* reference per-head norm: bf16 statistics */
                inv = dsi_bf16_round(1.0f / sqrtf(dsi_bf16_round(ms) + a->eps));
            else
                inv = 1.0f / sqrtf(ms + a->eps);
            for (int64_t i = 0; i < a->dim; i++) {
                float v = x[i] * inv;
                if (a->w) v = cpu_vec_get(a->w, i) * v;
                y[i] = rb(v, a->round_bf16);
            }
        }
}

void cpu_rms_norm(struct dsi_backend *be, const struct dsi_rms_norm_args *a) {
    struct rows_job j = {a};
    dsi_pool_run(cpu_ctx(be)->pool, a->n, 8, rms_part, &j);
    if (a->yq) {
        struct dsi_act_quant_args q = {a->y, a->yq, a->n, a->dim, a->ldy, a->dim, 128};
        cpu_act_quant(be, &q);
    }
    if (a->rope_dim > 0) { /* the fused RoPE and quantisation: those ops themselves */
        struct dsi_rope_args r = dsi_rms_norm_rope(a);
        cpu_rope(be, &r);
        if (a->q_dim > 0) {
            struct dsi_act_quant_args q = {a->y, a->y, a->n, a->q_dim, a->ldy, a->ldy, a->q_block};
            cpu_act_quant(be, &q);
        }
    }
}

/* ---- RoPE ------------------------------------------------------------------------------- */

static void rope_part(void *ctx, int64_t r0, int64_t r1, int tid) {
    const struct dsi_rope_args *a = ((const struct rows_job *)ctx)->a;
    int half = a->rope_dim / 2;
    for (int64_t r = r0; r < r1; r++) {
        float p = (float)a->pos[r];
        for (int64_t h = 0; h < a->n_heads; h++) {
            float *x = a->x + r * a->ldx + h * a->head_stride + (a->width - a->rope_dim);
            for (int i = 0; i < half; i++) {
                float ang = p * a->freq[i];
                float c = cpu_cosf(ang), s = cpu_sinf(ang);
                if (a->inverse) s = -s;
                float x0 = x[2 * i], x1 = x[2 * i + 1];
                x[2 * i] = rb(x0 * c - x1 * s, a->round_bf16);
                x[2 * i + 1] = rb(x1 * c + x0 * s, a->round_bf16);
            }
        }
    }
}

void cpu_rope(struct dsi_backend *be, const struct dsi_rope_args *a) {
    struct rows_job j = {a};
    dsi_pool_run(cpu_ctx(be)->pool, a->n, 8, rope_part, &j);
}

/* ---- mHC -------------------------------------------------------------------------------- */

/* m[j] = (fn[j] . x) * rsqrt(mean(x^2) + eps) for j < n_mix, x = the row's flattened streams. */
static void hc_mix(const float *x,
                   int64_t len,
                   const struct dsi_tensor *fn,
                   int n_mix,
                   float eps,
                   float *m,
                   float *tmp) {
    double ss = 0.0;
    for (int64_t i = 0; i < len; i++)
        ss += (double)x[i] * (double)x[i];
    float rho = 1.0f / sqrtf((float)(ss / (double)len) + eps);
    for (int j = 0; j < n_mix; j++) {
        cpu_decode_row(fn, j, tmp);
        m[j] = cpu_dot(tmp, x, len) * rho;
    }
}

struct hc_job {
    struct dsi_backend *be;
    const void *a;
};

static void hc_pre_part(void *ctx, int64_t r0, int64_t r1, int tid) {
    struct hc_job *j = ctx;
    const struct dsi_hc_pre_args *a = j->a;
    int64_t hc = a->hc, D = a->dim, len = hc * D;
    float *tmp = cpu_scratch(j->be, tid, len * (int64_t)sizeof(float));
    float m[64 + 64 * 64 + 64];
    float sc[3];
    for (int i = 0; i < 3; i++)
        sc[i] = cpu_vec_get(a->scale, i);
    for (int64_t r = r0; r < r1; r++) {
        const float *X = a->X + r * len;
        hc_mix(X, len, a->fn, (int)((2 + hc) * hc), a->norm_eps, m, tmp);
        float *pre = tmp, *post = a->post + r * hc, *C = a->comb + r * hc * hc;
        for (int k = 0; k < hc; k++) {
            pre[k] = sigmoidf(m[k] * sc[0] + cpu_vec_get(a->base, k)) + a->hc_eps;
            post[k] = 2.0f * sigmoidf(m[hc + k] * sc[1] + cpu_vec_get(a->base, hc + k));
        }
        for (int64_t i = 0; i < hc * hc; i++)
            C[i] = m[2 * hc + i] * sc[2] + cpu_vec_get(a->base, 2 * hc + i);
        for (int64_t jr = 0; jr < hc; jr++) { /* row softmax + eps */
            float mx = -INFINITY, z = 0.0f;
            for (int64_t k = 0; k < hc; k++)
                mx = fmaxf(mx, C[jr * hc + k]);
            for (int64_t k = 0; k < hc; k++)
                z += (C[jr * hc + k] = cpu_expf(C[jr * hc + k] - mx));
            for (int64_t k = 0; k < hc; k++)
                C[jr * hc + k] = C[jr * hc + k] / z + a->hc_eps;
        }
        for (int it = 0; it < a->iters; it++) {
            if (it > 0)
                for (int64_t jr = 0; jr < hc; jr++) {
                    float s = 0.0f;
                    for (int64_t k = 0; k < hc; k++)
                        s += C[jr * hc + k];
                    for (int64_t k = 0; k < hc; k++)
                        C[jr * hc + k] /= s + a->hc_eps;
                }
            for (int64_t k = 0; k < hc; k++) {
                float s = 0.0f;
                for (int64_t jr = 0; jr < hc; jr++)
                    s += C[jr * hc + k];
                for (int64_t jr = 0; jr < hc; jr++)
                    C[jr * hc + k] /= s + a->hc_eps;
            }
        }
        float *y = a->y + r * D;
        for (int64_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < hc; k++)
                acc += pre[k] * X[k * D + d];
            y[d] = rb(acc, a->round_bf16);
        }
    }
}

void cpu_hc_pre(struct dsi_backend *be, const struct dsi_hc_pre_args *a) {
    DSI_ASSERT(a->hc <= 64 && (2 + a->hc) * a->hc <= 64 + 64 * 64);
    if (a->post_first) cpu_hc_post(be, a->post_first);
    struct hc_job j = {be, a};
    dsi_pool_run(cpu_ctx(be)->pool, a->n, 1, hc_pre_part, &j);
    if (a->norm_w) { /* the fused norm: rms_norm itself */
        struct dsi_rms_norm_args na = dsi_hc_pre_norm(a);
        cpu_rms_norm(be, &na);
    }
}

static void hc_post_part(void *ctx, int64_t r0, int64_t r1, int tid) {
    const struct dsi_hc_post_args *a = ((const struct rows_job *)ctx)->a;
    int64_t hc = a->hc, D = a->dim;
    for (int64_t r = r0; r < r1; r++) {
        const float *X = a->X + r * hc * D, *f = a->f + r * D, *post = a->post + r * hc,
                    *C = a->comb + r * hc * hc;
        float *Xo = a->Xo + r * hc * D;
        for (int64_t k = 0; k < hc; k++)
            for (int64_t d = 0; d < D; d++) {
                float acc = 0.0f;
                for (int64_t jr = 0; jr < hc; jr++)
                    acc += C[jr * hc + k] * X[jr * D + d];
                Xo[k * D + d] = rb(post[k] * f[d] + acc, a->round_bf16);
            }
    }
}

void cpu_hc_post(struct dsi_backend *be, const struct dsi_hc_post_args *a) {
    struct rows_job j = {a};
    dsi_pool_run(cpu_ctx(be)->pool, a->n, 1, hc_post_part, &j);
}

static void hc_head_part(void *ctx, int64_t r0, int64_t r1, int tid) {
    struct hc_job *j = ctx;
    const struct dsi_hc_head_args *a = j->a;
    int64_t hc = a->hc, D = a->dim, len = hc * D;
    float *tmp = cpu_scratch(j->be, tid, len * (int64_t)sizeof(float));
    float m[64], pre[64];
    float sc = cpu_vec_get(a->scale, 0);
    for (int64_t r = r0; r < r1; r++) {
        const float *X = a->X + r * len;
        hc_mix(X, len, a->fn, (int)hc, a->norm_eps, m, tmp);
        for (int k = 0; k < hc; k++)
            pre[k] = sigmoidf(m[k] * sc + cpu_vec_get(a->base, k)) + a->hc_eps;
        float *y = a->y + r * D;
        for (int64_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < hc; k++)
                acc += pre[k] * X[k * D + d];
            y[d] = rb(acc, a->round_bf16);
        }
    }
}

void cpu_hc_head(struct dsi_backend *be, const struct dsi_hc_head_args *a) {
    DSI_ASSERT(a->hc <= 64);
    struct hc_job j = {be, a};
    dsi_pool_run(cpu_ctx(be)->pool, a->n, 1, hc_head_part, &j);
}

/* ---- MoE routing --------------------------------------------------------------------------- */

static float sqrtsoftplus(float z) { return sqrtf(z > 20.0f ? z : cpu_log1pf(cpu_expf(z))); }

void cpu_moe_route(struct dsi_backend *be, const struct dsi_moe_route_args *a) {
    int64_t E = a->n_experts;
    int K = a->topk;
    for (int64_t r = 0; r < a->n; r++) {
        const float *lg = a->logits + r * E;
        int32_t *idx = a->idx + r * K;
        float *w = a->weight + r * K;
        if (a->tid2eid) {
            const uint8_t *row = (const uint8_t *)a->tid2eid->data +
                                 (int64_t)a->tokens[r] * dsi_tensor_row_bytes(a->tid2eid);
            for (int k = 0; k < K; k++) {
                int64_t v;
                if (a->tid2eid->type == DSI_TYPE_I64)
                    memcpy(&v, row + 8 * k, 8);
                else {
                    int32_t v32;
                    memcpy(&v32, row + 4 * k, 4);
                    v = v32;
                }
                idx[k] = (int32_t)v;
            }
        } else {
            for (int k = 0; k < K; k++) { /* top-k of score + bias, lower index on ties */
                int best = -1;
                float bv = -INFINITY;
                for (int64_t e = 0; e < E; e++) {
                    int taken = 0;
                    for (int q = 0; q < k && !taken; q++)
                        taken = idx[q] == e;
                    if (taken) continue;
                    float v = sqrtsoftplus(lg[e]) + (a->bias ? cpu_vec_get(a->bias, e) : 0.0f);
                    if (best < 0 || v > bv) {
                        best = (int)e;
                        bv = v;
                    }
                }
                idx[k] = best;
            }
        }
        float sum = 0.0f;
        for (int k = 0; k < K; k++)
            sum += (w[k] = sqrtsoftplus(lg[idx[k]]));
        for (int k = 0; k < K; k++)
            w[k] = w[k] / (sum + a->eps) * a->route_scale;
    }
}

/* ---- small row ops ------------------------------------------------------------------------ */

void cpu_hadamard_q4(struct dsi_backend *be, const struct dsi_hadamard_q4_args *a) {
    for (int64_t r = 0; r < a->n; r++)
        for (int64_t g = 0; g < a->n_groups; g++) {
            float *x = a->x + r * a->ldx + g * a->dim;
            for (int64_t i = 0; i < a->dim; i++)
                x[i] = dsi_bf16_round(x[i]);
            dsi_hadamard(x, (int)a->dim);
            for (int64_t i = 0; i < a->dim; i++)
                x[i] = dsi_bf16_round(x[i]);
            dsi_q4_roundtrip(x, (int)a->dim, 32);
        }
}

void cpu_embed(struct dsi_backend *be, const struct dsi_embed_args *a) {
    int64_t D = a->table->ne[0];
    for (int64_t r = 0; r < a->n; r++) {
        float *o = a->out + r * a->copies * D;
        cpu_decode_row(a->table, a->tokens[r], o);
        for (int64_t c = 1; c < a->copies; c++)
            memcpy(o + c * D, o, (size_t)D * sizeof(float));
    }
}

void cpu_add(struct dsi_backend *be, const struct dsi_add_args *a) {
    for (int64_t r = 0; r < a->n; r++)
        for (int64_t d = 0; d < a->dim; d++)
            a->y[r * a->ldy + d] = rb(a->a[r * a->lda + d] + a->b[r * a->ldb + d], a->round_bf16);
}

void cpu_copy(struct dsi_backend *be, const struct dsi_copy_args *a) {
    for (int64_t r = 0; r < a->n; r++)
        memmove(a->dst + r * a->ldd, a->src + r * a->lds, (size_t)a->dim * sizeof(float));
}
