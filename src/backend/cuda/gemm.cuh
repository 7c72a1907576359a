/* gemm.cuh - device pieces of the GEMM shared by gemm.cu and moe.cu: loading and dequantising
 * one lane's 32-element chunk of a weight row, loading a chunk of an activation row, and the
 * chunk value in cpu_dot's order. */
#ifndef DSI_CUDA_GEMM_CUH
#define DSI_CUDA_GEMM_CUH

#include "common.cuh"

#define GEMM_RW 2 /* weight rows per warp */
/* dense: rows gvf.cu takes at most, in launches of up to 32 rows (as many as fit in shared
   memory: 32, 16 or 8) and at most GVF_CHUNKS of them; more rows: tc.cu / lt.cu (gemm.cu's
   cu_gemm_takes_kept relies on it) */
#define GVF_ROWS_MAX 63

bool gemm_w_ok(const struct cu_w *w); /* the weight fits the fast kernel */
/* The split-K second pass of k_gemm / k_gemv (gemm.cu). */
void launch_gemm_reduce(struct cu_ctx *c,
                        const float *cv,
                        int64_t nq,
                        int64_t n,
                        int64_t n_out,
                        float *y,
                        int64_t ldy,
                        bool round);
/* One call of the decode launchers: y[r][o] (+ r ldy) = x[r] (+ r ldx) . W[row0 + o] for r < n,
 * o < n_out, in `groups` groups (1: a plain call): group g multiplies rows row0 + g n_out.. by
 * x + g gxs into y + g gys, all in one launch; `round`: bf16-round the outputs. */
struct cu_gemm_call {
    const struct cu_w *w;
    int64_t row0, n_out;
    const float *x;
    int64_t n, ldx;
    float *y;
    int64_t ldy;
    bool round;
    int groups;
    int64_t gxs, gys;
    bool x_fp8;     /* x is act_quant's output (dsi_gemm_args.x_fp8) */
    bool y_to_attn; /* (dsi_gemm_args.y_to_attn: lt.cu may leave y's rows in c->q16) */
};

/* The decode GEMM (gemv.cu) for 1-2 rows of x on non-F32 weights that gemm_fast_ok takes;
 * false: not taken (the caller runs k_gemm, or the groups one by one: a grouped call that needs
 * split-K is not taken). */
bool launch_gemv(struct cu_ctx *c, const struct cu_gemm_call *g);
bool gemm_fast_ok(const struct cu_w *w, const float *x, int64_t ldx);
/* The tensor-core GEMM of `fast` numerics (tc.cu) for n >= c->tc_dense_min rows on FP8/BF16
 * weights with K % 64 == 0, groups in one launch (gxs % 4 == 0); false: not taken (the caller
 * runs the exact kernels). */
bool launch_tc_gemm(struct cu_ctx *c, const struct cu_gemm_call *g);
/* launch_tc_gemm would run g on wgr.cu's kernels, through wg_dense_copy's permuted copy of x */
bool tc_takes_kept_rows(const struct cu_ctx *c, const struct cu_gemm_call *g);
/* The gemm op a (x_from_attn, after an attention with out_to_gemm) reads x only through the rows
 * the attention kept (c->o16): gemm.cu's dispatch on a takes it to tc_takes_kept_rows's path. */
bool cu_gemm_takes_kept(const struct cu_ctx *c, const struct dsi_gemm_args *a);
/* y[r * ldy + o] = the bf16 d[r * m + o] as a float, r < n, o < m (m % 8 == 0, y 16-byte
 * aligned, ldy % 4 == 0): lt.cu's widening, also the attention's for rows c->q16 holds. */
void launch_lt_widen(
    struct cu_ctx *c, const uint16_t *d, float *y, int64_t n, int64_t m, int64_t ldy);

/* The decode GEMM of `fast` numerics (gvf.cu) for c->gvf_min <= n <= min(32, c->gvf_max) rows on
 * FP8/FP4/BF16 weights, the groups in one launch; false: not taken. */
bool launch_gvf_gemm(struct cu_ctx *c,
                     const struct cu_gemm_call *g,
                     const struct cu_gemm_call *g2 = nullptr);
