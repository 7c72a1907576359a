/* gvf.cu - decode GEMMs of the `fast` numerics profile: dense GEMMs and the shared expert of 1-63
 * activation rows (a launch stages at most 32, 16 or 8 rows, as many as fit in shared memory:
 * more rows take several launches, or tiles), the routed experts' tiles of up to 8-32 rows, on
 * tensor cores with the weights decoded into the mma fragments in registers (no shared-memory
 * weight tiles). (Step 20's FP8 mma for FP8 weights on act_quant's rows, DSI_CUDA_GVF_F8, and
 * step 21's FP4 weights on it were removed in step 22: sm_90 runs mma.sync's e4m3 as f16 HMMA
 * after conversions, so neither was faster.)
 *
 * At decode a GEMM reads each weight byte once and does a few multiply-adds with it. Here the
 * weights are dequantised (exactly, as in tc.cu) straight into the A fragments of mma.sync
 * m16n8k16, and the activation rows are the B operand (n8 column tiles; 1, 2 or 4 of them): the
 * multiply-adds of up to 32 rows cost one mma per 16 x 16 weight elements, and what is left per
 * element is its decoding (bf16 pairs straight from the code bits, step 12: from then on faster
 * than the exact kernels from one row for dense GEMMs; the routed experts at 1-2 tokens stay on
 * moe_gv.cu, measured faster there).
 *
 * The sum over k does not care which k sits in which slot of the mma as long as A and B agree.
 * Lane (g, t) of a warp (g = lane / 4, t = lane % 4) supplies rows g and g + 8 of the warp's 16
 * weight rows, k slots {2t, 2t+1, 2t+8, 2t+9} of every mma: here those slots are 4 consecutive
 * elements of a 32-byte slice of the row that the lane loads itself (FP8: 32 elements, FP4: 64,
 * BF16: 16); the four lanes of a row read 128 consecutive bytes (a "group"). The block stages its
 * activation rows once in shared memory as bf16 (exact for the rows `fast` numerics feeds, as in
 * tc.cu), ordered so that the B fragment of an mma is one conflict-free 8-byte load per lane.
 *
 * A block has 8 warps, about two blocks per SM, walking their tiles persistently: 8 / ks tiles of
 * 16 weight rows at a time, each tile's groups split over ks warps, GVF_U groups per step, the
 * next step's weight bytes loaded while the current step computes; the ks partial sums are added
 * in warp order through shared memory. Deterministic; fp32 sums in another order than the CPU
 * reference, so not bitwise (the op tests bound the difference).
 *
 * MoE up: a tile is 8 columns of the intermediate, its rows 0-7 the W1 rows and rows 8-15 the
 * same W3 rows, so lane (g, t) ends with the gate and the up value of column g and applies the
 * clamped SwiGLU and the routing weight itself. Down: 16 rows of W2.
 *
 * The code is kept short (step 18: Nsight showed warps waiting for instructions, each instance
 * was 60-200 KB): a group whose warp has a scale too large for the one bf16 multiply takes two
 * (2^120 or 2^126, then the scale: both exact, the second rounds once, as the fp32 product then
 * rounded to bf16 does) instead of an fp32 decode; no 64-bit divisions (shifts; the staging
 * loop's indices are 32-bit). */
#include "gvf.cuh"
#include "moe.cuh"

#include <algorithm>

#define GVF_T        256
#define GVF_W        (GVF_T / 32)
#define GVF_SMEM_MAX (160 * 1024) /* staged rows; plus part[] (<= 32 KiB) within 227 KiB */
#ifndef GVF_MINB
#define GVF_MINB 2 /* blocks per SM the kernels are built for (their registers) */
#endif
#ifndef GVF_U
#define GVF_U 2 /* groups per step (a warp loads the next step's while it computes one) */
#endif
#define GVF_PRE_MAX (32LL << 20) /* dense: weight bytes a grid prefetches into L2 at most */
/* dense: rows a call takes at most, in launches of up to 32 rows (as many as fit in shared
   memory: 32, 16 or 8) and at most GVF_CHUNKS of them (each reads the weights: 8 launches of 8
   rows of wo_b take ~1/3 of the exact kernels' time at 48 rows); more rows: tc.cu / lt.cu */
#define GVF_CHUNKS 8

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
    int64_t tiles;  /* weight tiles (16 rows; MoE up: 8 columns) */
    int64_t gy;     /* grid.y: MoE tiles; dense: groups (rows row0 + g n_out, x + g gxs, ...) */
    int xrows;      /* activation rows staged per block (the shared memory's size) */
    int64_t gxs;    /* dense groups: x + g gxs */
    int64_t gys;    /* dense groups: y + g gys */
    bool ilv;       /* the ks warps of a tile interleave their groups (c->gvf_ilv) */
    bool nbar;      /* the ks warps of a tile meet on barrier 1 + tile slot (c->gvf_nbar) */
    int pre;        /* dense: tile iterations whose weight rows go to L2 before cu_pdl_enter
                       (c->gvf_pre); MoE (not bal): after it, once the block's expert is known
                       (c->gvf_mpre, DSI_CUDA_GVF_MPRE; step 42) */
    bool ef;        /* the weight loads evict-first in L2 (c->gvf_ef) */
    /* MoE (c->gvf_bal, DSI_CUDA_GVF_BAL; off: step 39 measured batch 256 +3.7%): one row of
       blocks that split the routed tile table's items (tile, group of tpb weight tiles),
       *n_tiles x ceil(tiles / tpb) of them, evenly: each group of bal_g blocks a consecutive
       range (gvf_item's order), each block every bal_g-th item of it, restaging the rows where
       its next item is another tile's; instead of gx blocks a tile (grid.y = the table's size),
       whose waves end unevenly */
    bool bal;
    int bal_g; /* bal: blocks a group (c->gvf_bal_g, DSI_CUDA_GVF_BALG); the grid a multiple */
    /* dense pairs (pair, gy 2; launch_gvf_pair): the blocks of blockIdx.y 1 multiply the same x
       by a second weight of w's type, K and scale layout at data2 / scale2 (rows 0 .. n_out2,
       tiles2 tiles) into y2 (ldy2); row0, gxs, gys 0 */
    bool pair;
    const uint8_t *data2, *scale2;
    int64_t n_out2, tiles2, ldy2;
    float *y2;
};

