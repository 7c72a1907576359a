/* hc.cuh - hc_pre's mix in `fast` numerics (hc_tf.cu), for hc.cu. */
#ifndef DSI_CUDA_HC_CUH
#define DSI_CUDA_HC_CUH

#include "common.cuh"

/* fn[o] . X[r] for rows r < n of len floats and outputs o < n_mix <= 32 on the tensor cores
 * (3xTF32, `fast` numerics only), with each row's sum of squares, split along K into *S pieces:
 * *mixp = [S][n n_mix], *ssp = [S][n] (fp32 partial sums), both in CU_SCR_GEMM (valid until the
 * next op). false: not taken (shapes, alignment, fn not F32) or a launch failed (sticky). */
bool hc_mix_tf(struct cu_ctx *c,
               const struct cu_w *fn,
               int n_mix,
               const float *X,
               int64_t n,
               int64_t len,
               float **mixp,
               float **ssp,
               int64_t *S);

#endif
