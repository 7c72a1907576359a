/* gvf.cuh - the pieces of gvf.cu's decode walk (shared with step 44's gvb.cu until step 46
 * removed it, measured slower): a lane's 32-byte slice of a weight group (gvf_raw), its decoding
 * into mma fragments against the staged activation rows (gvf_group), and the staged rows'
 * layout (gvf_row_words, gvf_stage_unit). */
#ifndef DSI_CUDA_GVF_CUH
#define DSI_CUDA_GVF_CUH

#include "gemm.cuh"
#include "tc.cuh"

/* Elements in a lane's 32-byte slice. */
template <int WT> __host__ __device__ constexpr int gvf_e() {
    return WT == DSI_TYPE_FP4_E2M1 ? 64 : WT == DSI_TYPE_F8_E4M3 ? 32 : 16;
}

struct gvf_raw {
    uint4 v[2];
    uint32_t sc; /* FP8: the slice's scale byte; FP4: the two bytes of its 32-element halves */
};

/* The lane's slice of a group (the 32 bytes at d) and its scale byte(s) at sc (FP8: sc[0]; FP4:
 * sc[0], sc[1], the scales of its two 32-element halves), or zeros where !valid. The caller
 * works out d and sc in 32-bit offsets once per step (load_step). */
template <int WT>
__device__ __forceinline__ void
gvf_load(const uint8_t *d, const uint8_t *sc, bool valid, uint64_t pol, gvf_raw &r) {
    if (!valid) {
        r.v[0] = r.v[1] = make_uint4(0, 0, 0, 0);
        r.sc = 0;
        return;
    }
    r.v[0] = cu_ldg_pol((const uint4 *)d, pol);
    r.v[1] = cu_ldg_pol((const uint4 *)d + 1, pol);
    if (WT == DSI_TYPE_F8_E4M3) r.sc = __ldg(sc);
    if (WT == DSI_TYPE_FP4_E2M1) r.sc = __ldg(sc) | ((uint32_t)__ldg(sc + 1) << 8);
}

/* A slice's 8 words in order (an initialiser of uint32_t[8]). */
#define GVF_WORDS(r)                                                                               \
    { r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w, r.v[1].x, r.v[1].y, r.v[1].z, r.v[1].w }

/* One mma over 4 k at column tiles 0..NT-1; B from the staged rows (xb: this lane's 8 bytes
 * at the mma's slot in staged row 0; column tile j's row is xo[j] words further: row j 8 + g,
 * or the last staged row past the rows, whose columns finish() leaves out, so that every load
 * reads staged values and needs no predicate). */
template <int NT>
__device__ __forceinline__ void
gvf_mma(const uint32_t (&a)[4], const uint32_t *xb, const int (&xo)[NT], float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
        uint2 b = *(const uint2 *)(xb + xo[j]);
        mma_bf16(acc[j], a, b.x, b.y);
    }
}

/* ---- weight decoding into bf16 pairs: tc.cuh (e4m3_pair_bits, e2m1_pair_bits, bf16x2_mul) */

/* A group: the lane's slices ra (row g) and rb (row g + 8); xb points at its first mma's B. The
 * k slots of an mma's A registers {a0 / a1: 2t, 2t + 1; a2 / a3: 2t + 8, 2t + 9} hold the pairs
 * above, and gvf_stage puts the activations in the same order. */
