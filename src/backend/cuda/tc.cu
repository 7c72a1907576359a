/* tc.cu - tensor-core GEMMs for the `fast` numerics profile (dsi_gemm_args.fast,
 * dsi_moe_args.fast): mma.sync m16n8k16 with bf16 operands and fp32 accumulation, for dense
 * GEMMs on FP8 / BF16 weights and the MoE expert GEMMs (up + SwiGLU, down) on FP4 / FP8 weights
 * when a call has enough activation rows.
 *
 * Numerics. Weights are dequantised to bf16 in shared memory: an e4m3 or e2m1 code times a
 * UE8M0 scale has at most 4 significant bits, so the bf16 value is exact. Activations are
 * rounded to bf16, which is exact for the rows `fast` numerics feeds here (FP8-quantised with
 * power-of-two scales, or bf16-rounded, as in `reference`). Products of two bf16 values are
 * exact in fp32; only the order of the fp32 sums differs from the CPU reference (the tensor
 * cores add in their own order). Not bitwise; the op tests bound the difference.
 *
 * Layout. A block of TC_T = 256 threads (8 warps: 4 along the weight rows x 2 along the
 * activation rows) computes TC_BM = 128 weight rows (the mma's M) x BN activation rows (the
 * mma's N) over all of K, TC_BK = 64 at a time: every thread loads its share of the next step's
 * weight bytes and activation floats into registers while the warps multiply the current
 * step's bf16 tiles (two shared-memory buffers, one barrier per step). For the up projection
 * the 128 rows are 64 columns of W1 and the same 64 of W3, placed so that a thread holds the
 * gate and the up value of the same (column, row) and applies SwiGLU in registers. */
#include "gemm.cuh"
#include "moe.cuh"
#include "tc.cuh"

#define TC_BM 128
#define TC_BK 64
#define TC_LD (TC_BK + 8) /* bf16 per shared row: 144 bytes, ldmatrix without bank conflicts */
#define TC_T  256

enum { TC_DENSE = 0, TC_UP = 1, TC_DOWN = 2 };

struct tc_p {
    struct cu_w w; /* dense: the weight; row0 .. row0 + n_out */
    int64_t row0, n_out;
    const float *x;
    int64_t n, ldx;
    float *y;
    int64_t ldy;
    bool round;
    struct moe_p m; /* TC_UP / TC_DOWN */
    int64_t gx, gy; /* dense groups (blockIdx.z): rows row0 + z n_out, x + z gx, y + z gy */
};

static size_t tc_smem_bytes(int BN) { return (size_t)2 * (TC_BM + BN) * TC_LD * 2; }

/* One thread's share of a step's weight tile: 32 consecutive K values of one row. */
struct tc_wraw {
    uint4 v[4]; /* FP4: v[0]; FP8: v[0..1]; BF16: v[0..3] */
    uint32_t sb;
};

template <int WT>
__device__ __forceinline__ void
tc_load_w(const uint8_t *row, const uint8_t *srow, int sb1, int64_t k, struct tc_wraw &r) {
    if (!row) return;
    if (WT == DSI_TYPE_FP4_E2M1) {
        r.v[0] = __ldg((const uint4 *)(row + k / 2));
        r.sb = srow[k / sb1];
    } else if (WT == DSI_TYPE_F8_E4M3) {
        const uint4 *p = (const uint4 *)(row + k);
        r.v[0] = __ldg(p);
        r.v[1] = __ldg(p + 1);
        r.sb = srow[k / sb1];
    } else {
        const uint4 *p = (const uint4 *)(row + k * 2);
#pragma unroll
        for (int i = 0; i < 4; i++)
            r.v[i] = __ldg(p + i);
    }
}

