/* test_quant.c - number formats and [QAT] rules: hand-computed cases, and the dequantisation
 * of FP8/FP4 checkpoint tensors bit-exact against the Python decoder's goldens
 * (tests/golden/quant, written by ref/quant_golden.py). */
#include "test.h"

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/quant.h"
#include "load/safetensors.h"

#include <jansson.h>
#include <stdlib.h>

static int same_bits(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, 4) == 0;
}

int test_quant_formats(struct test_ctx *t) {
    TEST_ASSERT(dsi_e4m3_to_f32(0x00) == 0.0f && dsi_e4m3_to_f32(0x38) == 1.0f);
    TEST_ASSERT(dsi_e4m3_to_f32(0x7e) == 448.0f && dsi_e4m3_to_f32(0xfe) == -448.0f);
    TEST_ASSERT(isnan(dsi_e4m3_to_f32(0x7f)) && isnan(dsi_e4m3_to_f32(0xff)));
    TEST_ASSERT(dsi_e4m3_to_f32(0x01) == ldexpf(1, -9)); /* smallest subnormal */
    TEST_ASSERT(dsi_e8m0_to_f32(127) == 1.0f && dsi_e8m0_to_f32(130) == 8.0f);
    TEST_ASSERT(isnan(dsi_e8m0_to_f32(0xff)));
    TEST_ASSERT(dsi_fp4_to_f32(7) == 6.0f && dsi_fp4_to_f32(0xf) == -6.0f);
    TEST_ASSERT(dsi_fp4_to_f32(8) == 0.0f && signbit(dsi_fp4_to_f32(8)));
    TEST_ASSERT(dsi_bf16_round(1.00390625f) == 1.0f);      /* tie 1 + 2^-8 -> even */
    TEST_ASSERT(dsi_bf16_round(1.01171875f) == 1.015625f); /* tie 1 + 3*2^-8 -> even up */
    return 0;
}

int test_quant_rounding(struct test_ctx *t) {
    /* e4m3: spacing 1/8 in [1, 2); ties to even. */
    TEST_ASSERT(dsi_e4m3_round(1.0625f) == 1.0f);
    TEST_ASSERT(dsi_e4m3_round(1.1875f) == 1.25f);
    TEST_ASSERT(dsi_e4m3_round(440.0f) == 448.0f && dsi_e4m3_round(-432.0f) == -448.0f);
    TEST_ASSERT(dsi_e4m3_round(ldexpf(1.5f, -9)) == ldexpf(2, -9)); /* subnormal tie -> even */
    /* e2m1 ties (spec 4.1): 0.25, 1.25, 2.5, 5 go down; 0.75, 1.75, 3.5 go up. */
    float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -5.0f, 0.2f, 5.9f};
    float want[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -4.0f, 0.0f, 6.0f};
    for (int i = 0; i < 10; i++)
        TEST_ASSERTF(dsi_e2m1_round(in[i]) == want[i], "e2m1(%g) = %g, want %g", (double)in[i],
                     (double)dsi_e2m1_round(in[i]), (double)want[i]);
    /* UE8M0 scales: 2^ceil(log2(amax / max)), from the bit pattern, with floors. */
    TEST_ASSERT(dsi_ue8m0_scale(448.0f, 448.0f, 1e-4f) == 1.0f);
    TEST_ASSERT(dsi_ue8m0_scale(449.0f, 448.0f, 1e-4f) == 2.0f);
    TEST_ASSERT(dsi_ue8m0_scale(224.0f, 448.0f, 1e-4f) == 0.5f);
    TEST_ASSERT(dsi_ue8m0_scale(0.0f, 448.0f, 1e-4f) == ldexpf(1, -22)); /* 1e-4/448 ~ 2^-22.1 */
    TEST_ASSERT(dsi_ue8m0_scale(6.0f, 6.0f, 6 * ldexpf(1, -126)) == 1.0f);
    TEST_ASSERT(dsi_ue8m0_scale(0.0f, 6.0f, 6 * ldexpf(1, -126)) == ldexpf(1, -126));
    /* Q8 round trip over a block: amax 900 -> scale 4; 900/4 = 225 -> 224 (spacing 16? no: 8
     * in [128, 256)); 1.0/4 = 0.25 exact. */
    float x[64] = {900.0f, 1.0f, -3.0f};
    dsi_q8_roundtrip(x, 64, 64);
    TEST_ASSERT(x[0] == 896.0f && x[1] == 1.0f && x[2] == -3.0f && x[3] == 0.0f);
    /* Q4 round trip: amax 12 -> scale 2; 5/2 = 2.5 -> 2 -> 4; 12 -> 6*2 = 12. */
    float y[32] = {12.0f, 5.0f, 1.5f};
    dsi_q4_roundtrip(y, 32, 32);
    TEST_ASSERT(y[0] == 12.0f && y[1] == 4.0f && y[2] == 2.0f);
    /* Hadamard: e0 -> all 1/sqrt(n); orthonormal, so applying it twice is the identity. */
    float h[128] = {1.0f};
    dsi_hadamard(h, 128);
    for (int i = 0; i < 128; i++)
        TEST_ASSERT(fabsf(h[i] - 1.0f / sqrtf(128.0f)) < 1e-7f);
    float g[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    dsi_hadamard(g, 8);
    TEST_ASSERT(fabsf(g[0] - 36.0f / sqrtf(8.0f)) < 1e-5f &&
                fabsf(g[1] + 4.0f / sqrtf(8.0f)) < 1e-5f);
    dsi_hadamard(g, 8);
    for (int i = 0; i < 8; i++)
        TEST_ASSERT(fabsf(g[i] - (float)(i + 1)) < 1e-5f);
    return 0;
}

