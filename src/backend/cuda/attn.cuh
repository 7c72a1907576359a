/* attn.cuh - the attention op's parameters and key lookup, shared by attn.cu (the exact
 * kernels), attn_tc.cu (the tensor-core products of `fast` numerics) and attn_fa.cu (the fused
 * kernel of `fast` numerics). */
#ifndef DSI_CUDA_ATTN_CUH
#define DSI_CUDA_ATTN_CUH

#include "common.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

struct attn_p {
    struct cu_step st;
    const float *q;
    float *out;
    /* attn_fa.cu, not split: also out's rows as bf16 pairs (the values written to out, rounded)
       in wgr.cu's permuted K order of each 128 columns (wg.cuh's wg_perm_col), rows of H hd, for
       the grouped output projection (attn_o16_take; NULL: none) */
    uint16_t *o16;
    bool o_skip; /* with o16: out itself not written (the gemm after reads only o16) */
    bool o16v;   /* o16 stored 16 bytes at a time where the layout allows (c->attn_o16v) */
    /* attn_fa.cu with qn_on: q's rows as bf16 [r][H hd] (c->q16's), staged from here instead of
       q (the same values: q is their widening); NULL: q */
    const uint16_t *q16;
    int H, hd;
    const float *ring, *entries; /* DSI_KV_F32 rows */
    /* DSI_KV_FP8 rows (fp8; backend.h's dsi_kv_rows): data rows of rb bytes (nope e4m3 codes,
       then the rope dims as bf16), scale rows of sb bytes */
    const uint8_t *ring8, *ring_sc, *ent8, *ent_sc;
    bool fp8;
    int nope, rb, sb;
    int ratio;
    const int32_t *sel, *n_sel;
    int topk;
    struct cu_vec sinks;
    float scale;
    bool round_probs, round_bf16;
    float *S;
    int64_t maxk;
    int r0;
    int fexp;     /* attn_fa.cu: 1 the single-precision exp, 2 exp_nb, 3 __expf, 0 exp_ref
                     (c->attn_fa_exp) */
    bool qn_lean; /* attn_fa.cu: the q norm's staging of bf16 rows without redundant roundings
                     (c->attn_qn_lean) */
    /* attn_fa.cu split along the keys (fa_o non-NULL; blockIdx.z = split, fa_tps tiles each):
       each block's unnormalised output rows [split][row][H][hd] in fa_o and its running maximum
       and sum [split][row][H][2] in fa_ml, merged by k_attn_fa_merge */
    float *fa_o, *fa_ml;
    int fa_tps;
    /* attn_fa.cu: attn's q_norm applied as q is staged (qn_on; attn_fa_cfg_of's qn): the per-head
       norm without weight (eps qn_eps, rounding qn_round), then RoPE on the last qn_rope dims
       at qn_pos[r] with the device table qn_freq, as k_rms_norm_warp does */
    bool qn_on, qn_round;
    float qn_eps;
    int qn_rope;
    const int32_t *qn_pos;
    const float *qn_freq;
    /* attn_fa.cu: attn's out_rope applied as out is written (or_on; attn_fa_cfg_of's orope): RoPE
       on the last or_rope dims of each head at or_pos[r] with the device table or_freq (inverse
       or_inv, rounding or_round), as k_rope does */
    bool or_on, or_inv, or_round;
    int or_rope;
    const int32_t *or_pos;
    const float *or_freq;
};

/* attn_fa.cu's configuration for a call of n rows: c's forced choices, else by n (common.cuh's
   attn_fa_big). hb: heads per block (32 or 64); kt: keys a tile asked for (16 or 32; 32 is
   taken with 64 heads only); qn, orope: the q norm and the output's RoPE fused (orope at
   every n unless DSI_CUDA_ATTN_FA_OR=0: step 38 measured batch 1-8 level, 32 -1.5%). */
struct attn_fa_cfg {
    int hb, kt;
    bool qn, orope;
};

static inline attn_fa_cfg attn_fa_cfg_of(const struct cu_ctx *c, int64_t n) {
    bool big = c->attn_fa_big > 0 && n >= c->attn_fa_big;
    attn_fa_cfg f;
    f.hb = c->attn_fa_hb == 32 || c->attn_fa_hb == 64 ? c->attn_fa_hb : big ? 64 : 32;
    f.kt = c->attn_fa_kt == 16 || c->attn_fa_kt == 32 ? c->attn_fa_kt : big ? 32 : 16;
    f.qn = c->attn_fa_qn >= 0 ? c->attn_fa_qn == 1 : big;
    f.orope = c->attn_fa_or != 0; /* every configuration since step 38 (batch 32 -1.5%) */
    return f;
}

