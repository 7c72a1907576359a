/* norm.cuh - RMSNorm's arithmetic (cpu_rms_norm's) and act_quant of a warp's 128-block, shared by
 * the norm kernels (norm_rope.cu) and the norm fused into hc_pre (hc.cu). */
#ifndef DSI_CUDA_NORM_CUH
#define DSI_CUDA_NORM_CUH

#include "common.cuh"

/* 1 / rms from the sum of squares of dim values (cpu_rms_norm's arithmetic), and an output. */
__device__ __forceinline__ float rms_inv(double ss, int64_t dim, float eps, bool round, bool w) {
    float ms = (float)(ss / (double)dim);
    return round && !w ? bf16_round(1.0f / sqrtf(bf16_round(ms) + eps)) : 1.0f / sqrtf(ms + eps);
}
__device__ __forceinline__ float
rms_out(float v, float inv, struct cu_vec w, int64_t i, bool round) {
    v = v * inv;
    if (w.data) v = vec_get(w, i) * v;
    return rbf(v, round);
}

/* A float4 of a norm's input rounded as rbf, its squares added to ss (in double, x y z w order). */
__device__ __forceinline__ float4 rms_in4(float4 v, bool round, double &ss) {
    v = make_float4(rbf(v.x, round), rbf(v.y, round), rbf(v.z, round), rbf(v.w, round));
    ss += (double)v.x * (double)v.x;
    ss += (double)v.y * (double)v.y;
    ss += (double)v.z * (double)v.z;
    ss += (double)v.w * (double)v.w;
    return v;
}
/* rms_out of a float4 at element e of the group (e % 4 == 0): the weight's four values in one
 * load where it is F32 or BF16 (one type test per float4, not per element: the norm kernels
 * unroll their float4s, and their code was 20-60 KB, step 18); the same arithmetic. */
__device__ __forceinline__ float4
rms_out4(float4 v, float inv, struct cu_vec w, int64_t e, bool round) {
    if (w.data && w.type == DSI_TYPE_F32) {
        float4 g = *(const float4 *)((const float *)w.data + e);
        return make_float4(rbf(g.x * (v.x * inv), round), rbf(g.y * (v.y * inv), round),
                           rbf(g.z * (v.z * inv), round), rbf(g.w * (v.w * inv), round));
    }
    if (w.data && w.type == DSI_TYPE_BF16) {
        uint2 u = *(const uint2 *)((const uint16_t *)w.data + e);
        return make_float4(rbf(bf16_to_f32(u.x & 0xffffu) * (v.x * inv), round),
                           rbf(bf16_to_f32(u.x >> 16) * (v.y * inv), round),
                           rbf(bf16_to_f32(u.y & 0xffffu) * (v.z * inv), round),
                           rbf(bf16_to_f32(u.y >> 16) * (v.w * inv), round));
    }
    return make_float4(rms_out(v.x, inv, w, e, round), rms_out(v.y, inv, w, e + 1, round),
                       rms_out(v.z, inv, w, e + 2, round), rms_out(v.w, inv, w, e + 3, round));
}

/* act_quant of one 128-block held by a warp as a float4 per lane (k_act_quant's numbers: amax,
 * UE8M0 scale, e4m3 round trip): the lane's four values (and, with scale, the block's scale).
 * The whole warp calls it. */
__device__ __forceinline__ float4 q8_warp_quant(float4 y, float *scale = nullptr) {
    float amax = fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w)));
    amax = warp_max(amax);
    float s = ue8m0_scale(amax, 448.0f, 1e-4f), inv_s = 1.0f / s;
    if (scale) *scale = s;
    return make_float4(q8_value(y.x, s, inv_s), q8_value(y.y, s, inv_s), q8_value(y.z, s, inv_s),
                       q8_value(y.w, s, inv_s));
}

/* The same, stored at q. */
__device__ __forceinline__ void q8_warp_block(float4 y, float4 *q) { *q = q8_warp_quant(y); }

/* One RoPE pair (x0, x1) at position p, frequency f (rope's arithmetic: the angle as an fp32
 * product, the reference cos / sin, the inverse by the sine's sign). */
/* The rotation by (c, s) (s already negated for the inverse). */
__device__ __forceinline__ void rope_rot(float &x0, float &x1, float c, float s, bool round) {
    float a = x0, b = x1;
    x0 = rbf(a * c - b * s, round);
    x1 = rbf(b * c + a * s, round);
}

__device__ __forceinline__ void
rope_pair(float &x0, float &x1, float p, float f, bool inverse, bool round) {
    float ang = p * f;
    float c = cos_ref(ang), s = sin_ref(ang);
    if (inverse) s = -s;
    rope_rot(x0, x1, c, s, round);
}

/* The two RoPE pairs of a float4 (frequencies f[0], f[1]); out of line: the norm kernels unroll
 * their float4s, and the reference sine and cosine inlined at each made them 57-200 KB. (A
 * template so that a file including this without calling it has no copy.) */
/* The reference cosine and sine of p f, the sine negated for the inverse (rope_pair's), out of
 * line (the attention's output RoPE, attn_fa.cu). */
template <int = 0> __device__ __noinline__ float2 rope_cs(float p, float f, bool inverse) {
    float ang = p * f;
    float s = sin_ref(ang);
    return make_float2(cos_ref(ang), inverse ? -s : s);
}

template <int = 0>
__device__ __noinline__ float4 rope4(float p, const float *f, float4 o, bool round) {
    rope_pair(o.x, o.y, p, f[0], false, round);
    rope_pair(o.z, o.w, p, f[1], false, round);
    return o;
}

#endif
