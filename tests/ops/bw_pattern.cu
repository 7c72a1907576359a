/* bw_pattern.cu - DRAM read rate of gvf.cu's weight walk pattern against a plain stream, with no
 * arithmetic: is the batch-1 walk (33.5 MB FP8 weights in ~19 us, ~1.8 TB/s, where a copy moves
 * 2.9 TB/s on an H100) held back by its addresses or by its work? A standalone probe (not part of
 * the library or the tests; step 37), built here and run on the GPU machine:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o build/pre/bw_pattern \
 *       tests/ops/bw_pattern.cu
 *   build/pre/bw_pattern            (prints one line per pattern)
 * Patterns, each over 33.5 MB regions (8 of them in turn, 268 MB, so that no read hits L2 from
 * the run before), the median of 24 runs:
 *   stream      every thread 16-byte loads, consecutive threads consecutive addresses
 *   walk K ks   gvf.cu's addresses: tiles of 16 rows of K bytes, a warp's lane (g, t) reads 32
 *               bytes of rows g and g + 8 at group q (128 bytes a row), 2 groups a step, the next
 *               step's loads issued before the current step's values are used; a tile's groups
 *               over ks warps, interleaved; 2 blocks of 8 warps an SM, tiles persistent
 *   linear K ks the same bytes per warp and step as `walk`, each load instruction 512
 *               consecutive bytes of the tile (the tile's bytes in address order)
 * then a stream of 16.8 / 33.5 MB cold and after an L2 prefetch of it (l2pf.cu's bulk prefetch,
 * given time to land); then two 33.5 MB streams one after the other: plain launches, with
 * programmatic dependent launch (the second kernel's first loads before its wait), and one
 * kernel over both. */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bw_pattern: %s: %s\n", #x, cudaGetErrorString(e_));                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static __device__ __forceinline__ uint4 ldg_nc(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

/* 8 loads in flight a thread. */
__global__ void k_stream(const uint4 *a, int64_t n16, uint32_t *sink) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            st = (int64_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    for (; i + 7 * st < n16; i += 8 * st) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = ldg_nc(a + i + u * st);
#pragma unroll
        for (int u = 0; u < 8; u++)
            acc ^= fold(v[u]);
    }
    for (; i < n16; i += st)
        acc ^= fold(ldg_nc(a + i));
    if (acc == 0x12345678u) sink[0] = acc;
}

/* k_stream with programmatic dependent launch, as the library's kernels: the dependents may
 * start at once (launch_dependents first), and the first 8 loads of each thread are issued
 * before the wait for the previous kernel (weights do not depend on it; the activations would). */
__global__ void k_stream_pdl(const uint4 *a, int64_t n16, uint32_t *sink) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            st = (int64_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    bool waited = false;
    for (; i + 7 * st < n16; i += 8 * st) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = ldg_nc(a + i + u * st);
        if (!waited) {
            asm volatile("griddepcontrol.wait;" ::: "memory");
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            acc ^= fold(v[u]);
    }
    if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
    for (; i < n16; i += st)
        acc ^= fold(ldg_nc(a + i));
    if (acc == 0x12345678u) sink[0] = acc;
}

/* Bulk L2 prefetches of n bytes at a, 16 KB a thread in turn (l2pf.cu's kernel, one range). */
__global__ void k_prefetch(const uint8_t *a, int64_t n) {
    for (int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 16384; o < n;
         o += (int64_t)gridDim.x * blockDim.x * 16384) {
        unsigned len = (unsigned)(n - o < 16384 ? n - o : 16384);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a + o), "r"(len)
                     : "memory");
    }
}

