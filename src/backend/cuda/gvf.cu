/* gvf.cu - decode GEMMs of the `fast` numerics profile: dense GEMMs of at most 32 activation
 * rows and the MoE expert GEMMs for tiles of at most 8 rows, on tensor cores without shared
 * memory tiles.
 *
 * At decode a GEMM reads each weight byte once and does a few multiply-adds with it: it is bound
 * by the bytes in flight and by the instructions spent per weight element. Here the weights are
 * dequantised (exactly, as in tc.cu) straight into the A fragments of mma.sync m16n8k16 in
 * registers, and the activation rows are the B operand (the n8 columns; 1-4 of them): the
 * multiply-adds of up to 32 rows cost one mma per 16 x 16 weight elements, and what is left per
 * element is its decoding.
 *
 * The sum over k does not care which k sits in which slot of the mma as long as A and B agree.
 * Lane (g, t) of a warp (g = lane / 4, t = lane % 4) supplies rows g and g + 8 of the warp's 16
 * weight rows, k slots {2t, 2t+1, 2t+8, 2t+9} of every mma: here those slots are 4 consecutive
 * elements of a 32-byte slice of the row that the lane loads itself (FP8: 32 elements, FP4: 64,
 * BF16: 16); the four lanes of a row read 128 consecutive bytes (a "group"). The B fragment of
 * the same lane holds the same 4 k of activation row g, loaded as float4 and rounded to bf16
 * (exact for the rows `fast` numerics feeds, as in tc.cu).
 *
 * A block has 8 warps: 8 / ks tiles of 16 weight rows, each tile's groups split over ks warps
 * (ks chosen so that a warp has at most GVF_U groups, all loaded at once); the ks partial sums
 * are added in warp order through shared memory. Deterministic; fp32 sums in another order than
 * the CPU reference, so not bitwise (the op tests bound the difference).
 *
 * MoE up: a tile is 8 columns of the intermediate, its rows 0-7 the W1 rows and rows 8-15 the
 * same W3 rows, so lane (g, t) ends with the gate and the up value of column g and applies the
 * clamped SwiGLU and the routing weight itself. Down: 16 rows of W2. */
#include "gemm.cuh"
#include "moe.cuh"
#include "tc.cuh"

#include <algorithm>

#define GVF_T 256
#define GVF_W (GVF_T / 32)
#define GVF_U 4 /* groups a warp loads at once */

enum { GVF_DENSE = 0, GVF_UP = 1, GVF_DOWN = 2 };

struct gvf_p {
    struct cu_w w; /* dense: the weight; rows row0 .. row0 + n_out */
    int64_t row0, n_out;
    const float *x;
    int64_t n, ldx;
    float *y;
    int64_t ldy;
    bool round;
    struct moe_p m; /* GVF_UP / GVF_DOWN */
    int ks;         /* warps along K per tile (1, 2, 4, 8) */
};

/* Elements in a lane's 32-byte slice. */
template <int WT> __host__ __device__ constexpr int gvf_e() {
    return WT == DSI_TYPE_FP4_E2M1 ? 64 : WT == DSI_TYPE_F8_E4M3 ? 32 : 16;
}

struct gvf_raw {
    uint4 v[2];
    uint32_t sc; /* FP8: the slice's scale byte; FP4: the two bytes of its 32-element halves */
};

template <int WT>
__device__ __forceinline__ void
gvf_load(const uint8_t *row, const uint8_t *srow, int sb1, int64_t k0, bool valid, gvf_raw &r) {
    if (!valid) {
        r.v[0] = r.v[1] = make_uint4(0, 0, 0, 0);
        r.sc = 0;
        return;
    }
    int64_t off = WT == DSI_TYPE_FP4_E2M1 ? k0 / 2 : WT == DSI_TYPE_F8_E4M3 ? k0 : k0 * 2;
    const uint4 *p = (const uint4 *)(row + off);
    r.v[0] = __ldg(p);
    r.v[1] = __ldg(p + 1);
    if (WT == DSI_TYPE_F8_E4M3) r.sc = srow[k0 / sb1];
    if (WT == DSI_TYPE_FP4_E2M1) r.sc = srow[k0 / sb1] | ((uint32_t)srow[(k0 + 32) / sb1] << 8);
}

/* One mma over 4 k at column tiles 0..NT-1: B from the activation rows xr (nullptr: zeros). */
template <int NT>
__device__ __forceinline__ void gvf_mma(const uint32_t (&a)[4],
                                        const float *const (&xr)[NT],
                                        int64_t k,
                                        bool kin,
                                        float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float4 f = kin && xr[j] ? __ldg((const float4 *)(xr[j] + k)) : make_float4(0, 0, 0, 0);
        mma_bf16(acc[j], a, bf16x2_rn(f.x, f.y), bf16x2_rn(f.z, f.w));
    }
}

