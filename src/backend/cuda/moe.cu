/* moe.cu - MoE routing and the expert block, as cpu_moe_route / cpu_moe, on the device:
 *   group    idx [n, topk] -> rows sorted by expert, tiles of up to RX rows of one expert
 *            (one block, shared-memory counts; no host round trip);
 *   up       per tile: g = W1 x, u = W3 x for the tile's rows, SwiGLU with the clamp and the
 *            routing weight fused, h rows in sorted order (the shared expert: all rows, w = 1);
 *   [QAT]    act_quant of the h rows;
 *   down     per tile: out[slot] = W2 h (the shared expert's rows after the routed ones);
 *   combine  y[r] = sum_k out[r, k] in slot order, then the shared expert.
 * Every output element is one cpu_dot-ordered dot product of its own row, so the result does
 * not depend on how rows are grouped into tiles, and equals the CPU's bit for bit (up to the
 * exp in SiLU). The expert weights are addressed through a device table built once per layer
 * (cu_moe_table). The forward's `work` buffer is not used (its sub-arrays are not aligned for
 * vector loads); the op uses backend scratch instead. */
#include "common.cuh"
#include "gemm.cuh"
#include "moe.cuh"

#include <algorithm>
#include <string.h>

/* ---- routing ------------------------------------------------------------------------------------
 */

/* (out of line: its exact exp and log1p are long, and the routing kernel calls it in loops) */
__device__ __noinline__ float sqrtsoftplus(float z) {
    return sqrtf(z > 20.0f ? z : log1p_ref(exp_ref(z)));
}

/* The warp's best (value, expert) of the lanes' (bv, best), best < 0: none; ties: the lower
 * expert. Every lane ends with it. */
__device__ __forceinline__ void warp_argmax(float &bv, int &best) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int ob = __shfl_xor_sync(0xffffffffu, best, o);
        bool better = ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best));
        if (better) {
            bv = ov;
            best = ob;
        }
    }
}

#define ROUTE_V 16  /* experts per lane held in registers (E <= 512) */
#define ROUTE_T 256 /* threads per k_moe_route block: a warp per row */

/* The scores sqrtsoftplus(logit) of the block's rows (ROUTE_T / 32 of them from row r0; E <= 32
 * ROUTE_V) into ssp[row][e], spread over all the block's threads (step 37: at batch 1 each lane
 * of the row's warp computed 8-16 of them one after the other while 7 warps idled, a chain of
 * exact exp and log1p: 17 us of a 4-layer batch-1 step per learned layer). */
__device__ void
route_scores(const float *logits, int64_t r0, int64_t n, int64_t E, float (*ssp)[32 * ROUTE_V]) {
    int rows = (int)(n - r0 < ROUTE_T / 32 ? n - r0 : ROUTE_T / 32), Ei = (int)E;
#pragma unroll 1
    for (int i = threadIdx.x; i < rows * Ei; i += ROUTE_T) {
        int r = i / Ei, e = i - r * Ei;
        ssp[r][e] = sqrtsoftplus(logits[(r0 + r) * E + e]);
    }
}

/* One warp per row; E <= 32 ROUTE_V: the block's scores first (route_scores). */
__global__ void __launch_bounds__(ROUTE_T) k_moe_route(const float *logits,
                                                       int64_t n,
                                                       int64_t E,
                                                       int K,
                                                       struct cu_vec bias,
                                                       const uint8_t *tid2eid,
                                                       int64_t t2e_row_bytes,
                                                       bool t2e_i64,
                                                       const int32_t *tokens,
                                                       float route_scale,
                                                       float eps,
                                                       int32_t *idx,
                                                       float *weight) {
    cu_pdl_enter();
    __shared__ float ssp[ROUTE_T / 32][32 * ROUTE_V];
    int64_t r0 = (int64_t)blockIdx.x * (ROUTE_T / 32), r = r0 + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    bool small = E <= 32 * ROUTE_V;
    if (!tid2eid && small) { /* (the whole block: before any warp returns) */
        route_scores(logits, r0, n, E, ssp);
        __syncthreads();
    }
    if (r >= n) return;
    const float *lg = logits + r * E;
    int32_t *ix = idx + r * K;
    float *w = weight + r * K;
    const float *mine_sc = ssp[threadIdx.x >> 5];
    if (tid2eid) {
        const uint8_t *row = tid2eid + (int64_t)tokens[r] * t2e_row_bytes;
        for (int k = lane; k < K; k += 32)
            ix[k] = t2e_i64 ? (int32_t)((const int64_t *)row)[k] : ((const int32_t *)row)[k];
    } else if (small) {
        /* the lane's scores in registers (the loop below computes every score K times: ~40 us
           per call at E = 256, K = 6); the same choices */
        float sc[ROUTE_V];
        unsigned taken = 0;
#pragma unroll
        for (int m = 0; m < ROUTE_V; m++) {
            int64_t e = lane + 32 * m;
            sc[m] = e < E ? mine_sc[e] + (bias.data ? vec_get(bias, e) : 0.0f) : 0.0f;
        }
        for (int k = 0; k < K; k++) {
            int best = -1, bm = -1;
            float bv = -INFINITY;
#pragma unroll
            for (int m = 0; m < ROUTE_V; m++) {
                if (lane + 32 * m >= E || (taken >> m & 1u)) continue;
                if (best < 0 || sc[m] > bv) {
                    best = lane + 32 * m;
                    bv = sc[m];
                    bm = m;
                }
            }
            int mine = best;
            warp_argmax(bv, best);
            if (best >= 0 && best == mine) taken |= 1u << bm;
            if (lane == 0) ix[k] = best;
        }
    } else {
        for (int k = 0; k < K; k++) {
            /* lane's best among its experts e = lane + 32 m (ascending), then the warp's */
            int best = -1;
            float bv = -INFINITY;
            for (int64_t e = lane; e < E; e += 32) {
                bool taken = false;
                for (int q = 0; q < k && !taken; q++)
                    taken = ix[q] == e;
                if (taken) continue;
                float v = sqrtsoftplus(lg[e]) + (bias.data ? vec_get(bias, e) : 0.0f);
                if (best < 0 || v > bv) {
                    best = (int)e;
                    bv = v;
                }
            }
            warp_argmax(bv, best);
            if (lane == 0) ix[k] = best;
            __syncwarp();
        }
    }
    __syncwarp();
    /* the weights: lane k's score of choice k (the block's where computed, the same function of
       the same logit), added in k order on lane 0 */
    float sum = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 32) {
        int k = k0 + lane;
        float v = 0.0f;
        if (k < K) {
            int e = ix[k];
            v = small && !tid2eid ? mine_sc[e] : sqrtsoftplus(lg[e]);
        }
        int cnt = K - k0 < 32 ? K - k0 : 32;
        for (int j = 0; j < cnt; j++)
            sum += __shfl_sync(0xffffffffu, v, j);
        if (k < K) w[k] = v;
    }
    __syncwarp();
    for (int k = lane; k < K; k += 32)
        w[k] = w[k] / (sum + eps) * route_scale;
}

