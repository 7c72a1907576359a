/* gemm.c - CPU GEMMs on weights in their stored formats (decoded one row at a time into
 * per-thread scratch, never a full fp32 copy), activation quantisation and the MoE block.
 * Work is split over output rows only, so results do not depend on the thread count, and
 * every output element is one cpu_dot, so a row's result does not depend on the batch. */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

float cpu_vec_get(const struct dsi_tensor *t, int64_t i) {
    const uint8_t *p = t->data;
    switch (t->type) {
    case DSI_TYPE_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case DSI_TYPE_BF16:
        return dsi_bf16_to_f32(ld16(p + 2 * i));
    case DSI_TYPE_F16:
        return dsi_f16_to_f32(ld16(p + 2 * i));
    default:
        DSI_ASSERT(!"cpu_vec_get: not a float vector");
    }
}

/* Decoding tables, filled once by cpu_tables_init (the backend's constructor). */
float g_e4m3[256];
float g_fp4_pair[256][2]; /* byte -> (low nibble, high nibble) values */

void cpu_tables_init(void) {
    for (int i = 0; i < 256; i++) {
        g_e4m3[i] = dsi_e4m3_to_f32((uint8_t)i);
        g_fp4_pair[i][0] = dsi_fp4_to_f32((uint8_t)(i & 0xf));
        g_fp4_pair[i][1] = dsi_fp4_to_f32((uint8_t)(i >> 4));
    }
}

static inline float bf16f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void cpu_decode_row(const struct dsi_tensor *w, int64_t row, float *out) {
    int64_t K = w->ne[0];
    const uint8_t *p = (const uint8_t *)w->data + row * dsi_tensor_row_bytes(w);
    switch (w->type) {
    case DSI_TYPE_F32:
        memcpy(out, p, (size_t)K * 4);
        return;
    case DSI_TYPE_BF16:
        for (int64_t k = 0; k < K; k++)
            out[k] = bf16f(ld16(p + 2 * k));
        return;
    case DSI_TYPE_F16:
        for (int64_t k = 0; k < K; k++)
            out[k] = dsi_f16_to_f32(ld16(p + 2 * k));
        return;
    case DSI_TYPE_F8_E4M3: {
        const float *lut = g_e4m3;
        const uint8_t *s =
            (const uint8_t *)w->scale->data + (row / w->scale_block[0]) * w->scale_row_stride;
        int64_t bc = w->scale_block[1];
        for (int64_t k0 = 0; k0 < K; k0 += bc) {
            float sc = dsi_e8m0_to_f32(s[k0 / bc]);
            int64_t k1 = DSI_MIN(K, k0 + bc);
            for (int64_t k = k0; k < k1; k++)
                out[k] = lut[p[k]] * sc;
        }
        return;
    }
    case DSI_TYPE_FP4_E2M1: {
        const uint8_t *s = (const uint8_t *)w->scale->data + row * w->scale_row_stride;
        int64_t bc = w->scale_block[1];
        for (int64_t k0 = 0; k0 < K; k0 += bc) {
            float sc = dsi_e8m0_to_f32(s[k0 / bc]);
            for (int64_t k = k0; k < DSI_MIN(K, k0 + bc); k += 2) {
                const float *pr = g_fp4_pair[p[k / 2]];
                out[k] = pr[0] * sc;
                out[k + 1] = pr[1] * sc;
            }
        }
        return;
    }
    default:
        DSI_ASSERT(!"cpu_decode_row: unsupported weight type");
    }
}

float cpu_dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
        float l[8] = {0};
        for (int j = 0; j < 32; j += 8)
            for (int i = 0; i < 8; i++)
                l[i] += a[k + j + i] * b[k + j + i];
        acc += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    float t = 0.0f;
    for (; k < n; k++)
        t += a[k] * b[k];
    return acc + t;
}

struct gemm_job {
    struct dsi_backend *be;
    const struct dsi_gemm_args *a;
};

static void gemm_part(void *ctx, int64_t o0, int64_t o1, int tid) {
    struct gemm_job *j = ctx;
    const struct dsi_gemm_args *a = j->a;
    int64_t K = a->w->ne[0];
    float *wrow = cpu_scratch(j->be, tid, K * (int64_t)sizeof(float));
    for (int64_t o = o0; o < o1; o++) {
        cpu_decode_row(a->w, a->row0 + o, wrow);
        for (int64_t i = 0; i < a->n; i++) {
            float v = cpu_dot(a->x + i * a->ldx, wrow, K);
            a->y[i * a->ldy + o] = a->round_bf16 ? dsi_bf16_round(v) : v;
        }
    }
}

void cpu_gemm(struct dsi_backend *be, const struct dsi_gemm_args *a) {
    if (a->w2) { /* a pair: the two in turn */
        for (int k = 0; k < 2; k++) {
            struct dsi_gemm_args b = dsi_gemm_pair_part(a, k);
            cpu_gemm(be, &b);
        }
        return;
    }
    if (a->groups > 1) { /* the groups one by one */
        for (int g = 0; g < a->groups; g++) {
            struct dsi_gemm_args ga = dsi_gemm_group(a, g);
            cpu_gemm(be, &ga);
        }
        return;
    }
    DSI_ASSERT(a->row0 >= 0 && a->row0 + a->n_out <= a->w->ne[1]);
    if (a->n == 0 || a->n_out == 0) return;
    struct gemm_job j = {be, a};
    int64_t grain = DSI_MAX(1, 4096 / DSI_MAX(1, a->n * a->w->ne[0] / 64));
    dsi_pool_run(cpu_ctx(be)->pool, a->n_out, grain, gemm_part, &j);
}