/* A group: the lane's slices ra (row g) and rb (row g + 8) starting at element k0. */
template <int WT, int NT>
__device__ __forceinline__ void gvf_group(const gvf_raw &ra,
                                          const gvf_raw &rb,
                                          const float *const (&xr)[NT],
                                          int64_t k0,
                                          bool kin,
                                          float (&acc)[NT][4]) {
    const uint32_t wa[8] = {ra.v[0].x, ra.v[0].y, ra.v[0].z, ra.v[0].w,
                            ra.v[1].x, ra.v[1].y, ra.v[1].z, ra.v[1].w};
    const uint32_t wb[8] = {rb.v[0].x, rb.v[0].y, rb.v[0].z, rb.v[0].w,
                            rb.v[1].x, rb.v[1].y, rb.v[1].z, rb.v[1].w};
    if (WT == DSI_TYPE_F8_E4M3) { /* word w: elements 4w .. 4w + 3 */
#pragma unroll
        for (int w = 0; w < 8; w++) {
            float fa[4], fb[4];
            e4m3x4(wa[w], ra.sc & 0xffu, fa);
            e4m3x4(wb[w], rb.sc & 0xffu, fb);
            const uint32_t a[4] = {bf16x2_exact(fa[0], fa[1]), bf16x2_exact(fb[0], fb[1]),
                                   bf16x2_exact(fa[2], fa[3]), bf16x2_exact(fb[2], fb[3])};
            gvf_mma<NT>(a, xr, k0 + 4 * w, kin, acc);
        }
    } else if (WT == DSI_TYPE_FP4_E2M1) { /* word w: elements 8w .. 8w + 7 */
#pragma unroll
        for (int w = 0; w < 8; w++) {
            float fa[8], fb[8];
            e2m1x8(wa[w], (ra.sc >> (w >= 4 ? 8 : 0)) & 0xffu, fa);
            e2m1x8(wb[w], (rb.sc >> (w >= 4 ? 8 : 0)) & 0xffu, fb);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t a[4] = {bf16x2_exact(fa[4 * h], fa[4 * h + 1]),
                                       bf16x2_exact(fb[4 * h], fb[4 * h + 1]),
                                       bf16x2_exact(fa[4 * h + 2], fa[4 * h + 3]),
                                       bf16x2_exact(fb[4 * h + 2], fb[4 * h + 3])};
                gvf_mma<NT>(a, xr, k0 + 8 * w + 4 * h, kin, acc);
            }
        }
    } else { /* BF16: word w holds elements 2w, 2w + 1 */
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint32_t a[4] = {wa[2 * m], wb[2 * m], wa[2 * m + 1], wb[2 * m + 1]};
            gvf_mma<NT>(a, xr, k0 + 4 * m, kin, acc);
        }
    }
}

