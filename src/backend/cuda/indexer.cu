/* indexer.cu - the lightning indexer (cpu_indexer): scores of every visible compressed key,
 *   score[r, i] = sum_h (w[r,h] * w_scale) * relu(q[r,h] . k_i) * score_scale   (h in order),
 * then per row the min(topk, visible) largest, ties by lower index, written in ascending index
 * order. The top-k is an exact radix select (4 passes of 8 bits over order-preserving keys)
 * followed by an index-ordered compaction, so it selects exactly what the CPU's sort does.
 * In `fast` numerics the scores may come from k_idx_scores_tc (tensor cores, another sum order);
 * the top-k is the same. */
#include "tc.cuh"

#include <algorithm>

#define IDX_TK 128 /* keys per score block (one thread each) */
#define IDX_TN 64  /* keys per tensor-core score block */
#define IDX_SB 8   /* k_idx_scores_tc's staging: float4 loads in flight per thread */

struct idx_p {
    struct cu_step st;
    const float *q, *w;
    int H, hd;
    const float *keys;            /* F32 rows */
    const uint8_t *keys4, *k4_sc; /* FP4 rows (fp4: backend.h's dsi_kv_rows) */
    bool fp4;
    int ratio;
    float score_scale, w_scale;
    int topk;
    int32_t *sel, *n_sel;
    float *Sc;
    int64_t maxv;
    int r0;
    int tpb; /* k_idx_scores_tc: key tiles per block (blockIdx.y: tiles tpb y .. tpb y + tpb - 1) */
};

/* dims 4c .. 4c + 3 of key row `row`: F32 as they are; FP4 (two bytes of codes, low nibble
 * first, times the 32-block's UE8M0 scale: exact in fp32) */
__device__ __forceinline__ float4 idx_k4(const struct idx_p &p, int64_t row, int c) {
    if (!p.fp4) return __ldg((const float4 *)(p.keys + row * p.hd) + c);
    uint32_t w = __ldg((const unsigned short *)(p.keys4 + row * (p.hd / 2)) + c);
    uint32_t e = __ldg(p.k4_sc + row * ((p.hd / 32 + 3) / 4 * 4) + c / 8);
    float s = __uint_as_float(e ? e << 23 : 0x00400000u); /* 2^(e - 127) */
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) { /* e2m1: sign, 2 exponent bits, 1 mantissa bit */
        uint32_t n = (w >> (4 * i)) & 15, ex = (n >> 1) & 3, m = n & 1;
        float a = ex ? __uint_as_float((ex + 126) << 23 | m << 22) : 0.5f * (float)m;
        v[i] = (n & 8 ? -a : a) * s;
    }
    return make_float4(v[0], v[1], v[2], v[3]);
}

/* cpu_dot on 16-byte aligned shared rows, n % 32 == 0. */
__device__ __forceinline__ float dot_sm(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int k = 0; k < n; k += 32) {
        float l[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j += 8) {
            float4 a0 = *(const float4 *)(a + k + j), a1 = *(const float4 *)(a + k + j + 4);
            float4 b0 = *(const float4 *)(b + k + j), b1 = *(const float4 *)(b + k + j + 4);
            l[0] += a0.x * b0.x;
            l[1] += a0.y * b0.y;
            l[2] += a0.z * b0.z;
            l[3] += a0.w * b0.w;
            l[4] += a1.x * b1.x;
            l[5] += a1.y * b1.y;
            l[6] += a1.z * b1.z;
            l[7] += a1.w * b1.w;
        }
        acc += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    return acc + 0.0f;
}

