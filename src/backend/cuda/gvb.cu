/* gvb.cu - dense decode GEMMs of `fast` numerics at 1-8 activation rows (FP8 and BF16 weights,
 * the groups of a grouped call as grid rows) with the weight bytes streamed into shared memory
 * by bulk copies, ahead of the arithmetic (up to c->gvb_max rows, DSI_CUDA_GVB=8; 0, the
 * default: gvf.cu). Written in step 44, measured in step 45 (docs/cuda.md): batch 1 +6%, each
 * call as slow as or slower than gvf.cu's (an SM pulls ~11.5 GB/s either way, and the chunk
 * barriers add to it), so it is off; its op tests (test_cuda_gemm_fast / _grouped / _pair with
 * DSI_CUDA_GVB=8) keep it correct.
 *
 * gvf.cu's walk loads each lane's weight bytes into registers one step ahead of their use: at
 * batch 1 a warp walks only a few steps, each waiting for its loads (docs/cuda.md step 42: the
 * dense walks move their bytes at ~1.8 TB/s). Here one block per SM (per group) takes a
 * contiguous range of 16-row weight tiles and a producer warp asks for the whole range's bytes at
 * once, as far as a ring of GVB_NS_MAX chunks of shared memory goes: a chunk is GVB_KC bytes of
 * each of a tile's 16 rows, one cp.async.bulk a row, completing on the chunk's `full` mbarrier.
 * The weights do not depend on the previous kernel, so the first chunks are asked for before
 * cu_pdl_enter. The 8 consumer warps take a chunk's 8 groups of 128 bytes a row, one each
 * (gvf.cu's gvf_group on the slices read from shared memory: the same decoding and mma), keep
 * their partial sums over the tile's chunks, arrive on the chunk's `empty` mbarrier (the
 * producer then reuses the slot), and at the tile's end add the 8 partial sums in warp order
 * through shared memory (warp 0 writes y). Deterministic; the sums in another order than gvf.cu's
 * (`fast` numerics: the op tests bound both).
 *
 * Ownership: nothing outside the launch; the ring, the barriers and the staged rows are the
 * block's dynamic shared memory. */
#include "gvf.cuh"
#include "wg.cuh"

#include <algorithm>

#define GVB_W      8                 /* consumer warps */
#define GVB_T      (GVB_W * 32 + 32) /* + the producer warp */
#define GVB_KC     1024              /* bytes of a row a chunk: 8 groups of 128 */
#define GVB_LD     (GVB_KC + 16)     /* a chunk row's stride in shared memory (banks apart) */
#define GVB_CHUNK  (16 * GVB_LD)     /* a ring slot */
#define GVB_NS_MAX 12                /* ring slots at most */
#define GVB_SMEM   (227 * 1024)      /* the block's shared memory at most */
#define GVB_SPINS  (1u << 22)        /* mbar_wait's guard (a hang would be a bug: see mbar_wait) */

struct gvb_p {
    struct cu_w w;
    int64_t row0, n_out; /* group g: weight rows row0 + g n_out .., n_out of them */
    const float *x;      /* group g: x + g gxs, rows of ldx */
    int64_t n, ldx;
    float *y; /* group g: y + g gys, rows of ldy */
    int64_t ldy, gxs, gys;
    bool round;
    int ns;        /* ring slots */
    bool spf;      /* FP8: the block's scale rows prefetched into L2 first (c->gvb_spf) */
    int64_t tiles; /* 16-row tiles of a group */
    /* a pair (launch_gvb_pair; groups 1): a second weight of w's type, K and scale layout at
       data2 / scale2, rows 0 .. n_out2 in tiles2 tiles after w's, on the same x, into y2 (ldy2) */
    const uint8_t *data2, *scale2;
    int64_t n_out2, tiles2, ldy2;
    float *y2;
};

/* Tile `tile` of the block's group (from p.tiles: the pair's second weight): its weight bytes and
 * scales, the weight row of its first row, its output rows [o0, o0 + 16) of n_out, into y. */
struct gvb_tile {
    const uint8_t *data, *scale;
    int64_t wrow0, o0, n_out, ldy;
    float *y;
};
__device__ __forceinline__ gvb_tile gvb_tile_of(const struct gvb_p &p, int64_t tile) {
    gvb_tile d;
    bool first = tile < p.tiles;
    d.o0 = (first ? tile : tile - p.tiles) * 16;
    d.data = first ? p.w.data : p.data2;
    d.scale = first ? p.w.scale : p.scale2;
    d.wrow0 = (first ? p.row0 + (int64_t)blockIdx.y * p.n_out : 0) + d.o0;
    d.n_out = first ? p.n_out : p.n_out2;
    d.y = first ? p.y + (int64_t)blockIdx.y * p.gys : p.y2;
    d.ldy = first ? p.ldy : p.ldy2;
    return d;
}