template <int WT, int NT>
__device__ __forceinline__ void gvf_group(const gvf_raw &ra,
                                          const gvf_raw &rb,
                                          const uint32_t *xb,
                                          const int (&xo)[NT],
                                          float (&acc)[NT][4]) {
    const uint32_t wa[8] = GVF_WORDS(ra), wb[8] = GVF_WORDS(rb);
    /* mma m of the group reads its B 8 words (4 lanes x 8 bytes) after mma m - 1's */
    if (WT == DSI_TYPE_F8_E4M3) { /* word w: elements 4w .. 4w + 3, pairs (0, 2) and (1, 3) */
        uint32_t sa = ra.sc & 0xffu, sb = rb.sc & 0xffu;
        if (__all_sync(0xffffffffu, sa <= 134u && sb <= 134u)) { /* mma.sync: the whole warp */
            uint32_t ma = bf16x2_pow2(sa, 120), mb = bf16x2_pow2(sb, 120);
#pragma unroll
            for (int w = 0; w < 8; w++) {
                const uint32_t a[4] = {bf16x2_mul(e4m3_pair_bits<0>(wa[w]), ma),
                                       bf16x2_mul(e4m3_pair_bits<0>(wb[w]), mb),
                                       bf16x2_mul(e4m3_pair_bits<1>(wa[w]), ma),
                                       bf16x2_mul(e4m3_pair_bits<1>(wb[w]), mb)};
                gvf_mma<NT>(a, xb + 8 * w, xo, acc);
            }
        } else { /* a scale past 2^7 in the warp: 2^120 (the code's value), then the scale */
            const uint32_t m1 = bf16x2_pow2(127, 120), ma = bf16x2_e8m0(sa), mb = bf16x2_e8m0(sb);
            auto m2 = [&](uint32_t v, uint32_t m) { return bf16x2_mul(bf16x2_mul(v, m1), m); };
#pragma unroll
            for (int w = 0; w < 8; w++) {
                const uint32_t a[4] = {
                    m2(e4m3_pair_bits<0>(wa[w]), ma), m2(e4m3_pair_bits<0>(wb[w]), mb),
                    m2(e4m3_pair_bits<1>(wa[w]), ma), m2(e4m3_pair_bits<1>(wb[w]), mb)};
                gvf_mma<NT>(a, xb + 8 * w, xo, acc);
            }
        }
    } else if (WT == DSI_TYPE_FP4_E2M1) {
        /* word w: elements 8w .. 8w + 7; its mma h (0, 1) takes the pairs (2h, 2h + 4) and
         * (2h + 1, 2h + 5) */
        uint32_t s[4] = {ra.sc & 0xffu, (ra.sc >> 8) & 0xffu, rb.sc & 0xffu, (rb.sc >> 8) & 0xffu};
        if (__all_sync(0xffffffffu, max(max(s[0], s[1]), max(s[2], s[3])) <= 128u)) {
            const uint32_t ma[2] = {bf16x2_pow2(s[0], 126), bf16x2_pow2(s[1], 126)};
            const uint32_t mb[2] = {bf16x2_pow2(s[2], 126), bf16x2_pow2(s[3], 126)};
#pragma unroll
            for (int w = 0; w < 8; w++) {
                uint32_t A = ma[w >= 4], B = mb[w >= 4];
                const uint32_t a0[4] = {bf16x2_mul(e2m1_pair_bits<0>(wa[w]), A),
                                        bf16x2_mul(e2m1_pair_bits<0>(wb[w]), B),
                                        bf16x2_mul(e2m1_pair_bits<1>(wa[w]), A),
                                        bf16x2_mul(e2m1_pair_bits<1>(wb[w]), B)};
                gvf_mma<NT>(a0, xb + 16 * w, xo, acc);
                const uint32_t a1[4] = {bf16x2_mul(e2m1_pair_bits<2>(wa[w]), A),
                                        bf16x2_mul(e2m1_pair_bits<2>(wb[w]), B),
                                        bf16x2_mul(e2m1_pair_bits<3>(wa[w]), A),
                                        bf16x2_mul(e2m1_pair_bits<3>(wb[w]), B)};
                gvf_mma<NT>(a1, xb + 16 * w + 8, xo, acc);
            }
        } else { /* a scale past 2^1 in the warp: 2^126 (the code's value), then the scale */
            const uint32_t m1 = bf16x2_pow2(127, 126);
            const uint32_t ma[2] = {bf16x2_e8m0(s[0]), bf16x2_e8m0(s[1])};
            const uint32_t mb[2] = {bf16x2_e8m0(s[2]), bf16x2_e8m0(s[3])};
            auto m2 = [&](uint32_t v, uint32_t m) { return bf16x2_mul(bf16x2_mul(v, m1), m); };
#pragma unroll
            for (int w = 0; w < 8; w++) {
                uint32_t A = ma[w >= 4], B = mb[w >= 4];
                const uint32_t a0[4] = {
                    m2(e2m1_pair_bits<0>(wa[w]), A), m2(e2m1_pair_bits<0>(wb[w]), B),
                    m2(e2m1_pair_bits<1>(wa[w]), A), m2(e2m1_pair_bits<1>(wb[w]), B)};
                gvf_mma<NT>(a0, xb + 16 * w, xo, acc);
                const uint32_t a1[4] = {
                    m2(e2m1_pair_bits<2>(wa[w]), A), m2(e2m1_pair_bits<2>(wb[w]), B),
                    m2(e2m1_pair_bits<3>(wa[w]), A), m2(e2m1_pair_bits<3>(wb[w]), B)};
                gvf_mma<NT>(a1, xb + 16 * w + 8, xo, acc);
            }
        }
    } else { /* BF16: word w holds elements 2w, 2w + 1 */
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint32_t a[4] = {wa[2 * m], wb[2 * m], wa[2 * m + 1], wb[2 * m + 1]};
            gvf_mma<NT>(a, xb + 8 * m, xo, acc);
        }
    }
}