/* grid (rows, key tiles); thread = key. */
__global__ void __launch_bounds__(IDX_TK) k_idx_scores(struct idx_p p) {
    cu_pdl_enter();
    extern __shared__ float sm[];
    int hdp = p.hd + 4;
    float *qs = sm, *ws = sm + p.H * p.hd, *ks = ws + ((p.H + 3) & ~3);
    int r = p.r0 + blockIdx.x;
    int64_t nv = (p.st.pos[r] + 1) / p.ratio, i0 = (int64_t)blockIdx.y * IDX_TK;
    if (i0 >= nv) return;
    int nt = nv - i0 < IDX_TK ? (int)(nv - i0) : IDX_TK;
    int v4 = p.hd / 4, slot = p.st.slot[r];
    for (int e = threadIdx.x; e < p.H * v4; e += blockDim.x)
        ((float4 *)qs)[e] = ((const float4 *)(p.q + (int64_t)r * p.H * p.hd))[e];
    for (int e = threadIdx.x; e < p.H; e += blockDim.x)
        ws[e] = p.w[(int64_t)r * p.H + e];
    for (int e = threadIdx.x; e < nt * v4; e += blockDim.x) {
        int j = e / v4, c = e % v4;
        int64_t row =
            paged(p.st.page_table, p.st.max_pages, p.st.page_tokens, slot, i0 + j, p.ratio, 1);
        *(float4 *)(ks + j * hdp + 4 * c) = idx_k4(p, row, c);
    }
    __syncthreads();
    int j = threadIdx.x;
    if (j >= nt) return;
    float acc = 0.0f;
    for (int h = 0; h < p.H; h++) {
        float d = dot_sm(qs + h * p.hd, ks + j * hdp, p.hd);
        acc += (d > 0.0f ? d * p.score_scale : 0.0f) * (ws[h] * p.w_scale);
    }
    p.Sc[(int64_t)(r - p.r0) * p.maxv + i0 + j] = acc;
}

/* `fast` numerics: grid (rows, groups of p.tpb key tiles of IDX_TN, the tiles one after another
 * on the row's q staged once); H / 16 warps (H % 16 == 0, H <= 64,
 * hd % 16 == 0, hd <= 128). The row's q [H][hd] and the tile's keys [IDX_TN][hd] are rounded to
 * bf16 in shared memory, rows padded by 8 bf16 (ldmatrix without bank conflicts). q and the keys
 * are FP4 round trips with power-of-two scales in this model, so bf16 is exact and the products
 * are exact in fp32: only the order of the fp32 sums differs from k_idx_scores. Warp w computes
 * heads 16w .. 16w + 15 (the mma's M, q rows: A row-major) x the 64 keys (N: 8 n8 fragments,
 * key rows: the "col" B operand) over hd (K) with mma.sync m16n8k16 bf16 -> fp32; c[j][i] is
 * (head 16w + g + 8 (i / 2), key 8j + 2 t4 + i % 2), g = lane / 4, t4 = lane % 4. A lane weights
 * its two heads' relu'd products and adds them, the 8 lanes of a t4 add theirs (shuffles over
 * g), lanes 0..3 store the warp's 64 key sums and the warps' sums are added in warp order. */