/* Decode a checkpoint tensor with its scale the way the CPU backend does. */
static int decode_all(const struct dsi_st *st,
                      const char *name,
                      enum dsi_type ty,
                      int64_t rows,
                      int64_t cols,
                      int sb0,
                      int sb1,
                      float *out) {
    char sn[256];
    size_t l = strlen(name);
    if (l > 7 && !strcmp(name + l - 7, ".weight")) l -= 7;
    snprintf(sn, sizeof(sn), "%.*s.scale", (int)l, name);
    const struct dsi_st_tensor *w = dsi_st_find(st, name), *s = dsi_st_find(st, sn);
    if (!w || !s) return -1;
    struct dsi_tensor sc = {.type = DSI_TYPE_E8M0, .data = s->data};
    struct dsi_tensor tw = {.type = ty,
                            .ne = {cols, rows},
                            .data = w->data,
                            .scale = &sc,
                            .scale_block = {sb0, sb1},
                            .scale_row_stride = s->shape[1]};
    cpu_tables_init();
    for (int64_t r = 0; r < rows; r++)
        cpu_decode_row(&tw, r, out + r * cols);
    return 0;
}

int test_quant_golden(struct test_ctx *t) {
    struct dsi_err err = {0};
    char *file = NULL;
    size_t len = 0;
    TEST_ASSERTF(
        dsi_read_file(test_path(t, "tests/golden/quant/quant.safetensors"), &file, &len, &err) == 0,
        "%s", err.msg);
    struct dsi_st *st = calloc(1, sizeof(*st));
    TEST_ASSERTF(dsi_st_parse_header(st, 0, (const uint8_t *)file, len, &err) == 0, "%s", err.msg);
    dsi_st_sort(st);
    const struct dsi_st_tensor *e8 = dsi_st_find(st, "fp8_expected"),
                               *e4 = dsi_st_find(st, "fp4_expected");
    const struct dsi_st_tensor *w8 = NULL, *w4 = NULL;
    for (int i = 0; i < st->n_tensors; i++) {
        if (st->tensors[i].dtype == DSI_DT_F8_E4M3) w8 = &st->tensors[i];
        if (st->tensors[i].dtype == DSI_DT_I8) w4 = &st->tensors[i];
    }
    TEST_ASSERT(e8 && e4 && w8 && w4);
    int64_t r8 = w8->shape[0], c8 = w8->shape[1], r4 = w4->shape[0], c4 = w4->shape[1] * 2;
    TEST_ASSERT(e8->n_elem == r8 * c8 && e4->n_elem == r4 * c4);
    float *got = malloc(sizeof(float) * (size_t)(r8 * c8 + r4 * c4));
    TEST_ASSERT(got);
    TEST_ASSERT(decode_all(st, w8->name, DSI_TYPE_F8_E4M3, r8, c8, 128, 128, got) == 0);
    TEST_ASSERT(decode_all(st, w4->name, DSI_TYPE_FP4_E2M1, r4, c4, 1, 32, got + r8 * c8) == 0);
    int bad = 0;
    for (int64_t i = 0; i < r8 * c8 && !bad; i++) {
        float want;
        memcpy(&want, (const char *)e8->data + 4 * i, 4);
        if (!same_bits(got[i], want))
            bad = 1, fprintf(stderr, "  fp8 elem %lld: %g vs %g\n", (long long)i, (double)got[i],
                             (double)want);
    }
    for (int64_t i = 0; i < r4 * c4 && !bad; i++) {
        float want;
        memcpy(&want, (const char *)e4->data + 4 * i, 4);
        if (!same_bits(got[r8 * c8 + i], want))
            bad = 1, fprintf(stderr, "  fp4 elem %lld: %g vs %g\n", (long long)i,
                             (double)got[r8 * c8 + i], (double)want);
    }
    free(got);
    dsi_st_close(st);
    free(file);
    TEST_ASSERT(!bad);
    return 0;
}

