/* cuda_util.h - what the CUDA op tests share (cuda_util.c): the two backends, random inputs,
 * device buffers, comparisons and random weights in every stored format. */
#ifndef DSI_TESTS_CUDA_UTIL_H
#define DSI_TESTS_CUDA_UTIL_H

#include "test.h"

#include "backend/backend.h"
#include "dsinfer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

extern struct dsi_backend *g_cpu, *g_gpu; /* owned by cuda_util.c, made on first use */

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (backends() < 0) {                                                                      \
            fprintf(stderr, "[skipped: no CUDA device] ");                                         \
            return 0;                                                                              \
        }                                                                                          \
    } while (0)

struct rng {
    uint64_t s;
};

struct wt {
    struct dsi_tensor h, d, hs, ds;
    void *hdata, *hscale;
};

int backends(void);
/* Another CUDA backend made with the comma-separated VAR=value settings in the environment
 * (read at creation; unset again after), or NULL with the error printed. The caller frees it. */
struct dsi_backend *cuda_backend_with(const char *settings);
int tiny_only(void);
struct rng rng_of(const struct test_ctx *t, uint64_t salt);
uint64_t rnext(struct rng *r);
double runif(struct rng *r);
int rint_below(struct rng *r, int n);
float rnorm(struct rng *r);
float *fnorm(struct rng *r, int64_t n, float sd);
void *dput(const void *h, size_t bytes);
void dget(void *h, const void *d, size_t bytes);
void dfree(void *d);
void *dpoison(size_t bytes);
float *hpoison(int64_t n);
int gsync(const char *what);
/* The same on backend be. */
int gsync_on(struct dsi_backend *be, const char *what);
int same(const char *what, const void *got, const void *want, size_t bytes);
int close_to(const char *what, const float *got, const float *want, int64_t n, double tol);
uint16_t f16_bits(struct rng *r);
int64_t row_bytes_of(enum dsi_type t, int64_t K);
void wt_free(struct wt *w);
void vec_make(struct wt *w, const float *v, int64_t n, enum dsi_type type);
/* Scale bytes of the FP8 / FP4 weights wt_make makes from now on: false (default) FP8 120-127,
 * FP4 124-127; true FP8 128-135, FP4 126-129: both sides of the largest scale whose factor
 * 2^120 s (2^126 s) is a bf16, where gvf.cu's short decode hands over to the fp32 one. */
void wt_scales_wide(bool on);
void wt_make(struct wt *w, struct rng *r, enum dsi_type type, int64_t rows, int64_t K, float sd);

#endif