/* Two such calls on the same x rows (g2: rows from 0 of a weight of g's type, K and scale
 * layout) in one launch (c->gvf_pair); false: not taken (run them one by one). */
bool launch_gvf_pair(struct cu_ctx *c, const struct cu_gemm_call *g, const struct cu_gemm_call *g2);

/* Scale column of element k of a row: k / sb1 (a shift where sb1 is a power of two). */
__device__ __forceinline__ int64_t w_scol(const struct cu_w &w, int64_t k) {
    return w.sh1 >= 0 ? k >> w.sh1 : k / w.sb1;
}

/* The dense FP8 GEMM of `fast` numerics on the FP8 tensor cores through cuBLASLt (lt.cu) for
 * n >= c->lt_min rows whose values are act_quant's output (x_fp8); false: not taken. */
bool launch_lt_gemm(struct cu_ctx *c, const struct cu_gemm_call *g, bool x_fp8);

/* The scale of an FP8 block of act_quant's output whose largest magnitude is amax (lt.cu):
 * act_quant's rule (floor 1e-4, 2^ceil(log2(amax / 448)) from the bits) gives the block's
 * original scale or a smaller power of two, so every value times inv (1 / s exactly) is an FP8
 * code again (codes only double). */
__device__ __forceinline__ void fp8_requant_scale(float amax, float *s, float *inv) {
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    uint32_t u = __float_as_uint(amax / 448.0f);
    uint32_t e = (u >> 23) & 0xffu;
    if (u & 0x7fffffu) e++;
    *s = __uint_as_float(e << 23);
    *inv = __uint_as_float((254u - e) << 23);
}

__device__ __forceinline__ const uint8_t *w_scale_row(const struct cu_w &w, int64_t row) {
    if (w.type == DSI_TYPE_F8_E4M3)
        return w.scale + (w.sh0 >= 0 ? row >> w.sh0 : row / w.sb0) * w.srs;
    if (w.type == DSI_TYPE_FP4_E2M1) return w.scale + row * w.srs;
    return nullptr;
}

/* Dequantising a chunk with few instructions, to the same values as e4m3_to_f32(c) * scale and
 * fp4_to_f32(c) * scale. The code's magnitude bits are placed where a float keeps its exponent
 * and mantissa (e4m3: s eeee mmm -> sign bit 31, bits 20-26; e2m1: s ee m -> bit 31, bits
 * 22-24): that float is exactly the code's value times 2^-120 (e4m3) or 2^-126 (e2m1), the
 * subnormal codes included (they land on float subnormals), so one multiply by 2^120 (2^126)
 * times the scale gives the value times the scale. Every product here is a power-of-two scaling
 * of a value with at most 4 significant bits: exact, as the reference's own product is, unless
 * it overflows, which it does the same way. When 2^120 (2^126) times the scale itself would
 * overflow (scale byte > 134 / > 128) the two multiplies are done in turn. The e4m3 NaN code
 * (s 1111 111) is mapped to the NaN the reference returns. */
__device__ __forceinline__ float pow2f(int k) { /* 2^k for -126 <= k <= 127 */
    return __uint_as_float((uint32_t)(k + 127) << 23);
}

__device__ __forceinline__ void e4m3x4(uint32_t u, uint32_t sb, float *out) {
    bool one = sb != 0xffu && sb <= 134u;
    float mul = one ? (sb == 0 ? pow2f(-7) : pow2f((int)sb - 7)) : pow2f(120);
    float sc = e8m0_to_f32(sb);
#pragma unroll
    for (int b = 0; b < 4; b++) {
        uint32_t t = u >> (8 * b);
        float r = __uint_as_float(((t & 0x80u) << 24) | ((t & 0x7fu) << 20));
        float v = one ? r * mul : (r * mul) * sc;
        out[b] = (t & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) * sc : v;
    }
}

__device__ __forceinline__ void e2m1x8(uint32_t u, uint32_t sb, float *out) {
    bool one = sb != 0xffu && sb <= 128u;
    float mul = one ? (sb == 0 ? pow2f(-1) : pow2f((int)sb - 1)) : pow2f(126);
    float sc = e8m0_to_f32(sb);
#pragma unroll
    for (int b = 0; b < 8; b++) {
        uint32_t t = u >> (4 * b);
        float r = __uint_as_float(((t & 8u) << 28) | ((t & 7u) << 22));
        out[b] = one ? r * mul : (r * mul) * sc;
    }
}