/* The dense call of this block's blockIdx.y: its weight rows from grow0 (the weight's data and
 * scale from w, or a pair's second), n_out of them in tiles tiles, into y (ldy). */
struct gvf_dense {
    const uint8_t *data, *scale;
    int64_t grow0, n_out, tiles, ldy;
    float *y;
};

__device__ __forceinline__ gvf_dense gvf_dense_of(const struct gvf_p &p) {
    gvf_dense d;
    if (p.pair && blockIdx.y == 1) {
        d.data = p.data2;
        d.scale = p.scale2;
        d.grow0 = 0;
        d.n_out = p.n_out2;
        d.tiles = p.tiles2;
        d.ldy = p.ldy2;
        d.y = p.y2;
    } else {
        d.data = p.w.data;
        d.scale = p.w.scale;
        d.grow0 = p.row0 + (int64_t)blockIdx.y * p.n_out;
        d.n_out = p.n_out;
        d.tiles = p.tiles;
        d.ldy = p.ldy;
        d.y = p.y + (int64_t)blockIdx.y * p.gys;
    }
    return d;
}

/* Dense: the weight rows of this block's first p.pre tile iterations into L2 (bulk prefetch, one
 * instruction per tile iteration: its tpb tiles are consecutive rows), issued before
 * cu_pdl_enter, so that they stream in while the previous kernel (the norm or quantisation that
 * makes this GEMM's input, a few microseconds of little DRAM traffic) finishes. */
__device__ __forceinline__ void gvf_prefetch(const struct gvf_p &p, int64_t tpb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x >= (unsigned)p.pre) return;
    gvf_dense d = gvf_dense_of(p);
    int64_t o0 = ((int64_t)blockIdx.x + (int64_t)threadIdx.x * gridDim.x) * tpb * 16;
    int64_t o1 = o0 + tpb * 16 < d.n_out ? o0 + tpb * 16 : d.n_out;
    if (o0 >= o1) return;
    const uint8_t *a = d.data + (d.grow0 + o0) * p.w.row_bytes;
    cu_prefetch_l2(a, (size_t)((o1 - o0) * p.w.row_bytes));
#endif
}

/* w_scale_row without its division (gvf_w_ok: FP8's scale blocks along the rows are a power of
 * two; no 64-bit division code in the kernel, which keeps its hot loop short). */
template <int WT>
__device__ __forceinline__ const uint8_t *gvf_scale_row(const struct cu_w &w, int64_t row) {
    if (WT == DSI_TYPE_F8_E4M3) return w.scale + (row >> w.sh0) * w.srs;
    if (WT == DSI_TYPE_FP4_E2M1) return w.scale + row * w.srs;
    return nullptr;
}

/* DSI_CUDA_GVF_BAL's item it (of citems weight tile groups a table tile): its table tile tt and
 * group cg. An expert's T tiles hold the items of their span in the order (group, tile), so that
 * the blocks of a group (every bal_g-th item; bal_g even) read the same weights at the same time
 * (from L2 for all but one), each block staying on one tile (k_moe_group: a tile's w = its index
 * in its expert | T << 16). */
__device__ __forceinline__ void
gvf_item(const struct moe_p &m, int it, int citems, int *tt, int *cg) {
    unsigned t0 = (unsigned)it / (unsigned)citems; /* a tile of the item's expert */
    int w = m.tiles[t0].w, first = (int)t0 - (w & 0xffff), T = w >> 16;
    unsigned k = (unsigned)(it - first * citems);
    *cg = (int)(k / (unsigned)T);
    *tt = first + (int)k - *cg * T;
}

