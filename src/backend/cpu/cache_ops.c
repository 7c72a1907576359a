/* cache_ops.c - CPU ops that move rows between a step's activations and the cache pool:
 * window rings, compressor token slots and pooling, paged entries, row gathers. */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

/* UE8M0 scale byte and value of a block by dsi_ue8m0_scale's rule */
static uint8_t scale_byte(float amax, float fmt_max, float amax_floor, float *s) {
    *s = dsi_ue8m0_scale(amax, fmt_max, amax_floor);
    int e;
    frexpf(*s, &e); /* s = 2^(e - 1) */
    return (uint8_t)(e - 1 + 127);
}

void cpu_kv_row_put(const struct dsi_kv_rows *k, int64_t i, const float *v) {
    if (k->dtype == DSI_KV_F32) {
        memcpy((float *)k->data + i * k->dim, v, (size_t)k->dim * sizeof(float));
        return;
    }
    uint8_t *codes = (uint8_t *)k->data + i * dsi_kv_row_bytes(k->dtype, k->dim, k->rope);
    uint8_t *sc = k->sc + i * dsi_kv_sc_bytes(k->dtype, k->dim, k->rope);
    if (k->dtype == DSI_KV_FP4) {
        for (int b = 0; b < k->dim; b += 32) {
            float amax = 0.0f, s;
            for (int j = b; j < b + 32; j++)
                amax = fmaxf(amax, fabsf(v[j]));
            sc[b / 32] = scale_byte(amax, DSI_FP4_MAX, DSI_FP4_MAX * ldexpf(1.0f, -126), &s);
            for (int j = b; j < b + 32; j += 2)
                codes[j / 2] =
                    (uint8_t)(dsi_f32_to_e2m1(v[j] / s) | dsi_f32_to_e2m1(v[j + 1] / s) << 4);
        }
        return;
    }
    int nope = k->dim - k->rope;
    for (int b = 0; b < nope; b += 64) {
        float amax = 0.0f, s;
        for (int j = b; j < b + 64; j++)
            amax = fmaxf(amax, fabsf(v[j]));
        sc[b / 64] = scale_byte(amax, DSI_FP8_MAX, 1e-4f, &s);
        for (int j = b; j < b + 64; j++)
            codes[j] = dsi_f32_to_e4m3(v[j] / s);
    }
    uint16_t *rope = (uint16_t *)(codes + nope);
    for (int j = 0; j < k->rope; j++)
        rope[j] = dsi_f32_to_bf16(v[nope + j]);
}

const float *cpu_kv_row_get(const struct dsi_kv_rows *k, int64_t i, float *buf) {
    if (k->dtype == DSI_KV_F32) return (const float *)k->data + i * k->dim;
    const uint8_t *codes =
        (const uint8_t *)k->data + i * dsi_kv_row_bytes(k->dtype, k->dim, k->rope);
    const uint8_t *sc = k->sc + i * dsi_kv_sc_bytes(k->dtype, k->dim, k->rope);
    if (k->dtype == DSI_KV_FP4) {
        for (int b = 0; b < k->dim; b += 32) {
            float s = dsi_e8m0_to_f32(sc[b / 32]);
            for (int j = b; j < b + 32; j += 2) {
                const float *v = cpu_fp4_pair(codes[j / 2]);
                buf[j] = v[0] * s;
                buf[j + 1] = v[1] * s;
            }
        }
        return buf;
    }
    int nope = k->dim - k->rope;
    for (int b = 0; b < nope; b += 64) {
        float s = dsi_e8m0_to_f32(sc[b / 64]);
        for (int j = b; j < b + 64; j++)
            buf[j] = cpu_e4m3(codes[j]) * s;
    }
    const uint16_t *rope = (const uint16_t *)(codes + nope);
    for (int j = 0; j < k->rope; j++)
        buf[nope + j] = dsi_bf16_to_f32(rope[j]);
    return buf;
}

void cpu_kv_store(struct dsi_backend *be, const struct dsi_kv_store_args *a) {
    const struct dsi_step *st = a->st;
    for (int r = 0; r < st->n; r++)
        cpu_kv_row_put(&a->ring, (int64_t)st->slot[r] * st->ring_cap + st->pos[r] % st->ring_cap,
                       a->kv + r * a->head_dim);
}