/* Hex floats of a JSON array (strtof parses C99 hex floats exactly). */
static int hex_array(json_t *a, float *out, int cap) {
    int n = (int)json_array_size(a);
    if (n > cap) return -1;
    for (int i = 0; i < n; i++)
        out[i] = strtof(json_string_value(json_array_get(a, (size_t)i)), NULL);
    return n;
}

/* The [QAT] helpers against cases computed by ref/quant_golden.py from the spec in numpy. */
int test_quant_qat_cases(struct test_ctx *t) {
    json_error_t je;
    json_t *j = json_load_file(test_path(t, "tests/golden/quant/qat_cases.json"), 0, &je);
    TEST_ASSERTF(j, "qat_cases.json: %s", je.text);
    size_t i;
    json_t *c;
    int n_cases = 0;
    json_array_foreach(json_object_get(j, "ue8m0"), i, c) {
        float amax = strtof(json_string_value(json_object_get(c, "amax_hex")), NULL);
        float mx = (float)json_number_value(json_object_get(c, "fmt_max"));
        float fl = strtof(json_string_value(json_object_get(c, "floor_hex")), NULL);
        float want = strtof(json_string_value(json_object_get(c, "scale_hex")), NULL);
        float got = dsi_ue8m0_scale(amax, mx, fl);
        TEST_ASSERTF(same_bits(got, want), "ue8m0 case %zu: amax %a -> %a, want %a", i,
                     (double)amax, (double)got, (double)want);
        n_cases++;
    }
    float x[1024], y[1024];
    const char *casts[] = {"cast_e4m3", "cast_e2m1"};
    for (int k = 0; k < 2; k++) {
        json_t *o = json_object_get(j, casts[k]);
        int n = hex_array(json_object_get(o, "x_hex"), x, 1024);
        TEST_ASSERT(n > 0 && hex_array(json_object_get(o, "y_hex"), y, 1024) == n);
        for (int e = 0; e < n; e++) {
            float got = k == 0 ? dsi_e4m3_round(x[e]) : dsi_e2m1_round(x[e]);
            TEST_ASSERTF(same_bits(got, y[e]), "%s(%a) = %a, want %a", casts[k], (double)x[e],
                         (double)got, (double)y[e]);
            n_cases++;
        }
    }
    const char *rts[] = {"q8", "q4"};
    for (int k = 0; k < 2; k++) {
        json_array_foreach(json_object_get(j, rts[k]), i, c) {
            int block = (int)json_integer_value(json_object_get(c, "block"));
            int n = hex_array(json_object_get(c, "x_hex"), x, 1024);
            TEST_ASSERT(n > 0 && n % block == 0 &&
                        hex_array(json_object_get(c, "y_hex"), y, 1024) == n);
            if (k == 0)
                dsi_q8_roundtrip(x, n, block);
            else
                dsi_q4_roundtrip(x, n, block);
            for (int e = 0; e < n; e++)
                TEST_ASSERTF(same_bits(x[e], y[e]), "%s case %zu elem %d: %a, want %a", rts[k], i,
                             e, (double)x[e], (double)y[e]);
            n_cases++;
        }
    }
    json_array_foreach(json_object_get(j, "hadamard"), i, c) {
        int n = hex_array(json_object_get(c, "x_hex"), x, 1024);
        TEST_ASSERT(n > 0 && hex_array(json_object_get(c, "scaled_hex"), y, 1024) == n);
        dsi_hadamard(x, n);
        for (int e = 0; e < n; e++) /* fp32 butterflies: equal up to summation order */
            TEST_ASSERTF(fabsf(x[e] - y[e]) <= 1e-5f * (1.0f + fabsf(y[e])),
                         "hadamard case %zu elem %d: %g, want %g", i, e, (double)x[e],
                         (double)y[e]);
        n_cases++;
    }
    json_decref(j);
    TEST_ASSERT(n_cases > 50);
    return 0;
}