template <int MODE, int WT, int NT, bool BAL = false>
__global__ void __launch_bounds__(GVF_T, GVF_MINB) k_gvf(struct gvf_p p) {
    if (MODE == GVF_DENSE && p.pre > 0) gvf_prefetch(p, GVF_W / p.ks);
    /* MoE: the tile table is the previous kernel's. Dense: the first weight loads come first
       (below), then the wait, then the activations */
    if (MODE != GVF_DENSE) cu_pdl_enter();
    constexpr int E = gvf_e<WT>(), G = 4 * E;
    extern __shared__ uint4 gvf_smem[];
    uint32_t *xs = (uint32_t *)gvf_smem; /* [p.xrows][gvf_row_words(K)] */
    __shared__ float part[2][GVF_W][32][NT * 4];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int ks = p.ks, tpb = GVF_W / ks, kw = warp % ks;
    const uint64_t pol = cu_l2_policy(p.ef); /* the weight loads' L2 policy */

    /* ---- the block's activation rows (MoE: the tile of blockIdx.y), staged as bf16 */
    int e = -1, rows;
    int64_t pos0 = 0, nk = p.m.n * p.m.topk, K;
    /* p.bal: this block's items it0, it0 + bal_g, ... (n_bal of them; item it: tile it / citems
       of the table, weight tiles (it % citems) tpb + ...): its group of bal_g blocks takes a
       range of the items, each block every bal_g-th; stt: the staged tile */
    constexpr bool bal = MODE != GVF_DENSE && BAL; /* (an instance of its own: registers) */
    int it0 = 0, n_bal = 0, citems = 1, stt = 0;
    if (MODE == GVF_DENSE) {
        K = p.w.K;
        rows = (int)(p.n < p.xrows ? p.n : p.xrows);
    } else {
        if (bal) {
            citems = (int)((p.tiles + tpb - 1) / tpb);
            int tot = *p.m.n_tiles * citems;
            int nq = (int)gridDim.x / p.bal_g, q = (int)blockIdx.x / p.bal_g;
            int g1 = (int)((int64_t)(q + 1) * tot / nq);
            it0 = (int)((int64_t)q * tot / nq) + (int)blockIdx.x % p.bal_g;
            n_bal = g1 > it0 ? (g1 - it0 + p.bal_g - 1) / p.bal_g : 0;
            if (n_bal <= 0) return; /* the whole block */
            int cg0;
            gvf_item(p.m, it0, citems, &stt, &cg0);
            moe_tile_at(p.m, stt, &e, &pos0, &rows);
        } else if (!moe_tile(p.m, 8 * NT, &e, &pos0, &rows)) {
            return; /* the whole block */
        }
        K = MODE == GVF_UP ? p.m.D : p.m.I;
        if (rows > p.xrows) rows = p.xrows; /* not reached: the launcher sizes xrows */
    }
    /* whole groups: zeros past K (their weights are zeros too, and 0 * garbage may be NaN);
     * units of 4 elements (FP4: 8, the two mmas of a word) */
    constexpr int U = WT == DSI_TYPE_FP4_E2M1 ? 8 : 4;
    int64_t rw = gvf_row_words<WT>(K), ku = (K + G - 1) / G * G / U;
    auto src_row = [&](int r) -> const float * {
        if (MODE == GVF_DENSE) return p.x + (int64_t)blockIdx.y * p.gxs + r * p.ldx;
        int64_t pos = pos0 + r;
        return MODE == GVF_UP
                   ? p.m.x + (pos < nk ? (int64_t)(p.m.perm[pos] / p.m.topk) : pos - nk) * p.m.D
                   : p.m.h + pos * p.m.I;
    };
    /* (staged after the first weight loads are issued: their latency overlaps it; the compiler
       predicates the unrolled iterations' loads, 4 in flight per thread: step 24's rewrite with
       the loads written first had them sunk to their uses, one round trip per item, and cost
       batch 48 +21%, batch 8 +8%; reverted in step 26 after reading the SASS) */
    auto stage_x = [&]() {
        int kun = (int)ku; /* 32-bit: rows * ku < 2^31 (the staged rows fit in GVF_SMEM_MAX) */
#pragma unroll 4
        for (int i = threadIdx.x; i < rows * kun; i += GVF_T) {
            int r = i / kun;
            int64_t k = (int64_t)(i - r * kun) * U;
            gvf_stage_unit<WT>(xs, rw, r, k, src_row(r), K);
        }
    };
    int xo[NT]; /* gvf_mma: column tile j's staged row (rows >= 1 here) */
    auto set_xo = [&]() {
#pragma unroll
        for (int j = 0; j < NT; j++)
            xo[j] = (j * 8 + g < rows ? j * 8 + g : rows - 1) * (int)rw;
    };
    set_xo();

    /* ---- the weights: per tile, this lane's rows g (h = 0) and g + 8 (h = 1) */
    struct cu_w W[2];
    gvf_dense dn = {};
    if (MODE == GVF_DENSE) {
        dn = gvf_dense_of(p);
        W[0] = W[1] = p.w;
        W[0].data = W[1].data = dn.data;
        W[0].scale = W[1].scale = dn.scale;
    } else if (MODE == GVF_UP) {
        W[0] = p.m.w1;
        W[1] = p.m.w3;
        if (e >= 0) {
            W[0].data = p.m.tab[e].p[0];
            W[0].scale = p.m.tab[e].p[1];
            W[1].data = p.m.tab[e].p[2];
            W[1].scale = p.m.tab[e].p[3];
        }
    } else {
        W[0] = W[1] = p.m.w2;
        if (e >= 0) {
            W[0].data = W[1].data = p.m.tab[e].p[4];
            W[0].scale = W[1].scale = p.m.tab[e].p[5];
        }
    }
    int64_t n_rows = MODE == GVF_DENSE ? dn.n_out : MODE == GVF_UP ? p.m.I : p.m.D;
    /* weight row gg of half h of tile `tile` (wrow: this lane's, gg = g), or -1 */
    auto hrow = [&](int64_t tile, int h, int gg) -> int64_t {
        int64_t o = MODE == GVF_UP ? tile * 8 + gg : tile * 16 + gg + 8 * h;
        if (o >= n_rows) return -1;
        return MODE == GVF_DENSE ? dn.grow0 + o : o;
    };
    auto wrow = [&](int64_t tile, int h) { return hrow(tile, h, g); };

    /* ---- the walk: tile iterations i (this block's tiles blockIdx.x + i gridDim.x, tpb at a
     * time), each nb steps of GVF_U groups; step s + 1's bytes load while step s computes */
    /* The ks warps of a tile take its groups interleaved (p.ilv: at step b warp kw has groups
     * (b ks + kw) GVF_U ..., so a step of the tile's warps reads ks GVF_U consecutive groups of
     * each row: long runs for the DRAM pages), or as ks consecutive ranges. Step b, slot u of
     * this warp: group qa + b qs + u, below qe. */
    /* 32-bit: K < 2^31 (the staged rows of K fit in GVF_SMEM_MAX bytes) */
    int ng = (int)((K + G - 1) / G), gpw = (ng + ks - 1) / ks, Ki = (int)K;
    int qa = p.ilv ? kw * GVF_U : kw * gpw, qs = p.ilv ? ks * GVF_U : GVF_U;
    int qe = p.ilv ? ng : qa + gpw < ng ? qa + gpw : ng;
    int nb = p.ilv ? (ng + qs - 1) / qs : (gpw + GVF_U - 1) / GVF_U;
    int64_t tiles = MODE == GVF_DENSE ? dn.tiles : p.tiles;
    int n_iter =
        bal ? n_bal : (int)((tiles + (int64_t)gridDim.x * tpb - 1) / ((int64_t)gridDim.x * tpb));
    int steps = n_iter * nb;
    auto tile_of = [&](int64_t i) {
        if (bal) {
            int tt, cg;
            gvf_item(p.m, it0 + (int)i * p.bal_g, citems, &tt, &cg);
            return (int64_t)cg * tpb + warp / ks;
        }
        return ((int64_t)blockIdx.x + i * gridDim.x) * tpb + warp / ks;
    };
    /* No divisions per step: the load position (li, lb) holds its tile's row and scale
     * pointers, set when it enters a tile; scale indices are shifts (gvf_w_ok: the scale blocks
     * along K are powers of two). */
    const uint8_t *lp0 = nullptr, *lp1 = nullptr, *ls0 = nullptr, *ls1 = nullptr;
    int sh0 = W[0].sh1, sh1 = W[1].sh1;
    auto enter_tile = [&](int64_t i) {
        if (bal) { /* the item's expert (none past the block's last item) */
            if (i >= n_iter) return;
            int ex = p.m.tiles[(unsigned)(it0 + (int)i * p.bal_g) / (unsigned)citems].x;
            /* (any tile of the item's span: the same expert) */
            const struct cu_moe_ent &te = p.m.tab[ex];
            W[0].data = te.p[MODE == GVF_UP ? 0 : 4];
            W[0].scale = te.p[MODE == GVF_UP ? 1 : 5];
            W[1].data = te.p[MODE == GVF_UP ? 2 : 4];
            W[1].scale = te.p[MODE == GVF_UP ? 3 : 5];
        }
        int64_t tile = tile_of(i), r0 = wrow(tile, 0), r1 = wrow(tile, 1);
        lp0 = r0 >= 0 ? W[0].data + r0 * W[0].row_bytes : nullptr;
        lp1 = r1 >= 0 ? W[1].data + r1 * W[1].row_bytes : nullptr;
        ls0 = r0 >= 0 ? gvf_scale_row<WT>(W[0], r0) : nullptr;
        ls1 = r1 >= 0 ? gvf_scale_row<WT>(W[1], r1) : nullptr;
    };
    /* A step's loads, all in 32-bit offsets from the tile's row and scale pointers: slot u's
     * slice is u 128 bytes after slot 0's (a group row is 128 bytes in every type), its scale
     * index u G >> sh after (FP4: 8 u, its second half's one more; gvf_w_ok: FP4 scale blocks
     * of 32 along K, FP8 of 32-128, so the shifted sums are exact). */
    auto load_step = [&](int b, gvf_raw(&ra)[GVF_U], gvf_raw(&rb)[GVF_U]) {
        int q0 = qa + b * qs, k00 = q0 * G + t * E;
        uint32_t off = WT == DSI_TYPE_FP4_E2M1  ? (uint32_t)k00 >> 1
                       : WT == DSI_TYPE_F8_E4M3 ? (uint32_t)k00
                                                : (uint32_t)k00 << 1;
        const uint8_t *d0 = lp0 + off, *d1 = lp1 + off, *s0 = ls0, *s1 = ls1;
        if (WT != DSI_TYPE_BF16) {
            s0 += (uint32_t)k00 >> sh0;
            s1 += (uint32_t)k00 >> sh1;
        }
#pragma unroll
        for (int u = 0; u < GVF_U; u++) {
            bool in = q0 + u < qe && k00 + u * G < Ki;
            int o0 = WT == DSI_TYPE_FP4_E2M1 ? 8 * u : WT == DSI_TYPE_F8_E4M3 ? (u * G) >> sh0 : 0;
            int o1 = WT == DSI_TYPE_FP4_E2M1 ? 8 * u : WT == DSI_TYPE_F8_E4M3 ? (u * G) >> sh1 : 0;
            gvf_load<WT>(d0 + 128 * u, s0 + o0, in && lp0, pol, ra[u]);
            gvf_load<WT>(d1 + 128 * u, s1 + o1, in && lp1, pol, rb[u]);
        }
    };
    /* the next step of a position; true: it entered the next tile iteration */
    auto next = [&](int &i, int &b) -> bool {
        if (++b < nb) return false;
        b = 0;
        ++i;
        return true;
    };
    float acc[NT][4];
    acc_zero(acc);
    auto finish =
        [&](int64_t i) { /* the tile's ks partial sums in warp order, then out */
                         int64_t tile = tile_of(i);
                         if (ks > 1) {
                             int pb = (int)(i & 1); /* a buffer is rewritten two tiles later: after
                                                       a barrier */
                             /* only the tile's ks warps meet (p.nbar: named barrier 1 + tile
                                slot; 0, all the block's threads, is __syncthreads): the block's
                                other tiles walk on (step 33) */
                             int bid = p.nbar ? 1 + warp / ks : 0, bn = p.nbar ? 32 * ks : GVF_T;
#pragma unroll
                             for (int j = 0; j < NT; j++)
#pragma unroll
                                 for (int c = 0; c < 4; c++)
                                     part[pb][warp][lane][j * 4 + c] = acc[j][c];
                             asm volatile("bar.sync %0, %1;" ::"r"(bid), "r"(bn) : "memory");
                             if (kw == 0)
#pragma unroll 1
                                 for (int w = 1; w < ks; w++)
#pragma unroll
                                     for (int j = 0; j < NT; j++)
#pragma unroll
                                         for (int c = 0; c < 4; c++)
                                             acc[j][c] += part[pb][warp + w][lane][j * 4 + c];
                         }
                         if (kw == 0) {
            /* acc[j][c] is (row g + 8 (c / 2), column j * 8 + 2 t + c % 2) */
#pragma unroll
                             for (int j = 0; j < NT; j++)
#pragma unroll
                                 for (int c = 0; c < 4; c++) {
                                     int m = g + (c >> 1) * 8, col = j * 8 + 2 * t + (c & 1);
                                     if (MODE == GVF_DENSE) {
                                         int64_t o = tile * 16 + m;
                                         if (col < p.n && o < dn.n_out)
                                             dn.y[col * dn.ldy + o] =
                                                 rbf(acc[j][c] + 0.0f, p.round);
                                     } else if (MODE == GVF_UP) {
                                         int64_t cc = tile * 8 + g;
                                         if (c >= 2 || col >= rows || cc >= p.m.I) continue;
                                         int64_t pos = pos0 + col;
                                         float gt = rbf(acc[j][c] + 0.0f, p.m.round),
                                               u = rbf(acc[j][c + 2] + 0.0f, p.m.round);
                                         float wi = pos < nk ? p.m.weight[p.m.perm[pos]] : 1.0f;
                                         float gv = fminf(gt, p.m.limit),
                                               uv = fminf(fmaxf(u, -p.m.limit), p.m.limit);
                                         float silu = gv / (1.0f + exp_ref(-gv));
                                         p.m.h[pos * p.m.I + cc] = rbf(silu * uv * wi, p.m.round);
                                     } else {
                                         int64_t o = tile * 16 + m;
                                         if (col >= rows || o >= p.m.D) continue;
                                         int64_t pos = pos0 + col,
                                                 orow = pos < nk ? p.m.perm[pos] : pos;
                                         p.m.out[orow * p.m.D + o] =
                                             rbf(acc[j][c] + 0.0f, p.m.round);
                                     }
                                 }
                         }
                         acc_zero(acc);
        };
    auto compute_step = [&](int64_t i, int b, const gvf_raw(&ra)[GVF_U],
                            const gvf_raw(&rb)[GVF_U]) {
        if (bal && b == 0) { /* an item of the next tile: its rows (the same for the block) */
            int tt, cg;
            gvf_item(p.m, it0 + (int)i * p.bal_g, citems, &tt, &cg);
            if (tt != stt) {
                __syncthreads(); /* every warp is done with the staged rows */
                stt = tt;
                moe_tile_at(p.m, stt, &e, &pos0, &rows);
                if (rows > p.xrows) rows = p.xrows;
                set_xo();
                stage_x();
                __syncthreads();
            }
        }
#pragma unroll
        for (int u = 0; u < GVF_U; u++) {
            int q = qa + b * qs + u;
            if (q >= qe) break; /* the same for the whole warp */
            const uint32_t *xb = xs + (q * (E / 4) * 8 + 2 * t);
            gvf_group<WT, NT>(ra[u], rb[u], xb, xo, acc);
        }
        if (b == nb - 1) finish(i);
    };
    gvf_raw ra0[GVF_U], rb0[GVF_U], ra1[GVF_U], rb1[GVF_U];
    int li = 0, ci = 0; /* the next step to load and to compute: (tile iteration, step) */
    int lb = 0, cb = 0;
    auto load_next = [&](gvf_raw(&ra)[GVF_U], gvf_raw(&rb)[GVF_U]) {
        load_step(lb, ra, rb);
        if (next(li, lb)) enter_tile(li);
    };
    if (steps > 0) {
        enter_tile(0);
        load_next(ra0, rb0);
        if (MODE != GVF_DENSE && !bal && p.pre > 0 && kw == 0 && lane == 0) {
            /* (p.pre, DSI_CUDA_GVF_MPRE: the warp's first tile iterations' rows into L2 behind
               its first loads, one bulk prefetch a row range: at few rows a warp walks about one
               tile, so its later steps' loads wait on DRAM one step at a time otherwise) */
            for (int i = 0; i < p.pre && i < n_iter; i++) {
                int64_t tile = tile_of(i), r0 = hrow(tile, 0, 0);
                if (r0 < 0) break;
                int64_t nr = MODE == GVF_UP ? 8 : 16;
                nr = r0 + nr <= n_rows ? nr : n_rows - r0;
                cu_prefetch_l2(W[0].data + r0 * W[0].row_bytes, (size_t)(nr * W[0].row_bytes));
                if (MODE == GVF_UP)
                    cu_prefetch_l2(W[1].data + r0 * W[1].row_bytes, (size_t)(nr * W[1].row_bytes));
            }
        }
    }
    if (MODE == GVF_DENSE) cu_pdl_enter();
    stage_x();
    __syncthreads(); /* the staged rows */
    for (int s = 0; s < steps; s += 2) {
        if (s + 1 < steps) load_next(ra1, rb1);
        compute_step(ci, cb, ra0, rb0);
        next(ci, cb);
        if (s + 1 < steps) {
            if (s + 2 < steps) load_next(ra0, rb0);
            compute_step(ci, cb, ra1, rb1);
            next(ci, cb);
        }
    }
}

