/* hc_tf.cu - hc_pre's mix in `fast` numerics on the tensor cores (step 32): the n_mix dot
 * products fn[o] . X[r] (24 for V4's hc = 4, over 16384 fp32 values a row) as mma.sync m16n8k8
 * TF32 products with the split of each operand into a TF32 high part and a TF32 remainder
 * (3xTF32: hi hi + hi lo + lo hi; the lo lo term and the cuts, a few 2^-20 of a product, are
 * dropped: tf_split), fp32 sums
 * in the tensor cores' order: close to fp32, not cpu_dot's bits, so only where the caller says
 * `fast` (dsi_hc_pre_args.fast). The same pass adds each row's sum of squares (rho's statistic),
 * so hc_pre's finish reads X once (for the collapse) instead of twice.
 *
 * Why: k_hc_mix (hc.cu) keeps cpu_dot's bits, which costs it the shared-memory broadcast of fn
 * per 4 multiply-adds: ~500 us a prefill call of 8192 rows against ~145 us to read X once.
 *
 * A block of 8 warps takes 128 rows (16 a warp: the mma's M) and the K range [ka, ka + ks) of
 * its split s = blockIdx.y. Lane (g, t) (g = lane / 4, t = lane % 4) loads, per 16 k from k0,
 * the float4 X[row][k0 + 4t ..] of rows g and g + 8 and the float4 fn[8j + g][k0 + 4t ..] of each
 * n8 tile j; mma slice 0 takes elements 0 and 1 of those float4 in its k slots t and t + 4,
 * slice 1 elements 2 and 3 (a dot product does not care in which slot a k sits as long as A and
 * B agree). fn is read through L1 (every warp of a block reads the same 16 bytes a lane); X
 * once, 4 steps (64 k) of loads issued together. Rows past n load row n - 1 and are not
 * written; n8 tiles past n_mix read fn's last row and are not written.
 *
 * Out: mixp[s][r n_mix + o] (hc.cu's split-K chunk-value layout, [nq][n n_mix] with nq = S,
 * which k_hc_pre_finish adds in split order) and ssp[s][r] (the split's sum of squares in fp32,
 * each lane's k in order, then the four lanes of a row by shuffles; the finish adds the S values
 * in double). Deterministic. */
#include "gemm.cuh"
#include "hc.cuh"
#include "tc.cuh"

#include <algorithm>

#define TF_T    256
#define TF_ROWS 128 /* rows per block: 16 a warp */
#define TF_U    4   /* steps of 16 k whose loads are issued together */
#define TF_K    (16 * TF_U)

struct tf_p {
    const float *X, *fn;
    int64_t ldw, len, n, ks;
    int n_mix;
    float *mixp, *ssp;
};

/* x = hi + lo + r: hi is x with its low 13 mantissa bits cleared (a TF32 value, the mantissa's
   top 10 bits kept), x - hi is exact in fp32, lo is it cut to TF32 the same way: |r| < 2^-20 |x|.
   (Two bit masks and a subtraction; cvt.rna.tf32.f32 is ~5 instructions on sm_90. The operands
   are exact TF32 values either way, so the tensor cores' treatment of low bits does not matter.) */