/* wf[0..32) = elements 32q .. 32q+31 of the row at rowp (q < 0: zeros). */
template <int WT>
__device__ __forceinline__ void load_w_chunk(
    const struct cu_w &w, const uint8_t *rowp, const uint8_t *srow, int64_t q, float (&wf)[32]) {
    if (q < 0) {
#pragma unroll
        for (int e = 0; e < 32; e++)
            wf[e] = 0.0f;
        return;
    }
    if (WT == DSI_TYPE_BF16 || WT == DSI_TYPE_F16) {
        const uint4 *p = (const uint4 *)(rowp + q * 64);
        uint4 r[4];
#pragma unroll
        for (int v = 0; v < 4; v++)
            r[v] = __ldg(p + v);
#pragma unroll
        for (int v = 0; v < 4; v++) {
            uint32_t u[4] = {r[v].x, r[v].y, r[v].z, r[v].w};
#pragma unroll
            for (int h = 0; h < 4; h++) {
                if (WT == DSI_TYPE_BF16) {
                    wf[v * 8 + 2 * h] = __uint_as_float(u[h] << 16);
                    wf[v * 8 + 2 * h + 1] = __uint_as_float(u[h] & 0xffff0000u);
                } else {
                    wf[v * 8 + 2 * h] = f16_to_f32(u[h] & 0xffffu);
                    wf[v * 8 + 2 * h + 1] = f16_to_f32(u[h] >> 16);
                }
            }
        }
    } else if (WT == DSI_TYPE_F32) {
        const float4 *p = (const float4 *)(rowp + q * 128);
#pragma unroll
        for (int v = 0; v < 8; v++) {
            float4 f = __ldg(p + v);
            wf[4 * v] = f.x;
            wf[4 * v + 1] = f.y;
            wf[4 * v + 2] = f.z;
            wf[4 * v + 3] = f.w;
        }
    } else if (WT == DSI_TYPE_F8_E4M3) {
        const uint4 *p = (const uint4 *)(rowp + q * 32);
        uint4 r[2] = {__ldg(p), __ldg(p + 1)};
        uint32_t sb = srow[w_scol(w, q * 32)];
#pragma unroll
        for (int v = 0; v < 2; v++) {
            uint32_t u[4] = {r[v].x, r[v].y, r[v].z, r[v].w};
#pragma unroll
            for (int h = 0; h < 4; h++)
                e4m3x4(u[h], sb, &wf[v * 16 + h * 4]);
        }
    } else { /* FP4: two codes per byte, low nibble first */
        uint4 r = __ldg((const uint4 *)(rowp + q * 16));
        uint32_t sb = srow[w_scol(w, q * 32)];
        uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int h = 0; h < 4; h++)
            e2m1x8(u[h], sb, &wf[h * 8]);
    }
}

/* A lane's chunk as stored (BF16/F16: 64 bytes, FP8: 32, FP4: 16) and its scale byte, so
 * that the loads can be issued a piece ahead of the decoding (load_w_raw, then decode_w_raw:
 * the same values as load_w_chunk). Not for F32 weights. */
struct w_raw {
    uint4 v[4];
    uint32_t sc;
};

template <int WT>
__device__ __forceinline__ void
load_w_raw(const struct cu_w &w, const uint8_t *rowp, const uint8_t *srow, int64_t q, w_raw &r) {
    if (q < 0) return;
    if (WT == DSI_TYPE_BF16 || WT == DSI_TYPE_F16) {
        const uint4 *p = (const uint4 *)(rowp + q * 64);
#pragma unroll
        for (int v = 0; v < 4; v++)
            r.v[v] = __ldg(p + v);
    } else if (WT == DSI_TYPE_F8_E4M3) {
        const uint4 *p = (const uint4 *)(rowp + q * 32);
        r.v[0] = __ldg(p);
        r.v[1] = __ldg(p + 1);
        r.sc = srow[w_scol(w, q * 32)];
    } else if (WT == DSI_TYPE_FP4_E2M1) {
        r.v[0] = __ldg((const uint4 *)(rowp + q * 16));
        r.sc = srow[w_scol(w, q * 32)];
    }
}

