/* cuda_util.c - the helpers of the CUDA op tests (cuda_util.h). */
#include "cuda_util.h"

#include "backend/backend.h"
#include "backend/cpu/quant.h"
#include "core/core.h"
#include "dsinfer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

struct dsi_backend *g_cpu, *g_gpu;
static int g_state; /* 0 not tried, 1 ready, -1 no device */

int backends(void) {
    if (g_state) return g_state;
    struct dsi_err err = {0};
    g_state = -1;
    setenv("DSI_CUDA_PDL", "2", 0); /* every launch overlapped (unless the caller says) */
    if (dsi_backend_cuda_new(&g_gpu, 0, &err)) {
        fprintf(stderr, "[%s] ", err.msg);
        return g_state;
    }
    if (dsi_backend_cpu_new(&g_cpu, 0, &err) || g_cpu->ops->reserve(g_cpu, 16 << 20, &err)) {
        fprintf(stderr, "[cpu backend: %s] ", err.msg);
        return g_state;
    }
    g_state = 1;
    return g_state;
}

struct dsi_backend *cuda_backend_with(const char *settings) {
    char buf[256], *save = NULL, *names[8];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", settings);
    for (char *w = strtok_r(buf, ",", &save); w && n < 8; w = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(w, '=');
        if (!eq) continue;
        *eq = 0;
        setenv(w, eq + 1, 1);
        names[n++] = w;
    }
    struct dsi_err err = {0};
    struct dsi_backend *be = NULL;
    if (dsi_backend_cuda_new(&be, 0, &err)) {
        fprintf(stderr, "[cuda backend with %s: %s] ", settings, err.msg);
        be = NULL;
    }
    for (int i = 0; i < n; i++)
        unsetenv(names[i]);
    return be;
}

/* DSI_TEST_TINY=1 (set for runs under compute-sanitizer) skips the real-shape cases. */
int tiny_only(void) { return getenv("DSI_TEST_TINY") != NULL; }

/* ---- random numbers ------------------------------------------------------------------------ */

struct rng rng_of(const struct test_ctx *t, uint64_t salt) {
    struct rng r = {((uint64_t)t->seed + 1) * 0x9e3779b97f4a7c15ull ^
                    (salt * 0xbf58476d1ce4e5b9ull)};
    if (!r.s) r.s = 1;
    return r;
}