/* LIN 0: gvf.cu's lane slices; 1: each load instruction 512 consecutive bytes. */
template <int LIN>
__global__ void __launch_bounds__(256, 2)
    k_walk(const uint8_t *w, int64_t rows, int K, int ks, uint32_t *sink) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int tpb = 8 / ks, kw = warp % ks;
    int64_t tiles = rows / 16;
    int ng = K / 128, qs = ks * 2, nb = (ng + qs - 1) / qs;
    int64_t per_it = (int64_t)gridDim.x * tpb;
    int n_iter = (int)((tiles + per_it - 1) / per_it), steps = n_iter * nb;
    uint32_t acc = 0;
    /* step s: tile iteration s / nb, step b = s % nb: groups (b ks + kw) 2 + {0, 1} */
    auto load = [&](int s, uint4(&v)[8]) {
        int it = s / nb, b = s - it * nb;
        int64_t tile = ((int64_t)blockIdx.x + (int64_t)it * gridDim.x) * tpb + warp / ks;
        bool in = tile < tiles;
        const uint8_t *base = w + (in ? tile : 0) * 16 * (int64_t)K;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int q = (b * ks + kw) * 2 + u;
            bool ok = in && q < ng;
            if (LIN == 0) { /* rows g, g + 8: 32 bytes at q 128 + t 32 */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint4 *p =
                        (const uint4 *)(base + (int64_t)(g + 8 * h) * K + q * 128 + t * 32);
                    v[u * 4 + h * 2] = ok ? ldg_nc(p) : make_uint4(0, 0, 0, 0);
                    v[u * 4 + h * 2 + 1] = ok ? ldg_nc(p + 1) : make_uint4(0, 0, 0, 0);
                }
            } else { /* the same 16 x 128 bytes of group q, as 4 runs of 512 bytes of the tile:
                        rows 4 j .. 4 j + 3 of the group's column ... taken as the tile's bytes
                        [q 2048 + j 512, + 512): the same amount, in address order */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint4 *p = (const uint4 *)(base + (int64_t)q * 2048 + j * 512) + lane;
                    v[u * 4 + j] = ok ? ldg_nc(p) : make_uint4(0, 0, 0, 0);
                }
            }
        }
    };
    uint4 a[8], b[8];
    if (steps > 0) load(0, a);
    for (int s = 0; s < steps; s += 2) {
        if (s + 1 < steps) load(s + 1, b);
#pragma unroll
        for (int i = 0; i < 8; i++)
            acc ^= fold(a[i]);
        if (s + 1 < steps) {
            if (s + 2 < steps) load(s + 2, a);
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc ^= fold(b[i]);
        }
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

/* Runs of run(r) for r = 0 .. n - 1, each timed alone between events after pre(r) (untimed);
 * the times in us of all but the first `skip`, sorted; empty after a CUDA error (printed). */
template <class Pre, class Run> static std::vector<float> timed(int n, int skip, Pre pre, Run run) {
    static cudaEvent_t e0, e1;
    std::vector<float> us;
    cudaError_t e = cudaSuccess;
    if (!e0 && (e = cudaEventCreate(&e0)) == cudaSuccess) e = cudaEventCreate(&e1);
    for (int r = 0; r < n && e == cudaSuccess; r++) {
        pre(r);
        float ms = 0;
        if ((e = cudaEventRecord(e0)) != cudaSuccess) break;
        run(r);
        if ((e = cudaGetLastError()) == cudaSuccess && (e = cudaEventRecord(e1)) == cudaSuccess &&
            (e = cudaEventSynchronize(e1)) == cudaSuccess)
            e = cudaEventElapsedTime(&ms, e0, e1);
        if (r >= skip) us.push_back(1000.0f * ms);
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "bw_pattern: %s\n", cudaGetErrorString(e));
        return {};
    }
    std::sort(us.begin(), us.end());
    return us;
}

