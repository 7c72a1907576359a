/* peak.cu - the device's ceilings for benchmarks (see peak.h): the FP8 tensor-core GEMM rate
 * through cuBLASLt, free memory, a device description. Independent of the backend object: own
 * stream, own allocations, nothing left behind. */
#include "peak.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int peak_fail(char *msg, size_t len, const char *fmt, ...) {
    if (msg && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, len, fmt, ap);
        va_end(ap);
    }
    return 1;
}

/* Random non-zero e4m3 codes of magnitude 0.5..3.75 (no NaN, no zero): the product runs on
 * data like a real one (METHOD.md: never time on zeros). */
static __global__ void k_peak_fill_e4m3(uint8_t *p, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 0x7feb352du;
        h ^= h >> 15;
        h *= 0x846ca68bu;
        h ^= h >> 16;
        uint32_t e = 6 + ((h >> 8) & 3); /* biased exponent 6..9 (bias 7) */
        p[i] = (uint8_t)((h & 0x80u) | (e << 3) | ((h >> 12) & 7u));
    }
}

#define PEAK_WARM 20 /* untimed products first: clocks up from idle, heuristics settled */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define CU_TRY(call, what)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = peak_fail(msg, msg_len, "fp8 peak: %s: %s", what, cudaGetErrorString(e_));        \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
#define LT_TRY(call, what)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            rc = peak_fail(msg, msg_len, "fp8 peak: %s: cuBLASLt status %d", what, (int)s_);       \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

extern "C" int dsi_cuda_fp8_gemm_tflops(
    int device, int m, int n, int k, int iters, double *tflops, char *msg, size_t msg_len) {
    int rc = 0, ndev = 0;
    *tflops = 0;
    if (msg && msg_len) msg[0] = 0;
    if (m < 16 || n < 16 || k < 16 || m % 16 || n % 16 || k % 16 || iters < 1)
        return peak_fail(msg, msg_len, "fp8 peak: want m, n, k multiples of 16 and iters >= 1");
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= device || device < 0) {
        cudaGetLastError();
        return peak_fail(msg, msg_len, "fp8 peak: no CUDA device %d", device);
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return peak_fail(msg, msg_len, "fp8 peak: cannot read the properties of device %d", device);
    }
    if (prop.major * 10 + prop.minor < 89)
        return peak_fail(msg, msg_len, "fp8 peak: %s (sm_%d%d) has no FP8 tensor cores", prop.name,
                         prop.major, prop.minor);
    int prev = 0;
    cudaGetDevice(&prev);
    cudaStream_t stream = NULL;
    cudaEvent_t *ev = NULL;
    float *ms = NULL;
    uint8_t *A = NULL, *B = NULL;
    void *D = NULL, *ws = NULL;
    size_t ws_bytes = (size_t)64 << 20;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    float alpha = 1.0f, beta = 0.0f;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int n_ev = 2 * (iters + PEAK_WARM);
    CU_TRY(cudaSetDevice(device), "cudaSetDevice");
    CU_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    CU_TRY(cudaMalloc((void **)&A, (size_t)m * k), "alloc A");
    CU_TRY(cudaMalloc((void **)&B, (size_t)k * n), "alloc B");
    CU_TRY(cudaMalloc(&D, (size_t)m * n * 2), "alloc D");
    CU_TRY(cudaMalloc(&ws, ws_bytes), "alloc workspace");
    k_peak_fill_e4m3<<<1024, 256, 0, stream>>>(A, (size_t)m * k, 0x9e3779b9u);
    k_peak_fill_e4m3<<<1024, 256, 0, stream>>>(B, (size_t)k * n, 0x85ebca6bu);
    CU_TRY(cudaGetLastError(), "fill");
    LT_TRY(cublasLtCreate(&lt), "create");
    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
           "transa");
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
           "transb");
    /* column-major: op(A) = A^T with A stored [k rows, m cols]; B [k, n]; C = D [m, n] bf16 */
    LT_TRY(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k), "layout A");
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k), "layout B");
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m), "layout C/D");
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "preference");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_bytes, sizeof(ws_bytes)),
           "workspace");
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found),
           "heuristic");
    if (!found) {
        rc = peak_fail(msg, msg_len, "fp8 peak: cuBLASLt has no algorithm for e4m3 %dx%dx%d", m, n,
                       k);
        goto done;
    }
    ev = (cudaEvent_t *)calloc((size_t)n_ev, sizeof(*ev));
    ms = (float *)calloc((size_t)iters, sizeof(float));
    if (!ev || !ms) {
        rc = peak_fail(msg, msg_len, "fp8 peak: out of host memory");
        goto done;
    }
    for (int i = 0; i < n_ev; i++)
        CU_TRY(cudaEventCreate(&ev[i]), "event");
    for (int i = 0; i < iters + PEAK_WARM; i++) {
        CU_TRY(cudaEventRecord(ev[2 * i], stream), "record");
        LT_TRY(cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, lc, D, lc, &heur.algo, ws,
                              ws_bytes, stream),
               "matmul");
        CU_TRY(cudaEventRecord(ev[2 * i + 1], stream), "record");
    }
    CU_TRY(cudaStreamSynchronize(stream), "run");
    for (int i = 0; i < iters; i++)
        CU_TRY(cudaEventElapsedTime(&ms[i], ev[2 * (i + PEAK_WARM)], ev[2 * (i + PEAK_WARM) + 1]),
               "elapsed");
    qsort(ms, (size_t)iters, sizeof(float), cmp_float);
    if (ms[iters / 2] > 0) *tflops = 2.0 * m * (double)n * k / (ms[iters / 2] * 1e-3) / 1e12;