extern "C" void cuda_moe_route(struct dsi_backend *be, const struct dsi_moe_route_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0 || a->topk <= 0) return;
    const uint8_t *t2e = a->tid2eid ? (const uint8_t *)a->tid2eid->data : NULL;
    int64_t t2e_rb = a->tid2eid ? dsi_tensor_row_bytes(a->tid2eid) : 0;
    bool i64 = a->tid2eid && a->tid2eid->type == DSI_TYPE_I64;
    int64_t threads = a->n * 32;
    cu_launch(c, k_moe_route, (unsigned)cu_div_up(threads, ROUTE_T), ROUTE_T, 0, a->logits, a->n,
              a->n_experts, a->topk, cu_vec_of(a->bias), t2e, t2e_rb, i64, a->tokens,
              a->route_scale, a->eps, a->idx, a->weight);
    cu_check(c, "moe_route");
}

/* ---- the device expert table
 * ---------------------------------------------------------------------- */

static const void *scale_data(const struct dsi_tensor *t) {
    return t->scale ? t->scale->data : NULL;
}

static bool same_format(const struct dsi_tensor *a, const struct dsi_tensor *b) {
    return a->type == b->type && a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] &&
           a->scale_block[0] == b->scale_block[0] && a->scale_block[1] == b->scale_block[1] &&
           a->scale_row_stride == b->scale_row_stride && !a->scale == !b->scale;
}

/* The bytes of t's scales (0: none). */
static int64_t scale_bytes(const struct dsi_tensor *t) {
    const struct dsi_tensor *s = t->scale;
    if (!s) return 0;
    return dsi_tensor_row_bytes(s) * (s->ne[1] > 0 ? s->ne[1] : 1);
}

/* The scale bytes of the three matrices of an expert (w1, w3, w2: the table's entries 1, 3, 5
 * for the routed experts) and their sizes. */
struct moe_sb_args {
    int64_t n[3];         /* the routed experts' (all alike) */
    const uint8_t *sh[3]; /* the shared expert's, or NULL */
    int64_t shn[3];
};

/* The largest scale byte of matrix blockIdx.y of expert blockIdx.x (x = n_experts: the shared
 * expert) into out[0] (routed) or out[1] (shared) by atomicMax (the caller zeroes them): 16-byte
 * loads between an unaligned head and tail. */
__global__ void k_moe_sb_max(const struct cu_moe_ent *tab, int E, struct moe_sb_args a, int *out) {
    int j = (int)blockIdx.y;
    bool sh = (int)blockIdx.x == E;
    const uint8_t *p = sh ? a.sh[j] : tab[blockIdx.x].p[2 * j + 1];
    int64_t n = sh ? a.shn[j] : a.n[j];
    if (!p || n <= 0) return;
    int64_t head = (int64_t)((16 - (uintptr_t)p % 16) % 16);
    if (head > n) head = n;
    int64_t nv = (n - head) / 16;
    unsigned m = 0;
    for (int64_t i = threadIdx.x; i < head; i += blockDim.x)
        m = max(m, (unsigned)p[i]);
    const uint4 *v = (const uint4 *)(p + head);
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
        uint4 q = __ldg(v + i);
        m = max(m, __vmaxu4(__vmaxu4(q.x, q.y), __vmaxu4(q.z, q.w)));
    }
    for (int64_t i = head + 16 * nv + threadIdx.x; i < n; i += blockDim.x)
        m = max(m, (unsigned)p[i]);
    m = max(max(m & 0xffu, (m >> 8) & 0xffu), max((m >> 16) & 0xffu, m >> 24));
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(out + (sh ? 1 : 0), (int)m);
}

/* t->sb_max and t->sb_max_sh from the device table (its two ints after the entries), unless the
 * stream is being captured into a graph (a later call tries again); errors leave them unknown
 * (-1). Synchronises the stream (once a table). */
