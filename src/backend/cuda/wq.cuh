/* wq.cuh - wgq.cu's FP8 tensor-core pieces (the MoE's block GEMMs), apart from its kernel: the K
 * order of act_quant's codes within a 128-group, e2m1 -> e4m3 via a byte table, a step's raw
 * weight loads and their decode into wgmma's 8-bit A fragments. The numerics and the K order are
 * described in wgq.cu's header. (Step 31's wgd.cu, the decode's routed experts on m64n8k32 walks,
 * shared them: measured slower than gvf.cu and removed; docs/cuda.md step 31.) */
#ifndef DSI_CUDA_WQ_CUH
#define DSI_CUDA_WQ_CUH

#include "tc.cuh"

#include <cuda_fp8.h>

#define WQ_BK 128 /* k per step: one activation scale block */

/* Byte c (0..127) of a group of the activation codes holds element wq_perm_byte(c) of the group
 * (slot c % 32 of slice c / 32, see the header). */
__host__ __device__ constexpr int wq_perm_byte(int c) {
    return 32 * ((c & 15) >> 2) + 8 * (c >> 5) + 4 * ((c >> 4) & 1) + (c & 3);
}
static_assert(wq_perm_byte(0) == 0 && wq_perm_byte(4) == 32 && wq_perm_byte(16) == 4 &&
                  wq_perm_byte(32) == 8 && wq_perm_byte(127) == 127,
              "wgq.cu's K order");