/* ---- launchers --------------------------------------------------------------------------- */

/* Warps along K per tile: enough (tiles x ks) units for ~2 blocks of 8 warps per SM and at
 * least ks_min, at most 8 and at most the groups of K. */
static int gvf_ks(const struct cu_ctx *c, int64_t units, int64_t ng, int ks_min) {
    int ks = 1;
    while (ks < GVF_W && ks < ng && (units * ks < 2 * (int64_t)c->n_sms * GVF_W || ks < ks_min))
        ks *= 2;
    return ks;
}

/* The least warps along K: c->gvf_ks_min where set (DSI_CUDA_GVF_KS), else 2, and 1 for the
   routed experts of a step of c->gvf_ks1_min tokens or more (DSI_CUDA_GVF_KS1_MIN, default 192:
   no partial sums through shared memory, no tile-end barrier; measured -2.5% at batch 256,
   +0.5% at 128, level at 1 on the H100, docs/cuda.md step 35) */
static int gvf_ks_min(const struct cu_ctx *c, int mode, const struct gvf_p *p) {
    if (c->gvf_ks_min > 0) return c->gvf_ks_min;
    return mode != GVF_DENSE && c->gvf_ks1_min > 0 && p->m.n >= c->gvf_ks1_min ? 1 : 2;
}