/* The block's shared memory: the ring [ns][16][GVB_LD], the partial sums [2][GVB_W][32][4], the
 * barriers full[ns], empty[ns], then the staged rows [n][rw] (words). */
struct gvb_layout {
    size_t red, bar, xs, total;
};
static __host__ __device__ inline gvb_layout gvb_layout_of(int ns, int64_t n, int64_t rw) {
    gvb_layout l;
    l.red = (size_t)ns * GVB_CHUNK;
    l.bar = l.red + (size_t)2 * GVB_W * 32 * 4 * 4;
    l.xs = l.bar + (size_t)2 * ns * 8;
    l.total = l.xs + (size_t)n * (size_t)rw * 4;
    return l;
}

#ifdef WG_HAVE
/* `bytes` from global src to shared dst, completing bar's transactions (16-byte aligned, a
 * multiple of 16 bytes) */
__device__ __forceinline__ void
bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif

template <int WT> __global__ void __launch_bounds__(GVB_T, 1) k_gvb(struct gvb_p p) {
#ifdef WG_HAVE
    extern __shared__ uint4 gvb_smem[];
    constexpr int E = gvf_e<WT>(), EB = WT == DSI_TYPE_BF16 ? 2 : 1; /* EB: bytes an element */
    char *base = (char *)gvb_smem;
    const int64_t K = p.w.K, rw = gvf_row_words<WT>(K);
    const gvb_layout L = gvb_layout_of(p.ns, p.n, rw);
    float(*red)[GVB_W][32][4] = (float(*)[GVB_W][32][4])(base + L.red);
    uint32_t bars = smem_u32(base + L.bar); /* full[s] at bars + 8 s, empty[s] at + 8 (ns + s) */
    uint32_t *xs = (uint32_t *)(base + L.xs);
    uint32_t ring = smem_u32(base);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int ns = p.ns;
    /* this block's tiles [t0, t1) of its group (and a pair's second weight), nkc chunks each */
    int64_t nt = p.tiles + p.tiles2;
    int64_t t0 = (int64_t)blockIdx.x * nt / gridDim.x,
            t1 = (int64_t)(blockIdx.x + 1) * nt / gridDim.x;
    int nkc = (int)((K * EB + GVB_KC - 1) / GVB_KC);
    int nch = (int)(t1 - t0) * nkc;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ns; s++) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (ns + s), GVB_W);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == GVB_W) { /* the producer: chunk c = (tile t0 + c / nkc, bytes of kc = c % nkc) */
        /* FP8 (p.spf, DSI_CUDA_GVB_SPF=0: off): the scale rows of the block's tiles into L2
           first (one bulk prefetch a weight), so that the consumers' loads of them, a chunk
           ahead, hit L2 instead of waiting on DRAM chunk after chunk */
        if (WT == DSI_TYPE_F8_E4M3 && p.spf && lane < 2) {
            int64_t a = lane == 0 || t0 > p.tiles ? t0 : p.tiles,
                    b = lane == 1 || t1 < p.tiles ? t1 : p.tiles;
            if (a < b) {
                gvb_tile da = gvb_tile_of(p, a), db = gvb_tile_of(p, b - 1);
                int64_t r1 = db.wrow0 + (db.n_out - db.o0 < 16 ? db.n_out - db.o0 : 16) - 1;
                int64_t s0 = da.wrow0 >> p.w.sh0, s1 = r1 >> p.w.sh0;
                cu_prefetch_l2(da.scale + s0 * p.w.srs, (size_t)((s1 - s0 + 1) * p.w.srs));
            }
        }
        for (int c = 0; c < nch; c++) {
            int slot = c % ns;
            if (c >= ns &&
                !mbar_wait(bars + 8 * (ns + slot), (uint32_t)((c / ns - 1) & 1), GVB_SPINS))
                return;
            gvb_tile d = gvb_tile_of(p, t0 + c / nkc);
            int nr = d.n_out - d.o0 < 16 ? (int)(d.n_out - d.o0) : 16;
            int64_t b0 = (int64_t)(c % nkc) * GVB_KC;
            uint32_t bytes = (uint32_t)(K * EB - b0 < GVB_KC ? K * EB - b0 : GVB_KC);
            if (lane == 0) mbar_expect(bars + 8 * slot, bytes * (uint32_t)nr);
            __syncwarp();
            if (lane < nr)
                bulk_g2s(ring + (uint32_t)(slot * GVB_CHUNK + lane * GVB_LD),
                         d.data + (d.wrow0 + lane) * p.w.row_bytes + b0, bytes, bars + 8 * slot);
        }
        return; /* (it writes nothing another kernel reads) */
    }
    /* the consumers: the activation rows (the previous kernel's) staged as bf16 */
    cu_pdl_enter();
    constexpr int U = 4;
    const float *x = p.x + (int64_t)blockIdx.y * p.gxs;
    int rows = (int)p.n, ku = (int)((K + 4 * E - 1) / (4 * E) * (4 * E) / U);
    for (int i = threadIdx.x; i < rows * ku; i += GVB_W * 32) {
        int r = i / ku;
        gvf_stage_unit<WT>(xs, rw, r, (int64_t)(i - r * ku) * U, x + r * p.ldx, K);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(GVB_W * 32) : "memory");
    int xo[1] = {(g < rows ? g : rows - 1) * (int)rw};
    float acc[1][4];
    acc_zero(acc);
    /* FP8: the scale bytes of this lane's slices in chunk cc (rows g, g + 8 of its tile; past
       n_out the last row's), loaded a chunk ahead (on the chunk's path they would add an L2
       round trip to each) */
    auto scales = [&](int cc, uint32_t &sa, uint32_t &sb) {
        if (WT != DSI_TYPE_F8_E4M3 || cc >= nch) return;
        int64_t kk = (int64_t)(cc % nkc) * GVB_KC + warp * 128 + t * 32;
        if (kk >= K) return;
        gvb_tile d = gvb_tile_of(p, t0 + cc / nkc);
        int64_t last = d.n_out - 1 - d.o0, o = g < last ? g : last,
                o1 = g + 8 < last ? g + 8 : last;
        sa = __ldg(d.scale + ((d.wrow0 + o) >> p.w.sh0) * p.w.srs + (kk >> p.w.sh1));
        sb = __ldg(d.scale + ((d.wrow0 + o1) >> p.w.sh0) * p.w.srs + (kk >> p.w.sh1));
    };
    uint32_t sa = 0, sb = 0;
    scales(0, sa, sb);
    for (int c = 0; c < nch; c++) {
        int slot = c % ns, kc = c % nkc;
        uint32_t na = 0, nb = 0;
        scales(c + 1, na, nb);
        if (!mbar_wait(bars + 8 * slot, (uint32_t)((c / ns) & 1), GVB_SPINS)) return;
        int64_t k = (int64_t)kc * (GVB_KC / EB) + warp * 4 * E; /* this warp's group */
        if (k < K) {
            gvf_raw ra, rb;
            const char *s0 = base + slot * GVB_CHUNK + g * GVB_LD + warp * 128 + t * 32;
            const char *s1 = s0 + 8 * GVB_LD;
            ra.v[0] = *(const uint4 *)s0;
            ra.v[1] = *(const uint4 *)(s0 + 16);
            rb.v[0] = *(const uint4 *)s1;
            rb.v[1] = *(const uint4 *)(s1 + 16);
            ra.sc = sa;
            rb.sc = sb;
            const uint32_t *xb = xs + ((k / (4 * E)) * (E / 4) * 8 + 2 * t);
            gvf_group<WT, 1>(ra, rb, xb, xo, acc);
        }
        sa = na;
        sb = nb;
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (ns + slot));
        if (kc == nkc - 1) {               /* the tile's partial sums in warp order, then out */
            int pb = (int)((c / nkc) & 1); /* (rewritten two tiles later: after a barrier) */
#pragma unroll
            for (int i = 0; i < 4; i++)
                red[pb][warp][lane][i] = acc[0][i];
            asm volatile("bar.sync 1, %0;" ::"r"(GVB_W * 32) : "memory");
            if (warp == 0) {
#pragma unroll 1
                for (int w = 1; w < GVB_W; w++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[0][i] += red[pb][w][lane][i];
                /* acc[0][i] is (row g + 8 (i / 2), column 2 t + i % 2) */
                gvb_tile d = gvb_tile_of(p, t0 + c / nkc);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int64_t o = d.o0 + g + (i >> 1) * 8;
                    int col = 2 * t + (i & 1);
                    if (col < p.n && o < d.n_out)
                        d.y[col * d.ldy + o] = rbf(acc[0][i] + 0.0f, p.round);
                }
            }
            acc_zero(acc);
        }
    }
