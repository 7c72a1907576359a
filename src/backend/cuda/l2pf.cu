/* l2pf.cu - the backend's prefetch hint (dsi_prefetch_args): weights an op issued later will
 * read, brought into L2 on a side stream while the ops in between run (step 35,
 * DSI_CUDA_L2PF: steps of at most that many rows; 0, the default: hints ignored; measured
 * level at every batch in step 36, docs/cuda.md: the walks wait on their loads' latency with
 * too few warps rather than on DRAM).
 *
 * Why: a decode step of few rows alternates latency-bound ops (hc_pre, the norms, the cache
 * stores, the attention: tens of microseconds each with DRAM nearly idle) with GEMMs that stream
 * tens of MB of weights. A hint issued before the latency-bound ops lets the DRAM work during
 * them; the GEMM then reads its weight from L2 (50 MB on the H100 and H200).
 *
 * How: the hint records an event on the main stream, the side stream waits for it, and one
 * small kernel on the side stream issues cp.async.bulk.prefetch.L2 over the weights' bytes (data
 * and scales) and ends; the transfers go on without it. Nothing waits for the side stream but
 * the end of a captured step (cu_l2pf_join: a capture must join every stream it forked), so the
 * main stream never stalls on a hint. A hint changes no result: prefetches only move lines into
 * L2.
 *
 * Ownership: the side stream and its two events belong to the cu_ctx (cu_l2pf_init at backend
 * creation when DSI_CUDA_L2PF is set, cu_l2pf_free with the backend). */
#include "common.cuh"

#include <algorithm>
#include <stdlib.h>
#include <string.h>

#define L2PF_RANGES 8 /* a hint's byte ranges at most (DSI_PREFETCH_MAX weights, scales) */
#define L2PF_CHUNK  (16u << 10) /* bytes per bulk prefetch */
#define L2PF_BLOCKS 16          /* blocks of 32 threads issuing the prefetches */

struct l2pf_p {
    const uint8_t *p[L2PF_RANGES];
    uint64_t n[L2PF_RANGES];
    uint64_t total; /* sum of n */
};

/* Chunk i of the concatenated ranges goes to thread i mod (blocks x 32); a chunk over the end
 * of a range prefetches its pieces in both. */
__global__ void __launch_bounds__(32) k_l2pf(struct l2pf_p p) {
    uint64_t stride = (uint64_t)gridDim.x * 32 * L2PF_CHUNK;
    int r = 0;
    uint64_t base = 0; /* offset of range r in the concatenation */
    for (uint64_t c0 = ((uint64_t)blockIdx.x * 32 + threadIdx.x) * L2PF_CHUNK; c0 < p.total;
         c0 += stride) {
        uint64_t c1 = c0 + L2PF_CHUNK < p.total ? c0 + L2PF_CHUNK : p.total;
        while (r < L2PF_RANGES && c0 >= base + p.n[r]) {
            base += p.n[r];
            r++;
        }
        uint64_t o = c0, b = base;
        for (int q = r; q < L2PF_RANGES && o < c1; q++) {
            uint64_t e = c1 < b + p.n[q] ? c1 : b + p.n[q];
            if (e > o) cu_prefetch_l2(p.p[q] + (o - b), e - o);
            o = e;
            b += p.n[q];
        }
    }
}

/* Bytes of a weight tensor (all its rows) */
static uint64_t l2pf_bytes(const struct dsi_tensor *t) {
    int64_t rows = 1;
    for (int d = 1; d < 4; d++)
        rows *= t->ne[d] > 0 ? t->ne[d] : 1;
    return (uint64_t)(dsi_tensor_row_bytes(t) * rows);
}

int cu_l2pf_init(struct cu_ctx *c) {
    const char *e = getenv("DSI_CUDA_L2PF");
    c->l2pf_max = e && *e ? atoi(e) : 0;
    if (c->l2pf_max <= 0) return 0;
    if (cu_fork_make(&c->pf_stream, &c->pf_fork, &c->pf_join)) {
        c->l2pf_max = 0;
        return -1;
    }
    return 0;
}

void cu_l2pf_free(struct cu_ctx *c) {
    cu_fork_free(&c->pf_stream, &c->pf_fork, &c->pf_join);
    c->l2pf_max = 0;
    c->pf_pending = false;
}

/* The main stream waits for the hints issued so far (before a capture ends). */
void cu_l2pf_join(struct cu_ctx *c) {
    if (!c->pf_pending) return;
    if (cudaStreamWaitEvent(c->stream, c->pf_join, 0) != cudaSuccess) {
        cudaGetLastError();
        if (c->capturing) c->capture_bad = true;
    }
    c->pf_pending = false;
}

bool cu_l2pf_on(const struct cu_ctx *c, int64_t rows) {
    return c->pf_stream && rows <= c->l2pf_max && !c->sticky;
}

extern "C" void cuda_prefetch(struct dsi_backend *be, const struct dsi_prefetch_args *a) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (!cu_l2pf_on(c, a->rows)) return;
    struct l2pf_p p;
    memset(&p, 0, sizeof(p));
    int k = 0;
    for (int i = 0; i < DSI_PREFETCH_MAX; i++) {
        const struct dsi_tensor *t = a->w[i];
        if (!t || !t->data) continue;
        const struct dsi_tensor *parts[2] = {t, t->scale};
        for (int j = 0; j < 2 && k < L2PF_RANGES; j++) {
            uint64_t nb = parts[j] && parts[j]->data ? l2pf_bytes(parts[j]) : 0;
            if (!nb) continue;
            p.p[k] = (const uint8_t *)parts[j]->data;
            p.n[k] = nb;
            p.total += p.n[k++];
        }
    }
    if (!p.total) return;
    unsigned blocks = (unsigned)std::min<uint64_t>(L2PF_BLOCKS, (p.total + 32ull * L2PF_CHUNK - 1) /
                                                                    (32ull * L2PF_CHUNK));
    if (cudaEventRecord(c->pf_fork, c->stream) != cudaSuccess ||
        cudaStreamWaitEvent(c->pf_stream, c->pf_fork, 0) != cudaSuccess) {
        cudaGetLastError();
        if (c->capturing) c->capture_bad = true;
        return;
    }
    k_l2pf<<<blocks, 32, 0, c->pf_stream>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaEventRecord(c->pf_join, c->pf_stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (c->capturing) c->capture_bad = true;
    }
    c->pf_pending = true; /* (joined even after a failure: the fork may have been recorded) */
}