static void
moe_table_sb_max(struct cu_ctx *c, struct cu_moe_table *t, const struct dsi_moe_args *a) {
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (cs != cudaStreamCaptureStatusNone) return;
    int *dv = (int *)(t->dev + t->n_experts), h[2] = {-1, -1};
    if (cudaMemsetAsync(dv, 0, 2 * sizeof(int), c->stream) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    struct moe_sb_args sa;
    const struct dsi_tensor *rw[3] = {a->w1[0], a->w3[0], a->w2[0]},
                            *sw[3] = {a->sw1, a->sw3, a->sw2};
    for (int j = 0; j < 3; j++) {
        sa.n[j] = scale_bytes(rw[j]);
        sa.sh[j] = (const uint8_t *)scale_data(sw[j]);
        sa.shn[j] = scale_bytes(sw[j]);
    }
    cu_launch(c, k_moe_sb_max, dim3((unsigned)t->n_experts + 1, 3), 256, 0,
              (const struct cu_moe_ent *)t->dev, t->n_experts, sa, dv);
    if (!cu_check(c, "moe: the experts' largest scale")) return;
    if (cudaMemcpyAsync(h, dv, sizeof(h), cudaMemcpyDeviceToHost, c->stream) != cudaSuccess ||
        cudaStreamSynchronize(c->stream) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    t->sb_max = h[0];
    t->sb_max_sh = h[1];
    for (int j = 0; j < 3; j++)
        t->ssnap[j] = scale_data(sw[j]);
}

/* Keyed by the host pointer array a->w1; validated against a snapshot of the device addresses
 * every call (cheap), rebuilt (stream-ordered copy) when they differ. *sb_max, *sb_max_sh: the
 * routed and the shared experts' largest scale bytes (255 where not known), found once for the
 * addresses: like the table, they take weights as immutable while their addresses stay. */
const struct cu_moe_ent *
cu_moe_table(struct cu_ctx *c, const struct dsi_moe_args *a, int *sb_max, int *sb_max_sh) {
    *sb_max = *sb_max_sh = 255;
    int E = a->n_experts;
    struct cu_moe_table *t = NULL;
    for (int i = 0; i < c->n_moe && !t; i++)
        if (c->moe[i].key == (const void *)a->w1 && c->moe[i].n_experts == E) t = &c->moe[i];
    bool fresh = false;
    if (!t) {
        if (c->n_moe == CU_MAX_MOE_TABLES) {
            cu_fail(c, DSI_ERR_UNSUPPORTED, "moe: more than %d expert tables", CU_MAX_MOE_TABLES);
            return NULL;
        }
        t = &c->moe[c->n_moe];
        memset(t, 0, sizeof(*t));
        t->snap = (const void **)dsi_calloc((size_t)E * 6, sizeof(void *));
        if (!t->snap || cudaMalloc(&t->dev, sizeof(struct cu_moe_ent) * (size_t)E +
                                                2 * sizeof(int)) != cudaSuccess) {
            cudaGetLastError();
            free(t->snap);
            cu_fail(c, DSI_ERR_NOMEM, "moe: cannot allocate an expert table of %d experts", E);
            return NULL;
        }
        t->key = a->w1;
        t->n_experts = E;
        t->sb_max = t->sb_max_sh = -1;
        c->n_moe++;
        fresh = true;
    }
    bool same = !fresh;
    for (int e = 0; e < E && same; e++) {
        const void **s = t->snap + 6 * e;
        same = s[0] == a->w1[e]->data && s[1] == scale_data(a->w1[e]) && s[2] == a->w3[e]->data &&
               s[3] == scale_data(a->w3[e]) && s[4] == a->w2[e]->data &&
               s[5] == scale_data(a->w2[e]);
    }
    if (same) {
        if (t->ssnap[0] != scale_data(a->sw1) || t->ssnap[1] != scale_data(a->sw3) ||
            t->ssnap[2] != scale_data(a->sw2))
            t->sb_max = t->sb_max_sh = -1; /* (another shared expert: look again) */
        if (t->sb_max < 0 && c->wgr_sb) moe_table_sb_max(c, t, a);
        *sb_max = t->sb_max < 0 ? 255 : t->sb_max;
        *sb_max_sh = t->sb_max_sh < 0 ? 255 : t->sb_max_sh;
        return t->dev;
    }
    struct cu_moe_ent *h = (struct cu_moe_ent *)dsi_calloc((size_t)E, sizeof(*h));
    if (!h) {
        cu_fail(c, DSI_ERR_NOMEM, "moe: out of host memory");
        return NULL;
    }
    for (int e = 0; e < E; e++) {
        if (!same_format(a->w1[e], a->w1[0]) || !same_format(a->w3[e], a->w3[0]) ||
            !same_format(a->w2[e], a->w2[0])) {
            free(h);
            cu_fail(c, DSI_ERR_UNSUPPORTED, "moe: expert %d differs in format from expert 0", e);
            return NULL;
        }
        const void *v[6] = {a->w1[e]->data,       scale_data(a->w1[e]), a->w3[e]->data,
                            scale_data(a->w3[e]), a->w2[e]->data,       scale_data(a->w2[e])};
        for (int i = 0; i < 6; i++) {
            t->snap[6 * e + i] = v[i];
            h[e].p[i] = (const uint8_t *)v[i];
        }
    }
    cudaMemcpyAsync(t->dev, h, sizeof(*h) * (size_t)E, cudaMemcpyHostToDevice, c->stream);
    t->sb_max = t->sb_max_sh = -1;
    if (c->wgr_sb) moe_table_sb_max(c, t, a); /* (synchronises the stream: h is copied) */
    *sb_max = t->sb_max < 0 ? 255 : t->sb_max;
    *sb_max_sh = t->sb_max_sh < 0 ? 255 : t->sb_max_sh;
    free(h);
    return t->dev;
}

/* ---- grouping ----------------------------------------------------------------------------------
 */

#define MOE_MAX_E 4096

/* Exclusive prefix sums of a and b over the block (1024 threads, in thread order; integers, so
 * any order of the additions gives the same sums); *ta / *tb: the totals. */
__device__ __forceinline__ void block_scan2(int &a, int &b, int *ta, int *tb) {
    __shared__ int wa[32], wb[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int xa = __shfl_up_sync(0xffffffffu, ia, o), xb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
            ia += xa;
            ib += xb;
        }
    }
    if (lane == 31) {
        wa[warp] = ia;
        wb[warp] = ib;
    }
    __syncthreads();
    if (warp == 0) {
        int sa = wa[lane], sb = wb[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int xa = __shfl_up_sync(0xffffffffu, sa, o), xb = __shfl_up_sync(0xffffffffu, sb, o);
            if (lane >= o) {
                sa += xa;
                sb += xb;
            }
        }
        wa[lane] = sa; /* inclusive over warps */
        wb[lane] = sb;
    }
    __syncthreads();
    int pa = warp ? wa[warp - 1] : 0, pb = warp ? wb[warp - 1] : 0;
    *ta = wa[31];
    *tb = wb[31];
    a = pa + ia - a;
    b = pb + ib - b;
}

/* One block of 1024 threads. perm[pos] = slot, sorted by expert (inv, where given: inv[slot] = pos,
 * -1 for a dropped slot); tiles[t] = (expert, first pos,
 * rows, the tile's index among its expert's | their count << 16): an expert's rows in tiles of RX
 * and the rest, or (bal) in the same number of tiles of equal rows; *n_tiles. Slots with an expert
 * id out of range are dropped (the combine adds 0). The experts' offsets by a block scan (thread t:
 * experts t * per .. t * per + per - 1); one thread walking E experts took ~15 us at E = 256. */
__global__ void __launch_bounds__(1024) k_moe_group(const int32_t *idx,
                                                    int64_t nk,
                                                    int E,
                                                    int RX,
                                                    bool bal,
                                                    int32_t *perm,
                                                    int4 *tiles,
                                                    int32_t *n_tiles,
                                                    int32_t *inv) {
    cu_pdl_enter();
    __shared__ int cnt[MOE_MAX_E], off[MOE_MAX_E], toff[MOE_MAX_E];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    for (int64_t s = threadIdx.x; s < nk; s += blockDim.x) {
        int e = idx[s];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    int per = (E + 1023) / 1024, e0 = threadIdx.x * per, o = 0, to = 0;
    for (int e = e0; e < e0 + per && e < E; e++) {
        o += cnt[e];
        to += (cnt[e] + RX - 1) / RX;
    }
    int tot_o, tot_t;
    block_scan2(o, to, &tot_o, &tot_t);
    for (int e = e0; e < e0 + per && e < E; e++) {
        off[e] = o;
        toff[e] = to;
        o += cnt[e];
        to += (cnt[e] + RX - 1) / RX;
    }
    if (threadIdx.x == 0) *n_tiles = tot_t;
    __syncthreads();
    /* tiles of RX rows and the rest, or (bal) ceil(cnt / RX) tiles of equal rows (+-1) */
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = cnt[e], nt = (c + RX - 1) / RX;
        for (int t = 0; t < nt; t++) {
            int r0 = bal ? (int)((int64_t)t * c / nt) : t * RX,
                r1 = bal ? (int)((int64_t)(t + 1) * c / nt) : min(c, r0 + RX);
            tiles[toff[e] + t] = make_int4(e, off[e] + r0, r1 - r0, t | nt << 16);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0; /* reuse as cursors */
    __syncthreads();
    for (int64_t s = threadIdx.x; s < nk; s += blockDim.x) {
        int e = idx[s];
        int32_t pos = e >= 0 && e < E ? off[e] + atomicAdd(&cnt[e], 1) : -1;
        if (pos >= 0) perm[pos] = (int32_t)s;
        if (inv) inv[s] = pos;
    }
}

/* ---- expert GEMMs
 * -------------------------------------------------------------------------------- */

/* Up projection + SwiGLU: a warp computes GEMM_RW = 2 rows: W1 row c and W3 row c. Dynamic
 * shared memory gemm_smem_bytes(RX); with p.stage the tile's x rows are staged there (gemm.cuh);
 * every warp takes part in the block barriers. */
template <int WT, int RX>
__global__ void __launch_bounds__(CU_THREADS, 2) k_moe_up(struct moe_p p) {
    cu_pdl_enter();
    extern __shared__ float4 gsm[];
    float *xs = (float *)gsm;
    float(*cvs)[RX * GEMM_RW][33] = (float(*)[RX * GEMM_RW][33])(xs + RX * 32 * XS_STRIDE);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int e, rows;
    int64_t pos0;
    if (!moe_tile(p, RX, &e, &pos0, &rows)) return; /* the same for the whole block */
    int64_t col = (int64_t)blockIdx.x * CU_WARPS + warp;
    bool wact = col < p.I;
    int64_t nk = p.n * p.topk;
    struct cu_w W[2] = {p.w1, p.w3};
    if (e >= 0) {
        W[0].data = p.tab[e].p[0];
        W[0].scale = p.tab[e].p[1];
        W[1].data = p.tab[e].p[2];
        W[1].scale = p.tab[e].p[3];
    }
    const uint8_t *wr[2], *sr[2];
#pragma unroll
    for (int m = 0; m < 2; m++) {
        int64_t row = wact ? col : 0;
        wr[m] = W[m].data + row * W[m].row_bytes;
        sr[m] = w_scale_row(W[m], row);
    }
    __shared__ int64_t xoff[RX]; /* offset of the tile's x row rx in p.x, -1: none */
    if (threadIdx.x < RX) {
        int64_t pos = pos0 + threadIdx.x;
        xoff[threadIdx.x] = (int)threadIdx.x >= rows ? -1
                            : pos < nk               ? (int64_t)(p.perm[pos] / p.topk) * p.D
                                                     : (pos - nk) * p.D;
    }
    __syncthreads();
    int64_t nq = p.D / 32, np = (nq + 31) / 32;
    float acc = 0.0f;
    /* As k_gemm: small tiles issue piece pc + 1's weight loads before using piece pc's. */
    constexpr bool PF = WT != DSI_TYPE_F32 && RX <= 4;
    w_raw raw[2], nxt[2];
    if (PF) {
#pragma unroll
        for (int m = 0; m < 2; m++)
            load_w_raw<WT>(W[m], wr[m], sr[m], lane < nq && wact ? lane : -1, raw[m]);
    }
    for (int64_t pc = 0; pc < np; pc++) {
        int64_t q = pc * 32 + lane;
        bool qv = q < nq;
        if (PF && pc + 1 < np) {
#pragma unroll
            for (int m = 0; m < 2; m++)
                load_w_raw<WT>(W[m], wr[m], sr[m], q + 32 < nq && wact ? q + 32 : -1, nxt[m]);
        }
        if (p.stage) {
            __syncthreads();
            stage_x<RX>(xs, p.x, xoff, p.D, pc);
        }
        if (p.stage) __syncthreads();
        if (PF) {
#pragma unroll
            for (int m = 0; m < 2; m++) {
                float wf[32];
                decode_w_raw<WT>(raw[m], qv && wact ? q : -1, wf);
                raw[m] = nxt[m];
                if (!wact) continue;
#pragma unroll
                for (int rx = 0; rx < RX; rx++) {
                    float xf[32];
                    bool xv = qv && rx < rows;
                    if (p.stage)
                        load_x_staged(xs, rx, lane, xf);
                    else
                        load_x_chunk(p.x + (xv ? xoff[rx] + q * 32 : 0), xv, xf);
                    cvs[warp][rx * 2 + m][lane] = chunk_dot(xf, wf);
                }
            }
            if (!wact) continue;
        } else {
            float wf[2][32];
            load_w_chunk<WT>(W[0], wr[0], sr[0], qv && wact ? q : -1, wf[0]);
            load_w_chunk<WT>(W[1], wr[1], sr[1], qv && wact ? q : -1, wf[1]);
            if (!wact) continue;
#pragma unroll
            for (int rx = 0; rx < RX; rx++) {
                float xf[32];
                bool xv = qv && rx < rows;
                if (p.stage)
                    load_x_staged(xs, rx, lane, xf);
                else
                    load_x_chunk(p.x + (xv ? xoff[rx] + q * 32 : 0), xv, xf);
                cvs[warp][rx * 2][lane] = chunk_dot(xf, wf[0]);
                cvs[warp][rx * 2 + 1][lane] = chunk_dot(xf, wf[1]);
            }
        }
        __syncwarp();
        if (lane < RX * 2) {
            int cnt = (int)(nq - pc * 32 < 32 ? nq - pc * 32 : 32);
            for (int L = 0; L < cnt; L++)
                acc += cvs[warp][lane][L];
        }
        __syncwarp();
    }
    if (!wact) return;
    float v = acc + 0.0f; /* lane 2 rx: g, lane 2 rx + 1: u */
    float u = __shfl_down_sync(0xffffffffu, v, 1);
    int rx = lane / 2;
    if (lane >= RX * 2 || (lane & 1) || rx >= rows) return;
    float g = rbf(v, p.round);
    u = rbf(u, p.round);
    int64_t pos = pos0 + rx;
    float wi = pos < nk ? p.weight[p.perm[pos]] : 1.0f;
    float gv = fminf(g, p.limit), uv = fminf(fmaxf(u, -p.limit), p.limit);
    float silu = gv / (1.0f + exp_ref(-gv));
    p.h[pos * p.I + col] = rbf(silu * uv * wi, p.round);
}

/* Down projection: out[slot or nk + r] = W2 h. A warp computes GEMM_RW rows of W2. Shared
 * memory and staging as k_moe_up. */
template <int WT, int RX>
__global__ void __launch_bounds__(CU_THREADS, 2) k_moe_down(struct moe_p p) {
    cu_pdl_enter();
    extern __shared__ float4 gsm[];
    float *xs = (float *)gsm;
    float(*cvs)[RX * GEMM_RW][33] = (float(*)[RX * GEMM_RW][33])(xs + RX * 32 * XS_STRIDE);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int e, rows;
    int64_t pos0;
    if (!moe_tile(p, RX, &e, &pos0, &rows)) return; /* the same for the whole block */
    int64_t o0 = ((int64_t)blockIdx.x * CU_WARPS + warp) * GEMM_RW;
    bool wact = o0 < p.D;
    int64_t nk = p.n * p.topk;
    struct cu_w W = p.w2;
    if (e >= 0) {
        W.data = p.tab[e].p[4];
        W.scale = p.tab[e].p[5];
    }
    const uint8_t *wr[GEMM_RW], *sr[GEMM_RW];
    bool wv[GEMM_RW];
#pragma unroll
    for (int r = 0; r < GEMM_RW; r++) {
        wv[r] = o0 + r < p.D;
        int64_t row = wv[r] ? o0 + r : 0;
        wr[r] = W.data + row * W.row_bytes;
        sr[r] = w_scale_row(W, row);
    }
    __shared__ int64_t xoff[RX]; /* offset of the tile's h row rx in p.h, -1: none */
    if (threadIdx.x < RX)
        xoff[threadIdx.x] = (int)threadIdx.x < rows ? (pos0 + threadIdx.x) * p.I : -1;
    __syncthreads();
    int64_t nq = p.I / 32, np = (nq + 31) / 32;
    float acc = 0.0f;
    constexpr bool PF = WT != DSI_TYPE_F32 && RX <= 4; /* as k_moe_up */
    w_raw raw[GEMM_RW], nxt[GEMM_RW];
    if (PF) {
#pragma unroll
        for (int r = 0; r < GEMM_RW; r++)
            load_w_raw<WT>(W, wr[r], sr[r], lane < nq && wv[r] ? lane : -1, raw[r]);
    }
    for (int64_t pc = 0; pc < np; pc++) {
        int64_t q = pc * 32 + lane;
        bool qv = q < nq;
        if (PF && pc + 1 < np) {
#pragma unroll
            for (int r = 0; r < GEMM_RW; r++)
                load_w_raw<WT>(W, wr[r], sr[r], q + 32 < nq && wv[r] ? q + 32 : -1, nxt[r]);
        }
        if (p.stage) {
            __syncthreads();
            stage_x<RX>(xs, p.h, xoff, p.I, pc);
        }
        if (PF) {
            if (p.stage) __syncthreads();
#pragma unroll
            for (int r = 0; r < GEMM_RW; r++) {
                float wf[32];
                decode_w_raw<WT>(raw[r], qv && wv[r] ? q : -1, wf);
                raw[r] = nxt[r];
                if (!wact) continue;
#pragma unroll
                for (int rx = 0; rx < RX; rx++) {
                    float xf[32];
                    bool xv = qv && rx < rows;
                    if (p.stage)
                        load_x_staged(xs, rx, lane, xf);
                    else
                        load_x_chunk(p.h + (xv ? (pos0 + rx) * p.I + q * 32 : 0), xv, xf);
                    cvs[warp][rx * GEMM_RW + r][lane] = chunk_dot(xf, wf);
                }
            }
            if (!wact) continue;
        } else {
            float wf[GEMM_RW][32];
#pragma unroll
            for (int r = 0; r < GEMM_RW; r++)
                load_w_chunk<WT>(W, wr[r], sr[r], qv && wv[r] ? q : -1, wf[r]);
            if (p.stage) __syncthreads();
            if (!wact) continue;
#pragma unroll
            for (int rx = 0; rx < RX; rx++) {
                float xf[32];
                bool xv = qv && rx < rows;
                if (p.stage)
                    load_x_staged(xs, rx, lane, xf);
                else
                    load_x_chunk(p.h + (xv ? (pos0 + rx) * p.I + q * 32 : 0), xv, xf);
#pragma unroll
                for (int r = 0; r < GEMM_RW; r++)
                    cvs[warp][rx * GEMM_RW + r][lane] = chunk_dot(xf, wf[r]);
            }
        }
        __syncwarp();
        if (lane < RX * GEMM_RW) {
            int cnt = (int)(nq - pc * 32 < 32 ? nq - pc * 32 : 32);
            for (int L = 0; L < cnt; L++)
                acc += cvs[warp][lane][L];
        }
        __syncwarp();
    }
    int rx = lane / GEMM_RW, r = lane % GEMM_RW;
    if (!wact || lane >= RX * GEMM_RW || rx >= rows || !wv[r]) return;
    int64_t pos = pos0 + rx;
    int64_t orow = pos < nk ? p.perm[pos] : pos;
    p.out[orow * p.D + o0 + r] = rbf(acc + 0.0f, p.round);
}

/* The combine: y = the routed rows in k order, then the shared row. A slot whose expert id is out
 * of range adds 0 (its out row was never written; the CPU leaves it undefined). Until step 25
 * p.out was cleared first instead: 805 MB of stores a layer at the 8k prefill. */
struct comb_p {
    const float *out;
    const uint16_t *out16; /* the routed rows in bf16 (moe_p.out16), or NULL */
    const int32_t *idx;
    int E, topk;
    int64_t n, D;
    float *y;
    bool round;
};

/* slot s's W values from d added to acc (0 for an expert id out of range; s >= n topk: the
   shared expert's rows) */
template <int W>
__device__ __forceinline__ void comb_add(const comb_p &p, int64_t s, int64_t d, float (&acc)[W]) {
    int e = s < p.n * p.topk ? p.idx[s] : 0;
    bool ok = e >= 0 && e < p.E;
    if constexpr (W == 4) {
        float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok && p.out16 && s < p.n * p.topk) {
            uint2 b = *(const uint2 *)(p.out16 + s * p.D + d);
            f = make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u),
                            __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
        } else if (ok) {
            f = *(const float4 *)(p.out + s * p.D + d);
        }
        acc[0] += f.x;
        acc[1] += f.y;
        acc[2] += f.z;
        acc[3] += f.w;
    } else {
        acc[0] += !ok ? 0.0f
                  : p.out16 && s < p.n * p.topk
                      ? __uint_as_float((uint32_t)p.out16[s * p.D + d] << 16)
                      : p.out[s * p.D + d];
    }
}

/* a thread per value */
__global__ void k_moe_combine(struct comb_p p) {
    cu_pdl_enter();
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.n * p.D) return;
    int64_t r = t / p.D, d = t % p.D;
    float acc[1] = {0.0f};
    for (int k = 0; k < p.topk; k++)
        comb_add<1>(p, r * p.topk + k, d, acc);
    comb_add<1>(p, p.n * p.topk + r, d, acc);
    p.y[t] = rbf(acc[0], p.round);
}