/* Blocks along the weight tiles (tpb tiles per block): about 2 blocks per SM over the grid's
   rows (gy); a MoE grid of at least one expert tile per SM: c->gvf_blocks (8: an expert's tiles
   over several blocks, fewer idle SMs in the last wave; measured at batch 32 and 256 -15%, at
   batch 8 +3%) */
/* Tiles per blockIdx.y of a launch at most (a pair's larger weight) */
static int64_t gvf_tiles(const struct gvf_p *p) {
    return p->pair ? std::max(p->tiles, p->tiles2) : p->tiles;
}

static int64_t gvf_gx(const struct cu_ctx *c, int mode, int64_t tiles, int64_t gy, int64_t tpb) {
    int64_t bps = mode != GVF_DENSE && gy >= c->n_sms ? c->gvf_blocks : 2;
    return std::min(cu_div_up(tiles, tpb), std::max<int64_t>(1, bps * c->n_sms / gy));
}

/* The share of the last tile iteration's work that is done (1: every block's last iteration
   full): the blocks walk ceil(tiles / (gx tpb)) iterations, busy for tiles / (gx tpb). */
static double gvf_tail(const struct cu_ctx *c, int mode, int64_t tiles, int64_t gy, int ks) {
    int64_t tpb = GVF_W / ks, gx = gvf_gx(c, mode, tiles, gy, tpb);
    double it = (double)tiles / (double)(gx * tpb);
    return it / std::ceil(it);
}