__global__ void __launch_bounds__(128) k_idx_scores_tc(struct idx_p p) {
    cu_pdl_enter();
    extern __shared__ uint4 idx_smem[];
    int hd = p.hd, ld = hd + 8, nw = p.H / 16;
    uint16_t *Qs = (uint16_t *)idx_smem;     /* [H][ld] */
    uint16_t *Ks = Qs + p.H * ld;            /* [IDX_TN][ld] */
    float *ws = (float *)(Ks + IDX_TN * ld); /* [H] w * w_scale */
    float *red = ws + p.H;                   /* [nw][IDX_TN] */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int r = p.r0 + blockIdx.x;
    int64_t nv = (p.st.pos[r] + 1) / p.ratio, t0 = (int64_t)blockIdx.y * p.tpb;
    if (t0 * IDX_TN >= nv) return;
    int v4 = hd / 4, slot = p.st.slot[r];
    const bool c16 = p.fp4 && hd % 32 == 0 && (uintptr_t)p.keys4 % 16 == 0;
    const int64_t scs = (hd / 32 + 3) / 4 * 4; /* FP4 scale bytes a key row (idx_k4's) */
    /* q and the keys in rounds of IDX_SB float4 per thread, the loads of a round first (step 24:
       a load then its store per step, the keys' behind a branch and a page-table lookup, made
       ~48 dependent round trips per block): past the end a round reads its first float4 again,
       a key past the visible ones the tile's first key, stored as zeros */
    const float4 *q4 = (const float4 *)(p.q + (int64_t)r * p.H * hd);
    int nq4 = p.H * v4, bd = blockDim.x;
    for (int e0 = tid; e0 < nq4; e0 += IDX_SB * bd) {
        float4 f[IDX_SB];
#pragma unroll
        for (int u = 0; u < IDX_SB; u++)
            f[u] = q4[e0 + u * bd < nq4 ? e0 + u * bd : e0];
#pragma unroll
        for (int u = 0; u < IDX_SB; u++) {
            int e = e0 + u * bd;
            if (e < nq4)
                *(uint2 *)(Qs + (e / v4) * ld + 4 * (e % v4)) =
                    make_uint2(bf16x2_rn(f[u].x, f[u].y), bf16x2_rn(f[u].z, f[u].w));
        }
    }
    for (int e = tid; e < p.H; e += bd)
        ws[e] = p.w[(int64_t)r * p.H + e] * p.w_scale;
    /* the block's key tiles on the staged q (step 25: a block per tile staged q, 32 KB of loads
       as much as its keys, once per 64 keys) */
    for (int64_t tile = t0; tile < t0 + p.tpb; tile++) {
        int64_t i0 = tile * IDX_TN;
        if (i0 >= nv) break;
        int nt = nv - i0 < IDX_TN ? (int)(nv - i0) : IDX_TN;
        __syncthreads(); /* the tile before: its reads of Ks and red are done */
        /* FP4 keys (16-byte aligned rows, hd % 32 == 0; step 30): 16-byte chunks of 32 codes,
           each with its 32-block's scale byte, decoded to bf16 as FP4 weights are
           (tc_decode_w: exact), two chunks in flight per thread (a 64-key tile of 128 dims is
           256 chunks); else (F32 keys, step 29's FP4 path) float4 by float4 */
        const int cpk = hd / 32, nch = IDX_TN * cpk;
        for (int e0 = tid; c16 && e0 < nch; e0 += 2 * bd) {
            struct tc_wraw w[2];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int e = e0 + u * bd < nch ? e0 + u * bd : e0, j = e / cpk, c = e - j * cpk;
                int64_t kr = paged(p.st.page_table, p.st.max_pages, p.st.page_tokens, slot,
                                   i0 + (j < nt ? j : 0), p.ratio, 1);
                w[u].v[0] = __ldg((const uint4 *)(p.keys4 + kr * (hd / 2)) + c);
                w[u].sb = __ldg(p.k4_sc + kr * scs + c);
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int e = e0 + u * bd, j = e / cpk, c = e - j * cpk;
                if (e >= nch) break;
                uint4 d[4];
                tc_decode_w<DSI_TYPE_FP4_E2M1>(w[u], j < nt, d);
#pragma unroll
                for (int i = 0; i < 4; i++)
                    *(uint4 *)(Ks + j * ld + 32 * c + 8 * i) = d[i];
            }
        }
        for (int e0 = tid; !c16 && e0 < IDX_TN * v4; e0 += IDX_SB * bd) {
            int64_t kr[IDX_SB];
#pragma unroll
            for (int u = 0; u < IDX_SB; u++) { /* the page-table lookups, all in flight */
                int j = (e0 + u * bd) / v4;
                kr[u] = paged(p.st.page_table, p.st.max_pages, p.st.page_tokens, slot,
                              i0 + (j < nt ? j : 0), p.ratio, 1);
            }
            float4 f[IDX_SB];
#pragma unroll
            for (int u = 0; u < IDX_SB; u++) {
                int e = e0 + u * bd;
                f[u] = idx_k4(p, kr[u], e < IDX_TN * v4 ? e % v4 : 0);
            }
#pragma unroll
            for (int u = 0; u < IDX_SB; u++) {
                int e = e0 + u * bd, j = e / v4, c = e % v4;
                if (e >= IDX_TN * v4) break;
                float4 v = j < nt ? f[u] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                *(uint2 *)(Ks + j * ld + 4 * c) =
                    make_uint2(bf16x2_rn(v.x, v.y), bf16x2_rn(v.z, v.w));
            }
        }
        __syncthreads();
        float acc[8][4];
        acc_zero(acc);
        const uint16_t *qa = Qs + (warp * 16 + (lane & 15)) * ld + (lane >> 4) * 8;
        const uint16_t *kb = Ks + ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8;
        for (int k = 0; k < hd; k += 16) {
            uint32_t a[4];
            ldsm_x4(smem_u32(qa + k), a);
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                uint32_t b[4];
                ldsm_x4(smem_u32(kb + j * 8 * ld + k), b);
                mma_bf16(acc[j], a, b[0], b[1]);
                mma_bf16(acc[j + 1], a, b[2], b[3]);
            }
        }
        int g = lane >> 2, t4 = lane & 3;
        float w0 = ws[warp * 16 + g], w1 = ws[warp * 16 + g + 8];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float d0 = acc[j][e], d1 = acc[j][e + 2];
                float v = (d0 > 0.0f ? d0 * p.score_scale : 0.0f) * w0 +
                          (d1 > 0.0f ? d1 * p.score_scale : 0.0f) * w1;
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (g == 0) red[warp * IDX_TN + j * 8 + 2 * t4 + e] = v;
            }
        __syncthreads();
        for (int j = tid; j < nt; j += blockDim.x) {
            float s = 0.0f;
            for (int w = 0; w < nw; w++)
                s += red[w * IDX_TN + j];
            p.Sc[(int64_t)(r - p.r0) * p.maxv + i0 + j] = s;
        }
    }
}

