/* chain_probe.cu - how close can a chain of dependent batch-1 GEMVs get to the DRAM's steady read
 * rate, as separate kernels (the engine's way: one launch a GEMM, in a graph, with or without
 * programmatic dependent launch) or as one persistent kernel with a grid barrier between the
 * GEMVs (what a persistent per-layer decode kernel would do), with and without the next GEMV's
 * weights prefetched into L2 before each barrier? A standalone probe (not part of the library or
 * the tests; step 38), built here and run on the GPU machine:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o build/pre/chain_probe \
 *       tests/ops/chain_probe.cu
 *   build/pre/chain_probe           (prints one line per variant)
 * The chain: 4 "layers" of V4-Flash's batch-1 weight reads as 9 FP8-sized GEMVs each (wq_a 1024 x
 * 4096, wkv 512 x 4096, wq_b 32768 x 1024, wo_a as 8192 x 4096, wo_b 4096 x 8192, the shared
 * expert's up 4096 x 4096 and down 4096 x 2048, six routed experts' up 12288 x 4096 and down
 * 24576 x 1024 at their FP4 bytes), 830 MB in all; GEMV i reads x_i (the first K_i values of
 * y_(i-1)) and writes y_i = W_i x_i, the bytes taken as int8 values (the arithmetic is a stand-in:
 * the probe measures the reads and the dependencies). Variants, the median of 15 runs each:
 *   stream     one kernel reading 830 MB (the steady rate)
 *   graph      36 kernels in a CUDA graph, each waiting for the previous one
 *   graph+pdl  the same with programmatic dependent launch: a kernel starts, launches its
 *              dependents, then waits for the previous kernel's y (griddepcontrol)
 *   pdl+pre2r  the same, each warp's first 2 rows prefetched into L2 before the wait
 *   pdl+preall the same, all of each warp's rows prefetched into L2 before the wait
 *   persist    one cooperative kernel, a grid barrier between the GEMVs
 *   persist+pf the same, each warp prefetching its rows of the next GEMV into L2 (bulk
 *              prefetch) before the barrier, so that the DRAM stays busy across it
 *   persist+pf2 the prefetch as each GEMV starts (a whole GEMV ahead) */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "chain_probe: %s: %s\n", #x, cudaGetErrorString(e_));                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define MAXG  64
#define THR   256
#define WARPS (THR / 32)
#define XMAX  8192

struct gemv {
    const int8_t *w; /* [rows][K] */
    int rows, K;
};

struct chain {
    gemv g[MAXG];
    int n;
    float *y[2]; /* ping-pong outputs, XMAX... floats each (rows at most 32768) */
    const float *x0;
};

__constant__ chain c_chain;

