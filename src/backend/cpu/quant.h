/* quant.h - number formats and the quantisation rules of spec section 4.1 / 6.4, on the host.
 * Used by the CPU backend (weight decoding and the [QAT] simulations of the `reference`
 * numerics profile) and by tests. All functions are pure. */
#ifndef DSI_QUANT_H
#define DSI_QUANT_H

#include <stdint.h>

float dsi_bf16_to_f32(uint16_t h);
uint16_t dsi_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float dsi_bf16_round(float f);
float dsi_f16_to_f32(uint16_t h);
float dsi_e4m3_to_f32(uint8_t b);   /* e4m3fn: no infinities, 0x7F/0xFF NaN */
float dsi_e8m0_to_f32(uint8_t b);   /* 2^(b-127); 0xFF NaN */
float dsi_fp4_to_f32(uint8_t code); /* low 4 bits: bit 3 sign, 0,.5,1,1.5,2,3,4,6 */
float dsi_e4m3_round(float x);      /* nearest e4m3 value, ties to even, saturating at 448 */
float dsi_e2m1_round(float x);      /* nearest e2m1 value, ties to even, saturating at 6 */
uint8_t dsi_f32_to_e4m3(float x);   /* the code of dsi_e4m3_round(x) (NaN: 0x7F) */
uint8_t dsi_f32_to_e2m1(float x);   /* the 4-bit code of dsi_e2m1_round(x) (NaN: not handled) */

#define DSI_FP8_MAX 448.0f
#define DSI_FP4_MAX 6.0f

/* UE8M0 scale 2^ceil(log2(amax / fmt_max)) from the fp32 bit pattern, amax floored at
 * 1e-4 (FP8) or 6 * 2^-126 (FP4): pass the floor explicitly. */
float dsi_ue8m0_scale(float amax, float fmt_max, float amax_floor);
/* In-place round trips over blocks of `block` values (n a multiple of block). */
void dsi_q8_roundtrip(float *x, int n, int block);
void dsi_q4_roundtrip(float *x, int n, int block);
/* In-place Walsh-Hadamard rotation H x / sqrt(n) (n a power of two), Sylvester order. */
void dsi_hadamard(float *x, int n);

#endif
