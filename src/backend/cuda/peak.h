/* peak.h - the device's ceilings, measured in the running process (src/backend/cuda/peak.cu):
 * the FP8 tensor-core GEMM rate through cuBLASLt, free device memory and a one-line device
 * description. For benchmarks (`dsinfer bench layer`), not for the forward pass. Every function
 * returns 0 on success; on failure (no device, no FP8 tensor cores, a cuBLASLt error) a nonzero
 * value and, where a message buffer is given, one line saying why. */
#ifndef DSI_CUDA_PEAK_H
#define DSI_CUDA_PEAK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* FP8 GEMM rate of device `device`: D[m, n] (bf16) = A[m, k] * B[k, n], A and B e4m3 with
 * random non-zero codes, fp32 accumulation (cuBLASLt, CUBLAS_COMPUTE_32F, "TN" layout, no fast
 * accumulation), 20 warm-up products then `iters` products timed one by one with CUDA events;
 * *tflops = 2 m n k / median time. Uses its own stream and frees everything it allocates. */
int dsi_cuda_fp8_gemm_tflops(
    int device, int m, int n, int k, int iters, double *tflops, char *msg, size_t msg_len);

/* Free and total memory of device `device` (cudaMemGetInfo). */
int dsi_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes);

/* "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB, driver 13.0 (580.159.04), runtime 13.0" or the
 * reason there is none. */
int dsi_cuda_device_desc(int device, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