static __device__ __forceinline__ int4 ldg_nc(const int4 *p) {
    int4 v;
    asm volatile("ld.global.nc.v4.s32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ int fold(int4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

/* The rows of warp gw of tw warps: a contiguous range (so a warp's next rows are one span). */
static __device__ __forceinline__ void warp_rows(int rows, int gw, int tw, int *r0, int *r1) {
    int per = (rows + tw - 1) / tw;
    *r0 = min(rows, gw * per);
    *r1 = min(rows, *r0 + per);
}

/* Warp gw's rows of GEMV g: y[r] from W[r] and xs (x in shared memory). Lane l takes 16-byte
 * chunks l, l + 32, ... of a row; two rows' loads in flight, 4 a lane. The bytes are folded by
 * XOR (the engine's walks decode on tensor cores at ~2.5 instructions a weight per warp lane
 * group; a float dot product here would make the probe compute-bound) and the fold scales one
 * value of x, so that y still depends on the whole read and on x. */
static __device__ void gemv_warp(const gemv &g, const float *xs, float *y, int gw, int tw) {
    int lane = threadIdx.x & 31, r0, r1;
    warp_rows(g.rows, gw, tw, &r0, &r1);
    int nc = g.K / 16;
    for (int r = r0; r < r1; r += 2) {
        const int4 *a = (const int4 *)(g.w + (int64_t)r * g.K);
        const int4 *b = (const int4 *)(g.w + (int64_t)(r + 1 < r1 ? r + 1 : r) * g.K);
        int fa = 0, fb = 0;
        for (int c = lane; c < nc; c += 64) {
            int4 va = ldg_nc(a + c), vb = ldg_nc(b + c);
            int4 wa = c + 32 < nc ? ldg_nc(a + c + 32) : make_int4(0, 0, 0, 0);
            int4 wb = c + 32 < nc ? ldg_nc(b + c + 32) : make_int4(0, 0, 0, 0);
            fa ^= fold(va) ^ fold(wa);
            fb ^= fold(vb) ^ fold(wb);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            fa ^= __shfl_xor_sync(0xffffffffu, fa, o);
            fb ^= __shfl_xor_sync(0xffffffffu, fb, o);
        }
        if (lane == 0) {
            y[r] = (float)(fa & 0xff) * xs[r % g.K];
            if (r + 1 < r1) y[r + 1] = (float)(fb & 0xff) * xs[(r + 1) % g.K];
        }
    }
}

static __device__ void stage_x(const float *x, int K, float *xs) {
    for (int k = threadIdx.x; k < K; k += THR)
        xs[k] = x[k];
    __syncthreads();
}

static __device__ __forceinline__ const float *x_of(int i) {
    return i == 0 ? c_chain.x0 : c_chain.y[(i - 1) & 1];
}

/* A warp's rows of GEMV h into L2 (one bulk prefetch, lane 0), at most maxr of them. */
static __device__ __forceinline__ void
prefetch_rows(const gemv &h, int gw, int tw, int maxr = 1 << 30) {
    int r0, r1;
    warp_rows(h.rows, gw, tw, &r0, &r1);
    r1 = min(r1, r0 + maxr);
    if ((threadIdx.x & 31) == 0 && r1 > r0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(h.w + (int64_t)r0 * h.K),
                     "r"((r1 - r0) * h.K)
                     : "memory");
}

/* One GEMV a launch; pdl: the dependents launched at once, then the wait for the previous
 * kernel (griddepcontrol); before it, pre 1: the warp's first 2 rows into L2, 2: all its rows. */
__global__ void __launch_bounds__(THR) k_one(int i, bool pdl, int pre) {
    __shared__ float xs[XMAX];
    const gemv &g = c_chain.g[i];
    int tw = gridDim.x * WARPS, gw = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (pdl) {
        if (pre) prefetch_rows(g, gw, tw, pre == 1 ? 2 : 1 << 30);
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    stage_x(x_of(i), g.K, xs);
    gemv_warp(g, xs, c_chain.y[i & 1], gw, tw);
}

/* The whole chain in one cooperative launch; pf 1: each warp's rows of GEMV i + 1 prefetched
 * into L2 before the barrier that ends GEMV i; 2: as GEMV i starts. */
__global__ void __launch_bounds__(THR) k_persist(int pf) {
    __shared__ float xs[XMAX];
    cg::grid_group grid = cg::this_grid();
    int tw = gridDim.x * WARPS, gw = blockIdx.x * WARPS + (threadIdx.x >> 5);
    for (int i = 0; i < c_chain.n; i++) {
        const gemv &g = c_chain.g[i];
        if (pf == 2 && i + 1 < c_chain.n) prefetch_rows(c_chain.g[i + 1], gw, tw);
        stage_x(x_of(i), g.K, xs);
        gemv_warp(g, xs, c_chain.y[i & 1], gw, tw);
        if (pf == 1 && i + 1 < c_chain.n) prefetch_rows(c_chain.g[i + 1], gw, tw);
        grid.sync();
    }
}

__global__ void k_stream(const int4 *a, int64_t n16, float *sink) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            st = (int64_t)gridDim.x * blockDim.x;
    int acc = 0;
    for (; i + 7 * st < n16; i += 8 * st) {
        int4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = ldg_nc(a + i + u * st);
#pragma unroll
        for (int u = 0; u < 8; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += st) {
        int4 v = ldg_nc(a + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678) sink[0] = 1.0f;
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main() {
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    /* one layer: rows x K bytes */
    const int layer[][2] = {{1024, 4096}, {512, 4096},  {32768, 1024}, {8192, 4096}, {4096, 8192},
                            {4096, 4096}, {4096, 2048}, {12288, 4096}, {24576, 1024}};
    const int nl = (int)(sizeof(layer) / sizeof(layer[0])), L = 4;
    chain h = {};
    h.n = nl * L;
    int64_t total = 0;
    std::vector<int64_t> offs;
    for (int i = 0; i < h.n; i++) {
        offs.push_back(total);
        total += (int64_t)layer[i % nl][0] * layer[i % nl][1];
    }
    int8_t *w = nullptr;
    float *y0 = nullptr, *y1 = nullptr, *x0 = nullptr, *sink = nullptr;
    CK(cudaMalloc(&w, (size_t)total));
    CK(cudaMemset(w, 1, (size_t)total));
    CK(cudaMalloc(&y0, 32768 * 4));
    CK(cudaMalloc(&y1, 32768 * 4));
    CK(cudaMalloc(&x0, XMAX * 4));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(x0, 0, XMAX * 4));
    CK(cudaMemset(y0, 0, 32768 * 4));
    CK(cudaMemset(y1, 0, 32768 * 4));
    for (int i = 0; i < h.n; i++) {
        h.g[i].w = w + offs[i];
        h.g[i].rows = layer[i % nl][0];
        h.g[i].K = layer[i % nl][1];
    }
    h.y[0] = y0;
    h.y[1] = y1;
    h.x0 = x0;
    CK(cudaMemcpyToSymbol(c_chain, &h, sizeof(h)));
    printf("%s, %d SMs; chain of %d GEMVs, %.1f MB\n", prop.name, sms, h.n, total / 1e6);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int R = 15;
    auto report = [&](const char *name, std::vector<float> &ms) {
        float m = median(ms);
        printf("%-12s %9.1f us %8.1f GB/s\n", name, m * 1000.0f, total / (m * 1e-3) / 1e9);
        return m;
    };
    /* the steady rate */
    std::vector<float> t;
    for (int r = 0; r < R; r++) {
        CK(cudaEventRecord(e0, s));
        k_stream<<<sms * 4, 512, 0, s>>>((const int4 *)w, total / 16, sink);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    float ms_stream = report("stream", t);
    /* separate kernels in a graph, with and without PDL */
    const char *gname[4] = {"graph", "graph+pdl", "pdl+pre2r", "pdl+preall"};
    for (int v = 0; v < 4; v++) {
        int pdl = v > 0, pre = v == 2 ? 1 : v == 3 ? 2 : 0;
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < h.n; i++) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(2 * sms);
            cfg.blockDim = dim3(THR);
            cfg.stream = s;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = pdl ? 1 : 0;
            CK(cudaLaunchKernelEx(&cfg, k_one, i, (bool)pdl, pre));
        }
        CK(cudaStreamEndCapture(s, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        t.clear();
        for (int r = 0; r < R + 2; r++) {
            CK(cudaEventRecord(e0, s));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 2) t.push_back(ms);
        }
        float m = report(gname[v], t);
        printf("%-12s %9.1f%% of the stream rate\n", "", 100.0f * ms_stream / m);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(gr));
    }
    /* one persistent kernel */
    int per = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_persist, THR, 0));
    int grid = sms * std::min(per, 2);
    printf("persistent grid: %d blocks (%d an SM possible)\n", grid, per);
    for (int pf = 0; pf < 3; pf++) {
        t.clear();
        for (int r = 0; r < R + 2; r++) {
            int b = pf;
            void *args[] = {&b};
            CK(cudaEventRecord(e0, s));
            CK(cudaLaunchCooperativeKernel((const void *)k_persist, dim3(grid), dim3(THR), args, 0,
                                           s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 2) t.push_back(ms);
        }
        float m = report(pf == 2 ? "persist+pf2" : pf ? "persist+pf" : "persist", t);
        printf("%-12s %9.1f%% of the stream rate\n", "", 100.0f * ms_stream / m);
    }
    CK(cudaGetLastError());
    return 0;
}