template <int MODE, int WT, int NT> __global__ void __launch_bounds__(GVF_T) k_gvf(struct gvf_p p) {
    constexpr int E = gvf_e<WT>(), G = 4 * E;
    __shared__ float part[GVF_W][32][NT * 4];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int ks = p.ks, kw = warp % ks;
    int64_t tile = (int64_t)blockIdx.x * (GVF_W / ks) + warp / ks;

    /* ---- the block's activation rows (MoE: the tile of blockIdx.y) */
    int e = -1, rows = 0;
    int64_t pos0 = 0, nk = p.m.n * p.m.topk, K;
    if (MODE == GVF_DENSE) {
        K = p.w.K;
    } else {
        if (!moe_tile(p.m, 8 * NT, &e, &pos0, &rows)) return; /* the whole block */
        K = MODE == GVF_UP ? p.m.D : p.m.I;
    }
    const float *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int col = j * 8 + g;
        xr[j] = nullptr;
        if (MODE == GVF_DENSE) {
            if (col < p.n) xr[j] = p.x + col * p.ldx;
        } else if (col < rows) {
            int64_t pos = pos0 + col;
            if (MODE == GVF_UP)
                xr[j] = p.m.x + (pos < nk ? (int64_t)(p.m.perm[pos] / p.m.topk) : pos - nk) * p.m.D;
            else
                xr[j] = p.m.h + pos * p.m.I;
        }
    }
    /* ---- this lane's weight rows: g (a) and g + 8 (b) of the tile */
    const uint8_t *rowp[2] = {nullptr, nullptr}, *srow[2] = {nullptr, nullptr};
    int sb1[2] = {1, 1};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        struct cu_w W;
        int64_t r = -1;
        if (MODE == GVF_DENSE) {
            W = p.w;
            int64_t o = tile * 16 + g + 8 * h;
            if (o < p.n_out) r = p.row0 + o;
        } else if (MODE == GVF_UP) {
            W = h ? p.m.w3 : p.m.w1;
            if (e >= 0) {
                W.data = p.m.tab[e].p[h ? 2 : 0];
                W.scale = p.m.tab[e].p[h ? 3 : 1];
            }
            int64_t col = tile * 8 + g;
            if (col < p.m.I) r = col;
        } else {
            W = p.m.w2;
            if (e >= 0) {
                W.data = p.m.tab[e].p[4];
                W.scale = p.m.tab[e].p[5];
            }
            int64_t o = tile * 16 + g + 8 * h;
            if (o < p.m.D) r = o;
        }
        if (r >= 0) {
            rowp[h] = W.data + r * W.row_bytes;
            srow[h] = w_scale_row(W, r);
        }
        sb1[h] = W.sb1;
    }

    /* ---- this warp's groups, GVF_U loaded at once */
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[j][i] = 0.0f;
    int64_t ng = (K + G - 1) / G, gpw = (ng + ks - 1) / ks;
    int64_t q0 = kw * gpw, q1 = q0 + gpw < ng ? q0 + gpw : ng;
    for (int64_t q = q0; q < q1; q += GVF_U) {
        gvf_raw ra[GVF_U], rb[GVF_U];
#pragma unroll
        for (int u = 0; u < GVF_U; u++) {
            int64_t k0 = (q + u) * G + t * E;
            bool in = q + u < q1 && k0 < K;
            gvf_load<WT>(rowp[0], srow[0], sb1[0], k0, in && rowp[0], ra[u]);
            gvf_load<WT>(rowp[1], srow[1], sb1[1], k0, in && rowp[1], rb[u]);
        }
#pragma unroll
        for (int u = 0; u < GVF_U; u++) {
            if (q + u >= q1) break; /* the same for the whole warp */
            int64_t k0 = (q + u) * G + t * E;
            gvf_group<WT, NT>(ra[u], rb[u], xr, k0, k0 < K, acc);
        }
    }

    /* ---- the ks partial sums, in warp order */
    if (ks > 1) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                part[warp][lane][j * 4 + i] = acc[j][i];
        __syncthreads();
        if (kw != 0) return; /* after the block's only barrier */
        for (int w = 1; w < ks; w++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[j][i] += part[warp + w][lane][j * 4 + i];
    }

    /* ---- epilogue: acc[j][i] is (row g + 8 (i / 2), column j * 8 + 2 t + i % 2) */
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m = g + (i >> 1) * 8, col = j * 8 + 2 * t + (i & 1);
            if (MODE == GVF_DENSE) {
                int64_t o = tile * 16 + m;
                if (col < p.n && o < p.n_out) p.y[col * p.ldy + o] = rbf(acc[j][i] + 0.0f, p.round);
            } else if (MODE == GVF_UP) {
                int64_t c = tile * 8 + g;
                if (i >= 2 || col >= rows || c >= p.m.I) continue;
                int64_t pos = pos0 + col;
                float gt = rbf(acc[j][i] + 0.0f, p.m.round),
                      u = rbf(acc[j][i + 2] + 0.0f, p.m.round);
                float wi = pos < nk ? p.m.weight[p.m.perm[pos]] : 1.0f;
                float gv = fminf(gt, p.m.limit), uv = fminf(fmaxf(u, -p.m.limit), p.m.limit);
                float silu = gv / (1.0f + exp_ref(-gv));
                p.m.h[pos * p.m.I + c] = rbf(silu * uv * wi, p.m.round);
            } else {
                int64_t o = tile * 16 + m;
                if (col >= rows || o >= p.m.D) continue;
                int64_t pos = pos0 + col, orow = pos < nk ? p.m.perm[pos] : pos;
                p.m.out[orow * p.m.D + o] = rbf(acc[j][i] + 0.0f, p.m.round);
            }
        }
}

/* ---- launchers --------------------------------------------------------------------------- */

/* Warps along K for a K of ng groups: the fewest (1, 2, 4, 8) that leave a warp <= GVF_U. */
static int gvf_ks(int64_t ng) {
    int ks = 1;
    while (ks < GVF_W && cu_div_up(ng, ks) > GVF_U)
        ks *= 2;
    return ks;
}

