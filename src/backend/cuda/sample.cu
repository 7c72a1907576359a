/* sample.cu - the sample op (cpu/sample.c): per row, the token core/draw.c picks (greedy argmax,
 * or temperature -> top-k -> top-p -> min-p -> keyed Gumbel-max draw) with the CPU's arithmetic:
 * x / T in float, the Gumbel noise from core/philox.h (the same code, __host__ __device__),
 * sums and thresholds in double in the CPU's order. One block of 1024 threads per row:
 *
 *   argmax       strided scan, then a block reduction in the order (value desc, id asc).
 *   no top-k     Gumbel-max over the row (one Philox block per 4 tokens), reduced in the order
 *                (value desc, id asc). A token whose x / T plus the largest possible noise
 *                (22.9) is below a value already drawn (the argmax's, the thread's best) cannot
 *                win and skips its noise.
 *   top-k        exact radix select of the k <= 1024 best by a 64-bit key (order-preserving bits
 *                of x / T, then ~id: distinct keys, the CPU's order), 8 bits per pass over the
 *                row, stopping as soon as the boundary bin is taken whole; a gather of the k
 *                keys, a bitonic sort in shared memory, then top-p on one thread in sorted order
 *                (the exponentials and divisions computed in parallel: the same doubles), min-p,
 *                and the Gumbel-max over the kept prefix.
 *
 * Rows the op does not take (dsi_sample_op_takes: top-p without top-k, top-k > 1024) get -1:
 * the row parameters are device memory, so the op cannot report them as a host error. */
#include "common.cuh"

#include "core/philox.h"

#include <limits.h>

#define SMP_T    1024 /* threads per block (one row) */
#define SMP_W    (SMP_T / 32)
#define SMP_K    DSI_SAMPLE_OP_MAX_TOPK /* candidates: at most one per thread in the sort */
#define SMP_FULL 0xffffffffu
/* Above the largest Gumbel value dsi_gumbel_of returns (-log(-log(1 - 2^-33)) = 22.874). */
#define SMP_GMAX 22.9

struct smp_p {
    const float *logits;
    int64_t ld;
    int n;
    const struct dsi_sample_row *rows;
    int32_t *out;
};

struct smp_sh {
    unsigned long long key[SMP_K]; /* top-k keys, sorted in place */
    double e[SMP_K];               /* top-p: exp, then exp / z */
    float s[SMP_K];                /* sorted candidates: x / T */
    int id[SMP_K];                 /* sorted candidates: token */
    int hist[256];
    float rv[SMP_W];
    double rg[SMP_W];
    int ri[SMP_W];
    int sel_b, sel_above, sel_cnt, cnt, m;
    double z;
};

static_assert(SMP_K <= SMP_T, "the sort keeps one candidate per thread");
static_assert(SMP_W == 32, "block reductions finish in one warp");

/* dsi_sample_op_takes (a host function) for device code. */
__device__ __forceinline__ bool smp_takes(const struct dsi_sample_row &r, int n) {
    if (!(r.temperature > 0.0f)) return true;
    bool topk = r.top_k > 0 && r.top_k < n;
    bool topp = r.top_p > 0.0f && r.top_p < 1.0f;
    return topk ? r.top_k <= DSI_SAMPLE_OP_MAX_TOPK : !topp;
}

/* Order-preserving bits of a float (larger float, larger key; -0 and +0 equal). */
__device__ __forceinline__ uint32_t smp_key(float f) {
    uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The candidate order as one integer: larger scaled logit first, then the lower id. */
__device__ __forceinline__ unsigned long long smp_comp(float s, int i) {
    return ((unsigned long long)smp_key(s) << 32) | (unsigned long long)(0xffffffffu - (uint32_t)i);
}

/* Block-wide best (v, id): the larger value, then the lower id; every thread gets it. */
__device__ void smp_best_f(float &v, int &id, struct smp_sh &sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_down_sync(SMP_FULL, v, o);
        int jd = __shfl_down_sync(SMP_FULL, id, o);
        if (w > v || (w == v && jd < id)) {
            v = w;
            id = jd;
        }
    }
    __syncthreads(); /* an earlier reduction's readers are done */
    if (lane == 0) {
        sh.rv[wid] = v;
        sh.ri[wid] = id;
    }
    __syncthreads();
    if (wid == 0) {
        v = sh.rv[lane];
        id = sh.ri[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_down_sync(SMP_FULL, v, o);
            int jd = __shfl_down_sync(SMP_FULL, id, o);
            if (w > v || (w == v && jd < id)) {
                v = w;
                id = jd;
            }
        }
        if (lane == 0) {
            sh.rv[0] = v;
            sh.ri[0] = id;
        }
    }
    __syncthreads();
    v = sh.rv[0];
    id = sh.ri[0];
}