/* Words (bf16 pairs) per staged activation row: whole groups, plus 8 so that rows g = 0..3 fall
 * in different banks. The B operand of mma m of lane t's slice in group q sits at words
 * (q (E / 4) + m) 8 + 2 t (slots 2t, 2t + 1) and + 1 (slots 2t + 8, 2t + 9): the 4 lanes of a
 * row read 32 consecutive bytes per mma. Which elements fill the slots follows gvf_group: BF16
 * (4m, 4m + 1 | 4m + 2, 4m + 3), FP8 (4m, 4m + 2 | 4m + 1, 4m + 3), FP4 (mma m = 2w + h:
 * 8w + 2h, 8w + 2h + 4 | 8w + 2h + 1, 8w + 2h + 5), element indices within the slice. */
template <int WT> __host__ __device__ inline int64_t gvf_row_words(int64_t K) {
    int64_t G = 4 * gvf_e<WT>();
    return (K + G - 1) / G * G / 2 + 8;
}

/* The activation rows staged as bf16 in gvf_group's slot order (gvf_row_words per row): the U
 * elements at k of row r (U = 8 for FP4, else 4; zeros from K on), read from src (the row). */
template <int WT>
__device__ __forceinline__ void
gvf_stage_unit(uint32_t *xs, int64_t rw, int r, int64_t k, const float *src, int64_t K) {
    constexpr int E = gvf_e<WT>(), G = 4 * E;
    float4 f = k < K ? __ldg((const float4 *)(src + k)) : make_float4(0, 0, 0, 0);
    int64_t q = k / G, rem = k - q * G;
    uint32_t *d = xs + r * rw + (q * (E / 4) + (rem % E) / 4) * 8 + 2 * (rem / E);
    if (WT == DSI_TYPE_FP4_E2M1) { /* K % 64 == 0 */
        float4 h = k < K ? __ldg((const float4 *)(src + k + 4)) : make_float4(0, 0, 0, 0);
        *(uint2 *)d = make_uint2(bf16x2_rn(f.x, h.x), bf16x2_rn(f.y, h.y));
        *(uint2 *)(d + 8) = make_uint2(bf16x2_rn(f.z, h.z), bf16x2_rn(f.w, h.w));
    } else if (WT == DSI_TYPE_F8_E4M3) {
        *(uint2 *)d = make_uint2(bf16x2_rn(f.x, f.z), bf16x2_rn(f.y, f.w));
    } else {
        *(uint2 *)d = make_uint2(bf16x2_rn(f.x, f.y), bf16x2_rn(f.z, f.w));
    }
}

#endif