__device__ __forceinline__ int attn_nkeys(const struct attn_p &p, int r, int64_t *w0) {
    int64_t t = p.st.pos[r];
    *w0 = t - p.st.window + 1 > 0 ? t - p.st.window + 1 : 0;
    int64_t nk = t - *w0 + 1;
    if (p.entries || p.ent8) nk += p.sel ? p.n_sel[r] : (t + 1) / p.ratio;
    return (int)(nk < p.maxk ? nk : p.maxk);
}

/* Key j of row r as a handle: its row in the ring (>= 0) or in the entries (bit 62 set);
 * attn_k4 reads it in either format, attn_kptr gives an F32 row's address. */
#define ATTN_KH_ENT (1LL << 62)
__device__ __forceinline__ int64_t attn_kh(const struct attn_p &p, int r, int64_t w0, int j) {
    int64_t t = p.st.pos[r];
    int64_t nwin = t - w0 + 1;
    int slot = p.st.slot[r];
    if (j < nwin) return (int64_t)slot * p.st.ring_cap + (w0 + j) % p.st.ring_cap;
    int64_t i = j - nwin;
    if (p.sel) i = p.sel[(int64_t)r * p.topk + i];
    return ATTN_KH_ENT |
           paged(p.st.page_table, p.st.max_pages, p.st.page_tokens, slot, i, p.ratio, 1);
}

__device__ __forceinline__ const float *attn_kptr(const struct attn_p &p, int64_t h) {
    return (h & ATTN_KH_ENT ? p.entries : p.ring) + (h & (ATTN_KH_ENT - 1)) * p.hd;
}

/* dims 4c .. 4c + 3 of key h: F32 rows as they are; FP8 rows decoded (e4m3 code x the block's
 * UE8M0 scale, exact in fp32; the rope dims' bf16 widened) */
__device__ __forceinline__ float4 attn_k4(const struct attn_p &p, int64_t h, int c) {
    if (!p.fp8) return __ldg((const float4 *)attn_kptr(p, h) + c);
    bool ent = (h & ATTN_KH_ENT) != 0;
    int64_t row = h & (ATTN_KH_ENT - 1);
    const uint8_t *d = (ent ? p.ent8 : p.ring8) + row * p.rb;
    int k = 4 * c;
    if (k < p.nope) {
        uint32_t w = __ldg((const unsigned int *)(d + k));
        uint32_t e = __ldg((ent ? p.ent_sc : p.ring_sc) + row * p.sb + k / 64);
        float s = __uint_as_float(e ? e << 23 : 0x00400000u); /* 2^(e - 127) */
        __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffff), __NV_E4M3);
        __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
        float2 a = __half22float2(*(const __half2 *)&lo), b = __half22float2(*(const __half2 *)&hi);
        return make_float4(a.x * s, a.y * s, b.x * s, b.y * s);
    }
    uint2 u = __ldg((const uint2 *)(d + p.nope + 2 * (k - p.nope)));
    return make_float4(bf16_to_f32(u.x & 0xffff), bf16_to_f32(u.x >> 16), bf16_to_f32(u.y & 0xffff),
                       bf16_to_f32(u.y >> 16));
}

/* The tensor-core score and p.v kernels (attn_tc.cu) for one batch of rows [p.r0, p.r0 + rows);
 * false: not taken (shapes), the caller runs the exact ones. The softmax between them is
 * attn.cu's. */
bool attn_tc_ok(const struct attn_p *p);
bool launch_attn_scores_tc(struct cu_ctx *c, const struct attn_p *p, int rows);
bool launch_attn_pv_tc(struct cu_ctx *c, const struct attn_p *p, int rows);

/* `fast` numerics: scores, softmax and p.v in one kernel (attn_fa.cu; split along the keys below a
 * block per SM, then a merge) for all rows [0, rows) of the step (p->S unused), where attn_fa_ok
 * (shapes, alignment, the device's shared memory); the launch's false: an error (sticky). */
bool attn_fa_ok(const struct cu_ctx *c, const struct attn_p *p);
/* o16_kept (may be NULL): set to whether p->o16 was written (not where the keys are split) */
bool launch_attn_fa(struct cu_ctx *c, const struct attn_p *p, int rows, bool *o16_kept);

#endif