/* smp_best_f for double values. */
__device__ void smp_best_d(double &v, int &id, struct smp_sh &sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        double w = __shfl_down_sync(SMP_FULL, v, o);
        int jd = __shfl_down_sync(SMP_FULL, id, o);
        if (w > v || (w == v && jd < id)) {
            v = w;
            id = jd;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sh.rg[wid] = v;
        sh.ri[wid] = id;
    }
    __syncthreads();
    if (wid == 0) {
        v = sh.rg[lane];
        id = sh.ri[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            double w = __shfl_down_sync(SMP_FULL, v, o);
            int jd = __shfl_down_sync(SMP_FULL, id, o);
            if (w > v || (w == v && jd < id)) {
                v = w;
                id = jd;
            }
        }
        if (lane == 0) {
            sh.rg[0] = v;
            sh.ri[0] = id;
        }
    }
    __syncthreads();
    v = sh.rg[0];
    id = sh.ri[0];
}

/* The CPU's argmax of x[n]: the first of the largest values (a NaN at 0 wins, as in its scan). */
__device__ int smp_argmax(const float *x, int n, struct smp_sh &sh) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n; i += SMP_T) {
        float xv = x[i];
        if (xv > bv || (xv == bv && i < bi)) {
            bv = xv;
            bi = i;
        }
    }
    smp_best_f(bv, bi, sh);
    return x[0] != x[0] ? 0 : bi;
}

/* Warp 0: the bin b of hist where the kk-th largest lies (bins >= b hold >= kk, bins > b fewer):
 * sel_b = b, sel_above = the count in bins > b, sel_cnt = hist[b]. */
__device__ void smp_pick_bin(struct smp_sh &sh, int kk) {
    int lane = threadIdx.x;
    int h[8], l = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        h[j] = sh.hist[8 * lane + j];
        l += h[j];
    }
    int x = l; /* inclusive suffix sum over lanes >= lane */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_down_sync(SMP_FULL, x, o);
        if (lane + o < 32) x += y;
    }
    int s = x - l;
#pragma unroll
    for (int j = 7; j >= 0; j--) {
        if (s < kk && s + h[j] >= kk) {
            sh.sel_b = 8 * lane + j;
            sh.sel_above = s;
            sh.sel_cnt = h[j];
        }
        s += h[j];
    }
}

/* No top-k (and no top-p): the Gumbel-max over every token min-p keeps. A token can only win
 * if x / T + SMP_GMAX reaches the best value seen: the thread's best so far, or the argmax's
 * value (which wins unless something beats it; if min-p drops the argmax it drops every token).
 * The test is in rounded double arithmetic, which is monotonic, so a skipped token's value is
 * strictly below a value that is drawn. */