__device__ __forceinline__ uint32_t wq_prmt(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d; /* PTX's prmt: selector bit 3 replicates the selected byte's sign bit */
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* 2^e as a float, e >= -149 (subnormals below -126), without ldexpf's code */
__device__ __forceinline__ float wq_pow2(int e) {
    return __uint_as_float(e >= -126 ? (uint32_t)(e + 127) << 23 : 1u << (e + 149));
}

/* wq_table's values below 2^-5: each converted (e4m3 subnormals; past 2^-14 the smallest round).
 * Out of line: scales that far apart within a row's 128 k are rare, and the step loop's code
 * stays short. */
static __device__ __noinline__ void wq_table_small(int dp, uint32_t *t0, uint32_t *t1) {
    float f = dp >= -149 ? wq_pow2(dp) : 0.0f;
    const float m[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    uint32_t b[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        b[i] = (uint32_t)__nv_cvt_float_to_fp8(m[i] * f, __NV_SATFINITE, __NV_E4M3);
    *t0 = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24;
    *t1 = b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24;
}

/* The e4m3 bytes of the e2m1 magnitudes 0, 0.5, 1, 1.5 (t0, byte i: magnitude i) and 2, 3, 4, 6
 * (t1) times 2^dp, dp <= 6. From dp >= -5: dp added to the exponent fields (0x30 is 0.5: its
 * field stays >= 1; at most 0x4c + 6 x 8 = 0x7c = 384; no carries or borrows between bytes;
 * checked against the conversion for every dp by tools/wg_layout_check.py); below,
 * wq_table_small. */
__device__ __forceinline__ void wq_table(int dp, uint32_t &t0, uint32_t &t1) {
    if (dp >= -5) {
        t0 = 0x3c383000u + (uint32_t)dp * 0x08080800u;
        t1 = 0x4c484440u + (uint32_t)dp * 0x08080808u;
    } else {
        wq_table_small(dp, &t0, &t1);
    }
}

/* A step's raw weights of `row` (NULL: nothing loaded) for lane t: FP4, the 32 codes from k = 128
 * s + 32 t (16 bytes) and their 32-block's scale (column 4 s + t); FP8, the 32 bytes and the
 * 128-block's scale (column s; wgq_w_ok: blocks of 128 along K). */
template <int WT>
__device__ __forceinline__ void
wq_load_w(const uint8_t *row, const uint8_t *srow, uint32_t s, int t, struct tc_wraw &r) {
    if (!row) return;
    if (WT == DSI_TYPE_FP4_E2M1) {
        r.v[0] = __ldg((const uint4 *)(row + s * 64u + (uint32_t)t * 16u));
        r.sb = __ldg(srow + s * 4u + (uint32_t)t);
    } else {
        const uint4 *p = (const uint4 *)(row + s * 128u + (uint32_t)t * 32u);
        r.v[0] = __ldg(p);
        r.v[1] = __ldg(p + 1);
        r.sb = __ldg(srow + s);
    }
}

/* 8 e2m1 codes (a word, the low nibble first) to 8 e4m3 bytes (lo: codes 0-3, hi: 4-7): the
 * magnitudes through the table (prmt picks byte m of {t1, t0}), the signs from prmt's sign mode
 * on the bytes holding them (code 2 j's sign is bit 7 of byte j of x << 4, code 2 j + 1's of byte
 * j of x). 9 instructions for 8 values. */
__device__ __forceinline__ void
wq_e2m1x8(uint32_t x, uint32_t t0, uint32_t t1, uint32_t &lo, uint32_t &hi) {
    uint32_t m = x & 0x77777777u, sx = x << 4;
    lo = wq_prmt(t0, t1, m) | (wq_prmt(sx, x, 0xd9c8u) & 0x80808080u);
    hi = wq_prmt(t0, t1, m >> 16) | (wq_prmt(sx, x, 0xfbeau) & 0x80808080u);
}

/* FP4: the base B of a weight row: the largest of its nsc scale bytes (nsc a multiple of 4: lane t
 * of the quad takes the t-th quarter, as 16-byte loads where aligned, all issued before their
 * maxima; then two shuffles; the whole warp calls this). 0 for a row not valid. */
__device__ __forceinline__ uint32_t wq_row_base(const uint8_t *srow,
                                                int64_t nsc,
                                                int t,
                                                bool valid) {
    uint32_t b = 0;
    int64_t n4 = nsc / 4;
    const uint8_t *r = srow + t * n4;
    if (valid && ((uintptr_t)r & 15) == 0 && n4 % 16 == 0) {
        uint32_t m = 0;
#pragma unroll 4
        for (int64_t q = 0; q < n4; q += 16) {
            uint4 v = __ldg((const uint4 *)(r + q));
            m = __vmaxu4(m, __vmaxu4(__vmaxu4(v.x, v.y), __vmaxu4(v.z, v.w)));
        }
        b = max(max(m & 0xffu, (m >> 8) & 0xffu), max((m >> 16) & 0xffu, m >> 24));
    } else if (valid) {
#pragma unroll 8
        for (int64_t q = 0; q < n4; q++)
            b = max(b, (uint32_t)__ldg(r + q));
    }
    b = max(b, __shfl_xor_sync(0xffffffffu, b, 1));
    return max(b, __shfl_xor_sync(0xffffffffu, b, 2));
}

/* The block's activation rows on the FP8 codes (wgq.cu, wgp.cu; threads below BN write them):
 * tc_block_rows on p.m.x8 (up) or p.m.h8 (down), and each row's scales (srow; NULL: none).
 * false: no tile here (the whole block returns). */
template <int MODE, int BN>
__device__ __forceinline__ bool wq_block_rows(struct tc_p &p,
                                              const uint8_t **xrow,
                                              const float **srow,
                                              int64_t *opos,
                                              int *e,
                                              int64_t *K,
                                              int *rows) {
    const uint8_t *xs = MODE == TC_UP ? p.m.x8 : p.m.h8;
    const float *ss = MODE == TC_UP ? p.m.x8s : p.m.h8s;
    int64_t lds = MODE == TC_UP ? p.m.D : p.m.I;
    if (!tc_block_rows<MODE, BN>(p, xs, lds, 0, xrow, opos, e, K, rows)) return false;
    int tid = threadIdx.x;
    if (tid < BN) /* (this thread wrote xrow[tid]) */
        srow[tid] = xrow[tid] ? ss + (xrow[tid] - xs) / lds * (lds / WQ_BK) : nullptr;
    return true;
}

/* A step's fragments a[slice][reg] from the raw loads of rows g (w[0]) and g + 8 (w[1]) (a row
 * not valid: zeros). FP8: ws, the rows' step scales. FP4: each code times 2^(S_q - B + 6), B =
 * base[h], the row's largest scale (wq_row_base; the row's weight scale 2^(B - 6 - 127) is then
 * one for the whole K, applied after the loop); ws untouched. */
template <int WT>
__device__ __forceinline__ void wq_decode(const struct tc_wraw (&w)[2],
                                          const bool (&valid)[2],
                                          const uint32_t (&base)[2],
                                          uint32_t (&a)[4][4],
                                          float (&ws)[2]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t keep = valid[h] ? 0xffffffffu : 0u; /* (a real instruction: wgmma must not read
                                                        the loads' own registers, tc.cuh) */
        if (WT == DSI_TYPE_F8_E4M3) {
            const uint32_t u[8] = {w[h].v[0].x, w[h].v[0].y, w[h].v[0].z, w[h].v[0].w,
                                   w[h].v[1].x, w[h].v[1].y, w[h].v[1].z, w[h].v[1].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i][h] = u[2 * i] & keep;
                a[i][2 + h] = u[2 * i + 1] & keep;
            }
            ws[h] = valid[h] ? e8m0_to_f32(w[h].sb) : 0.0f;
        } else {
            uint32_t t0, t1;
            wq_table(valid[h] ? (int)w[h].sb - (int)base[h] + 6 : 6, t0, t1);
            const uint32_t u[4] = {w[h].v[0].x, w[h].v[0].y, w[h].v[0].z, w[h].v[0].w};
#pragma unroll
            for (int i = 0; i < 4; i++)
                wq_e2m1x8(u[i] & keep, t0, t1, a[i][h], a[i][2 + h]);
        }
    }
}

#endif