/* a thread per 4 values of a row (D % 4 == 0, y 16-byte aligned), rows in grid.y (strided past
   65535): no division per value, 16-byte loads */
__global__ void k_moe_combine4(struct comb_p p) {
    cu_pdl_enter();
    int64_t d = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (d >= p.D) return;
    for (int64_t r = blockIdx.y; r < p.n; r += gridDim.y) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = 0; k < p.topk; k++)
            comb_add<4>(p, r * p.topk + k, d, acc);
        comb_add<4>(p, p.n * p.topk + r, d, acc);
        *(float4 *)(p.y + r * p.D + d) = make_float4(rbf(acc[0], p.round), rbf(acc[1], p.round),
                                                     rbf(acc[2], p.round), rbf(acc[3], p.round));
    }
}

#define MOE_SMEM(R) gemm_smem_bytes(R)

template <int WT>
static void launch_up(struct cu_ctx *c, const struct moe_p *p, int rx, dim3 grid) {
    static bool smem8 = false;
    if (rx == 8 && !smem_limit(c, k_moe_up<WT, 8>, MOE_SMEM(8), &smem8, "moe up")) return;
    switch (rx) {
    case 1:
        cu_launch(c, k_moe_up<WT, 1>, grid, CU_THREADS, MOE_SMEM(1), *p);
        break;
    case 2:
        cu_launch(c, k_moe_up<WT, 2>, grid, CU_THREADS, MOE_SMEM(2), *p);
        break;
    case 4:
        cu_launch(c, k_moe_up<WT, 4>, grid, CU_THREADS, MOE_SMEM(4), *p);
        break;
    default:
        cu_launch(c, k_moe_up<WT, 8>, grid, CU_THREADS, MOE_SMEM(8), *p);
        break;
    }
}