void cpu_act_quant(struct dsi_backend *be, const struct dsi_act_quant_args *a) {
    int block = a->block ? a->block : 128;
    DSI_ASSERT(a->dim % block == 0);
    for (int64_t i = 0; i < a->n; i++) {
        float *y = a->y + i * a->ldy;
        if (y != a->x + i * a->ldx) memmove(y, a->x + i * a->ldx, (size_t)a->dim * sizeof(float));
        dsi_q8_roundtrip(y, (int)a->dim, block);
    }
}

/* ---- MoE ------------------------------------------------------------------------------ */

static float silu(float x) { return x / (1.0f + cpu_expf(-x)); }

/* a[i] = silu(min(g, L)) * clamp(u, -L, L) * w (w = 1 for the shared expert). */
static void swiglu_rows(float *g,
                        const float *u,
                        int64_t m,
                        int64_t inter,
                        const float *w,
                        float limit,
                        bool round_bf16) {
    for (int64_t i = 0; i < m; i++) {
        float wi = w ? w[i] : 1.0f;
        for (int64_t c = 0; c < inter; c++) {
            float gv = g[i * inter + c], uv = u[i * inter + c];
            gv = fminf(gv, limit);
            uv = fminf(fmaxf(uv, -limit), limit);
            float v = silu(gv) * uv * wi;
            g[i * inter + c] = round_bf16 ? dsi_bf16_round(v) : v;
        }
    }
}

static void run_expert(struct dsi_backend *be,
                       const struct dsi_moe_args *a,
                       const struct dsi_tensor *w1,
                       const struct dsi_tensor *w2,
                       const struct dsi_tensor *w3,
                       const float *xg,
                       int64_t m,
                       const float *wts,
                       float *g,
                       float *u,
                       float *out) {
    struct dsi_gemm_args ga = {.w = w1,
                               .n_out = a->inter,
                               .x = xg,
                               .n = m,
                               .ldx = a->dim,
                               .y = g,
                               .ldy = a->inter,
                               .round_bf16 = a->round_bf16};
    cpu_gemm(be, &ga);
    ga.w = w3;
    ga.y = u;
    cpu_gemm(be, &ga);
    swiglu_rows(g, u, m, a->inter, wts, a->limit, a->round_bf16);
    if (a->act_quant) {
        struct dsi_act_quant_args q = {g, g, m, a->inter, a->inter, a->inter, 128};
        cpu_act_quant(be, &q);
    }
    struct dsi_gemm_args gb = {.w = w2,
                               .n_out = a->dim,
                               .x = g,
                               .n = m,
                               .ldx = a->inter,
                               .y = out,
                               .ldy = a->dim,
                               .round_bf16 = a->round_bf16};
    cpu_gemm(be, &gb);
}

/* Work layout (caller-provided, see dsi_moe_work_floats): xg [nk, D], wts [nk], g [nk, I],
 * u [nk, I], out [nk + n, D] (routed rows, then the shared expert's rows), rows [nk]. */
void cpu_moe(struct dsi_backend *be, const struct dsi_moe_args *a) {
    int64_t n = a->n, D = a->dim, I = a->inter, nk = n * a->topk;
    float *xg = a->work, *wts = xg + nk * D, *g = wts + nk, *u = g + nk * I, *out = u + nk * I;
    int32_t *rows = (int32_t *)(out + (nk + n) * D);
    int n_experts = a->n_experts;
    for (int e = 0; e < n_experts; e++) {
        int64_t m = 0;
        for (int64_t s = 0; s < nk; s++)
            if (a->idx[s] == e) {
                memcpy(xg + m * D, a->x + (s / a->topk) * D, (size_t)D * sizeof(float));
                wts[m] = a->weight[s];
                rows[m++] = (int32_t)s;
            }
        if (!m) continue;
        run_expert(be, a, a->w1[e], a->w2[e], a->w3[e], xg, m, wts, g, u, xg);
        for (int64_t i = 0; i < m; i++)
            memcpy(out + (int64_t)rows[i] * D, xg + i * D, (size_t)D * sizeof(float));
    }
    /* Shared expert on all rows. */
    run_expert(be, a, a->sw1, a->sw2, a->sw3, a->x, n, NULL, g, u, out + nk * D);
    for (int64_t r = 0; r < n; r++) {
        float *y = a->y + r * D;
        for (int64_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int k = 0; k < a->topk; k++)
                acc += out[(r * a->topk + k) * D + d];
            acc += out[(nk + r) * D + d];
            y[d] = a->round_bf16 ? dsi_bf16_round(acc) : acc;
        }
    }
}

int64_t dsi_moe_work_floats(int64_t n, int64_t topk, int64_t dim, int64_t inter) {
    int64_t nk = n * topk;
    return nk * dim + nk + 2 * nk * inter + (nk + n) * dim + nk + 16;
}