/* Decode 32 values to bf16 and store them at dst (16-byte aligned, 64 bytes). */
template <int WT>
__device__ __forceinline__ void tc_store_w(const struct tc_wraw &r, bool valid, uint16_t *dst) {
    uint4 *d = (uint4 *)dst;
    if (!valid) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            d[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    if (WT == DSI_TYPE_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            d[i] = r.v[i];
    } else if (WT == DSI_TYPE_FP4_E2M1) {
        uint32_t u[4] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w};
        if (r.sb <= 128u) { /* pairs (j, j + 4) of a word, put back in k order (tc.cuh) */
            uint32_t m = bf16x2_pow2(r.sb, 126);
#pragma unroll
            for (int h = 0; h < 4; h++) {
                uint32_t p04 = bf16x2_mul(e2m1_pair_bits<0>(u[h]), m),
                         p15 = bf16x2_mul(e2m1_pair_bits<1>(u[h]), m),
                         p26 = bf16x2_mul(e2m1_pair_bits<2>(u[h]), m),
                         p37 = bf16x2_mul(e2m1_pair_bits<3>(u[h]), m);
                d[h] = make_uint4(__byte_perm(p04, p15, 0x5410), __byte_perm(p26, p37, 0x5410),
                                  __byte_perm(p04, p15, 0x7632), __byte_perm(p26, p37, 0x7632));
            }
            return;
        }
#pragma unroll
        for (int h = 0; h < 4; h++) {
            float f[8];
            e2m1x8(u[h], r.sb, f);
            d[h] = make_uint4(bf16x2_exact(f[0], f[1]), bf16x2_exact(f[2], f[3]),
                              bf16x2_exact(f[4], f[5]), bf16x2_exact(f[6], f[7]));
        }
    } else if (r.sb <= 134u) { /* FP8: pairs (0, 2) and (1, 3) of a word, in k order (tc.cuh) */
        uint32_t m = bf16x2_pow2(r.sb, 120);
#pragma unroll
        for (int v = 0; v < 2; v++) {
            uint32_t u[4] = {r.v[v].x, r.v[v].y, r.v[v].z, r.v[v].w};
            uint32_t o[4];
#pragma unroll
            for (int h = 0; h < 4; h++) {
                uint32_t p02 = bf16x2_mul(e4m3_pair_bits<0>(u[h]), m),
                         p13 = bf16x2_mul(e4m3_pair_bits<1>(u[h]), m);
                o[h] = __byte_perm(p02, p13, 0x5410); /* elements 0, 1 */
                u[h] = __byte_perm(p02, p13, 0x7632); /* elements 2, 3 */
            }
            d[v * 2] = make_uint4(o[0], u[0], o[1], u[1]);
            d[v * 2 + 1] = make_uint4(o[2], u[2], o[3], u[3]);
        }
    } else {
#pragma unroll
        for (int v = 0; v < 2; v++) {
            uint32_t u[4] = {r.v[v].x, r.v[v].y, r.v[v].z, r.v[v].w};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float f[8];
                e4m3x4(u[2 * h], r.sb, f);
                e4m3x4(u[2 * h + 1], r.sb, f + 4);
                d[v * 2 + h] = make_uint4(bf16x2_exact(f[0], f[1]), bf16x2_exact(f[2], f[3]),
                                          bf16x2_exact(f[4], f[5]), bf16x2_exact(f[6], f[7]));
            }
        }
    }
}

/* Shared row of the m-fragment f (0, 1) of warp row wm (0..3). For the up projection, fragment
 * 0 holds W1 columns and fragment 1 the same W3 columns. */
template <int MODE> __device__ __forceinline__ int tc_arow(int wm, int f) {
    return MODE == TC_UP ? f * 64 + wm * 16 : wm * 32 + f * 16;
}

