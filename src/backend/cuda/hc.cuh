/* hc.cuh - what hc.cu shares with hc_tf.cu (hc_pre's mix in `fast` numerics) and hc_cl.cu
 * (hc_pre of a few rows on a thread block cluster): the comb's Sinkhorn on a warp, the
 * parameters of the one-launch hc_pre. */
#ifndef DSI_CUDA_HC_CUH
#define DSI_CUDA_HC_CUH

#include "common.cuh"

#include <string.h>

#define HC_MAX 8 /* streams; mix rows (2 + hc) * hc <= 80 */

/* The residual streams X as floats, or (XB: dsi_hc_post_args.xbf16, c->xbf16) as bf16 values at
 * the same address: the 4 values from element i (i % 4 == 0; 16-byte aligned floats, 8-byte
 * aligned bf16) loaded as floats (CG: through L2 only, CS: streaming, else plain), and 4 floats
 * stored. The bf16 store keeps the top 16 bits: exact for the bf16 values the streams hold
 * (hc_post rounds them; the embedding's rows are bf16). */
template <bool XB, int CO = 0> __device__ __forceinline__ float4 xs_ld4(const float *X, int64_t i) {
    if constexpr (XB) {
        const uint2 *p = (const uint2 *)((const uint16_t *)X + i);
        uint2 u = CO == 1 ? __ldcg(p) : CO == 2 ? __ldcs(p) : *p;
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
    } else {
        const float4 *p = (const float4 *)(X + i);
        return CO == 1 ? __ldcg(p) : CO == 2 ? __ldcs(p) : *p;
    }
}
#define XS_CG 1
#define XS_CS 2
template <bool XB> __device__ __forceinline__ float xs_ld1(const float *X, int64_t i) {
    if constexpr (XB)
        return __uint_as_float((uint32_t)((const uint16_t *)X)[i] << 16);
    else
        return X[i];
}
/* X + i as a pointer (i in elements of X's type) */
template <bool XB> __device__ __forceinline__ const float *xs_at(const float *X, int64_t i) {
    if constexpr (XB)
        return (const float *)((const uint16_t *)X + i);
    else
        return X + i;
}
template <bool XB> __device__ __forceinline__ void xs_st4(float *X, int64_t i, float4 v) {
    if constexpr (XB)
        *(uint2 *)((uint16_t *)X + i) =
            make_uint2((__float_as_uint(v.x) >> 16) | (__float_as_uint(v.y) & 0xffff0000u),
                       (__float_as_uint(v.z) >> 16) | (__float_as_uint(v.w) & 0xffff0000u));
    else
        *(float4 *)(X + i) = v;
}

/* hc_post's value of one element: Xo[k][d] from the streams' column x[j] = X[j][d], f[d] and
 * the row's comb column c[j] = comb[j][k] and post[k] (the CPU's operations in its order;
 * k_hc_post, k_hc_pre_one's fused hc_post and hc_tf.cu's k_hc_mix_tf_post, so the same bits) */
__device__ __forceinline__ float hc_post_val(
    const float (&c)[HC_MAX], const float (&x)[HC_MAX], float pk, float fd, int hc, bool round) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < HC_MAX; j++)
        if (j < hc) acc += c[j] * x[j];
    return rbf(pk * fd + acc, round);
}

/* comb from its logits m (lane jr hc + k of warp 0 holds element (jr, k), hc * hc <= 32): the
 * row softmax plus eps, then iters Sinkhorn normalisations (columns; from the second on rows
 * first), each sum in the CPU's order from the lanes' values by shuffles (the shared-memory
 * version below had two barriers per half step). HC > 0: hc is HC (the loops unrolled, a sum's
 * shuffles issued together; 0: any hc). The whole warp calls it; out: this lane's comb element
 * (null: none). */
template <int HC>
__device__ __forceinline__ void
comb_sinkhorn_warp(float m, int jr, int k, int hc_, int iters, float hc_eps, float *out) {
    const int hc = HC > 0 ? HC : hc_;
    float mx = -INFINITY;
#pragma unroll
    for (int kk = 0; kk < hc; kk++)
        mx = fmaxf(mx, __shfl_sync(0xffffffffu, m, jr * hc + kk));
    float v = exp_ref(m - mx), z = 0.0f;
#pragma unroll
    for (int kk = 0; kk < hc; kk++)
        z += __shfl_sync(0xffffffffu, v, jr * hc + kk);
    v = v / z + hc_eps;
#pragma unroll 1
    for (int it = 0; it < iters; it++) {
        if (it > 0) { /* rows */
            float s = 0.0f;
#pragma unroll
            for (int kk = 0; kk < hc; kk++)
                s += __shfl_sync(0xffffffffu, v, jr * hc + kk);
            v /= s + hc_eps;
        }
        float s = 0.0f; /* columns */
#pragma unroll
        for (int j = 0; j < hc; j++)
            s += __shfl_sync(0xffffffffu, v, j * hc + k);
        v /= s + hc_eps;
    }
    if (out) *out = v;
}

/* Warp 0's part of the finish when hc * hc <= 32: comb of row r from the mix values mr (rho
 * applied here) by comb_sinkhorn_warp (hc 4 unrolled). */