__device__ __forceinline__ uint32_t order_key(float f) {
    uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive block scan of v (blockDim.x == 1024); *total gets the sum. */
__device__ __forceinline__ int block_scan(int v, int *wsum, int *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int s = wsum[lane], t = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        wsum[lane] = t - s; /* exclusive warp offsets */
        if (lane == 31) wsum[32] = t;
    }
    __syncthreads();
    *total = wsum[32];
    return wsum[warp] + x - v;
}

/* grid (rows); 1024 threads. */
__global__ void __launch_bounds__(1024) k_idx_topk(struct idx_p p) {
    cu_pdl_enter();
    __shared__ int hist[256];
    __shared__ int wsum[33];
    __shared__ uint32_t s_prefix;
    __shared__ int s_kk;
    int r = p.r0 + blockIdx.x;
    int64_t nv = (p.st.pos[r] + 1) / p.ratio;
    int k = (int)(nv < p.topk ? nv : p.topk);
    int32_t *sel = p.sel + (int64_t)r * p.topk;
    if (threadIdx.x == 0) p.n_sel[r] = k;
    if (nv <= p.topk) {
        for (int i = threadIdx.x; i < k; i += blockDim.x)
            sel[i] = i;
        return;
    }
    const float *S = p.Sc + (int64_t)(r - p.r0) * p.maxv;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_kk = k;
    }
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        uint32_t prefix = s_prefix;
        for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
            uint32_t u = order_key(S[i]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1);
        }
        __syncthreads();
        /* the bin b holding the kk-th largest: the keys above it (a scan of the bins from the
           top, thread t = bin 255 - t) fewer than kk, with it at least kk. One thread walking
           the 256 bins took ~4 us a pass (step 18); the same bin and count. */
        {
            int kk = s_kk, h = threadIdx.x < 256 ? hist[255 - threadIdx.x] : 0, total;
            int above = block_scan(h, wsum, &total); /* (its barriers: kk read by all first) */
            if (threadIdx.x < 256 && h > 0 && above < kk && above + h >= kk) {
                s_kk = kk - above;
                s_prefix = prefix | ((uint32_t)(255 - threadIdx.x) << shift);
            }
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    uint32_t T = s_prefix;
    int kk = s_kk; /* keys equal to T to take, lowest index first */
    int base_eq = 0, base_take = 0;
    for (int64_t c0 = 0; c0 < nv; c0 += blockDim.x) {
        int64_t i = c0 + threadIdx.x;
        uint32_t u = i < nv ? order_key(S[i]) : 0u;
        int gt = i < nv && u > T, eq = i < nv && u == T;
        int tot_eq, tot_take;
        int eq_rank = base_eq + block_scan(eq, wsum, &tot_eq);
        int take = gt || (eq && eq_rank < kk);
        int pos = base_take + block_scan(take, wsum, &tot_take);
        if (take) sel[pos] = (int32_t)i;
        base_eq += tot_eq;
        base_take += tot_take;
    }
}