template <int MODE, int WT, int BN>
__global__ void __launch_bounds__(TC_T, BN >= 128 ? 1 : 2) k_tc(struct tc_p p) {
    cu_pdl_enter();
    constexpr int NF = BN / 16;        /* n8 fragments per warp (a warp has BN / 2 rows) */
    constexpr int XV = BN * 16 / TC_T; /* float4 activation loads per thread per step */
    extern __shared__ uint4 tc_smem[];
    uint16_t *Ws = (uint16_t *)tc_smem;    /* [2][TC_BM][TC_LD] */
    uint16_t *Xs = Ws + 2 * TC_BM * TC_LD; /* [2][BN][TC_LD] */
    __shared__ const float *xrow[BN];
    __shared__ int64_t opos[BN]; /* MoE: h / out position of the row; -1: none */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int wm = warp & 3, wn = warp >> 2;

    /* ---- the block's rows */
    int e = -1, rows = 0;
    int64_t pos0 = 0, nk = p.m.n * p.m.topk, K;
    if (MODE == TC_DENSE) {
        K = p.w.K;
        p.row0 += (int64_t)blockIdx.z * p.n_out;
        p.x += (int64_t)blockIdx.z * p.gx;
        p.y += (int64_t)blockIdx.z * p.gy;
    } else {
        if (!moe_tile(p.m, BN, &e, &pos0, &rows)) return; /* the same for the whole block */
        K = MODE == TC_UP ? p.m.D : p.m.I;
    }
    if (tid < BN) {
        const float *xr = nullptr;
        int64_t op = -1;
        if (MODE == TC_DENSE) {
            int64_t r = (int64_t)blockIdx.y * BN + tid;
            if (r < p.n) xr = p.x + r * p.ldx;
        } else if (tid < rows) {
            int64_t pos = pos0 + tid;
            op = pos;
            if (MODE == TC_UP)
                xr = p.m.x + (pos < nk ? (int64_t)(p.m.perm[pos] / p.m.topk) : pos - nk) * p.m.D;
            else
                xr = p.m.h + pos * p.m.I;
        }
        xrow[tid] = xr;
        opos[tid] = op;
    }
    /* ---- this thread's weight row (loads): row tid / 2, K half tid % 2 of each step */
    int srow = tid >> 1, khalf = tid & 1;
    const uint8_t *wrow = nullptr, *wsrow = nullptr;
    int sb1 = 1;
    {
        struct cu_w W;
        int64_t r = -1;
        if (MODE == TC_DENSE) {
            W = p.w;
            int64_t o = (int64_t)blockIdx.x * TC_BM + srow;
            if (o < p.n_out) r = p.row0 + o;
        } else if (MODE == TC_UP) {
            int mat = srow >= 64;
            W = mat ? p.m.w3 : p.m.w1;
            if (e >= 0) {
                W.data = p.m.tab[e].p[mat ? 2 : 0];
                W.scale = p.m.tab[e].p[mat ? 3 : 1];
            }
            int64_t col = (int64_t)blockIdx.x * 64 + (srow & 63);
            if (col < p.m.I) r = col;
        } else {
            W = p.m.w2;
            if (e >= 0) {
                W.data = p.m.tab[e].p[4];
                W.scale = p.m.tab[e].p[5];
            }
            int64_t o = (int64_t)blockIdx.x * TC_BM + srow;
            if (o < p.m.D) r = o;
        }
        if (r >= 0) {
            wrow = W.data + r * W.row_bytes;
            wsrow = w_scale_row(W, r);
        }
        sb1 = W.sb1;
    }
    __syncthreads();

    /* ---- main loop */
    float acc[2][NF][4];
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int j = 0; j < NF; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[f][j][i] = 0.0f;
    /* Weight bytes are loaded PF steps ahead (wr[u] holds step s with s % PF == u: the loop is
     * unrolled by PF so the register arrays are indexed statically), activations one step. */
    constexpr int PF = BN <= 32 ? 4 : 2;
    struct tc_wraw wr[PF];
    float4 xr[XV];
    int64_t steps = K / TC_BK;
    auto load_x = [&](int64_t s) {
        int64_t k0 = s * TC_BK;
#pragma unroll
        for (int v = 0; v < XV; v++) {
            int idx = tid + v * TC_T, j = idx >> 4, q = idx & 15;
            const float *src = xrow[j];
            xr[v] = src ? __ldg((const float4 *)(src + k0) + q) : make_float4(0, 0, 0, 0);
        }
    };
    auto step = [&](int64_t s, struct tc_wraw &w) {
        int buf = (int)(s & 1);
        uint16_t *W = Ws + buf * TC_BM * TC_LD, *X = Xs + buf * BN * TC_LD;
        tc_store_w<WT>(w, wrow != nullptr, W + srow * TC_LD + khalf * 32);
#pragma unroll
        for (int v = 0; v < XV; v++) {
            int idx = tid + v * TC_T, j = idx >> 4, q = idx & 15;
            *(uint2 *)(X + j * TC_LD + q * 4) =
                make_uint2(bf16x2_rn(xr[v].x, xr[v].y), bf16x2_rn(xr[v].z, xr[v].w));
        }
        __syncthreads();
        if (s + PF < steps) tc_load_w<WT>(wrow, wsrow, sb1, (s + PF) * TC_BK + khalf * 32, w);
        if (s + 1 < steps) load_x(s + 1);
#pragma unroll
        for (int kk = 0; kk < TC_BK / 16; kk++) {
            uint32_t a[2][4];
#pragma unroll
            for (int f = 0; f < 2; f++) {
                const uint16_t *ap =
                    W + (tc_arow<MODE>(wm, f) + (lane & 15)) * TC_LD + kk * 16 + (lane >> 4) * 8;
                ldsm_x4(smem_u32(ap), a[f]);
            }
            int tb = wn * (BN / 2);
            if (NF == 1) {
                uint32_t b0, b1;
                const uint16_t *bp =
                    X + (tb + (lane & 7)) * TC_LD + kk * 16 + ((lane >> 3) & 1) * 8;
                ldsm_x2(smem_u32(bp), b0, b1);
#pragma unroll
                for (int f = 0; f < 2; f++)
                    mma_bf16(acc[f][0], a[f], b0, b1);
            } else {
#pragma unroll
                for (int j = 0; j < NF; j += 2) {
                    uint32_t b[4];
                    const uint16_t *bp = X +
                                         (tb + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * TC_LD +
                                         kk * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4(smem_u32(bp), b);
#pragma unroll
                    for (int f = 0; f < 2; f++) {
                        mma_bf16(acc[f][j], a[f], b[0], b[1]);
                        mma_bf16(acc[f][j + 1], a[f], b[2], b[3]);
                    }
                }
            }
        }
    };
#pragma unroll
    for (int u = 0; u < PF; u++)
        if (u < steps) tc_load_w<WT>(wrow, wsrow, sb1, (int64_t)u * TC_BK + khalf * 32, wr[u]);
    load_x(0);
    for (int64_t s = 0; s < steps; s += PF) {
#pragma unroll
        for (int u = 0; u < PF; u++)
            if (s + u < steps) step(s + u, wr[u]);
    }

    /* ---- epilogue: c[i] is (row g + 8 (i / 2), activation row 2 t + i % 2) of the fragment */
    int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < NF; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m = g + (i >> 1) * 8, jr = wn * (BN / 2) + j * 8 + 2 * t4 + (i & 1);
            if (MODE == TC_DENSE) {
                int64_t r = (int64_t)blockIdx.y * BN + jr;
                if (r >= p.n) continue;
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    int64_t o = (int64_t)blockIdx.x * TC_BM + tc_arow<MODE>(wm, f) + m;
                    if (o < p.n_out) p.y[r * p.ldy + o] = rbf(acc[f][j][i] + 0.0f, p.round);
                }
            } else if (MODE == TC_UP) {
                int64_t pos = opos[jr], col = (int64_t)blockIdx.x * 64 + wm * 16 + m;
                if (pos < 0 || col >= p.m.I) continue;
                float gt = rbf(acc[0][j][i] + 0.0f, p.m.round),
                      u = rbf(acc[1][j][i] + 0.0f, p.m.round);
                float wi = pos < nk ? p.m.weight[p.m.perm[pos]] : 1.0f;
                float gv = fminf(gt, p.m.limit), uv = fminf(fmaxf(u, -p.m.limit), p.m.limit);
                float silu = gv / (1.0f + exp_ref(-gv));
                p.m.h[pos * p.m.I + col] = rbf(silu * uv * wi, p.m.round);
            } else {
                int64_t pos = opos[jr];
                if (pos < 0) continue;
                int64_t orow = pos < nk ? p.m.perm[pos] : pos;
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    int64_t o = (int64_t)blockIdx.x * TC_BM + tc_arow<MODE>(wm, f) + m;
                    if (o < p.m.D) p.m.out[orow * p.m.D + o] = rbf(acc[f][j][i] + 0.0f, p.m.round);
                }
            }
        }
}