template <int WT>
static void launch_down(struct cu_ctx *c, const struct moe_p *p, int rx, dim3 grid) {
    static bool smem8 = false;
    if (rx == 8 && !smem_limit(c, k_moe_down<WT, 8>, MOE_SMEM(8), &smem8, "moe down")) return;
    switch (rx) {
    case 1:
        cu_launch(c, k_moe_down<WT, 1>, grid, CU_THREADS, MOE_SMEM(1), *p);
        break;
    case 2:
        cu_launch(c, k_moe_down<WT, 2>, grid, CU_THREADS, MOE_SMEM(2), *p);
        break;
    case 4:
        cu_launch(c, k_moe_down<WT, 4>, grid, CU_THREADS, MOE_SMEM(4), *p);
        break;
    default:
        cu_launch(c, k_moe_down<WT, 8>, grid, CU_THREADS, MOE_SMEM(8), *p);
        break;
    }
}

static bool moe_up(struct cu_ctx *c, const struct moe_p *p, int type, int rx, dim3 grid) {
    if (launch_moe_up_gv(c, p, type, rx, grid.y)) return cu_check(c, "moe up") && !c->sticky;
    switch (type) {
    case DSI_TYPE_F32:
        launch_up<DSI_TYPE_F32>(c, p, rx, grid);
        break;
    case DSI_TYPE_BF16:
        launch_up<DSI_TYPE_BF16>(c, p, rx, grid);
        break;
    case DSI_TYPE_F16:
        launch_up<DSI_TYPE_F16>(c, p, rx, grid);
        break;
    case DSI_TYPE_F8_E4M3:
        launch_up<DSI_TYPE_F8_E4M3>(c, p, rx, grid);
        break;
    case DSI_TYPE_FP4_E2M1:
        launch_up<DSI_TYPE_FP4_E2M1>(c, p, rx, grid);
        break;
    default:
        return false;
    }
    return cu_check(c, "moe up") && !c->sticky;
}