template <int MODE, int WT>
static bool gvf_launch(struct cu_ctx *c, struct gvf_p *p, int nt, int64_t tiles16, unsigned gy) {
    int64_t K = MODE == GVF_DENSE ? p->w.K : MODE == GVF_UP ? p->m.D : p->m.I;
    p->ks = gvf_ks(cu_div_up(K, 4 * gvf_e<WT>()));
    dim3 grid((unsigned)cu_div_up(tiles16, GVF_W / p->ks), gy);
    if (nt == 1)
        k_gvf<MODE, WT, 1><<<grid, GVF_T, 0, c->stream>>>(*p);
    else if (nt == 2)
        k_gvf<MODE, WT, 2><<<grid, GVF_T, 0, c->stream>>>(*p);
    else
        k_gvf<MODE, WT, 4><<<grid, GVF_T, 0, c->stream>>>(*p);
    return cu_check(c, MODE == GVF_DENSE ? "gemm (decode, tensor cores)"
                                         : "moe (decode, tensor cores)");
}

static bool gvf_w_ok(const struct cu_w *w, int64_t K) {
    if (!gemm_w_ok(w) || w->K != K) return false;
    switch (w->type) {
    case DSI_TYPE_F8_E4M3:
        return K % 32 == 0 && w->sb1 % 32 == 0;
    case DSI_TYPE_FP4_E2M1:
        return K % 64 == 0 && w->sb1 % 32 == 0;
    case DSI_TYPE_BF16:
        return K % 16 == 0;
    default:
        return false;
    }
}

static int gvf_nt(int64_t n) { return n <= 8 ? 1 : n <= 16 ? 2 : 4; }

bool launch_gvf_gemm(struct cu_ctx *c,
                     const struct cu_w *w,
                     int64_t row0,
                     int64_t n_out,
                     const float *x,
                     int64_t n,
                     int64_t ldx,
                     float *y,
                     int64_t ldy,
                     bool round) {
    if (n > c->gvf_max || n > 32 || !gvf_w_ok(w, w->K) || !gemm_fast_ok(w, x, ldx)) return false;
    struct gvf_p p;
    memset(&p, 0, sizeof(p));
    p.w = *w;
    p.row0 = row0;
    p.n_out = n_out;
    p.x = x;
    p.n = n;
    p.ldx = ldx;
    p.y = y;
    p.ldy = ldy;
    p.round = round;
    int64_t tiles = cu_div_up(n_out, 16);
    int pp = cu_prof_begin(c, "gemm.gvf");
    bool ok;
    switch (w->type) {
    case DSI_TYPE_F8_E4M3:
        ok = gvf_launch<GVF_DENSE, DSI_TYPE_F8_E4M3>(c, &p, gvf_nt(n), tiles, 1);
        break;
    case DSI_TYPE_FP4_E2M1:
        ok = gvf_launch<GVF_DENSE, DSI_TYPE_FP4_E2M1>(c, &p, gvf_nt(n), tiles, 1);
        break;
    default:
        ok = gvf_launch<GVF_DENSE, DSI_TYPE_BF16>(c, &p, gvf_nt(n), tiles, 1);
        break;
    }
    cu_prof_end(c, pp);
    return ok || c->sticky;
}

bool gvf_moe_ok(const struct cu_ctx *c,
                const struct cu_w *w1,
                const struct cu_w *w3,
                const struct cu_w *w2,
                int64_t D,
                int64_t I,
                const float *x) {
    return c->gvf_max > 0 && gvf_w_ok(w1, D) && gvf_w_ok(w3, D) && gvf_w_ok(w2, I) &&
           w1->type == w3->type && w1->type != DSI_TYPE_BF16 && w2->type != DSI_TYPE_BF16 &&
           (uintptr_t)x % 16 == 0 && D % 4 == 0 && I % 4 == 0;
}

int gvf_moe_nt(int64_t rows) { return gvf_nt(rows); }

bool launch_gvf_moe(struct cu_ctx *c, const struct moe_p *mp, bool up, int nt, unsigned tiles) {
    struct gvf_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    int type = up ? mp->w1.type : mp->w2.type;
    bool fp4 = type == DSI_TYPE_FP4_E2M1;
    if (up) {
        int64_t t8 = cu_div_up(mp->I, 8);
        return fp4 ? gvf_launch<GVF_UP, DSI_TYPE_FP4_E2M1>(c, &p, nt, t8, tiles)
                   : gvf_launch<GVF_UP, DSI_TYPE_F8_E4M3>(c, &p, nt, t8, tiles);
    }
    int64_t t16 = cu_div_up(mp->D, 16);
    return fp4 ? gvf_launch<GVF_DOWN, DSI_TYPE_FP4_E2M1>(c, &p, nt, t16, tiles)
               : gvf_launch<GVF_DOWN, DSI_TYPE_F8_E4M3>(c, &p, nt, t16, tiles);
}
