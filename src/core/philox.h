/* philox.h - the counter-based RNG shared by both backends' samplers: Philox4x32-10 (Salmon et
 * al., SC'11) and the keyed Gumbel noise of the draw (run/sample.h, core/draw.h).
 *
 * Word w of block (v / 4) is the noise of token v: Philox keyed by the 64-bit seed with counter
 * (v / 4, position, purpose << 16, stream). The Gumbel value is -log(-log(u)) in double, with
 * u = (w + 0.5) / 2^32 never 0 or 1, so it lies in [-3.14, 22.9].
 *
 * The functions are header-inline so that the CUDA sampler (backend/cuda/sample.cu) compiles
 * the very same code (__host__ __device__ under nvcc); the C files call them as usual. */
#ifndef DSI_PHILOX_H
#define DSI_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DSI_PHILOX_FN static __host__ __device__ __forceinline__
#else
#define DSI_PHILOX_FN static inline
#endif

/* The counter's third word (purpose << 16): draws for different uses never share noise. */
enum dsi_sample_purpose { DSI_PURPOSE_SAMPLE = 0, DSI_PURPOSE_DRAFT = 1 };

/* out = philox4x32-10(key, ctr). */
DSI_PHILOX_FN void
dsi_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four words of block blk (tokens 4 blk .. 4 blk + 3) at position pos. */
DSI_PHILOX_FN void dsi_philox_block(
    uint64_t seed, uint32_t stream, int purpose, int64_t pos, int32_t blk, uint32_t out[4]) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)pos, (uint32_t)purpose << 16, stream};
    dsi_philox4x32_10(ctr, key, out);
}

/* Gumbel(0, 1) from one 32-bit word. */
DSI_PHILOX_FN double dsi_gumbel_of(uint32_t w) {
    double u = ((double)w + 0.5) * (1.0 / 4294967296.0); /* never 0 or 1 */
    return -log(-log(u));
}

/* The Gumbel noise of token v (>= 0) at position pos. */
DSI_PHILOX_FN double
dsi_philox_gumbel(uint64_t seed, uint32_t stream, int purpose, int64_t pos, int32_t v) {
    uint32_t w[4];
    dsi_philox_block(seed, stream, purpose, pos, v / 4, w);
    return dsi_gumbel_of(w[v % 4]);
}

#ifdef __cplusplus
extern "C" {
#endif
/* dsi_philox4x32_10 as a linkable function (run/sample.h's public name). */
void dsi_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
#ifdef __cplusplus
}
#endif

#endif