static bool moe_down(struct cu_ctx *c, const struct moe_p *p, int type, int rx, dim3 grid) {
    if (launch_moe_down_gv(c, p, type, rx, grid.y)) return cu_check(c, "moe down") && !c->sticky;
    switch (type) {
    case DSI_TYPE_F32:
        launch_down<DSI_TYPE_F32>(c, p, rx, grid);
        break;
    case DSI_TYPE_BF16:
        launch_down<DSI_TYPE_BF16>(c, p, rx, grid);
        break;
    case DSI_TYPE_F16:
        launch_down<DSI_TYPE_F16>(c, p, rx, grid);
        break;
    case DSI_TYPE_F8_E4M3:
        launch_down<DSI_TYPE_F8_E4M3>(c, p, rx, grid);
        break;
    case DSI_TYPE_FP4_E2M1:
        launch_down<DSI_TYPE_FP4_E2M1>(c, p, rx, grid);
        break;
    default:
        return false;
    }
    return cu_check(c, "moe down") && !c->sticky;
}

/* wgq.cu's weights: FP4 with 32-blocks along K, or FP8 with 128-blocks (a scale per step) */
static bool wgq_w_ok(const struct cu_w *w) {
    return w->type == DSI_TYPE_FP4_E2M1 ? w->sb1 == 32
                                        : w->type == DSI_TYPE_F8_E4M3 && w->sb1 == 128;
}

static int pick_rx(double rows_per_tile) {
    return rows_per_tile <= 1.0 ? 1 : rows_per_tile <= 2.0 ? 2 : rows_per_tile <= 4.0 ? 4 : 8;
}

/* Whether the expert / shared weights fit the fast kernels (else the op reports it). */
static bool moe_shapes_ok(
    const struct cu_w *w1, const struct cu_w *w3, const struct cu_w *w2, int64_t D, int64_t I) {
    return w1->K == D && w3->K == D && w2->K == I && w1->rows >= I && w3->rows >= I &&
           w2->rows >= D && w1->type == w3->type && gemm_w_ok(w1) && gemm_w_ok(w3) && gemm_w_ok(w2);
}

/* ---- the shared expert on a side stream (step 37; the default since step 38: batch 1 -1.6%,
 * 8-32 -2.5% on the H100; DSI_CUDA_MOE_SIDE=0: off) ------------------------------------------
 * At a few rows (the shared expert on gvf.cu, below tc.cu's 64 rows) the shared expert needs
 * only x, so it can run beside the routed experts' grouping and walks instead of after them:
 * the main stream records moe_fork, the side stream waits for it and runs the shared up
 * projection, its rows' act_quant and its down projection (their own rows of h and out, so
 * nothing is shared with the routed work), then records moe_join, which the main stream waits
 * for before the combine. In a captured step the fork and join become parallel branches of the
 * graph. Why: at batch 1 the grouping (one block) and the routed walks leave DRAM and most SMs
 * idle at their ends, and each walk pays ~6-8 us of ramp and drain alone (docs/cuda.md step 37);
 * two walks side by side share theirs. Same values: every kernel computes the same rows. */
int cu_moe_side_init(struct cu_ctx *c) {
    const char *e = getenv("DSI_CUDA_MOE_SIDE"); /* default on (step 38); =0: off */
    if (e && *e == '0') return 0;
    return cu_fork_make(&c->moe_side, &c->moe_fork, &c->moe_join);
}

void cu_moe_side_free(struct cu_ctx *c) { cu_fork_free(&c->moe_side, &c->moe_fork, &c->moe_join); }

/* The main stream's wait for the side stream's join, once: before the combine, or at any early
 * return (a capture must join every stream it forked). */
struct moe_side_wait {
    struct cu_ctx *c;
    bool pending;
    void wait() {
        if (!pending) return;
        pending = false;
        if (cudaStreamWaitEvent(c->stream, c->moe_join, 0) != cudaSuccess) {
            cudaGetLastError();
            if (c->capturing) c->capture_bad = true;
            cu_fail(c, DSI_ERR_DEVICE, "moe: waiting for the shared expert's stream");
        }
    }
    ~moe_side_wait() { wait(); }
};