done:
    if (ev)
        for (int i = 0; i < n_ev; i++)
            if (ev[i]) cudaEventDestroy(ev[i]);
    free(ev);
    free(ms);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    if (stream) cudaStreamSynchronize(stream);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D);
    cudaFree(ws);
    if (stream) cudaStreamDestroy(stream);
    cudaGetLastError();
    cudaSetDevice(prev);
    return rc;
}

extern "C" int dsi_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
    int prev = 0, ndev = 0;
    *free_bytes = *total_bytes = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || device < 0 || device >= ndev) {
        cudaGetLastError();
        return 1;
    }
    cudaGetDevice(&prev);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMemGetInfo(free_bytes, total_bytes);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    return 0;
}

/* The kernel module's version from /proc/driver/nvidia/version ("... Kernel Module  580.159.04
 * ..."), or "" where that file is not there. */
static void driver_string(char *buf, size_t len) {
    buf[0] = 0;
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f) return;
    char line[512];
    if (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "Kernel Module");
        if (p) {
            p += strlen("Kernel Module");
            while (*p == ' ' || *p == '\t')
                p++;
            size_t n = strcspn(p, " \t\n");
            if (n >= len) n = len - 1;
            memcpy(buf, p, n);
            buf[n] = 0;
        }
    }
    fclose(f);
}

extern "C" int dsi_cuda_device_desc(int device, char *buf, size_t len) {
    int ndev = 0, drv = 0, rt = 0;
    if (!buf || !len) return 1;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || device < 0 || device >= ndev) {
        cudaGetLastError();
        snprintf(buf, len, "no CUDA device %d", device);
        return 1;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, len, "CUDA device %d: properties unreadable", device);
        return 1;
    }
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    char mod[64];
    driver_string(mod, sizeof(mod));
    snprintf(buf, len, "%s, sm_%d%d, %d SMs, %.1f GiB, driver %d.%d%s%s%s, runtime %d.%d", p.name,
             p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30),
             drv / 1000, drv % 1000 / 10, mod[0] ? " (" : "", mod, mod[0] ? ")" : "", rt / 1000,
             rt % 1000 / 10);
    return 0;
}