__device__ __forceinline__ void tf_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}
__device__ __forceinline__ void tf_mma(
    float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One mma slice: A from rows g (x0, x1: its two k) and g + 8 (y0, y1), B from fn (f0, f1), each
   split; the small terms first. */
__device__ __forceinline__ void
tf_slice(float (&d)[4], float x0, float x1, float y0, float y1, float f0, float f1) {
    uint32_t xh0, xl0, xh1, xl1, yh0, yl0, yh1, yl1, fh0, fl0, fh1, fl1;
    tf_split(x0, xh0, xl0);
    tf_split(x1, xh1, xl1);
    tf_split(y0, yh0, yl0);
    tf_split(y1, yh1, yl1);
    tf_split(f0, fh0, fl0);
    tf_split(f1, fh1, fl1);
    tf_mma(d, xl0, yl0, xl1, yl1, fh0, fh1);
    tf_mma(d, xh0, yh0, xh1, yh1, fl0, fl1);
    tf_mma(d, xh0, yh0, xh1, yh1, fh0, fh1);
}

/* Rows g and g + 8's float4 a and b at the same 4 k: their squares into sa and sb (in k order),
   then their products with fn's float4 f[j] at those k into each n8 tile's acc[j] */
template <int NT>
__device__ __forceinline__ void tf_take(float (&acc)[NT][4],
                                        float &sa,
                                        float &sb,
                                        const float4 a,
                                        const float4 b,
                                        const float4 (&f)[NT]) {
    sa = fmaf(a.x, a.x, sa);
    sa = fmaf(a.y, a.y, sa);
    sa = fmaf(a.z, a.z, sa);
    sa = fmaf(a.w, a.w, sa);
    sb = fmaf(b.x, b.x, sb);
    sb = fmaf(b.y, b.y, sb);
    sb = fmaf(b.z, b.z, sb);
    sb = fmaf(b.w, b.w, sb);
#pragma unroll
    for (int j = 0; j < NT; j++) {
        tf_slice(acc[j], a.x, a.y, b.x, b.y, f[j].x, f[j].y);
        tf_slice(acc[j], a.z, a.w, b.z, b.w, f[j].z, f[j].w);
    }
}

/* A warp's results: the row's four lanes' sums of squares (lanes 4g .. 4g + 3) added by
   shuffles, then lane t = 0 writes them; the outputs of rows r0 + g and r0 + g + 8 (split
   blockIdx.y's slot of mixp and ssp) */
template <int NT>
__device__ __forceinline__ void tf_out(
    const struct tf_p &p, const float (&acc)[NT][4], float sa, float sb, int64_t r0, int g, int t) {
    sa += __shfl_xor_sync(0xffffffffu, sa, 1);
    sb += __shfl_xor_sync(0xffffffffu, sb, 1);
    sa += __shfl_xor_sync(0xffffffffu, sa, 2);
    sb += __shfl_xor_sync(0xffffffffu, sb, 2);
    int64_t base = (int64_t)blockIdx.y * p.n;
    bool ga = r0 + g < p.n, gb = r0 + g + 8 < p.n;
    if (t == 0) {
        if (ga) p.ssp[base + r0 + g] = sa;
        if (gb) p.ssp[base + r0 + g + 8] = sb;
    }
    float *out = p.mixp + base * p.n_mix;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int o = 8 * j + 2 * t;
        if (ga && o < p.n_mix) out[(r0 + g) * p.n_mix + o] = acc[j][0];
        if (ga && o + 1 < p.n_mix) out[(r0 + g) * p.n_mix + o + 1] = acc[j][1];
        if (gb && o < p.n_mix) out[(r0 + g + 8) * p.n_mix + o] = acc[j][2];
        if (gb && o + 1 < p.n_mix) out[(r0 + g + 8) * p.n_mix + o + 1] = acc[j][3];
    }
}