#endif
}

/* K's groups whole in 128-byte rows (FP8: K % 128; BF16: K % 64) with FP8 scale blocks of 128
   along K (a group one scale byte) and powers of two along the rows; 16-byte aligned rows */
static bool gvb_w_ok(const struct cu_w *w) {
    if ((uintptr_t)w->data % 16 || w->row_bytes % 16 || !gemm_w_ok(w)) return false;
    if (w->type == DSI_TYPE_F8_E4M3)
        return w->K % 128 == 0 && w->sb1 == 128 && w->sh1 == 7 && w->sh0 >= 0 && w->scale;
    return w->type == DSI_TYPE_BF16 && w->K % 64 == 0;
}

static bool gvb_call_ok(const struct cu_ctx *c, const struct cu_gemm_call *g) {
    const struct cu_w *w = g->w;
    int groups = g->groups > 1 ? g->groups : 1;
    return g->n >= 1 && g->n <= 8 && g->n <= c->gvb_max && gvb_w_ok(w) &&
           gemm_fast_ok(w, g->x, g->ldx) && groups <= 65535 && (groups == 1 || g->gxs % 4 == 0) &&
           g->row0 >= 0 && g->n_out >= 1 && g->row0 + groups * g->n_out <= w->rows;
}

/* The launch of p for g (g2: a pair's second call, which gvb_call_ok and launch_gvb_pair took) */
static bool gvb_go(struct cu_ctx *c, const struct cu_gemm_call *g, const struct cu_gemm_call *g2) {
    const struct cu_w *w = g->w;
    int groups = g->groups > 1 ? g->groups : 1;
    int64_t rw = w->type == DSI_TYPE_BF16 ? gvf_row_words<DSI_TYPE_BF16>(w->K)
                                          : gvf_row_words<DSI_TYPE_F8_E4M3>(w->K);
    /* ring slots: c->gvb_ns, or as many as fit beside the staged rows; at least 3 */
    int ns = c->gvb_ns < GVB_NS_MAX ? c->gvb_ns : GVB_NS_MAX;
    while (ns >= 3 && gvb_layout_of(ns, g->n, rw).total > GVB_SMEM)
        ns--;
    if (ns < 3) return false;
    struct gvb_p p;
    memset(&p, 0, sizeof(p));
    p.w = *w;
    p.row0 = g->row0;
    p.n_out = g->n_out;
    p.x = g->x;
    p.n = g->n;
    p.ldx = g->ldx;
    p.y = g->y;
    p.ldy = g->ldy;
    p.gxs = g->gxs;
    p.gys = g->gys;
    p.round = g->round;
    p.ns = ns;
    p.spf = c->gvb_spf;
    p.tiles = cu_div_up(g->n_out, 16);
    if (g2) {
        p.data2 = g2->w->data;
        p.scale2 = g2->w->scale;
        p.n_out2 = g2->n_out;
        p.tiles2 = cu_div_up(g2->n_out, 16);
        p.ldy2 = g2->ldy;
        p.y2 = g2->y;
    }
    /* one block an SM over the groups, at least one tile a block */
    int64_t gx = std::min<int64_t>(p.tiles + p.tiles2, std::max<int64_t>(1, c->n_sms / groups));
    size_t sm = gvb_layout_of(ns, g->n, rw).total;
    int pp = cu_prof_begin(c, "gemm.gvb");
    static bool done8 = false, done16 = false;
    dim3 grid((unsigned)gx, (unsigned)groups);
    bool ok;
    if (w->type == DSI_TYPE_F8_E4M3) {
        ok = smem_limit(c, k_gvb<DSI_TYPE_F8_E4M3>, GVB_SMEM, &done8, "decode gemm (bulk)");
        if (ok) cu_launch(c, k_gvb<DSI_TYPE_F8_E4M3>, grid, GVB_T, sm, p);
    } else {
        ok = smem_limit(c, k_gvb<DSI_TYPE_BF16>, GVB_SMEM, &done16, "decode gemm (bulk)");
        if (ok) cu_launch(c, k_gvb<DSI_TYPE_BF16>, grid, GVB_T, sm, p);
    }
    ok = ok && cu_check(c, "gemm (decode, bulk copies)");
    cu_prof_end(c, pp);
    return ok || c->sticky;
}

bool launch_gvb_gemm(struct cu_ctx *c, const struct cu_gemm_call *g) {
    return gvb_call_ok(c, g) && gvb_go(c, g, nullptr);
}

bool launch_gvb_pair(struct cu_ctx *c,
                     const struct cu_gemm_call *g,
                     const struct cu_gemm_call *g2) {
    const struct cu_w *a = g->w, *b = g2->w;
    if (g->groups > 1 || g2->groups > 1 || g->x != g2->x || g->n != g2->n || g->ldx != g2->ldx ||
        g->round != g2->round || g2->row0 != 0 || !gvb_call_ok(c, g) || !gvb_call_ok(c, g2) ||
        a->type != b->type || a->K != b->K || a->row_bytes != b->row_bytes || a->srs != b->srs ||
        a->sb0 != b->sb0 || a->sb1 != b->sb1 || a->sh0 != b->sh0 || a->sh1 != b->sh1)
        return false;
    return gvb_go(c, g, g2);
}
