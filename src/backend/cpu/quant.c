/* quant.c - number formats and quantisation rules; see quant.h. */
#include "quant.h"

#include <math.h>
#include <string.h>

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float dsi_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dsi_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dsi_bf16_round(float f) { return dsi_bf16_to_f32(dsi_f32_to_bf16(f)); }

float dsi_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    if (e == 31) return bits_f32(s | 0x7f800000u | (m << 13));
    return bits_f32(s | ((e + 112) << 23) | (m << 13));
}

float dsi_e4m3_to_f32(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

float dsi_e8m0_to_f32(uint8_t b) {
    if (b == 0xff) return NAN;
    if (b == 0) return ldexpf(1.0f, -127);
    return bits_f32((uint32_t)b << 23);
}

float dsi_fp4_to_f32(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}

/* Round |x| to the grid whose spacing in [2^e, 2^(e+1)) is 2^(e - mbits), with the spacing
 * fixed at 2^(emin - mbits) below 2^emin (subnormals); ties to even via rintf. */
static float round_grid(float x, int mbits, int emin) {
    if (x == 0.0f || !isfinite(x)) return x;
    int e;
    frexpf(fabsf(x), &e);
    e -= 1; /* |x| in [2^e, 2^(e+1)) */
    if (e < emin) e = emin;
    float q = ldexpf(1.0f, e - mbits);
    return rintf(x / q) * q;
}

/* Saturating: values beyond the largest finite code round to it. */
float dsi_e4m3_round(float x) {
    float y = round_grid(x, 3, -6);
    return y > DSI_FP8_MAX ? DSI_FP8_MAX : y < -DSI_FP8_MAX ? -DSI_FP8_MAX : y;
}
uint8_t dsi_f32_to_e4m3(float x) {
    if (isnan(x)) return 0x7f;
    float y = dsi_e4m3_round(x), a = fabsf(y);
    uint8_t s = signbit(y) ? 0x80 : 0;
    if (a < ldexpf(1.0f, -6)) return (uint8_t)(s | (uint8_t)ldexpf(a, 9)); /* subnormal: m 2^-9 */
    int e;
    float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
    return (uint8_t)(s | (e - 1 + 7) << 3 | ((int)ldexpf(f, 4) - 8));
}

uint8_t dsi_f32_to_e2m1(float x) {
    float y = dsi_e2m1_round(x), a = fabsf(y);
    uint8_t s = signbit(y) ? 8 : 0;
    uint8_t m = a < 2.0f   ? (uint8_t)(a * 2.0f)
                : a < 4.0f ? (uint8_t)(a + 2.0f)
                           : (uint8_t)(a / 2.0f + 4.0f);
    return (uint8_t)(s | m); /* magnitudes 0 .5 1 1.5 2 3 4 6 -> 0 .. 7 */
}

float dsi_e2m1_round(float x) {
    float y = round_grid(x, 1, 0);
    return y > DSI_FP4_MAX ? DSI_FP4_MAX : y < -DSI_FP4_MAX ? -DSI_FP4_MAX : y;
}

float dsi_ue8m0_scale(float amax, float fmt_max, float amax_floor) {
    if (!(amax >= amax_floor)) amax = amax_floor; /* also catches NaN */
    float v = amax / fmt_max;
    uint32_t u = f32_bits(v);
    int e = (int)((u >> 23) & 0xff) - 127;
    if (u & 0x7fffffu) e += 1;
    return ldexpf(1.0f, e);
}

static void
roundtrip(float *x, int n, int block, float fmt_max, float floor_, float (*cast)(float)) {
    for (int b = 0; b < n; b += block) {
        float amax = 0.0f;
        for (int i = 0; i < block; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        float s = dsi_ue8m0_scale(amax, fmt_max, floor_);
        for (int i = 0; i < block; i++) {
            float v = x[b + i] / s;
            v = v > fmt_max ? fmt_max : v < -fmt_max ? -fmt_max : v;
            x[b + i] = cast(v) * s;
        }
    }
}

void dsi_q8_roundtrip(float *x, int n, int block) {
    roundtrip(x, n, block, DSI_FP8_MAX, 1e-4f, dsi_e4m3_round);
}

void dsi_q4_roundtrip(float *x, int n, int block) {
    roundtrip(x, n, block, DSI_FP4_MAX, 6.0f * ldexpf(1.0f, -126), dsi_e2m1_round);
}

void dsi_hadamard(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++)
        x[i] *= s;
}
