/* tc.cuh - warp-level tensor-core pieces shared by tc.cu (GEMMs) and attn_tc.cu (attention)
 * of the `fast` numerics profile: bf16 packing, ldmatrix, mma.sync m16n8k16 bf16 -> fp32. */
#ifndef DSI_CUDA_TC_CUH
#define DSI_CUDA_TC_CUH

#include "common.cuh"
#include "gemm.cuh"
#include "moe.cuh"

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
 * a mask, a multiply and a mask (FP4) or two shifts and two masks (FP8). Short path: the code's
 * exponent and mantissa bits are moved to where a bf16 keeps them (the value times 2^-120 for e4m3,
 * 2^-126 for e2m1, subnormal codes included, as e4m3x4 / e2m1x8 do in fp32), and one bf16x2
 * multiply by 2^120 (2^126) times the UE8M0 scale gives the exact value times scale (a code times a
 * power of two: 4 significant bits). About 2.5 instructions per weight instead of ~9 through fp32
 * (docs/cuda.md step 12). Scale bytes past 134 (FP8) or 128 (FP4), whose combined factor is not a
 * bf16, take the fp32 path (gvf.cu: the choice is the warp's, as its mma needs all its lanes;
 * tc.cu: per thread). In this profile an FP8 NaN code (0x7f) reads as 480 (no checkpoint has one;
 * the exact kernels keep the NaN). */
/* e2m1: the pair's two codes (nibbles J and J + 4; J 2, 3 after one shift by 8, shared) masked
 * out, then one multiply by 2^a + 2^b (two shifted copies, no bits in common, so no carries: the
 * magnitude moved to bits 6-8 and the sign to 15, and the same for the high half), then the mask
 * of those bits: three instructions a pair, not four (step 23; checked equal to the two-shift form
 * for all 2^32 words). */