__device__ __forceinline__ void hc_comb_warp(const float *mr,
                                             float rho,
                                             int hc,
                                             struct cu_vec base,
                                             struct cu_vec scale,
                                             int iters,
                                             float hc_eps,
                                             float *comb_r) {
    int tid = threadIdx.x & 31, nt = hc * hc;
    bool act = tid < nt;
    int jr = act ? tid / hc : 0, k = act ? tid % hc : 0;
    float m = act ? mr[2 * hc + tid] * rho * vec_get(scale, 2) + vec_get(base, 2 * hc + tid) : 0.0f;
    if (hc == 4)
        comb_sinkhorn_warp<4>(m, jr, k, hc, iters, hc_eps, act ? comb_r + tid : nullptr);
    else
        comb_sinkhorn_warp<0>(m, jr, k, hc, iters, hc_eps, act ? comb_r + tid : nullptr);
}

struct hc_one_p {
    const float *X, *fn;
    int64_t ldw, n, dim;
    int hc, iters;
    struct cu_vec base, scale, nw;
    float norm_eps, hc_eps, z_eps;
    float *cv;   /* [nq][n n_mix] */
    double *ssp; /* [n][S] */
    int *cnt;    /* [n], zero on entry and on exit */
    float *y, *post, *comb, *z, *zq;
    bool round;
    /* the hc_post before it (dsi_hc_pre_args.post_first; k_hc_pre_one only, else null): X's
       values made from the old streams pX [n][hc][dim], f [n][dim] and the old post / comb,
       and written to X, where k_hc_pre_one reads them (step 41) */
    const float *pX, *pf, *ppost, *pcomb;
    /* `fast` numerics (c->hc_tree, DSI_CUDA_HC_TREE; step 41): each block's 32 chunk values of an
       output added by a warp's shuffles into one value a piece (cv [S][n n_mix]), so the finish
       adds S values an output where it added nq in chunk order */
    bool tree;
    /* the finish's loads of the sums of squares and of X's first collapse round issued before
       the mix's sums (c->hc_early, DSI_CUDA_HC_EARLY=1; step 42; hc 4 only): the same bits */
    bool early;
};

/* The parameters of a's rows common to k_hc_pre_one and k_hc_pre_cl (fn: a's mix weights;
 * norm: the norm after it, z / zq); cv, ssp and cnt left null. */
static inline struct hc_one_p
hc_one_params(const struct dsi_hc_pre_args *a, const struct cu_w *fn, bool norm) {
    struct hc_one_p p;
    memset(&p, 0, sizeof(p));
    p.X = a->X;
    p.fn = (const float *)fn->data;
    p.ldw = fn->row_bytes / 4;
    p.n = a->n;
    p.dim = a->dim;
    p.hc = (int)a->hc;
    p.iters = a->iters;
    p.base = cu_vec_of(a->base);
    p.scale = cu_vec_of(a->scale);
    p.norm_eps = a->norm_eps;
    p.hc_eps = a->hc_eps;
    p.y = a->y;
    p.post = a->post;
    p.comb = a->comb;
    p.round = a->round_bf16;
    if (norm) {
        p.nw = cu_vec_of(a->norm_w);
        p.z_eps = a->z_eps;
        p.z = a->z;
        p.zq = a->zq;
    }
    return p;
}

/* k_hc_pre_cl (hc_cl.cu; c->hc_cl, DSI_CUDA_HC_CL=1; step 38): hc_pre of a's rows (at most
 * c->hc_one) with the norm after it where norm, one cluster of S = ceil(len / 1024) blocks a row;
 * false: not taken (shapes: S > 16, hc * hc > 32, the norm's slices not whole 128-blocks; the
 * caller runs k_hc_pre_one). Bit for bit k_hc_pre_one's y, post and comb. */
bool hc_pre_cl(struct cu_ctx *c, const struct dsi_hc_pre_args *a, const struct cu_w *fn, bool norm);

/* fn[o] . X[r] for rows r < n of len floats and outputs o < n_mix <= 32 on the tensor cores
 * (3xTF32, `fast` numerics only), with each row's sum of squares, split along K into *S pieces:
 * *mixp = [S][n n_mix], *ssp = [S][n] (fp32 partial sums), both in CU_SCR_GEMM (valid until the
 * next op). xbf16: X holds bf16 values (xs_ld4). false: not taken (shapes, alignment, fn not
 * F32) or a launch failed (sticky). */
bool hc_mix_tf(struct cu_ctx *c,
               const struct cu_w *fn,
               int n_mix,
               const float *X,
               bool xbf16,
               int64_t n,
               int64_t len,
               float **mixp,
               float **ssp,
               int64_t *S);

/* hc_mix_tf of the streams pa makes (pa: the hc_post before hc_pre, dsi_hc_pre_args.post_first),
 * with that hc_post in the same pass (k_hc_mix_tf_post: pa->Xo written, bit for bit k_hc_post's;
 * the mix and sums of squares as hc_mix_tf's, split along d, so not its bits). false: not taken
 * (hc != 4, dim % 16, alignment, fn not F32: the caller runs hc_post, then hc_mix_tf) or a
 * launch failed (sticky). With pa->xbf16 the streams in and out are bf16 (xs_ld4, xs_st4). */
bool hc_mix_tf_post(struct cu_ctx *c,
                    const struct cu_w *fn,
                    int n_mix,
                    const struct dsi_hc_post_args *pa,
                    float **mixp,
                    float **ssp,
                    int64_t *S);

#endif