/* gvf_ks, then (c->gvf_tail, DSI_CUDA_GVF_TAIL) twice or four times that where the blocks'
   last tile iteration is then much fuller: the routed experts at batch 1 (6 experts x 256 tiles:
   1.45 iterations of 4 tiles at ks 2, the kernel as long as 2; at ks 4, 2.9 of 3; step 18). */
static int
gvf_ks_tail(const struct cu_ctx *c, int mode, int64_t tiles, int64_t gy, int64_t ng, int ks_min) {
    int ks = gvf_ks(c, tiles * gy, ng, ks_min), best = ks;
    if (!c->gvf_tail) return ks;
    double bt = gvf_tail(c, mode, tiles, gy, ks);
    for (int k = ks * 2; k <= GVF_W && k <= 4 * ks && k < ng; k *= 2) {
        double t = gvf_tail(c, mode, tiles, gy, k);
        if (t > bt + 0.1) {
            bt = t;
            best = k;
        }
    }
    return best;
}

/* Shared memory for xrows staged rows of K on weights of `type`. */
static int64_t gvf_stage_bytes(int type, int64_t xrows, int64_t K) {
    int64_t w = type == DSI_TYPE_FP4_E2M1  ? gvf_row_words<DSI_TYPE_FP4_E2M1>(K)
                : type == DSI_TYPE_F8_E4M3 ? gvf_row_words<DSI_TYPE_F8_E4M3>(K)
                                           : gvf_row_words<DSI_TYPE_BF16>(K);
    return xrows * w * 4;
}

static int gvf_nt(int64_t n) { return n <= 8 ? 1 : n <= 16 ? 2 : 4; }