template <int WT>
__device__ __forceinline__ void decode_w_raw(const w_raw &r, int64_t q, float (&wf)[32]) {
    if (q < 0) {
#pragma unroll
        for (int e = 0; e < 32; e++)
            wf[e] = 0.0f;
        return;
    }
    if (WT == DSI_TYPE_BF16 || WT == DSI_TYPE_F16) {
#pragma unroll
        for (int v = 0; v < 4; v++) {
            uint32_t u[4] = {r.v[v].x, r.v[v].y, r.v[v].z, r.v[v].w};
#pragma unroll
            for (int h = 0; h < 4; h++) {
                if (WT == DSI_TYPE_BF16) {
                    wf[v * 8 + 2 * h] = __uint_as_float(u[h] << 16);
                    wf[v * 8 + 2 * h + 1] = __uint_as_float(u[h] & 0xffff0000u);
                } else {
                    wf[v * 8 + 2 * h] = f16_to_f32(u[h] & 0xffffu);
                    wf[v * 8 + 2 * h + 1] = f16_to_f32(u[h] >> 16);
                }
            }
        }
    } else if (WT == DSI_TYPE_F8_E4M3) {
#pragma unroll
        for (int v = 0; v < 2; v++) {
            uint32_t u[4] = {r.v[v].x, r.v[v].y, r.v[v].z, r.v[v].w};
#pragma unroll
            for (int h = 0; h < 4; h++)
                e4m3x4(u[h], r.sc & 0xffu, &wf[v * 16 + h * 4]);
        }
    } else if (WT == DSI_TYPE_FP4_E2M1) {
        uint32_t u[4] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w};
#pragma unroll
        for (int h = 0; h < 4; h++)
            e2m1x8(u[h], r.sc & 0xffu, &wf[h * 8]);
    }
}