/* ---- launchers --------------------------------------------------------------------------- */

template <int MODE, int WT, int BN>
static bool tc_launch(struct cu_ctx *c, const struct tc_p *p, dim3 grid) {
    static bool smem_done = false;
    size_t sm = tc_smem_bytes(BN);
    if (!smem_limit(c, k_tc<MODE, WT, BN>, sm, &smem_done, "tensor-core gemm")) return false;
    cu_launch(c, k_tc<MODE, WT, BN>, grid, TC_T, sm, *p);
    return cu_check(c, MODE == TC_DENSE ? "gemm (tensor cores)" : "moe (tensor cores)");
}

template <int MODE, int WT>
static bool tc_launch_bn(struct cu_ctx *c, const struct tc_p *p, int bn, dim3 grid) {
    switch (bn) {
    case 16:
        return tc_launch<MODE, WT, 16>(c, p, grid);
    case 32:
        return tc_launch<MODE, WT, 32>(c, p, grid);
    case 64:
        return tc_launch<MODE, WT, 64>(c, p, grid);
    default:
        return tc_launch<MODE, WT, 128>(c, p, grid);
    }
}

/* Activation rows per block for an expert's `rows` rows, at most c->tc_bn_max. */
int tc_pick_bn(const struct cu_ctx *c, double rows) {
    int bn = rows > 64 ? 128 : rows > 32 ? 64 : rows > 16 ? 32 : 16;
    return bn < c->tc_bn_max ? bn : c->tc_bn_max;
}