uint64_t rnext(struct rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

double runif(struct rng *r) { return (double)(rnext(r) >> 11) * (1.0 / 9007199254740992.0); }
int rint_below(struct rng *r, int n) { return (int)(rnext(r) % (uint64_t)n); }

float rnorm(struct rng *r) {
    double u = runif(r), v = runif(r);
    if (u < 1e-300) u = 1e-300;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

float *fnorm(struct rng *r, int64_t n, float sd) {
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        x[i] = rnorm(r) * sd;
    return x;
}

/* ---- device helpers ----------------------------------------------------------------------------
 */

void *dput(const void *h, size_t bytes) {
    void *d = g_gpu->ops->alloc(g_gpu, bytes ? bytes : 4);
    if (d && bytes) g_gpu->ops->upload(g_gpu, d, h, bytes);
    return d;
}

void dget(void *h, const void *d, size_t bytes) {
    if (bytes) g_gpu->ops->download(g_gpu, h, d, bytes);
}

void dfree(void *d) {
    if (d) g_gpu->ops->mfree(g_gpu, d);
}

/* Device buffer filled with 0xff bytes (NaN floats, -1 ints). */
void *dpoison(size_t bytes) {
    void *h = malloc(bytes ? bytes : 4);
    memset(h, 0xff, bytes ? bytes : 4);
    void *d = dput(h, bytes);
    free(h);
    return d;
}

float *hpoison(int64_t n) {
    float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    memset(h, 0xff, sizeof(float) * (size_t)(n > 0 ? n : 1));
    return h;
}

int gsync(const char *what) { return gsync_on(g_gpu, what); }

int gsync_on(struct dsi_backend *be, const char *what) {
    struct dsi_err e = {0};
    int rc = be->ops->sync(be, &e);
    if (rc) fprintf(stderr, "\n  %s: %s\n", what, e.msg);
    return rc;
}

/* ---- comparisons ----------------------------------------------------------------------------- */

/* Bytes equal; on failure prints the first differing float. */
int same(const char *what, const void *got, const void *want, size_t bytes) {
    if (!memcmp(got, want, bytes)) return 1;
    const float *g = got, *w = want;
    for (size_t i = 0; i < bytes / 4; i++)
        if (memcmp(g + i, w + i, 4)) {
            int64_t nd = 0;
            for (size_t j = i; j < bytes / 4; j++)
                nd += memcmp(g + j, w + j, 4) != 0;
            fprintf(stderr,
                    "\n  %s: element %zu differs: got %.9g want %.9g (%lld of %zu differ)\n", what,
                    i, (double)g[i], (double)w[i], (long long)nd, bytes / 4);
            return 0;
        }
    fprintf(stderr, "\n  %s: bytes differ\n", what);
    return 0;
}

/* max |got - want| / max |want| <= tol (NaN fails unless both NaN bit-equal); prints stats. */
int close_to(const char *what, const float *got, const float *want, int64_t n, double tol) {
    double mw = 0, md = 0;
    int64_t nd = 0, bad = -1;
    for (int64_t i = 0; i < n; i++) {
        if (!memcmp(got + i, want + i, 4)) continue;
        nd++;
        if (isnan(got[i]) || isnan(want[i])) {
            if (bad < 0) bad = i;
            continue;
        }
        md = fmax(md, fabs((double)got[i] - (double)want[i]));
    }
    for (int64_t i = 0; i < n; i++)
        if (!isnan(want[i])) mw = fmax(mw, fabs((double)want[i]));
    double rel = md / (mw > 0 ? mw : 1);
    if (nd)
        fprintf(stderr, "[%s: %lld/%lld differ, rel %.2e] ", what, (long long)nd, (long long)n,
                rel);
    if (bad >= 0) {
        fprintf(stderr, "\n  %s: element %lld: got %g want %g\n", what, (long long)bad,
                (double)got[bad], (double)want[bad]);
        return 0;
    }
    if (rel > tol) {
        fprintf(stderr, "\n  %s: relative error %.3g > %.3g\n", what, rel, tol);
        return 0;
    }
    return 1;
}

/* ---- weights -----------------------------------------------------------------------------------
 */

uint16_t f16_bits(struct rng *r) {
    uint16_t s = (uint16_t)(rnext(r) & 1), e = (uint16_t)(10 + rint_below(r, 9));
    return (uint16_t)((s << 15) | (e << 10) | (rnext(r) & 0x3ff));
}

int64_t row_bytes_of(enum dsi_type t, int64_t K) {
    return t == DSI_TYPE_F32                         ? 4 * K
           : t == DSI_TYPE_BF16 || t == DSI_TYPE_F16 ? 2 * K
           : t == DSI_TYPE_FP4_E2M1                  ? K / 2
                                                     : K;
}

static bool g_wide;

void wt_scales_wide(bool on) { g_wide = on; }

/* A [rows, K] weight of `type` with random contents (values ~ sd for float types). */
void wt_make(struct wt *w, struct rng *r, enum dsi_type type, int64_t rows, int64_t K, float sd) {
    memset(w, 0, sizeof(*w));
    int64_t rb = row_bytes_of(type, K), bytes = rb * rows;
    uint8_t *p = malloc((size_t)bytes);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t k = 0; k < K; k++) {
            uint8_t *q = p + i * rb;
            switch (type) {
            case DSI_TYPE_F32: {
                float v = rnorm(r) * sd;
                memcpy(q + 4 * k, &v, 4);
                break;
            }
            case DSI_TYPE_BF16: {
                uint16_t v = dsi_f32_to_bf16(rnorm(r) * sd);
                memcpy(q + 2 * k, &v, 2);
                break;
            }
            case DSI_TYPE_F16: {
                uint16_t v = f16_bits(r);
                memcpy(q + 2 * k, &v, 2);
                break;
            }
            case DSI_TYPE_F8_E4M3: {
                uint8_t v;
                do
                    v = (uint8_t)rnext(r);
                while ((v & 0x7f) == 0x7f);
                q[k] = v;
                break;
            }
            default:
                if (!(k & 1)) q[k / 2] = (uint8_t)rnext(r);
                break;
            }
        }
    w->hdata = p;
    w->h = (struct dsi_tensor){.type = type, .ne = {K, rows, 1, 1}, .data = p};
    if (type == DSI_TYPE_F8_E4M3 || type == DSI_TYPE_FP4_E2M1) {
        int sb0 = type == DSI_TYPE_F8_E4M3 ? 128 : 1, sb1 = type == DSI_TYPE_F8_E4M3 ? 128 : 32;
        int64_t sr = (rows + sb0 - 1) / sb0, sc = (K + sb1 - 1) / sb1;
        uint8_t *s = malloc((size_t)(sr * sc));
        for (int64_t i = 0; i < sr * sc; i++)
            s[i] = (uint8_t)(type == DSI_TYPE_F8_E4M3 ? (g_wide ? 128 : 120) + rint_below(r, 8)
                                                      : (g_wide ? 126 : 124) + rint_below(r, 4));
        w->hscale = s;
        w->hs = (struct dsi_tensor){.type = DSI_TYPE_E8M0, .ne = {sc, sr, 1, 1}, .data = s};
        w->h.scale = &w->hs;
        w->h.scale_block[0] = sb0;
        w->h.scale_block[1] = sb1;
        w->h.scale_row_stride = sc;
        w->ds = w->hs;
        w->ds.data = g_gpu->ops->import(g_gpu, s, (size_t)(sr * sc));
    }
    w->d = w->h;
    w->d.data = g_gpu->ops->import(g_gpu, p, (size_t)bytes);
    if (w->h.scale) w->d.scale = &w->ds;
}

void wt_free(struct wt *w) {
    free(w->hdata);
    free(w->hscale);
}

/* A float vector tensor. */
void vec_make(struct wt *w, const float *v, int64_t n, enum dsi_type type) {
    memset(w, 0, sizeof(*w));
    int64_t rb = row_bytes_of(type, n);
    uint8_t *p = malloc((size_t)rb);
    for (int64_t i = 0; i < n; i++) {
        if (type == DSI_TYPE_F32)
            memcpy(p + 4 * i, &v[i], 4);
        else {
            uint16_t b = dsi_f32_to_bf16(v[i]);
            memcpy(p + 2 * i, &b, 2);
        }
    }
    w->hdata = p;
    w->h = (struct dsi_tensor){.type = type, .ne = {n, 1, 1, 1}, .data = p};
    w->d = w->h;
    w->d.data = g_gpu->ops->import(g_gpu, p, (size_t)rb);
}