template <int MODE, int WT, int NT, bool BAL = false>
static bool gvf_go(struct cu_ctx *c, const struct gvf_p *p) {
    int64_t K = MODE == GVF_DENSE ? p->w.K : MODE == GVF_UP ? p->m.D : p->m.I;
    size_t sm = (size_t)gvf_stage_bytes(WT, p->xrows, K);
    static bool smem_done = false;
    if (!smem_limit(c, k_gvf<MODE, WT, NT, BAL>, GVF_SMEM_MAX, &smem_done, "decode gemm"))
        return false;
    unsigned gy = (unsigned)(p->gy > 0 ? p->gy : 1);
    int64_t tpb = GVF_W / p->ks;
    int64_t gx = gvf_gx(c, MODE, gvf_tiles(p), gy, tpb);
    struct gvf_p q = *p;
    if (BAL) { /* one row of c->gvf_bal blocks an SM, whole groups of bal_g */
        gx = (int64_t)c->gvf_bal * c->n_sms / q.bal_g * q.bal_g;
        gy = 1;
    }
    if (MODE == GVF_DENSE && q.pre > 0) { /* at most GVF_PRE_MAX bytes prefetched by the grid */
        int64_t it = gx * gy * tpb * 16 * q.w.row_bytes;
        q.pre = (int)std::min<int64_t>(q.pre, GVF_PRE_MAX / std::max<int64_t>(it, 1));
    }
    cu_launch(c, k_gvf<MODE, WT, NT, BAL>, dim3((unsigned)gx, gy), GVF_T, sm, q);
    return cu_check(c, MODE == GVF_DENSE ? "gemm (decode, tensor cores)"
                                         : "moe (decode, tensor cores)");
}

/* false: not taken (the staged rows do not fit in shared memory) */
template <int MODE, int WT> static bool gvf_launch(struct cu_ctx *c, struct gvf_p *p, int nt) {
    int64_t K = MODE == GVF_DENSE ? p->w.K : MODE == GVF_UP ? p->m.D : p->m.I;
    if (gvf_stage_bytes(WT, p->xrows, K) > GVF_SMEM_MAX) return false;
    p->ks = gvf_ks_tail(c, MODE, gvf_tiles(p), p->gy > 0 ? p->gy : 1, cu_div_up(K, 4 * gvf_e<WT>()),
                        gvf_ks_min(c, MODE, p));
    p->ilv = c->gvf_ilv;
    p->nbar = c->gvf_nbar;
    p->pre = MODE == GVF_DENSE ? c->gvf_pre : c->gvf_mpre;
    p->ef = c->gvf_ef;
    if (MODE != GVF_DENSE && nt == 1 && p->bal) return gvf_go<MODE, WT, 1, true>(c, p) || c->sticky;
    if (nt == 1) return gvf_go<MODE, WT, 1>(c, p) || c->sticky;
    if (nt == 2) return gvf_go<MODE, WT, 2>(c, p) || c->sticky;
    return gvf_go<MODE, WT, 4>(c, p) || c->sticky;
}

static bool gvf_w_ok(const struct cu_w *w, int64_t K) {
    if (!gemm_w_ok(w) || w->K != K) return false;
    bool pow2 = w->sh1 >= 0; /* scale indices by shifts */
    switch (w->type) {
    case DSI_TYPE_F8_E4M3: /* scale blocks of 32-128 along K (load_step's scale offsets) */
        return K % 32 == 0 && w->sb1 % 32 == 0 && w->sb1 <= 128 && pow2 && w->sh0 >= 0;
    case DSI_TYPE_FP4_E2M1: /* scale blocks of 32 along K, the format's (load_step) */
        return K % 64 == 0 && w->sb1 == 32;
    case DSI_TYPE_BF16:
        return K % 16 == 0;
    default:
        return false;
    }
}

static bool gvf_call_ok(const struct cu_ctx *c, const struct cu_gemm_call *g) {
    const struct cu_w *w = g->w;
    int64_t n = g->n;
    return n >= c->gvf_min && n <= c->gvf_max && n <= GVF_ROWS_MAX && gvf_w_ok(w, w->K) &&
           gemm_fast_ok(w, g->x, g->ldx) && g->groups >= 1 && g->groups <= 65535;
}

/* the same scaled weight layout (a pair's second weight is addressed with the first's) */
static bool gvf_same_layout(const struct cu_w *a, const struct cu_w *b) {
    return a->type == b->type && a->K == b->K && a->row_bytes == b->row_bytes && a->srs == b->srs &&
           a->sb0 == b->sb0 && a->sb1 == b->sb1 && a->sh0 == b->sh0 && a->sh1 == b->sh1;
}

bool launch_gvf_pair(struct cu_ctx *c,
                     const struct cu_gemm_call *g,
                     const struct cu_gemm_call *g2) {
    if (!c->gvf_pair || g->groups != 1 || g2->groups != 1 || g->x != g2->x || g->n != g2->n ||
        g->ldx != g2->ldx || g->round != g2->round || !gvf_call_ok(c, g) || !gvf_call_ok(c, g2) ||
        !gvf_same_layout(g->w, g2->w) || g2->row0 != 0)
        return false;
    return launch_gvf_gemm(c, g, g2);
}