__device__ int smp_draw_all(const float *x,
                            int n,
                            const struct dsi_sample_row &row,
                            int amax,
                            double minp_th,
                            struct smp_sh &sh) {
    float t = row.temperature;
    double g = -INFINITY,
           lim = (double)(x[amax] / t) +
                 dsi_philox_gumbel(row.seed, row.stream, DSI_PURPOSE_SAMPLE, row.pos, amax);
    int gi = INT_MAX;
    int ng = (n + 3) / 4;
    for (int q = threadIdx.x; q < ng; q += SMP_T) { /* ascending tokens per thread */
        int v0 = 4 * q;
        float sv[4];
        unsigned keep = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            sv[j] = 0.0f;
            if (v0 + j < n) {
                sv[j] = x[v0 + j] / t;
                double d = (double)sv[j];
                if (!(d < minp_th) && !(d + SMP_GMAX < lim)) keep |= 1u << j;
            }
        }
        if (!keep) continue;
        uint32_t w[4];
        dsi_philox_block(row.seed, row.stream, DSI_PURPOSE_SAMPLE, row.pos, q, w);
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (keep >> j & 1u) {
                double v = (double)sv[j] + dsi_gumbel_of(w[j]);
                if (v > g) { /* strict: ties keep the lower id */
                    g = v;
                    gi = v0 + j;
                    if (v > lim) lim = v;
                }
            }
    }
    smp_best_d(g, gi, sh);
    return g > -INFINITY ? gi : amax;
}

/* top-k (k < n, k <= SMP_K), then top-p, min-p and the draw. */
__device__ int
smp_draw_topk(const float *x, int n, const struct dsi_sample_row &row, struct smp_sh &sh) {
    int lane = threadIdx.x & 31, k = row.top_k;
    float t = row.temperature;
    /* radix select: the k keys >= prefix (under mask); pass 0 also finds the argmax */
    unsigned long long prefix = 0, mask = 0;
    int kk = k; /* still to take among the keys equal to prefix under mask */
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int pass = 0; pass < 8; pass++) {
        int shift = 56 - 8 * pass;
        for (int b = threadIdx.x; b < 256; b += SMP_T)
            sh.hist[b] = 0;
        __syncthreads();
        for (int base = 0; base < n; base += SMP_T) { /* uniform trip count: whole warps */
            int i = base + threadIdx.x, bin = -1;
            if (i < n) {
                float xv = x[i];
                if (pass == 0 && (xv > bv || (xv == bv && i < bi))) {
                    bv = xv;
                    bi = i;
                }
                unsigned long long c = smp_comp(xv / t, i);
                if ((c & mask) == prefix) bin = (int)((c >> shift) & 255u);
            }
            if (__any_sync(SMP_FULL, bin >= 0)) { /* warp-uniform */
                unsigned peers = __match_any_sync(SMP_FULL, bin);
                if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], __popc(peers));
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) smp_pick_bin(sh, kk);
        __syncthreads();
        prefix |= (unsigned long long)sh.sel_b << shift;
        mask |= 0xffull << shift;
        kk -= sh.sel_above;
        if (sh.sel_cnt == kk) break; /* the boundary bin is taken whole (always by pass 7) */
    }
    smp_best_f(bv, bi, sh);
    int amax = x[0] != x[0] ? 0 : bi;
    float smax = x[amax] / t;
    double minp_th = row.min_p > 0.0f ? (double)smax + log((double)row.min_p) : -INFINITY;
    /* gather the k keys (any order: the keys are distinct, the sort fixes it) */
    if (threadIdx.x == 0) sh.cnt = 0;
    __syncthreads();
    for (int base = 0; base < n; base += SMP_T) {
        int i = base + threadIdx.x;
        bool take = false;
        unsigned long long c = 0;
        if (i < n) {
            c = smp_comp(x[i] / t, i);
            take = (c & mask) >= prefix;
        }
        unsigned bal = __ballot_sync(SMP_FULL, take);
        if (bal) {
            int slot0 = 0;
            if (lane == 0) slot0 = atomicAdd(&sh.cnt, __popc(bal));
            slot0 = __shfl_sync(SMP_FULL, slot0, 0);
            int slot = slot0 + __popc(bal & ((1u << lane) - 1u));
            if (take && slot < SMP_K) sh.key[slot] = c;
        }
    }
    __syncthreads();
    /* bitonic sort, descending, over the next power of two (padding 0 sorts last) */
    int K2 = 1;
    while (K2 < k)
        K2 <<= 1;
    if (threadIdx.x >= k && threadIdx.x < K2) sh.key[threadIdx.x] = 0;
    for (int size = 2; size <= K2; size <<= 1)
        for (int j = size >> 1; j > 0; j >>= 1) {
            __syncthreads();
            int i = threadIdx.x, p = i ^ j;
            if (i < K2 && p > i) {
                unsigned long long a = sh.key[i], b = sh.key[p];
                bool desc = (i & size) == 0;
                if (desc ? a < b : a > b) {
                    sh.key[i] = b;
                    sh.key[p] = a;
                }
            }
        }
    __syncthreads();
    if (threadIdx.x < k) {
        int id = (int)(0xffffffffu - (uint32_t)sh.key[threadIdx.x]);
        sh.id[threadIdx.x] = id;
        sh.s[threadIdx.x] = x[id] / t;
    }
    __syncthreads();
    int m = k;
    if (row.top_p > 0.0f && row.top_p < 1.0f) {
        if (threadIdx.x < k) sh.e[threadIdx.x] = exp((double)(sh.s[threadIdx.x] - smax));
        __syncthreads();
        if (threadIdx.x == 0) { /* the CPU's order of additions */
            double z = 0.0;
            for (int i = 0; i < k; i++)
                z += sh.e[i];
            sh.z = z;
        }
        __syncthreads();
        if (threadIdx.x < k) sh.e[threadIdx.x] = sh.e[threadIdx.x] / sh.z;
        __syncthreads();
        if (threadIdx.x == 0) {
            double cum = 0.0;
            int mm = k;
            for (int i = 0; i < k; i++) {
                cum += sh.e[i];
                if (cum >= (double)row.top_p) {
                    mm = i + 1;
                    break;
                }
            }
            sh.m = mm;
        }
        __syncthreads();
        m = sh.m;
    }
    /* min-p cuts a prefix of the sorted list; the draw: the largest value, then the lower id */
    double g = -INFINITY;
    int gi = INT_MAX;
    if (threadIdx.x < m) {
        float s = sh.s[threadIdx.x];
        if (!((double)s < minp_th)) {
            int id = sh.id[threadIdx.x];
            double v = (double)s +
                       dsi_philox_gumbel(row.seed, row.stream, DSI_PURPOSE_SAMPLE, row.pos, id);
            if (v > g) {
                g = v;
                gi = id;
            }
        }
    }
    smp_best_d(g, gi, sh);
    return g > -INFINITY ? gi : sh.id[0];
}