static bool tc_w_ok(const struct cu_w *w, int64_t K) {
    if (!gemm_w_ok(w) || w->K != K || K % TC_BK) return false;
    return w->type == DSI_TYPE_F8_E4M3 || w->type == DSI_TYPE_FP4_E2M1 || w->type == DSI_TYPE_BF16;
}

bool launch_tc_gemm(struct cu_ctx *c, const struct cu_gemm_call *g) {
    const struct cu_w *w = g->w;
    int64_t n = g->n;
    if (n < c->tc_dense_min || !tc_w_ok(w, w->K) || w->type == DSI_TYPE_FP4_E2M1 ||
        !gemm_fast_ok(w, g->x, g->ldx) || g->groups < 1 || g->groups > 65535 ||
        (g->groups > 1 && (g->gxs % 4 || (uintptr_t)g->x % 16)))
        return false;
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.w = *w;
    p.row0 = g->row0;
    p.n_out = g->n_out;
    p.x = g->x;
    p.n = n;
    p.ldx = g->ldx;
    p.y = g->y;
    p.ldy = g->ldy;
    p.round = g->round;
    p.gx = g->gxs;
    p.gy = g->gys;
    int bn = n >= 512 ? 128 : n >= 128 ? 64 : 32;
    dim3 grid((unsigned)cu_div_up(g->n_out, TC_BM), (unsigned)cu_div_up(n, bn),
              (unsigned)g->groups);
    int pp = cu_prof_begin(c, "gemm.tc");
    bool ok = w->type == DSI_TYPE_F8_E4M3
                  ? tc_launch_bn<TC_DENSE, DSI_TYPE_F8_E4M3>(c, &p, bn, grid)
                  : tc_launch_bn<TC_DENSE, DSI_TYPE_BF16>(c, &p, bn, grid);
    cu_prof_end(c, pp);
    return ok || c->sticky;
}

bool tc_moe_ok(const struct cu_w *w1,
               const struct cu_w *w3,
               const struct cu_w *w2,
               int64_t D,
               int64_t I,
               const float *x) {
    return tc_w_ok(w1, D) && tc_w_ok(w3, D) && tc_w_ok(w2, I) && w1->type == w3->type &&
           w1->type != DSI_TYPE_BF16 && w2->type != DSI_TYPE_BF16 && (uintptr_t)x % 16 == 0 &&
           D % 4 == 0 && I % 4 == 0;
}

bool launch_tc_moe(struct cu_ctx *c, const struct moe_p *mp, bool up, int bn, unsigned tiles) {
    struct tc_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    int type = up ? mp->w1.type : mp->w2.type;
    dim3 grid((unsigned)(up ? cu_div_up(mp->I, 64) : cu_div_up(mp->D, TC_BM)), tiles);
    if (up)
        return type == DSI_TYPE_FP4_E2M1 ? tc_launch_bn<TC_UP, DSI_TYPE_FP4_E2M1>(c, &p, bn, grid)
                                         : tc_launch_bn<TC_UP, DSI_TYPE_F8_E4M3>(c, &p, bn, grid);
    return type == DSI_TYPE_FP4_E2M1 ? tc_launch_bn<TC_DOWN, DSI_TYPE_FP4_E2M1>(c, &p, bn, grid)
                                     : tc_launch_bn<TC_DOWN, DSI_TYPE_F8_E4M3>(c, &p, bn, grid);
}