/* xf[0..32) = p[0..32) (16-byte aligned), or zeros. */
__device__ __forceinline__ void load_x_chunk(const float *p, bool valid, float (&xf)[32]) {
#pragma unroll
    for (int v = 0; v < 8; v++) {
        float4 f = valid ? ((const float4 *)p)[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        xf[4 * v] = f.x;
        xf[4 * v + 1] = f.y;
        xf[4 * v + 2] = f.z;
        xf[4 * v + 3] = f.w;
    }
}

/* Staging of activation pieces in shared memory (the GEMM kernels, c->xstage; see gemm.cu).
 * A piece is 1024 elements = 32 chunks of 32; lane L of every warp needs chunk L. Loading that
 * straight from global memory has each lane read its own 128 bytes (32 cache lines per
 * load instruction, and the same lines again in each of the block's 8 warps); instead the
 * block loads the piece of each of its RX rows once, coalesced (one float4 per thread per row),
 * into xs[rx][chunk][XS_STRIDE], and each lane reads its chunk back from there. The 4-float pad
 * makes the 16-byte stores (8 threads: one chunk) and the 16-byte loads (8 lanes: 8 chunks)
 * free of bank conflicts. The values, and so the arithmetic, are the same either way. */
#define XS_STRIDE 36
#define XS_PIECE  (CU_THREADS * 4) /* elements staged per row: one float4 per thread */

static_assert(XS_PIECE == 1024, "a staged piece is 32 chunks of 32");

/* Bytes of dynamic shared memory of the GEMM kernels: the staged x, then the chunk values. */
static inline size_t gemm_smem_bytes(int rx) {
    return (size_t)rx * 32 * XS_STRIDE * 4 + (size_t)CU_WARPS * rx * GEMM_RW * 33 * 4;
}

/* Kernels whose dynamic shared memory may pass 48 KiB: raise their limit once (per process:
 * one device kind). */
template <typename K>
static bool smem_limit(struct cu_ctx *c, K kernel, size_t bytes, bool *done, const char *what) {
    if (bytes <= 48 * 1024 || *done) return true;
    if (bytes > c->smem_optin ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
            cudaSuccess) {
        cudaGetLastError();
        cu_fail(c, DSI_ERR_UNSUPPORTED, "%s: %zu bytes of shared memory per block", what, bytes);
        return false;
    }
    *done = true;
    return true;
}

/* All CU_THREADS threads: xs <- piece p (elements [1024 p, 1024 p + 1024)) of the rows
 * x + xoff[rx] (shared memory; zeros for xoff[rx] < 0 and past K; K % 32 == 0, rows 16-byte
 * aligned). The caller puts __syncthreads() before (the previous piece is consumed) and after. */
template <int RX>
__device__ __forceinline__ void
stage_x(float *xs, const float *x, const int64_t *xoff, int64_t K, int64_t p) {
    int tid = threadIdx.x;
    int64_t f = p * XS_PIECE + tid * 4;
    float4 v[RX];
#pragma unroll
    for (int rx = 0; rx < RX; rx++) {
        int64_t o = xoff[rx];
        v[rx] =
            o >= 0 && f < K ? *(const float4 *)(x + o + f) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int rx = 0; rx < RX; rx++)
        *(float4 *)(xs + (rx * 32 + (tid >> 3)) * XS_STRIDE + (tid & 7) * 4) = v[rx];
}

/* xf[0..32) = staged chunk `lane` of row rx. */
__device__ __forceinline__ void load_x_staged(const float *xs, int rx, int lane, float (&xf)[32]) {
    const float4 *p = (const float4 *)(xs + (rx * 32 + lane) * XS_STRIDE);
#pragma unroll
    for (int v = 0; v < 8; v++) {
        float4 f = p[v];
        xf[4 * v] = f.x;
        xf[4 * v + 1] = f.y;
        xf[4 * v + 2] = f.z;
        xf[4 * v + 3] = f.w;
    }
}

/* One chunk of cpu_dot. */
__device__ __forceinline__ float chunk_dot(const float (&a)[32], const float (&b)[32]) {
    float l[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j += 8)
#pragma unroll
        for (int i = 0; i < 8; i++)
            l[i] += a[j + i] * b[j + i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The in-order sum of split-K chunk values: acc = 0, acc += cv[q * T + t] for q = 0 .. nq - 1
 * (the same additions as the one-pass kernels and cpu_dot; the caller adds + 0.0f). Called by
 * all CU_THREADS threads of the block (it has barriers); lane l of every warp names its output t
 * (tv: valid) and warp 0's lanes return the sums. The adds are one serial chain per output; what
 * must not be serial is the loads: the 8 warps stage RED_ROWS chunk rows at a time in buf
 * (warp w loads rows w, w + 8, ...: RED_PER independent loads per thread in flight), and warp 0
 * adds the staged rows in order while the next round's rows are being loaded. One round trip to
 * L2 per RED_ROWS chunks instead of one per few chunks. The loads bypass L1 (__ldcg): k_hc_pre_one
 * reads values other blocks of its grid wrote. */
#define RED_ROWS 128
#define RED_PER  (RED_ROWS / CU_WARPS)

__device__ __forceinline__ float
chunk_sum_staged(const float *cv, int64_t nq, int64_t T, int64_t t, bool tv, float (*buf)[32]) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *src = cv + (tv ? t : 0);
    float v[RED_PER];
#pragma unroll
    for (int j = 0; j < RED_PER; j++) {
        int64_t q = warp + CU_WARPS * j;
        v[j] = tv && q < nq ? __ldcg(src + q * T) : 0.0f;
    }
    float acc = 0.0f;
    for (int64_t q0 = 0; q0 < nq; q0 += RED_ROWS) {
#pragma unroll
        for (int j = 0; j < RED_PER; j++)
            buf[warp + CU_WARPS * j][lane] = v[j];
        __syncthreads();
        if (q0 + RED_ROWS < nq) { /* next round's loads, in flight during the adds */
#pragma unroll
            for (int j = 0; j < RED_PER; j++) {
                int64_t q = q0 + RED_ROWS + warp + CU_WARPS * j;
                v[j] = tv && q < nq ? __ldcg(src + q * T) : 0.0f;
            }
        }
        if (warp == 0) {
            int cnt = (int)(nq - q0 < RED_ROWS ? nq - q0 : RED_ROWS);
#pragma unroll 16
            for (int k = 0; k < cnt; k++)
                acc += buf[k][lane];
        }
        __syncthreads();
    }
    return acc;
}

#endif