/* grid (rows); SMP_T threads. */
__global__ void __launch_bounds__(SMP_T) k_sample(struct smp_p p) {
    cu_pdl_enter();
    __shared__ struct smp_sh sh;
    struct dsi_sample_row row = p.rows[blockIdx.x];
    const float *x = p.logits + (int64_t)blockIdx.x * p.ld;
    int n = p.n, tok;
    if (!smp_takes(row, n)) {
        tok = -1;
    } else if (!(row.temperature > 0.0f)) {
        tok = smp_argmax(x, n, sh);
    } else if (row.top_k > 0 && row.top_k < n) {
        tok = smp_draw_topk(x, n, row, sh);
    } else {
        int amax = smp_argmax(x, n, sh);
        float smax = x[amax] / row.temperature;
        double minp_th = row.min_p > 0.0f ? (double)smax + log((double)row.min_p) : -INFINITY;
        tok = smp_draw_all(x, n, row, amax, minp_th, sh);
    }
    if (threadIdx.x == 0) p.out[blockIdx.x] = tok;
}

extern "C" void cuda_sample(struct dsi_backend *be, const struct dsi_sample_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (a->n <= 0) return;
    if (a->n_vocab < 1 || a->n_vocab > ((int64_t)1 << 30) || a->ld < a->n_vocab || !a->logits ||
        !a->rows || !a->out || a->n > INT_MAX) {
        cu_fail(c, DSI_ERR_INVALID, "sample: %lld rows, n_vocab %lld, ld %lld", (long long)a->n,
                (long long)a->n_vocab, (long long)a->ld);
        return;
    }
    struct smp_p p;
    p.logits = a->logits;
    p.ld = a->ld;
    p.n = (int)a->n_vocab;
    p.rows = a->rows;
    p.out = a->out;
    cu_launch(c, k_sample, (unsigned)a->n, SMP_T, 0, p);
    cu_check(c, "sample");
}