template <int J> __device__ __forceinline__ uint32_t e2m1_pair_bits(uint32_t u) {
    uint32_t x = (J >= 2 ? u >> 8 : u) & ((J & 1) ? 0x00f000f0u : 0x000f000fu);
    return (x * ((J & 1) ? (1u << 2) + (1u << 8) : (1u << 6) + (1u << 12))) & 0x81c081c0u;
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

/* The UE8M0 scale byte sb as bf16x2: 2^(sb - 127) (sb 0: the subnormal 2^-127; 255: NaN). A
 * code's bits times 2^120 (e4m3) or 2^126 (e2m1) is its value, exactly; times this, the scaled
 * value, rounded once, as the fp32 product then rounded to bf16 (gvf.cu's large scales). */
__device__ __forceinline__ uint32_t bf16x2_e8m0(uint32_t sb) {
    uint32_t h = sb == 0 ? 0x40u : sb == 255 ? 0x7fc0u : sb << 7;
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

/* The mma accumulators of N n8 tiles to zero. */
template <int N> __device__ __forceinline__ void acc_zero(float (&acc)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[j][i] = 0.0f;
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

/* ---- weight tiles in registers (tc.cu, wg.cu) ------------------------------------------- */

enum { TC_DENSE = 0, TC_UP = 1, TC_DOWN = 2 };

struct tc_p {
    struct cu_w w; /* dense: the weight; row0 .. row0 + n_out */
    int64_t row0, n_out;
    const float *x;
    int64_t n, ldx;
    float *y;
    int64_t ldy;
    bool round;
    struct moe_p m;      /* TC_UP / TC_DOWN */
    int64_t gx, gy;      /* dense groups (blockIdx.z): rows row0 + z n_out, x + z gx, y + z gy */
    const uint16_t *x16; /* wg.cu, dense: the bf16 copy of the rows of x (row stride ld16) */
    int64_t ld16;
    /* tc.cu, dense: split > 1 pieces along K (group blockIdx.z / split, piece blockIdx.z %
       split), sps steps of TC_BK each, whose fp32 sums go to cv ([split][n][groups n_out]:
       group g's n_out columns at g n_out; groups whose outputs sit side by side, gy = n_out) for
       launch_gemm_reduce */
    int split;
    int64_t sps;
    float *cv;
};

/* One thread's share of a step's weight tile: 32 consecutive K values of one row. */
struct tc_wraw {
    uint4 v[4]; /* FP4: v[0]; FP8: v[0..1]; BF16: v[0..3] */
    uint32_t sb;
};

/* The 32 values of `row` from k and their scale byte (scale column k >> sh1, or k / sb1 where
 * the block is not a power of two: sh1 < 0). A NULL row loads nothing (ROW: the caller knows it
 * is not NULL; step 51: wgr.cu's MoE tested both rows' pointers every step). */
template <int WT, bool POW2 = false, bool ROW = false>
__device__ __forceinline__ void
tc_load_w(const uint8_t *row, const uint8_t *srow, int sh1, int sb1, int64_t k, struct tc_wraw &r) {
    uint32_t ku = (uint32_t)k; /* k < 2^31: 32-bit offsets */
    /* (POW2: the caller took only power-of-two blocks; else ptxas computes the division beside
       the shift, predicated, in every call: ~12 instructions a row and step in wgr.cu) */
    uint32_t sc = POW2 || sh1 >= 0 ? ku >> sh1 : ku / (uint32_t)sb1;
    if (!ROW && !row) return;
    if (WT == DSI_TYPE_FP4_E2M1) {
        r.v[0] = __ldg((const uint4 *)(row + (ku >> 1)));
        r.sb = __ldg(srow + sc);
    } else if (WT == DSI_TYPE_F8_E4M3) {
        const uint4 *p = (const uint4 *)(row + ku);
        r.v[0] = __ldg(p);
        r.v[1] = __ldg(p + 1);
        r.sb = __ldg(srow + sc);
    } else {
        const uint4 *p = (const uint4 *)(row + 2 * ku);
#pragma unroll
        for (int i = 0; i < 4; i++)
            r.v[i] = __ldg(p + i);
    }
}

/* The largest scale byte tc_decode_w's short path takes for weights of type wt. */
static inline int tc_sb_short(int wt) { return wt == DSI_TYPE_FP4_E2M1 ? 128 : 134; }

/* tc_decode_w's FP4 path for scales past its bf16 multiply (sb > 128: 2^2 and up for a block of
 * FP4 weights, which trained checkpoints do not have) through floats, out of line where the
 * caller asks (OUTL; step 32: inline, the slow paths were ~750 of the ~2500 instructions of
 * wgr.cu's K loop at 192 rows, whose warps waited for instructions 14.5% of the time). All four
 * quads. (The FP8 one stays inline: its call made ptxas spill around it in wgr.cu.) */
struct tc_q4 {
    uint4 d[4];
};
static __device__ __noinline__ tc_q4 tc_decode_f4_slow(uint4 v, uint32_t sb) {
    tc_q4 q;
    uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float f[8];
        e2m1x8(u[h], sb, f);
        q.d[h] = make_uint4(bf16x2_exact(f[0], f[1]), bf16x2_exact(f[2], f[3]),
                            bf16x2_exact(f[4], f[5]), bf16x2_exact(f[6], f[7]));
    }
    return q;
}
/* Decode 32 values to bf16, in k order: d[i] holds k 8i .. 8i + 7; or (Q0, NQ) only the NQ
 * quads from Q0 (k 8 Q0 .. 8 (Q0 + NQ) - 1) into d[0 .. NQ - 1] (FP8: Q0 and NQ even). SB: the
 * scale byte is not looked at, the caller knows it is within the short path's (FP4 <= 128, FP8
 * <= 134: tc_sb_short). */
template <int WT, int Q0 = 0, int NQ = 4, bool OUTL = false, bool SB = false>
__device__ __forceinline__ void tc_decode_w(const struct tc_wraw &r, bool valid, uint4 (&d)[NQ]) {
    static_assert(Q0 >= 0 && NQ > 0 && Q0 + NQ <= 4 && Q0 % 2 == 0 && NQ % 2 == 0, "quads");
    if (!valid) {
#pragma unroll
        for (int i = 0; i < NQ; i++)
            d[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    if (WT == DSI_TYPE_BF16) {
#pragma unroll
        for (int i = 0; i < NQ; i++)
            d[i] = r.v[Q0 + i];
    } else if (WT == DSI_TYPE_FP4_E2M1) {
        uint32_t u[4] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w};
        if (SB || r.sb <= 128u) { /* pairs (j, j + 4) of a word, put back in k order (tc.cuh) */
            uint32_t m = bf16x2_pow2(r.sb, 126);
#pragma unroll
            for (int h = Q0; h < Q0 + NQ; h++) {
                uint32_t p04 = bf16x2_mul(e2m1_pair_bits<0>(u[h]), m),
                         p15 = bf16x2_mul(e2m1_pair_bits<1>(u[h]), m),
                         p26 = bf16x2_mul(e2m1_pair_bits<2>(u[h]), m),
                         p37 = bf16x2_mul(e2m1_pair_bits<3>(u[h]), m);
                d[h - Q0] =
                    make_uint4(__byte_perm(p04, p15, 0x5410), __byte_perm(p26, p37, 0x5410),
                               __byte_perm(p04, p15, 0x7632), __byte_perm(p26, p37, 0x7632));
            }
            return;
        }
        if constexpr (OUTL) {
            tc_q4 q = tc_decode_f4_slow(r.v[0], r.sb);
#pragma unroll
            for (int h = Q0; h < Q0 + NQ; h++)
                d[h - Q0] = q.d[h];
        } else {
#pragma unroll
            for (int h = Q0; h < Q0 + NQ; h++) {
                float f[8];
                e2m1x8(u[h], r.sb, f);
                d[h - Q0] = make_uint4(bf16x2_exact(f[0], f[1]), bf16x2_exact(f[2], f[3]),
                                       bf16x2_exact(f[4], f[5]), bf16x2_exact(f[6], f[7]));
            }
        }
    } else if (SB || r.sb <= 134u) { /* FP8: pairs (0, 2) and (1, 3) of a word, in k order */
        uint32_t m = bf16x2_pow2(r.sb, 120);
#pragma unroll
        for (int v = Q0 / 2; v < (Q0 + NQ) / 2; v++) {
            uint32_t u[4] = {r.v[v].x, r.v[v].y, r.v[v].z, r.v[v].w};
            uint32_t o[4];
#pragma unroll
            for (int h = 0; h < 4; h++) {
                uint32_t p02 = bf16x2_mul(e4m3_pair_bits<0>(u[h]), m),
                         p13 = bf16x2_mul(e4m3_pair_bits<1>(u[h]), m);
                o[h] = __byte_perm(p02, p13, 0x5410); /* elements 0, 1 */
                u[h] = __byte_perm(p02, p13, 0x7632); /* elements 2, 3 */
            }
            d[v * 2 - Q0] = make_uint4(o[0], u[0], o[1], u[1]);
            d[v * 2 + 1 - Q0] = make_uint4(o[2], u[2], o[3], u[3]);
        }
    } else {
#pragma unroll
        for (int v = Q0 / 2; v < (Q0 + NQ) / 2; v++) {
            uint32_t u[4] = {r.v[v].x, r.v[v].y, r.v[v].z, r.v[v].w};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float f[8];
                e4m3x4(u[2 * h], r.sb, f);
                e4m3x4(u[2 * h + 1], r.sb, f + 4);
                d[v * 2 + h - Q0] = make_uint4(bf16x2_exact(f[0], f[1]), bf16x2_exact(f[2], f[3]),
                                               bf16x2_exact(f[4], f[5]), bf16x2_exact(f[6], f[7]));
            }
        }
    }
}

/* ---- block GEMM pieces shared by tc.cu (mma.sync) and wg.cu (wgmma) ------------------------
 * A block computes a tile of weight rows x activation rows over all of K. These pieces find the
 * block's activation rows, its weight rows, and write an output element; what the kernels own
 * is the shared-memory layout and the tensor-core instructions. */

/* The block's activation rows (threads < BN write them): xrow[j] (NULL: none) and, for the MoE,
 * opos[j] (the h / out position of row j; -1: none) and *nrows (the tile's rows); K. The rows come
 * from xs (T: float, or uint16_t for bf16 copies) with row stride lds: dense: the activation rows
 * (group z at xs + z gxs; p's row0 and y move to group blockIdx.z too); MoE up: x ([n, D]); down: h
 * ([nk + n, I]). false: no tile here (the same for the whole block, which returns). The caller
 * synchronises before reading xrow / opos. */
template <int MODE, int BN, typename T>
__device__ __forceinline__ bool tc_block_rows(struct tc_p &p,
                                              const T *xs,
                                              int64_t lds,
                                              int64_t gxs,
                                              const T **xrow,
                                              int64_t *opos,
                                              int *e,
                                              int64_t *K,
                                              int *nrows = nullptr,
                                              bool by_pos = false) {
    int tid = threadIdx.x, rows = 0;
    int64_t pos0 = 0, nk = p.m.n * p.m.topk;
    *e = -1;
    if (MODE == TC_DENSE) {
        *K = p.w.K;
        int64_t z = p.split > 1 ? blockIdx.z / p.split : blockIdx.z; /* the group */
        p.row0 += z * p.n_out;
        xs += z * gxs;
        p.y += z * p.gy;
    } else {
        if (!moe_tile(p.m, BN, e, &pos0, &rows)) return false;
        *K = MODE == TC_UP ? p.m.D : p.m.I;
        if (nrows) *nrows = rows;
    }
    if (tid < BN) {
        const T *xr = nullptr;
        int64_t op = -1;
        if (MODE == TC_DENSE) {
            int64_t r = (int64_t)blockIdx.y * BN + tid;
            if (r < p.n) xr = xs + r * lds;
        } else if (tid < rows) {
            int64_t pos = pos0 + tid;
            op = pos;
            if (MODE == TC_UP)
                xr = xs + (by_pos     ? pos
                           : pos < nk ? (int64_t)(p.m.perm[pos] / p.m.topk)
                                      : pos - nk) *
                              lds;
            else
                xr = xs + pos * lds;
        }
        xrow[tid] = xr;
        opos[tid] = op;
    }
    return true;
}

/* Weight row r (-1: none; the caller checks the bounds) of the block: dense: p.w's row r; MoE
 * up: row r of W1 (mat 0) or W3 (mat 1) of expert e (-1: the shared expert); down: W2's.
 * *wrow stays NULL for none. */
template <int MODE>
__device__ __forceinline__ void tc_wsrc(const struct tc_p &p,
                                        int e,
                                        int mat,
                                        int64_t r,
                                        const uint8_t **wrow,
                                        const uint8_t **wsrow,
                                        int *sh1,
                                        int *sb1) {
    struct cu_w W = MODE == TC_DENSE ? p.w : MODE == TC_DOWN ? p.m.w2 : mat ? p.m.w3 : p.m.w1;
    if (MODE != TC_DENSE && e >= 0) {
        int i = MODE == TC_DOWN ? 4 : mat ? 2 : 0;
        W.data = p.m.tab[e].p[i];
        W.scale = p.m.tab[e].p[i + 1];
    }
    *sh1 = W.sh1;
    *sb1 = W.sb1;
    *wrow = *wsrow = nullptr;
    if (r >= 0) {
        *wrow = W.data + r * W.row_bytes;
        *wsrow = w_scale_row(W, r);
    }
}

/* Output (weight row o, the block's activation row j) = v, dense or MoE down (bounds of o
 * checked here; ar: dense activation row blockIdx.y * BN + j). */
template <int MODE>
__device__ __forceinline__ void
tc_put(const struct tc_p &p, const int64_t *opos, int j, int64_t ar, int64_t o, float v) {
    if (MODE == TC_DENSE) {
        if (ar < p.n && o < p.n_out) p.y[ar * p.ldy + o] = rbf(v + 0.0f, p.round);
    } else {
        int64_t pos = opos[j], nk = p.m.n * p.m.topk;
        if (pos < 0 || o >= p.m.D) return;
        int64_t orow = pos < nk ? p.m.perm[pos] : pos;
        p.m.out[orow * p.m.D + o] = rbf(v + 0.0f, p.m.round);
    }
}

/* MoE up: h at (the block's activation row j, intermediate column col) from the gate and up
 * sums: the clamped SwiGLU times the routing weight. */
__device__ __forceinline__ void
tc_put_up(const struct tc_p &p, const int64_t *opos, int j, int64_t col, float gs, float us) {
    int64_t pos = opos[j], nk = p.m.n * p.m.topk;
    if (pos < 0 || col >= p.m.I) return;
    float gt = rbf(gs + 0.0f, p.m.round), u = rbf(us + 0.0f, p.m.round);
    float wi = pos < nk ? p.m.weight[p.m.perm[pos]] : 1.0f;
    float gv = fminf(gt, p.m.limit), uv = fminf(fmaxf(u, -p.m.limit), p.m.limit);
    float silu = gv / (1.0f + exp_ref(-gv));
    p.m.h[pos * p.m.I + col] = rbf(silu * uv * wi, p.m.round);
}

/* wg.cu: the bf16 copy of a dense call's rows (permuted: in wgr.cu's K order) in CU_SCR_GEMM, q =
 * *p with x16 / ld16 set to it; false: no scratch (the sticky error is set). */
bool wg_dense_copy(
    struct cu_ctx *c, const struct tc_p *p, dim3 grid, bool permuted, struct tc_p *q);
/* wg.cu: a dense GEMM of tc.cu's parameters on wgmma (its rows copied to bf16 first), tiles of bn
 * (64, 128) rows, grid (weight rows / 128, rows / bn, groups). */
bool launch_wg_gemm(struct cu_ctx *c, const struct tc_p *p, int bn, dim3 grid);
/* wgr.cu: the same with the weights in registers (c->wg_rs), on a permuted bf16 copy of the
 * rows, FP8 weights; false (nothing launched) for other weights (BF16 ones would feed wgmma the
 * loads' own registers: ptxas then fences each one, C7519) or where K or the groups' column
 * stride is not a multiple of 128. */
bool launch_wgr_gemm(struct cu_ctx *c, const struct tc_p *p, int bn, dim3 grid);
/* ltb.cu: a dense (grouped) call that the wgmma kernels would take (FP8: where wgr.cu would),
 * from c->ltb_min rows on cuBLASLt's bf16 matmul (FP8 weights through a bf16 copy of their rows
 * in wgr.cu's K order; grid.z: the groups); false: not taken (nothing launched). */
bool launch_ltb_gemm(struct cu_ctx *c, const struct tc_p *p, dim3 grid);
/* launch_wgr_gemm takes a dense call of `groups` groups (gx apart) on w */
bool wgr_dense_ok(const struct cu_w *w, int groups, int64_t gx);
/* wgr.cu's MoE launch for launch_wg_moe (p and grid as it builds them; f4: FP4 weights). */
bool wr_launch_moe(
    struct cu_ctx *c, const struct tc_p *p, bool up, bool f4, int bn, bool dyn, dim3 grid);

#endif