extern "C" void cuda_moe(struct dsi_backend *be, const struct dsi_moe_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    int64_t n = a->n, D = a->dim, I = a->inter, nk = n * a->topk;
    int E = a->n_experts;
    if (n <= 0) return;
    if (E < 1 || E > MOE_MAX_E || a->topk < 1 || (uintptr_t)a->x % 16) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "moe: %d experts, top-%d (at most %d experts)", E, a->topk,
                MOE_MAX_E);
        return;
    }
    struct cu_w r1 = cu_w_of(a->w1[0]), r3 = cu_w_of(a->w3[0]), r2 = cu_w_of(a->w2[0]);
    struct cu_w s1 = cu_w_of(a->sw1), s3 = cu_w_of(a->sw3), s2 = cu_w_of(a->sw2);
    if (!moe_shapes_ok(&r1, &r3, &r2, D, I) || !moe_shapes_ok(&s1, &s3, &s2, D, I)) {
        cu_fail(c, DSI_ERR_UNSUPPORTED,
                "moe: expert weights must be [%lld, %lld] / [%lld, %lld] with K %% 32 == 0 in a "
                "supported format",
                (long long)I, (long long)D, (long long)D, (long long)I);
        return;
    }
    int sb_max, sb_max_sh;
    const struct cu_moe_ent *tab = cu_moe_table(c, a, &sb_max, &sb_max_sh);
    if (!tab) return;
    /* `fast` numerics: the tensor-core kernels for tiles of many rows (tiles of rx = their
       block's activation rows) */
    /* (from c->gvf_moe_min tokens, default 1; fewer: the exact persistent kernels of moe_gv.cu) */
    bool rfast = a->fast && n >= c->gvf_moe_min;
    bool tc = rfast && n >= c->gvf_min && (double)nk / E >= c->tc_moe_min &&
              tc_moe_ok(&r1, &r3, &r2, D, I, a->x);
    /* `fast` numerics, fewer rows: the decode tensor-core kernels (tiles of up to 8-32 rows) */
    /* tiles of 8, 16 or 32 rows: the mean's (an expert with more takes several tiles: measured
       faster than 2x the mean at batch 256, whose 16-row tiles fit one block per SM; step 15),
       or c->gvf_moe_nt (DSI_CUDA_GVF_MOE_NT) */
    int gnt = c->gvf_moe_nt ? c->gvf_moe_nt : gvf_moe_nt(nk / E);
    bool gv = rfast && !tc && gvf_moe_ok(c, &r1, &r3, &r2, D, I, a->x, n, gnt);
    /* (the weights in registers, wgr.cu: c->wg_rs; routed and shared together, as they share
       the activations' copies) */
    bool rs = c->wg_rs && wgr_ok(D, I) && wgr_w_ok(&r1) && wgr_w_ok(&r3) && wgr_w_ok(&r2) &&
              wgr_w_ok(&s1) && wgr_w_ok(&s3) && wgr_w_ok(&s2);
    /* (wgq.cu: FP8 tensor cores on act_quant's codes, c->wg_q8; routed and shared together, as
       they share the codes of x and h) */
    bool q8 = rs && (c->wg_q8 || c->wg_p) && a->act_quant && wgq_ok(D, I) && wgq_w_ok(&r1) &&
              wgq_w_ok(&r3) && wgq_w_ok(&r2) && wgq_w_ok(&s1) && wgq_w_ok(&s3) && wgq_w_ok(&s2);
    /* wg.cu's wgmma kernels for tc.cu's tiles from 32 rows per expert (c->wg); with wgq.cu also
       from c->wgq_min rows per expert (DSI_CUDA_WGQ_MIN; 0: wg.cu's rule only): the decode's
       tiles on the FP8 tensor cores, blocks of 32 rows */
    bool wg = (tc && c->wg && (double)nk / E > 32) ||
              (rfast && q8 && c->wgq_min > 0 && (double)nk / E >= c->wgq_min);
    gv = gv && !wg;
    /* (wgp.cu: the routed tiles on the FP8 tensor cores with a producer warpgroup, c->wg_p;
       tiles of 128 rows and the rest, not balanced: a last tile of up to 64 rows runs one of its
       two consumer warpgroups) */
    bool wp = c->wg_p && q8 && wg && wgp_w_ok(&r1) && wgp_w_ok(&r3) && wgp_w_ok(&r2);
    if (!c->wg_q8 && !wp) q8 = false; /* (DSI_CUDA_WG_P alone: the codes only for wgp.cu's calls) */
    /* (wg.cu's tiles of equal rows, each block's wgmma as wide as its tile's rows: c->wg_dyn) */
    bool wdyn = c->wg_dyn;
    int rx = wp   ? 128
             : wg ? q8   ? wgq_pick_bn(c, (double)nk / E)
                    : rs ? wgr_pick_bn_routed(c, (double)nk / E)
                         : wg_pick_bn(c, (double)nk / E, wdyn)
             : tc ? tc_pick_bn(c, (double)nk / E)
             : gv ? 8 * gnt
                  : pick_rx((double)nk / E);
    /* the shared expert: implicit tiles over all rows */
    bool stc = a->fast && n >= c->tc_dense_min && tc_moe_ok(&s1, &s3, &s2, D, I, a->x);
    /* (below tc.cu's floor: tiles of 32 rows, or 16 or 8 where those do not fit in shared
       memory; step 20: the exact kernels took 17-63 rows, 3-4x slower) */
    int snt = gvf_moe_nt(n);
    while (snt > 1 && !gvf_moe_ok(c, &s1, &s3, &s2, D, I, a->x, n, snt))
        snt /= 2;
    bool sgv = a->fast && !stc && gvf_moe_ok(c, &s1, &s3, &s2, D, I, a->x, n, snt);
    /* (the wgmma kernels from c->wg_shared_min rows, default 128 since step 37: at a decode
       batch of 256 wgr.cu's blocks of 64 rows measured -1.4% a step against tc.cu's tiles,
       its 128- and 192-row blocks level, as wg.cu's 192-row blocks were slower in step 23;
       below 512 rows wgr.cu's blocks of c->wg_shared_bn rows at most) */
    bool swg = stc && c->wg && n >= c->wg_shared_min;
    int srx = swg   ? q8   ? wgq_pick_bn(c, (double)n)
                      : rs ? (n < 512 ? std::min(wgr_pick_bn(c, (double)n), c->wg_shared_bn)
                                      : wgr_pick_bn(c, (double)n))
                           : wg_pick_bn(c, (double)n, wdyn)
                : stc ? tc_pick_bn(c, (double)n)
              : sgv ? 8 * snt
                    : pick_rx((double)n);
    /* (wgr.cu's TMA copies, c->wgr_tma: x copied by position, nk + n rows, after the grouping;
       step 27's experiment) */
    bool tma = rs && !q8 && c->wgr_tma && (wg || swg) && wdyn;
    q8 = q8 && (wg || swg);
    int64_t max_tiles = nk / rx + 1 + (nk < E ? nk : E);
    if (max_tiles > nk) max_tiles = nk;
    size_t o_perm = 0, o_tiles = cu_align((size_t)nk * 4),
           o_nt = o_tiles + cu_align((size_t)max_tiles * 16);
    size_t o_inv = o_nt + 256, o_h = o_inv + cu_align((size_t)nk * 4),
           o_out = o_h + cu_align((size_t)((nk + n) * I) * 4);
    /* wg.cu reads bf16 copies of x and h; wgq.cu their FP8 codes and scales */
    size_t o_x16 = o_out + cu_align((size_t)((nk + n) * D) * 4);
    size_t xs8 = cu_align((size_t)(n * D)), hs8 = cu_align((size_t)((nk + n) * I));
    size_t o_h16 = o_x16 + (q8 ? xs8 + cu_align((size_t)(n * (D / 128)) * 4)
                               : cu_align((size_t)((tma ? nk + n : n) * D) * 2));
    size_t total = !(wg || swg) ? o_x16
                   : q8         ? o_h16 + hs8 + cu_align((size_t)((nk + n) * (I / 128)) * 4)
                                : o_h16 + cu_align((size_t)((nk + n) * I) * 2);
    char *s = (char *)cu_scratch(c, CU_SCR_OP, total);
    if (!s) return;
    struct moe_p p;
    p.x = a->x;
    p.n = n;
    p.D = D;
    p.I = I;
    p.topk = a->topk;
    p.perm = (const int32_t *)(s + o_perm);
    p.tiles = (const int4 *)(s + o_tiles);
    p.n_tiles = (const int32_t *)(s + o_nt);
    p.tab = tab;
    p.sb_max = sb_max;
    p.fexp = c->wg_exp;
    p.w1 = r1;
    p.w3 = r3;
    p.w2 = r2;
    p.weight = a->weight;
    p.limit = a->limit;
    p.round = a->round_bf16;
    p.stage = c->xstage;
    p.h = (float *)(s + o_h);
    p.out = (float *)(s + o_out);
    p.out16 = nullptr; /* (set for the routed rows below, after the shared expert's copy) */
    p.x16 = (wg || swg) && !q8 ? (const uint16_t *)(s + o_x16) : NULL;
    p.h16 = (wg || swg) && !q8 ? (const uint16_t *)(s + o_h16) : NULL;
    p.x16_pos = tma;
    p.x8 = q8 ? (const uint8_t *)(s + o_x16) : NULL;
    p.x8s = q8 ? (const float *)(s + o_x16 + xs8) : NULL;
    p.h8 = q8 ? (const uint8_t *)(s + o_h16) : NULL;
    p.h8s = q8 ? (const float *)(s + o_h16 + hs8) : NULL;
    if (p.x16 && !tma) launch_wg_bf16(c, a->x, n, D, D, (uint16_t *)p.x16, D, rs);
    /* (x is act_quant's output: its codes, exact) */
    if (q8 && !launch_wgq_codes(c, a->x, n, D, D, (uint8_t *)p.x8, (float *)p.x8s, NULL, n)) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "moe: FP8 codes of x (%lld columns) not taken",
                (long long)D);
        return;
    }
    /* the shared expert on the side stream (default; see cu_moe_side_init): on
       gvf.cu (below 64 rows), its h rows quantised alone; forked before the grouping */
    bool sfirst = cu_l2pf_on(c, n);
    bool side = c->moe_side && sgv && !(wg || swg) && !q8 && !sfirst;
    struct moe_side_wait sw = {c, false};
    if (side && (cudaEventRecord(c->moe_fork, c->stream) != cudaSuccess ||
                 cudaStreamWaitEvent(c->moe_side, c->moe_fork, 0) != cudaSuccess)) {
        cudaGetLastError();
        if (c->capturing) c->capture_bad = true;
        side = false;
    }
    int32_t *inv = tma && c->wg_tok ? (int32_t *)(s + o_inv) : nullptr; /* (the copy by token) */
    cu_launch(c, k_moe_group, 1, 1024, 0, a->idx, nk, E, rx, wg && wdyn && !wp,
              (int32_t *)(s + o_perm), (int4 *)(s + o_tiles), (int32_t *)(s + o_nt), inv);
    if (!cu_check(c, "moe group")) return;
    if (tma) launch_wg_bf16_pos(c, a->x, n, nk, p.perm, inv, a->topk, D, (uint16_t *)p.x16);
    /* The up projections, routed and shared; the shared expert first where the forward's
       prefetch hints are taken (cu_l2pf_on, step 36): its weights were hinted before the FFN's
       hc_pre, and the routed experts' weights (~8 MB an expert) streamed before its own read
       would evict them from L2. The two write separate rows of h: the order changes nothing. */
    struct moe_p ps = p; /* (out16 stays the routed rows': set after this copy) */
    /* the routed rows' outputs in bf16 (c->moe_o16, step 47) where the routed down runs on
       wg.cu / wgr.cu with rounded outputs (D even: wg_finish stores pairs): in the first half of
       their fp32 rows' space (the shared rows' stay fp32 after it), half the bytes for the
       down's stores and the combine */
    if (c->moe_o16 && wg && !wp && !q8 && p.round && D % 2 == 0) p.out16 = (uint16_t *)p.out;
    ps.tiles = NULL;
    ps.sb_max = sb_max_sh;
    ps.w1 = s1;
    ps.w3 = s3;
    ps.w2 = s2;
    /* One projection: up or down, of the routed experts (their tiles) or of the shared expert
       (implicit tiles over all rows), on the kernels chosen above. */
    auto proj = [&](bool up, bool sh) {
        const struct moe_p *mp = sh ? &ps : &p;
        int bn = sh ? srx : rx, nt = sh ? snt : gnt;
        unsigned gy = sh ? (unsigned)cu_div_up(n, srx) : (unsigned)max_tiles;
        bool kwg = sh ? swg : wg, ktc = sh ? stc : tc, kgv = sh ? sgv : gv;
        int pr = cu_prof_begin(c, up   ? (sh ? "moe.shared_up" : "moe.up")
                                  : sh ? "moe.shared_down"
                                       : "moe.down");
        /* the shared down projection on lt.cu (cuBLASLt FP8) where it takes the call
           (c->moe_lt; from lt_min rows): h's rows are act_quant's and the outputs bf16-rounded,
           as for the dense GEMMs it takes (step 24; step 23 had the gate and up there too,
           outside the MoE test's bound) */
        struct cu_gemm_call sl = {
            &s2, 0, D, p.h + nk * I, n,    I, p.out + nk * D, D, p.round,
            1,   0, 0, true,         false}; /* struct cu_gemm_call's field order */
        bool slt =
            !up && sh && c->moe_lt && a->fast && a->act_quant && launch_lt_gemm(c, &sl, true);
        dim3 gx((unsigned)(up ? cu_div_up(I, CU_WARPS) : cu_div_up(D, CU_WARPS * GEMM_RW)), gy);
        bool ok = slt   ? !c->sticky
                  : kwg ? ((!sh && wp && launch_wgp_moe(c, mp, up, gy)) ||
                           launch_wg_moe(c, mp, up, bn, rs, wdyn, gy)) &&
                              !c->sticky
                  : ktc ? launch_tc_moe(c, mp, up, bn, gy) && !c->sticky
                  : kgv ? launch_gvf_moe(c, mp, up, nt, gy) && !c->sticky
                  : up  ? moe_up(c, mp, (sh ? s1 : r1).type, bn, gx)
                        : moe_down(c, mp, (sh ? s2 : r2).type, bn, gx);
        cu_prof_end(c, pr);
        return ok;
    };
    if (side) { /* the shared expert's three launches on the side stream, then its join */
        cudaStream_t keep = c->stream;
        c->stream = c->moe_side;
        bool ok = proj(true, true);
        if (ok && a->act_quant) launch_act_quant(c, p.h + nk * I, p.h + nk * I, n, I, I, I, 128);
        if (ok && !c->sticky) proj(false, true);
        cudaError_t e = cudaEventRecord(c->moe_join, c->moe_side);
        c->stream = keep;
        if (e != cudaSuccess) {
            cudaGetLastError();
            if (c->capturing) c->capture_bad = true;
            cu_fail(c, DSI_ERR_DEVICE, "moe: the shared expert's stream: %s",
                    cudaGetErrorString(e));
            return;
        }
        sw.pending = true;
    }
    if (!(side     ? proj(true, false)
          : sfirst ? proj(true, true) && proj(true, false)
                   : proj(true, false) && proj(true, true)))
        return;
    /* h's act_quant and its bf16 copy for wgr.cu in one pass (step 27): the routed rows' floats
       are not read again when their down projection is on wgr.cu (the shared rows' may be:
       lt.cu, tc.cu) */
    bool q16 = a->act_quant && p.h16 && rs &&
               launch_wg_bf16_q8(c, p.h, nk + n, I, I, (uint16_t *)p.h16, I, wg ? nk : 0);
    /* (wgq.cu: h's act_quant and its codes in one pass, the same rows' floats kept) */
    if (q8 && !launch_wgq_codes(c, p.h, nk + n, I, I, (uint8_t *)p.h8, (float *)p.h8s, p.h,
                                wg ? nk : 0)) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "moe: FP8 codes of h (%lld columns) not taken",
                (long long)I);
        return;
    }
    q16 = q16 || q8;
    if (c->sticky) return;
    if (!q16 && a->act_quant) launch_act_quant(c, p.h, p.h, side ? nk : nk + n, I, I, I, 128);
    if (!q16 && p.h16) launch_wg_bf16(c, p.h, nk + n, I, I, (uint16_t *)p.h16, I, rs);
    /* the down projections, in the up projections' order */
    if (!(side     ? proj(false, false)
          : sfirst ? proj(false, true) && proj(false, false)
                   : proj(false, false) && proj(false, true)))
        return;
    sw.wait(); /* the shared rows of out */
    struct comb_p cp = {p.out, p.out16, a->idx, E, a->topk, n, D, a->y, a->round_bf16};
    if (D % 4 == 0 && (uintptr_t)a->y % 16 == 0)
        cu_launch(c, k_moe_combine4,
                  dim3((unsigned)cu_div_up(D / 4, 256), (unsigned)std::min<int64_t>(n, 65535)), 256,
                  0, cp);
    else
        cu_launch(c, k_moe_combine, (unsigned)cu_div_up(n * D, 256), 256, 0, cp);
    cu_check(c, "moe combine");
}