/* The cache's FP8 key rows (spec 5.5): values of the [QAT] steps (nope dims Q8 over 64-blocks,
 * RoPE dims bf16) come back bit for bit; the bytes are the format's (e4m3 codes of the nope dims
 * times their block's UE8M0 scale, then the RoPE dims as bf16; 576 + 8 bytes a row at V4-Flash's
 * shapes); and every finite e4m3 code survives dsi_f32_to_e4m3. */
int test_quant_kv_rows(struct test_ctx *t) {
    cpu_tables_init();
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN */
        TEST_ASSERTF(dsi_f32_to_e4m3(dsi_e4m3_to_f32((uint8_t)c)) == c, "e4m3 code 0x%02x", c);
    }
    TEST_ASSERT(dsi_f32_to_e4m3(1000.0f) == 0x7e && dsi_f32_to_e4m3(ldexpf(1, -12)) == 0);
    enum { DIM = 512, ROPE = 64, NOPE = DIM - ROPE, ROWS = 6 };
    TEST_ASSERT(dsi_kv_row_bytes(DSI_KV_FP8, DIM, ROPE) == 576 &&
                dsi_kv_sc_bytes(DSI_KV_FP8, DIM, ROPE) == 8);
    TEST_ASSERT(dsi_kv_row_total(DSI_KV_FP8, DIM, ROPE) == 584);
    TEST_ASSERT(dsi_kv_row_total(DSI_KV_F32, DIM, ROPE) == 2048);
    TEST_ASSERT(dsi_kv_fp8_ok(DIM, ROPE) && dsi_kv_fp8_ok(128, 64) && !dsi_kv_fp8_ok(112, 16) &&
                !dsi_kv_fp8_ok(64, 64) && !dsi_kv_fp8_ok(132, 4));
    static uint8_t data[ROWS * 576], sc[ROWS * 8];
    struct dsi_kv_rows k = {data, sc, DSI_KV_FP8, DIM, ROPE};
    static float v[ROWS][DIM], back[DIM];
    uint32_t s = t->seed * 2654435761u + 1;
    for (int r = 0; r < ROWS; r++) {
        float mag = ldexpf(1.0f, 4 * r - 12); /* 2^-12 .. 2^8: scales far apart */
        for (int d = 0; d < DIM; d++) {
            s = s * 1664525u + 1013904223u;
            float u = (float)(s >> 8) / (float)(1 << 24) - 0.5f;
            v[r][d] = u * mag * (d % 64 == 5 ? 37.0f : 1.0f); /* an outlier per block */
        }
        if (r == 2)
            for (int d = 64; d < 128; d++)
                v[r][d] = 0.0f; /* an all-zero block */
        dsi_q8_roundtrip(v[r], NOPE, 64);
        for (int d = NOPE; d < DIM; d++)
            v[r][d] = dsi_bf16_round(v[r][d]);
        cpu_kv_row_put(&k, r, v[r]);
    }
    for (int r = 0; r < ROWS; r++) {
        const float *g = cpu_kv_row_get(&k, r, back);
        TEST_ASSERT(g == back);
        for (int d = 0; d < DIM; d++)
            TEST_ASSERTF(same_bits(g[d], v[r][d]), "row %d dim %d: %a, stored %a", r, d,
                         (double)g[d], (double)v[r][d]);
        for (int d = 0; d < NOPE; d++) /* the bytes, decoded by the spec's rule */
            TEST_ASSERTF(
                same_bits(dsi_e4m3_to_f32(data[r * 576 + d]) * dsi_e8m0_to_f32(sc[r * 8 + d / 64]),
                          v[r][d]),
                "row %d dim %d: code 0x%02x scale %d", r, d, data[r * 576 + d], sc[r * 8 + d / 64]);
        for (int d = NOPE; d < DIM; d++) {
            uint16_t h;
            memcpy(&h, data + r * 576 + NOPE + 2 * (d - NOPE), 2);
            TEST_ASSERT(h == dsi_f32_to_bf16(v[r][d]));
        }
    }
    /* F32 rows: the row itself */
    struct dsi_kv_rows f = dsi_kv_rows_f32(&v[0][0], DIM);
    TEST_ASSERT(cpu_kv_row_get(&f, 3, back) == v[3]);
    /* FP4 rows (the indexer keys beside FP8 rows): 128 dims in 64 bytes of codes, low nibble
       first, and 4 scale bytes; Q4(32) values back bit for bit; every e2m1 code survives */
    for (int c = 0; c < 16; c++)
        TEST_ASSERTF(dsi_f32_to_e2m1(dsi_fp4_to_f32((uint8_t)c)) == c, "e2m1 code %d", c);
    TEST_ASSERT(dsi_f32_to_e2m1(7.0f) == 7 && dsi_f32_to_e2m1(-2.6f) == 13);
    enum { IDIM = 128 };
    TEST_ASSERT(dsi_kv_row_total(DSI_KV_FP4, IDIM, 0) == 68 &&
                dsi_kv_sc_bytes(DSI_KV_FP4, IDIM, 0) == 4);
    TEST_ASSERT(dsi_kv_fp4_ok(IDIM) && !dsi_kv_fp4_ok(48));
    struct dsi_kv_rows k4 = {data, sc, DSI_KV_FP4, IDIM, 0};
    for (int r = 0; r < ROWS; r++) {
        dsi_q4_roundtrip(v[r], IDIM, 32);
        cpu_kv_row_put(&k4, r, v[r]);
    }
    for (int r = 0; r < ROWS; r++) {
        const float *g = cpu_kv_row_get(&k4, r, back);
        for (int d = 0; d < IDIM; d++) {
            TEST_ASSERTF(same_bits(g[d], v[r][d]), "fp4 row %d dim %d: %a, stored %a", r, d,
                         (double)g[d], (double)v[r][d]);
            uint8_t code = (uint8_t)(data[r * 64 + d / 2] >> (4 * (d & 1)) & 15);
            TEST_ASSERT(
                same_bits(dsi_fp4_to_f32(code) * dsi_e8m0_to_f32(sc[r * 4 + d / 32]), v[r][d]));
        }
    }
    return 0;
}
