/* tc.cuh - warp-level tensor-core pieces shared by tc.cu (GEMMs) and attn_tc.cu (attention)
 * of the `fast` numerics profile: bf16 packing, ldmatrix, mma.sync m16n8k16 bf16 -> fp32. */
#ifndef DSI_CUDA_TC_CUH
#define DSI_CUDA_TC_CUH

#include "common.cuh"

#include <cuda_bf16.h>

__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* Upper halves of two floats that are exact in bf16. */
__device__ __forceinline__ uint32_t bf16x2_exact(float lo, float hi) {
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

/* ---- weight decoding into bf16 pairs -------------------------------------------------------
 * A pair holds elements k and k + d of a lane's word (FP8: bytes 0/2 or 1/3, d = 2; FP4: codes j
 * and j + 4, d = 4): their bits sit 16 apart in the word, as the halves of a bf16x2, so a pair is
 * two shifts and two masks. Short path: the code's exponent and mantissa bits are moved to where
 * a bf16 keeps them (the value times 2^-120 for e4m3, 2^-126 for e2m1, subnormal codes
 * included, as e4m3x4 / e2m1x8 do in fp32), and one bf16x2 multiply by 2^120 (2^126) times the
 * UE8M0 scale gives the exact value times scale (a code times a power of two: 4 significant
 * bits). About 2.5 instructions per weight instead of ~9 through fp32 (docs/cuda.md step 12).
 * Scale bytes past 134 (FP8) or 128 (FP4), whose combined factor is not a bf16, take the fp32
 * path (gvf.cu: the choice is the warp's, as its mma needs all its lanes; tc.cu: per thread). In
 * this profile an FP8 NaN code (0x7f) reads as 480 (no checkpoint has one; the exact kernels keep
 * the NaN). */
template <int J> __device__ __forceinline__ uint32_t e2m1_pair_bits(uint32_t u) {
    uint32_t mag = (J <= 1 ? u << (6 - 4 * J) : u >> (4 * J - 6)) & 0x01c001c0u;
    return mag | ((u << (12 - 4 * J)) & 0x80008000u);
}

template <int J> __device__ __forceinline__ uint32_t e4m3_pair_bits(uint32_t u) {
    uint32_t mag = (J == 0 ? u << 4 : u >> 4) & 0x07f007f0u;
    return mag | ((J == 0 ? u << 8 : u) & 0x80008000u);
}

/* a * m, both bf16x2 (m: a power of two in both halves); bf16 arithmetic keeps subnormals. */
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t m) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(m), "r"(0x80008000u));
    return d;
}

/* The bf16x2 factor 2^bias times the scale 2^(sb - 127), for sb + bias <= 254. */
__device__ __forceinline__ uint32_t bf16x2_pow2(uint32_t sb, uint32_t bias) {
    uint32_t h = (sb + bias) << 7;
    return h | (h << 16);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(uint32_t a, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm_x2(uint32_t a, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(a));
}

__device__ __forceinline__ void
mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Transposed: for B fragments from a tile stored [k][n] (n contiguous). */
__device__ __forceinline__ void ldsm_x4_t(uint32_t a, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

#endif