extern "C" void cuda_indexer(struct dsi_backend *be, const struct dsi_indexer_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    const struct dsi_step *st = a->st;
    int n = st->n, H = (int)a->n_heads, hd = (int)a->head_dim;
    if (n <= 0) return;
    if (a->keys.dtype != DSI_KV_F32 && a->keys.dtype != DSI_KV_FP4) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "indexer: keys in format %d (want f32 or fp4)",
                a->keys.dtype);
        return;
    }
    if (hd % 32 || H <= 0 || a->ratio <= 0 || a->topk <= 0) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "indexer: head_dim %d, heads %d, ratio %d, topk %d", hd, H,
                a->ratio, a->topk);
        return;
    }
    int64_t maxv = (int64_t)st->max_pages * st->page_tokens / a->ratio;
    if (maxv < 1) maxv = 1;
    int64_t per_row = maxv * 4, cap = (int64_t)256 << 20;
    int nb = (int)(per_row * n <= cap ? n : cap / per_row > 0 ? cap / per_row : 1);
    float *Sc = (float *)cu_scratch(c, CU_SCR_OP, (size_t)(per_row * nb));
    if (!Sc) return;
    /* `fast` numerics: the products on tensor cores (k_idx_scores_tc; under 48 KB of shared
       memory: 36 KB at 64 heads x 128) */
    bool tc = a->fast && c->tc_idx && H % 16 == 0 && H <= 64 && hd % 16 == 0 && hd <= 128;
    size_t smem = tc ? (size_t)(H + IDX_TN) * (hd + 8) * 2 + (size_t)(H + H / 16 * IDX_TN) * 4
                     : ((size_t)H * hd + ((H + 3) & ~3) + (size_t)IDX_TK * (hd + 4)) * 4;
    static size_t smem_set = 0;
    if (!tc && smem > 48 * 1024 && smem > smem_set) {
        if (smem > c->smem_optin) {
            cu_fail(c, DSI_ERR_UNSUPPORTED,
                    "indexer: %d heads of %d need %zu bytes of shared memory", H, hd, smem);
            return;
        }
        cudaFuncSetAttribute(k_idx_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        smem_set = smem;
    }
    struct idx_p p;
    p.st = cu_step_of(st);
    p.q = a->q;
    p.w = a->w;
    p.H = H;
    p.hd = hd;
    p.fp4 = a->keys.dtype == DSI_KV_FP4;
    p.keys = p.fp4 ? NULL : (const float *)a->keys.data;
    p.keys4 = p.fp4 ? (const uint8_t *)a->keys.data : NULL;
    p.k4_sc = a->keys.sc;
    p.ratio = a->ratio;
    p.score_scale = a->score_scale;
    p.w_scale = a->w_scale;
    p.topk = a->topk;
    p.sel = a->sel;
    p.n_sel = a->n_sel;
    p.Sc = Sc;
    p.maxv = maxv;
    for (int r0 = 0; r0 < n; r0 += nb) {
        int rows = n - r0 < nb ? n - r0 : nb;
        p.r0 = r0;
        /* key tiles per block: up to 8 while the grid keeps ~8 blocks per SM (c->idx_tpb,
           DSI_CUDA_IDX_TPB: this many instead; 1: step 24's one tile a block) */
        int64_t tiles = cu_div_up(maxv, IDX_TN);
        int64_t tpb = c->idx_tpb > 0 ? c->idx_tpb : rows * tiles / (8 * (int64_t)c->n_sms);
        p.tpb = (int)std::max<int64_t>(1, std::min<int64_t>({8, tiles, tpb}));
        if (tc)
            cu_launch(c, k_idx_scores_tc, dim3(rows, (unsigned)cu_div_up(tiles, p.tpb)),
                      H / 16 * 32, smem, p);
        else
            cu_launch(c, k_idx_scores, dim3(rows, (unsigned)cu_div_up(maxv, IDX_TK)), IDX_TK, smem,
                      p);
        cu_launch(c, k_idx_topk, rows, 1024, 0, p);
        if (!cu_check(c, "indexer")) return;
    }
}