/* One launch for the n <= 32 rows of g (and g2); false: not taken. */
static bool
gvf_dense_call(struct cu_ctx *c, const struct cu_gemm_call *g, const struct cu_gemm_call *g2) {
    const struct cu_w *w = g->w;
    int64_t n = g->n;
    struct gvf_p p;
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
    p.tiles = cu_div_up(g->n_out, 16);
    p.gy = g->groups;
    p.gxs = g->gxs;
    p.gys = g->gys;
    if (g2) { /* launch_gvf_pair checked it */
        p.pair = true;
        p.gy = 2;
        p.gxs = p.gys = 0;
        p.data2 = g2->w->data;
        p.scale2 = g2->w->scale;
        p.n_out2 = g2->n_out;
        p.tiles2 = cu_div_up(g2->n_out, 16);
        p.ldy2 = g2->ldy;
        p.y2 = g2->y;
    }
    int nt = gvf_nt(n);
    p.xrows = (int)std::min<int64_t>(n, 8 * nt);
    int pp = cu_prof_begin(c, "gemm.gvf");
    bool ok;
    switch (w->type) {
    case DSI_TYPE_F8_E4M3:
        ok = gvf_launch<GVF_DENSE, DSI_TYPE_F8_E4M3>(c, &p, nt);
        break;
    case DSI_TYPE_FP4_E2M1:
        ok = gvf_launch<GVF_DENSE, DSI_TYPE_FP4_E2M1>(c, &p, nt);
        break;
    default:
        ok = gvf_launch<GVF_DENSE, DSI_TYPE_BF16>(c, &p, nt);
        break;
    }
    cu_prof_end(c, pp);
    return ok;
}

bool launch_gvf_gemm(struct cu_ctx *c,
                     const struct cu_gemm_call *g,
                     const struct cu_gemm_call *g2) {
    if (!gvf_call_ok(c, g)) return false;
    /* rows per launch: 32, 16 or 8, as many as fit in shared memory (a launch reads the
       weights once: chunks of fewer rows read them more often) */
    const struct cu_w *w = g->w;
    auto fits = [&](int64_t rows) { return gvf_stage_bytes(w->type, rows, w->K) <= GVF_SMEM_MAX; };
    int64_t per = 32;
    while (per > 8 && !fits(per))
        per /= 2;
    if (g->n <= per) return gvf_dense_call(c, g, g2);
    if (cu_div_up(g->n, per) > GVF_CHUNKS || !fits(per)) return false;
    for (int64_t r0 = 0; r0 < g->n; r0 += per) {
        struct cu_gemm_call a = *g, b = g2 ? *g2 : *g;
        a.n = b.n = std::min(per, g->n - r0);
        a.x += r0 * g->ldx;
        a.y += r0 * g->ldy;
        if (g2) {
            b.x = a.x;
            b.y += r0 * g2->ldy;
        }
        /* (a later chunk has the first one's shapes; false: the caller redoes the whole call) */
        if (!gvf_dense_call(c, &a, g2 ? &b : nullptr)) return c->sticky != 0;
    }
    return true;
}

bool gvf_moe_ok(const struct cu_ctx *c,
                const struct cu_w *w1,
                const struct cu_w *w3,
                const struct cu_w *w2,
                int64_t D,
                int64_t I,
                const float *x,
                int64_t n,
                int nt) {
    int64_t xr = std::min<int64_t>(n, 8 * nt);
    return n >= c->gvf_min && n <= c->gvf_max && gvf_w_ok(w1, D) && gvf_w_ok(w3, D) &&
           gvf_w_ok(w2, I) && w1->type == w3->type && w1->type != DSI_TYPE_BF16 &&
           w2->type != DSI_TYPE_BF16 && (uintptr_t)x % 16 == 0 && D % 4 == 0 && I % 4 == 0 &&
           gvf_stage_bytes(w1->type, xr, D) <= GVF_SMEM_MAX &&
           gvf_stage_bytes(w2->type, xr, I) <= GVF_SMEM_MAX;
}

int gvf_moe_nt(int64_t rows) { return gvf_nt(rows); }

bool launch_gvf_moe(struct cu_ctx *c, const struct moe_p *mp, bool up, int nt, unsigned tiles) {
    struct gvf_p p;
    memset(&p, 0, sizeof(p));
    p.m = *mp;
    p.gy = tiles;
    p.xrows = (int)std::min<int64_t>(mp->n, 8 * nt); /* an expert has at most one row per token */
    p.bal = c->gvf_bal > 0 && mp->tiles && nt == 1;
    p.bal_g = std::max(1, std::min(c->gvf_bal_g, c->gvf_bal * c->n_sms));
    int type = up ? mp->w1.type : mp->w2.type;
    bool fp4 = type == DSI_TYPE_FP4_E2M1, ok;
    if (up) {
        p.tiles = cu_div_up(mp->I, 8);
        ok = fp4 ? gvf_launch<GVF_UP, DSI_TYPE_FP4_E2M1>(c, &p, nt)
                 : gvf_launch<GVF_UP, DSI_TYPE_F8_E4M3>(c, &p, nt);
    } else {
        p.tiles = cu_div_up(mp->D, 16);
        ok = fp4 ? gvf_launch<GVF_DOWN, DSI_TYPE_FP4_E2M1>(c, &p, nt)
                 : gvf_launch<GVF_DOWN, DSI_TYPE_F8_E4M3>(c, &p, nt);
    }
    if (!ok) /* gvf_moe_ok said it fits */
        cu_fail(c, DSI_ERR_UNSUPPORTED, "moe: decode kernel refused %lld rows", (long long)p.xrows);
    return ok;
}