/* NT: n8 tiles of outputs (n_mix <= 8 NT); XB: X holds bf16 values (xs_ld4) */
template <int NT, bool XB> __global__ void __launch_bounds__(TF_T, 2) k_hc_mix_tf(struct tf_p p) {
    cu_pdl_enter();
    int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int64_t r0 = (int64_t)blockIdx.x * TF_ROWS + 16 * w;
    int64_t ka = (int64_t)blockIdx.y * p.ks, kb = min(p.len, ka + p.ks);
    int64_t ra = min(r0 + g, p.n - 1), rb = min(r0 + g + 8, p.n - 1);
    int64_t xa = ra * p.len + 4 * t, xb = rb * p.len + 4 * t; /* (elements of X) */
    const float *fo[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        fo[j] = p.fn + (int64_t)min(8 * j + g, p.n_mix - 1) * p.ldw + 4 * t;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    float sa = 0.0f, sb = 0.0f;
    for (int64_t k0 = ka; k0 < kb; k0 += TF_K) {
        float4 va[TF_U], vb[TF_U], vf[TF_U][NT];
#pragma unroll
        for (int u = 0; u < TF_U; u++) {
            va[u] = xs_ld4<XB, XS_CS>(p.X, xa + k0 + 16 * u);
            vb[u] = xs_ld4<XB, XS_CS>(p.X, xb + k0 + 16 * u);
        }
#pragma unroll
        for (int u = 0; u < TF_U; u++)
#pragma unroll
            for (int j = 0; j < NT; j++)
                vf[u][j] = __ldg((const float4 *)(fo[j] + k0 + 16 * u));
#pragma unroll
        for (int u = 0; u < TF_U; u++) {
            tf_take<NT>(acc, sa, sb, va[u], vb[u], vf[u]);
        }
    }
    tf_out<NT>(p, acc, sa, sb, r0, g, t);
}

/* hc_pre's mix with the hc_post before it in the same pass (dsi_hc_pre_args.post_first;
 * c->hc_ptf, DSI_CUDA_HC_PTF=1-3; step 46; 2 the default since step 47). The prefill ran k_hc_post
 * (old streams and f read, the new streams written: ~0.40 ms a call of 8192 rows) and then
 * k_hc_mix_tf, which read the new streams back (~0.21 ms); here the mix takes the new values where
 * they are made, so the new streams are written and never read by the mix (the finish still reads
 * them for the collapse).
 *
 * The same block of 8 warps and 128 rows, split along d (not the flattened k): lane (g, t) loads,
 * per 16 d from d0, the float4 at d0 + 4t of each of the HC old streams and of f, for rows g and
 * g + 8, computes the HC new float4 of each (hc_post_val: k_hc_post's bits), stores them, and
 * feeds stream k's float4 to the mma with fn's at k dim + d0 + 4t (a dot product's k slots
 * need only agree between A and B). How the loads are kept in flight is W (DSI_CUDA_HC_PTF): 1,
 * the next step's issued before the current step's arithmetic (two register sets; measured in
 * step 46: 662 us a prefill call against 398 + 215 for the two kernels, 20 us against 25 at 256
 * rows); 2, 32 d a step; 3, a ring in shared memory filled by cp.async (step 47, the 8k
 * prefill: 2 -0.7 ms against the two kernels, 3 level at 632 us a call; batch 256 level). The rows'
 * comb columns and post stay in registers. Outputs as k_hc_mix_tf's (tf_out); the values are the
 * same sums in another order, so not its bits. XB: the streams in and out are bf16 values
 * (xs_ld4, xs_st4; W 1 or 2: the ring's copies are float4). */
struct tf_post {
    const float *X0, *f, *post, *comb; /* hc_post's inputs: the old streams [n][HC][dim], f
                                          [n][dim], post [n][HC], comb [n][HC][HC] */
    float *Xo;                         /* the new streams (the mix's X) */
    int64_t dim;
    bool round;
    int w; /* k_hc_mix_tf_post's W (DSI_CUDA_HC_PTF): 1 the next 16 d's loads a step ahead,
              2 32 d a step without them, 3 a ring in shared memory filled by cp.async */
};

#define TF_HC   4                                /* k_hc_mix_tf_post's streams */
#define TF_NS   4                                /* W = 3: a warp's ring's steps */
#define TF_SW   (16 * (TF_HC + 1) * 4)           /* W = 3: float4 a step a warp */
#define TF_RING (TF_T / 32 * TF_NS * TF_SW * 16) /* W = 3: bytes of shared memory a block */

template <int NT, int W, bool XB>
__global__ void __launch_bounds__(TF_T, 1) k_hc_mix_tf_post(struct tf_p p, struct tf_post q) {
    constexpr int HC = TF_HC;
    static_assert(!(XB && W == 3), "the ring copies floats");
    cu_pdl_enter();
    int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int64_t r0 = (int64_t)blockIdx.x * TF_ROWS + 16 * w, dim = q.dim;
    int64_t da = (int64_t)blockIdx.y * p.ks, db = min(dim, da + p.ks);
    int64_t ra = min(r0 + g, p.n - 1), rb = min(r0 + g + 8, p.n - 1);
    bool ga = r0 + g < p.n, gb = r0 + g + 8 < p.n;
    const float *fo[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        fo[j] = p.fn + (int64_t)min(8 * j + g, p.n_mix - 1) * p.ldw + 4 * t;
    /* the rows' comb columns (c[k][j] = comb[j][k]) and post */
    float ca[HC][HC_MAX], cb[HC][HC_MAX], pa[HC], pb[HC];
#pragma unroll
    for (int k = 0; k < HC; k++) {
        pa[k] = q.post[ra * HC + k];
        pb[k] = q.post[rb * HC + k];
#pragma unroll
        for (int j = 0; j < HC_MAX; j++) {
            ca[k][j] = j < HC ? q.comb[ra * HC * HC + j * HC + k] : 0.0f;
            cb[k][j] = j < HC ? q.comb[rb * HC * HC + j * HC + k] : 0.0f;
        }
    }
    /* (the streams' offsets in elements, as X may hold bf16) */
    int64_t xa = ra * HC * dim + 4 * t, xb = rb * HC * dim + 4 * t;
    const float *fa = q.f + ra * dim + 4 * t, *fb = q.f + rb * dim + 4 * t;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    float sa = 0.0f, sb = 0.0f;
    /* a step's loads: [0..HC) row g's streams, HC its f, HC + 1.. row g + 8's */
    auto load = [&](int64_t d0, float4(&v)[2 * HC + 2]) {
#pragma unroll
        for (int k = 0; k < HC; k++) {
            v[k] = xs_ld4<XB, XS_CS>(q.X0, xa + k * dim + d0);
            v[HC + 1 + k] = xs_ld4<XB, XS_CS>(q.X0, xb + k * dim + d0);
        }
        v[HC] = __ldcs((const float4 *)(fa + d0));
        v[2 * HC + 1] = __ldcs((const float4 *)(fb + d0));
    };
    /* a sub-step: the new streams of 16 d from d0, stored, and their squares and products */
    auto step = [&](int64_t d0, const float4(&v)[2 * HC + 2]) {
        float4 vf[HC][NT];
#pragma unroll
        for (int k = 0; k < HC; k++)
#pragma unroll
            for (int j = 0; j < NT; j++)
                vf[k][j] = __ldg((const float4 *)(fo[j] + k * dim + d0));
#pragma unroll
        for (int k = 0; k < HC; k++) {
            float4 a, b;
            {
                float x0[HC_MAX], x1[HC_MAX], x2[HC_MAX], x3[HC_MAX];
#pragma unroll
                for (int j = 0; j < HC_MAX; j++) {
                    float4 e = j < HC ? v[j] : make_float4(0, 0, 0, 0);
                    x0[j] = e.x, x1[j] = e.y, x2[j] = e.z, x3[j] = e.w;
                }
                float4 f = v[HC];
                a = make_float4(hc_post_val(ca[k], x0, pa[k], f.x, HC, q.round),
                                hc_post_val(ca[k], x1, pa[k], f.y, HC, q.round),
                                hc_post_val(ca[k], x2, pa[k], f.z, HC, q.round),
                                hc_post_val(ca[k], x3, pa[k], f.w, HC, q.round));
#pragma unroll
                for (int j = 0; j < HC_MAX; j++) {
                    float4 e = j < HC ? v[HC + 1 + j] : make_float4(0, 0, 0, 0);
                    x0[j] = e.x, x1[j] = e.y, x2[j] = e.z, x3[j] = e.w;
                }
                f = v[2 * HC + 1];
                b = make_float4(hc_post_val(cb[k], x0, pb[k], f.x, HC, q.round),
                                hc_post_val(cb[k], x1, pb[k], f.y, HC, q.round),
                                hc_post_val(cb[k], x2, pb[k], f.z, HC, q.round),
                                hc_post_val(cb[k], x3, pb[k], f.w, HC, q.round));
            }
            if (ga) xs_st4<XB>(q.Xo, xa + k * dim + d0, a);
            if (gb) xs_st4<XB>(q.Xo, xb + k * dim + d0, b);
            tf_take<NT>(acc, sa, sb, a, b, vf[k]);
        }
    };
    if constexpr (W == 1) { /* the next 16 d's loads issued before this step's arithmetic */
        float4 cur[2 * HC + 2], nxt[2 * HC + 2];
        if (da < db) load(da, cur);
        for (int64_t d0 = da; d0 < db; d0 += 16) {
            if (d0 + 16 < db) load(d0 + 16, nxt);
            step(d0, cur);
#pragma unroll
            for (int i = 0; i < 2 * HC + 2; i++)
                cur[i] = nxt[i];
        }
    } else if constexpr (W == 2) { /* 32 d a step, both halves' loads issued together: whole
                                      128-byte lines a row */
        for (int64_t d0 = da; d0 < db; d0 += 32) {
            float4 v0[2 * HC + 2], v1[2 * HC + 2];
            bool two = d0 + 16 < db;
            load(d0, v0);
            if (two) load(d0 + 16, v1);
            step(d0, v0);
            if (two) step(d0 + 16, v1);
        }
    } else if constexpr (W ==
                         3) { /* W = 3: each warp's ring of TF_NS steps of 16 d in shared memory,
           filled by cp.async TF_NS - 1 steps ahead, so the bytes in flight hold no registers. A
           step's slot: float4 (row, array, part) at row (HC + 1) 4 + array 4 + part (rows
           past n copy row n - 1); lane (g, t) reads its rows' parts t (conflict-free: the
           rows' 80-word strides put a quarter warp's 8 float4 on distinct banks). */
        extern __shared__ float4 tf_sm[];
        constexpr int SW = TF_SW; /* float4 a step a warp */
        float4 *ring = tf_sm + (size_t)w * TF_NS * SW;
        auto issue = [&](int64_t d0, int slot) {
#pragma unroll
            for (int i = 0; i < SW / 32; i++) {
                int ch = lane + 32 * i, row = ch / ((HC + 1) * 4), a = (ch / 4) % (HC + 1),
                    part = ch % 4;
                int64_t rr = min(r0 + row, p.n - 1);
                const float *src = a < HC ? q.X0 + (rr * HC + a) * dim + d0 + 4 * part
                                          : q.f + rr * dim + d0 + 4 * part;
                cu_cp16(smem_u32(ring + slot * SW + ch), src, true);
            }
        };
        int ns = (int)((db - da + 15) / 16);
#pragma unroll
        for (int s = 0; s < TF_NS - 1; s++) {
            if (s < ns) issue(da + 16 * s, s);
            cu_cp_commit();
        }
        for (int s = 0; s < ns; s++) {
            cu_cp_wait<TF_NS - 2>();
            __syncwarp(); /* the step's copies by every lane; slot s - 1 read by every lane */
            if (s + TF_NS - 1 < ns) issue(da + 16 * (s + TF_NS - 1), (s + TF_NS - 1) % TF_NS);
            cu_cp_commit();
            const float4 *st = ring + (s % TF_NS) * SW;
            float4 v[2 * HC + 2];
#pragma unroll
            for (int a = 0; a <= HC; a++) {
                v[a] = st[(g * (HC + 1) + a) * 4 + t];
                v[HC + 1 + a] = st[((g + 8) * (HC + 1) + a) * 4 + t];
            }
            step(da + 16 * s, v);
        }
    }
    tf_out<NT>(p, acc, sa, sb, r0, g, t);
}

/* k_hc_mix_tf_post<NT, q.w> (W = 3 with its ring's shared memory, the limit raised once; with
   bf16 streams W = 2 in its place) */
template <int NT>
static void tf_launch_post(
    struct cu_ctx *c, dim3 grid, const struct tf_p &p, const struct tf_post &q, bool xb) {
    static bool done;
    if (xb) {
        if (q.w == 1)
            cu_launch(c, k_hc_mix_tf_post<NT, 1, true>, grid, TF_T, 0, p, q);
        else
            cu_launch(c, k_hc_mix_tf_post<NT, 2, true>, grid, TF_T, 0, p, q);
    } else if (q.w == 3) {
        if (smem_limit(c, k_hc_mix_tf_post<NT, 3, false>, TF_RING, &done, "hc mix with hc_post"))
            cu_launch(c, k_hc_mix_tf_post<NT, 3, false>, grid, TF_T, TF_RING, p, q);
    } else if (q.w == 2) {
        cu_launch(c, k_hc_mix_tf_post<NT, 2, false>, grid, TF_T, 0, p, q);
    } else {
        cu_launch(c, k_hc_mix_tf_post<NT, 1, false>, grid, TF_T, 0, p, q);
    }
}

/* The launch for split [S] of ks (k, or with q d) a block: the scratch for mixp and ssp, then
   k_hc_mix_tf (q null) or k_hc_mix_tf_post; xb: bf16 streams. */
static bool tf_run(struct cu_ctx *c,
                   const struct cu_w *fn,
                   int n_mix,
                   const float *X,
                   bool xb,
                   int64_t n,
                   int64_t len,
                   int64_t rt,
                   int64_t ks,
                   int64_t S,
                   const struct tf_post *q,
                   float **mixp,
                   float **ssp,
                   int64_t *S_out) {
    if (rt > 65535 * 16 || S > 65535) return false;
    size_t mb = cu_align((size_t)(S * n * n_mix) * 4);
    char *s = (char *)cu_scratch(c, CU_SCR_GEMM, mb + (size_t)(S * n) * 4);
    if (!s) return false;
    struct tf_p p = {X,          (const float *)fn->data, fn->row_bytes / 4, len, n, ks, n_mix,
                     (float *)s, (float *)(s + mb)};
    dim3 grid((unsigned)rt, (unsigned)S);
    int nt = (n_mix + 7) / 8;
    int pm = cu_prof_begin(c, q ? "hc.mix_tf_post" : "hc.mix_tf");
#define TF_LAUNCH(NT)                                                                              \
    do {                                                                                           \
        if (q)                                                                                     \
            tf_launch_post<NT>(c, grid, p, *q, xb);                                                \
        else if (xb)                                                                               \
            cu_launch(c, k_hc_mix_tf<NT, true>, grid, TF_T, 0, p);                                 \
        else                                                                                       \
            cu_launch(c, k_hc_mix_tf<NT, false>, grid, TF_T, 0, p);                                \
    } while (0)
    if (nt == 1)
        TF_LAUNCH(1);
    else if (nt == 2)
        TF_LAUNCH(2);
    else if (nt == 3)
        TF_LAUNCH(3);
    else
        TF_LAUNCH(4);
#undef TF_LAUNCH
    cu_prof_end(c, pm);
    if (!cu_check(c, q ? "hc mix with hc_post (TF32)" : "hc mix (TF32)")) return false;
    *mixp = p.mixp;
    *ssp = p.ssp;
    *S_out = S;
    return true;
}

bool hc_mix_tf(struct cu_ctx *c,
               const struct cu_w *fn,
               int n_mix,
               const float *X,
               bool xbf16,
               int64_t n,
               int64_t len,
               float **mixp,
               float **ssp,
               int64_t *S_out) {
    if (n <= 0 || n_mix < 1 || n_mix > 32 || len % TF_K || fn->type != DSI_TYPE_F32 ||
        (uintptr_t)X % (xbf16 ? 8 : 16) || (uintptr_t)fn->data % 16 || fn->row_bytes % 16 ||
        fn->K < len)
        return false;
    /* splits along K: at most two blocks per SM (two fit), one wave (step 32's first form
       rounded up: 320 blocks for 264 places at 8192 rows, a second wave a fifth full), in whole
       TF_K pieces */
    int64_t rt = cu_div_up(n, TF_ROWS), pieces = len / TF_K;
    int64_t S = std::max<int64_t>(1, std::min<int64_t>(pieces, 2 * c->n_sms / rt));
    int64_t ks = cu_div_up(pieces, S) * TF_K;
    S = cu_div_up(len, ks);
    return tf_run(c, fn, n_mix, X, xbf16, n, len, rt, ks, S, NULL, mixp, ssp, S_out);
}

bool hc_mix_tf_post(struct cu_ctx *c,
                    const struct cu_w *fn,
                    int n_mix,
                    const struct dsi_hc_post_args *pa,
                    float **mixp,
                    float **ssp,
                    int64_t *S_out) {
    int64_t n = pa->n, dim = pa->dim, len = TF_HC * dim;
    size_t xa = pa->xbf16 ? 8 : 16; /* (the streams' alignment) */
    if (n <= 0 || pa->hc != TF_HC || n_mix < 1 || n_mix > 32 || dim % 16 ||
        fn->type != DSI_TYPE_F32 || (uintptr_t)pa->X % xa || (uintptr_t)pa->f % 16 ||
        (uintptr_t)pa->Xo % xa || (uintptr_t)fn->data % 16 || fn->row_bytes % 16 || fn->K < len)
        return false;
    /* splits along d: one block per SM (its registers), one wave, in whole steps of 16 d */
    int64_t rt = cu_div_up(n, TF_ROWS), pieces = dim / 16;
    int64_t S = std::max<int64_t>(1, std::min<int64_t>(pieces, c->n_sms / rt));
    int64_t ks = cu_div_up(pieces, S) * 16;
    S = cu_div_up(dim, ks);
    struct tf_post q = {pa->X, pa->f, pa->post, pa->comb, pa->Xo, dim, pa->round_bf16, c->hc_ptf};
    return tf_run(c, fn, n_mix, pa->Xo, pa->xbf16, n, len, rt, ks, S, &q, mixp, ssp, S_out);
}