void cpu_comp_ape(struct dsi_backend *be, const struct dsi_comp_ape_args *a) {
    for (int r = 0; r < a->st->n; r++) {
        int64_t off = a->st->pos[r] % a->ratio;
        float *b = a->b + r * a->width;
        for (int64_t d = 0; d < a->width; d++)
            b[d] += cpu_vec_get(a->ape, off * a->width + d);
    }
}

/* Slot row of token u for emitted row r: from this step's rows when u is in the step. */
static void token_rows(
    const struct dsi_compress_args *a, int r, int64_t u, const float **pa, const float **pb) {
    const struct dsi_step *st = a->st;
    int64_t slot_w = (a->overlap ? 2 : 1) * (int64_t)a->width;
    int64_t t = st->pos[r], first = st->pos[st->row0[r]];
    if (u >= first) {
        int64_t row = r - (t - u);
        *pa = a->a + row * slot_w;
        *pb = a->b + row * slot_w;
    } else {
        int64_t off = ((int64_t)st->slot[r] * a->n_slots + u % a->n_slots) * slot_w;
        *pa = a->slot_a + off;
        *pb = a->slot_b + off;
    }
}

void cpu_compress(struct dsi_backend *be, const struct dsi_compress_args *a) {
    const float *pa[1024], *pb[1024];
    DSI_ASSERT(2 * a->ratio <= 1024);
    for (int e = 0; e < a->n_emit; e++) {
        int r = a->emit_rows[e];
        if (r < 0) { /* padding */
            memset(a->out + (int64_t)e * a->width, 0, sizeof(float) * (size_t)a->width);
            continue;
        }
        int64_t t = a->st->pos[r], i = (t + 1) / a->ratio - 1, R = a->ratio;
        int ns = 0;
        if (a->overlap) {
            for (int64_t u = R * i - R; u < R * i; u++) /* A-halves of window i-1 */
                if (u >= 0) token_rows(a, r, u, &pa[ns], &pb[ns]), ns++;
            for (int64_t u = R * i; u < R * (i + 1); u++) { /* B-halves of window i */
                token_rows(a, r, u, &pa[ns], &pb[ns]);
                pa[ns] += a->width;
                pb[ns++] += a->width;
            }
        } else {
            for (int64_t u = R * i; u < R * (i + 1); u++)
                token_rows(a, r, u, &pa[ns], &pb[ns]), ns++;
        }
        float *out = a->out + (int64_t)e * a->width;
        for (int d = 0; d < a->width; d++) { /* per-channel softmax over the slots */
            float mx = -INFINITY, z = 0.0f, ex[1024];
            for (int s = 0; s < ns; s++)
                mx = fmaxf(mx, pb[s][d]);
            for (int s = 0; s < ns; s++)
                z += (ex[s] = cpu_expf(pb[s][d] - mx));
            float acc = 0.0f;
            for (int s = 0; s < ns; s++)
                acc += pa[s][d] * (ex[s] / z);
            out[d] = acc;
        }
    }
}

void cpu_comp_store(struct dsi_backend *be, const struct dsi_comp_store_args *a) {
    const struct dsi_step *st = a->st;
    for (int r = 0; r < st->n; r++) {
        if (!a->store[r]) continue;
        int64_t off = ((int64_t)st->slot[r] * a->n_slots + st->pos[r] % a->n_slots) * a->slot_w;
        memcpy(a->slot_a + off, a->a + r * a->slot_w, (size_t)a->slot_w * sizeof(float));
        memcpy(a->slot_b + off, a->b + r * a->slot_w, (size_t)a->slot_w * sizeof(float));
    }
}

void cpu_entry_store(struct dsi_backend *be, const struct dsi_entry_store_args *a) {
    for (int e = 0; e < a->n_emit; e++) {
        int r = a->emit_rows[e];
        if (r < 0) continue; /* padding */
        cpu_kv_row_put(&a->pool, cpu_paged(a->st, a->st->slot[r], a->emit_entry[e], a->ratio, 1),
                       a->src + (int64_t)e * a->width);
    }
}

void cpu_gather(struct dsi_backend *be, const struct dsi_gather_args *a) {
    for (int64_t i = 0; i < a->n; i++)
        memmove(a->dst + i * a->dim, a->src + (int64_t)a->idx[i] * a->dim,
                (size_t)a->dim * sizeof(float));
}