int main() {
    const int64_t region = 32768LL * 1024; /* wq_b: 32768 rows x 1024 bytes = 33.5 MB */
    const int nreg = 8, reps = 24;
    uint8_t *buf;
    uint32_t *sink;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&buf, region * nreg));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 1, region * nreg));
    auto none = [](int) {};
    /* the first round over the regions warms up; "median (min)" of the rest */
    auto report = [](const std::vector<float> &us, double bytes, const char *fmt, auto... args) {
        if (us.empty()) return false;
        float med = us[us.size() / 2];
        printf(fmt, args...);
        printf(" %7.2f us  %6.0f GB/s  (min %.2f us)\n", med, bytes / (med * 1e3), us[0]);
        return true;
    };
    struct pat {
        const char *name;
        int kind, K, ks;
    } pats[] = {{"stream", 0, 0, 0},   {"walk", 1, 1024, 2},   {"linear", 2, 1024, 2},
                {"walk", 1, 4096, 8},  {"linear", 2, 4096, 8}, {"walk", 1, 8192, 8},
                {"linear", 2, 8192, 8}};
    for (const pat &p : pats) {
        auto us = timed(reps + nreg, nreg, none, [&](int r) {
            const uint8_t *a = buf + (r % nreg) * region;
            if (p.kind == 0)
                k_stream<<<2 * sms, 256>>>((const uint4 *)a, region / 16, sink);
            else if (p.kind == 1)
                k_walk<0><<<2 * sms, 256>>>(a, region / p.K, p.K, p.ks, sink);
            else
                k_walk<1><<<2 * sms, 256>>>(a, region / p.K, p.K, p.ks, sink);
        });
        if (!report(us, (double)region, "%-7s K %5d ks %d:", p.name, p.K, p.ks)) return 1;
    }
    /* the steady rate: one kernel over all 268 MB */
    auto all = timed(8, 0, none, [&](int) {
        k_stream<<<2 * sms, 256>>>((const uint4 *)buf, nreg * region / 16, sink);
    });
    if (!report(all, (double)(nreg * region), "stream 268 MB:")) return 1;
    /* A read from L2: the region prefetched (l2pf.cu's way), the prefetches given 300 us to land,
       then read; against the same read cold. 16.8 and 33.5 MB. */
    for (int half = 1; half >= 0; half--) {
        int64_t bytes = half ? region / 2 : region;
        for (int pf = 0; pf < 2; pf++) {
            auto us = timed(
                reps + nreg, nreg,
                [&](int r) {
                    if (!pf) return;
                    k_prefetch<<<16, 32>>>(buf + (r % nreg) * region, bytes);
                    cudaDeviceSynchronize();
                    usleep(300);
                },
                [&](int r) {
                    const uint8_t *a = buf + (r % nreg) * region;
                    k_stream<<<2 * sms, 256>>>((const uint4 *)a, bytes / 16, sink);
                });
            if (!report(us, (double)bytes, "stream %4.1f MB %-14s", bytes / 1048576.0,
                        pf ? "from L2" : "cold"))
                return 1;
        }
    }
    /* Two 33.5 MB reads one after the other (two regions): one after the other as plain
       launches, with programmatic dependent launch, and as one kernel over 67 MB; with 2 and with
       4 resident blocks an SM (the library's walks: 2 of 256 threads). */
    for (int bps = 2; bps <= 4; bps += 2) {
        const char *names[3] = {"2 x 33.5 MB, plain", "2 x 33.5 MB, PDL", "1 x 67 MB"};
        for (int mode = 0; mode < 3; mode++) {
            auto us = timed(reps + nreg, nreg, none, [&](int r) {
                const uint8_t *a = buf + (r % (nreg / 2)) * 2 * region;
                if (mode == 2) {
                    k_stream<<<bps * sms, 256>>>((const uint4 *)a, 2 * region / 16, sink);
                    return;
                }
                for (int k = 0; k < 2; k++) {
                    const uint4 *ak = (const uint4 *)(a + k * region);
                    if (mode == 0) {
                        k_stream<<<bps * sms, 256>>>(ak, region / 16, sink);
                        continue;
                    }
                    cudaLaunchConfig_t cfg = {};
                    cfg.gridDim = dim3((unsigned)(bps * sms));
                    cfg.blockDim = dim3(256);
                    cudaLaunchAttribute at[1];
                    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    at[0].val.programmaticStreamSerializationAllowed = 1;
                    cfg.attrs = at;
                    cfg.numAttrs = 1;
                    cudaLaunchKernelEx(&cfg, k_stream_pdl, ak, (int64_t)(region / 16), sink);
                }
            });
            if (!report(us, (double)(2 * region), "%-20s %d blocks/SM:", names[mode], bps))
                return 1;
        }
    }
    return 0;
}
