/* cuda.cu - the CUDA backend object: one stream, a sticky error, device memory (allocations,
 * weight slabs, step scratch), the caches that turn host-side op arguments into device data
 * once (rope frequency tables, MoE expert tables), and the op table.
 *
 * Host synchronisation: none inside ops, except where an op has to replace its scratch buffer
 * (grows only; after the first steps at the largest shapes it never happens) and the first use
 * of a host rope table / expert table (one blocking copy each). `download` of pageable memory
 * waits for the copy, as the forward pass expects. */
#include "common.cuh"

#include <chrono>
#include <stdarg.h>
#include <string.h>

#define SLAB_BYTES ((size_t)256 << 20)
#define SLAB_SOLO  ((size_t)32 << 20) /* larger tensors get their own allocation */

void cu_fail(struct cu_ctx *c, int code, const char *fmt, ...) {
    if (c->capturing) { /* not run yet: the eager retry reports it (graph.cu) */
        c->capture_bad = true;
        return;
    }
    if (c->sticky) return;
    c->sticky = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
    va_end(ap);
    dsi_log(DSI_LOG_ERROR, "cuda: %s", c->msg);
}

bool cu_check(struct cu_ctx *c, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return true;
    cu_fail(c, DSI_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    return false;
}

void *cu_scratch(struct cu_ctx *c, int which, size_t bytes) {
    bytes = cu_align(bytes ? bytes : 1);
    if (bytes <= c->scratch_bytes[which]) return c->scratch[which];
    if (c->capturing) { /* cannot grow inside a capture: give up the capture */
        c->capture_bad = true;
        return NULL;
    }
    c->scratch_gen++; /* captured steps hold the old address */
    size_t want = bytes + bytes / 4;
    if (c->scratch[which]) {
        cudaStreamSynchronize(c->stream); /* kernels in flight may still use it */
        cudaFree(c->scratch[which]);
        c->scratch[which] = NULL;
        c->scratch_bytes[which] = 0;
    }
    if (cudaMalloc(&c->scratch[which], want) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        cu_fail(c, DSI_ERR_NOMEM, "scratch: cannot allocate %zu bytes (%zu free of %zu)", want, fr,
                tot);
        c->scratch[which] = NULL;
        return NULL;
    }
    c->scratch_bytes[which] = want;
    return c->scratch[which];
}

/* The forward pass hands rope its host table (m->freq). Keep a device copy per host array,
 * refreshed (stream-ordered) whenever the host contents differ from the snapshot. */
const float *cu_freq_dev(struct cu_ctx *c, const float *freq, int n) {
    if (n > 64 || n < 0) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "rope: %d frequencies, at most 64 supported", n);
        return NULL;
    }
    struct cu_freq *f = NULL;
    for (int i = 0; i < c->n_freq && !f; i++)
        if (c->freq[i].host == freq) f = &c->freq[i];
    if (f && f->is_device) return freq;
    if (!f) {
        cudaPointerAttributes pa;
        bool dev = cudaPointerGetAttributes(&pa, freq) == cudaSuccess &&
                   (pa.type == cudaMemoryTypeDevice || pa.type == cudaMemoryTypeManaged);
        cudaGetLastError();
        /* a new entry, or the oldest one recycled: stream order keeps its old users safe */
        f = &c->freq[c->n_freq < CU_MAX_FREQ ? c->n_freq++ : 0];
        float *keep = f->dev;
        memset(f, 0, sizeof(*f));
        f->dev = keep;
        f->host = freq;
        f->is_device = dev;
        if (dev) return freq;
        f->n = -1;
    }
    if (!f->dev && cudaMalloc(&f->dev, 64 * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        f->dev = NULL;
        cu_fail(c, DSI_ERR_NOMEM, "rope: cannot allocate a frequency table");
        return NULL;
    }
    if (f->n != n || memcmp(f->vals, freq, sizeof(float) * (size_t)n)) {
        f->n = n;
        memcpy(f->vals, freq, sizeof(float) * (size_t)n);
        cudaMemcpyAsync(f->dev, f->vals, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice,
                        c->stream);
    }
    return f->dev;
}

/* ---- memory ops --------------------------------------------------------------------------------
 */

static void *cuda_alloc(struct dsi_backend *be, size_t bytes) {
    struct cu_ctx *c = cu_ctx_of(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        dsi_log(DSI_LOG_ERROR, "cuda: alloc of %zu bytes failed (%zu free of %zu)", bytes, fr, tot);
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_mfree(struct dsi_backend *be, void *p) {
    if (p) cudaFree(p);
}

static void cuda_upload(struct dsi_backend *be, void *dst, const void *src, size_t bytes) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (!bytes) return;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess)
        cu_fail(c, DSI_ERR_DEVICE, "upload of %zu bytes: %s", bytes, cudaGetErrorString(e));
}

static void cuda_download(struct dsi_backend *be, void *dst, const void *src, size_t bytes) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (!bytes) return;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream); /* the caller reads dst next */
    if (e != cudaSuccess)
        cu_fail(c, DSI_ERR_DEVICE, "download of %zu bytes: %s", bytes, cudaGetErrorString(e));
}

static bool slab_push(struct cu_ctx *c, void *p) {
    if (c->n_slabs == c->cap_slabs) {
        int cap = c->cap_slabs ? 2 * c->cap_slabs : 64;
        void **s = (void **)realloc(c->slabs, sizeof(void *) * (size_t)cap);
        if (!s) return false;
        c->slabs = s;
        c->cap_slabs = cap;
    }
    c->slabs[c->n_slabs++] = p;
    return true;
}

static void *dev_malloc_report(struct cu_ctx *c, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
    cudaGetLastError();
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    cu_fail(c, DSI_ERR_NOMEM,
            "out of device memory importing weights: %zu bytes needed, %zu free of %zu "
            "(%zu bytes imported so far)",
            bytes, fr, tot, c->imported_bytes);
    return NULL;
}

/* Weights: copied once into 256-byte aligned places in large slabs (fewer allocations than
 * tensors; the real model has ~69k). Released with the backend. */
static const void *cuda_import(struct dsi_backend *be, const void *host, size_t bytes) {
    struct cu_ctx *c = cu_ctx_of(be);
    size_t need = cu_align(bytes ? bytes : 1);
    void *dst;
    if (need >= SLAB_SOLO) {
        dst = dev_malloc_report(c, need);
        if (!dst) return NULL;
        if (!slab_push(c, dst)) {
            cudaFree(dst);
            return NULL;
        }
    } else {
        if (!c->slab_cur || c->slab_used + need > c->slab_cap) {
            void *s = dev_malloc_report(c, SLAB_BYTES);
            if (!s) return NULL;
            if (!slab_push(c, s)) {
                cudaFree(s);
                return NULL;
            }
            c->slab_cur = (char *)s;
            c->slab_used = 0;
            c->slab_cap = SLAB_BYTES;
        }
        dst = c->slab_cur + c->slab_used;
        c->slab_used += need;
    }
    /* stream-ordered before every later op; pageable sources are staged before the call
     * returns, so the host copy may go away */
    cudaError_t e = cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) {
        cu_fail(c, DSI_ERR_DEVICE, "import of %zu bytes: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    c->imported_bytes += bytes;
    return dst;
}

/* ---- profiling ---------------------------------------------------------------------------- */

static int prof_begin(struct cu_ctx *c, const char *name) {
    if (c->n_pairs == c->cap_pairs) {
        int cap = c->cap_pairs ? 2 * c->cap_pairs : 1024;
        struct cu_prof_pair *p = (struct cu_prof_pair *)realloc(c->pairs, sizeof(*p) * (size_t)cap);
        if (!p) return -1;
        c->pairs = p;
        c->cap_pairs = cap;
    }
    int i = c->n_pairs;
    if (i == c->n_events) {
        if (cudaEventCreate(&c->pairs[i].a) != cudaSuccess ||
            cudaEventCreate(&c->pairs[i].b) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        c->n_events++;
    }
    c->pairs[i].name = name;
    cudaEventRecord(c->pairs[i].a, c->stream);
    c->n_pairs++;
    return i;
}

static void prof_end(struct cu_ctx *c, int i) {
    if (i >= 0) cudaEventRecord(c->pairs[i].b, c->stream);
}

int cu_prof_begin_(struct cu_ctx *c, const char *name) { return prof_begin(c, name); }

const char *cu_prof_name(struct cu_ctx *c, const char *fmt, ...) {
    char b[sizeof(c->prof_names[0])];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof(b), fmt, ap);
    va_end(ap);
    for (int i = 0; i < c->n_prof_names; i++)
        if (strcmp(c->prof_names[i], b) == 0) return c->prof_names[i];
    if (c->n_prof_names == (int)(sizeof(c->prof_names) / sizeof(c->prof_names[0])))
        return "x.other";
    memcpy(c->prof_names[c->n_prof_names], b, strlen(b) + 1);
    return c->prof_names[c->n_prof_names++];
}
void cu_prof_end_(struct cu_ctx *c, int i) { prof_end(c, i); }

static void prof_harvest(struct cu_ctx *c) {
    for (int i = 0; i < c->n_pairs; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, c->pairs[i].a, c->pairs[i].b) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        int k = 0;
        while (k < c->n_tot && c->tot[k].name != c->pairs[i].name)
            k++;
        if (k == c->n_tot) {
            if (c->n_tot == (int)(sizeof(c->tot) / sizeof(c->tot[0]))) continue;
            c->tot[c->n_tot++] = (struct cu_prof_tot){c->pairs[i].name, 0, 0};
        }
        c->tot[k].ms += ms;
        c->tot[k].calls++;
    }
    c->n_pairs = 0;
}

/* Parts of an op ("gemm.reduce") are listed but not added to the total. */
static bool prof_is_part(const char *name) { return strchr(name, '.') != NULL; }

static double host_s(void) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* Prints the totals; returns the ops' GPU time in ms. */
static double prof_print(struct cu_ctx *c) {
    double all = 0;
    for (int k = 0; k < c->n_tot; k++)
        if (!prof_is_part(c->tot[k].name)) all += c->tot[k].ms;
    fprintf(stderr, "# cuda op profile (GPU time between events around each op; a.b = part of op "
                    "a, not added to the total)\n");
    fprintf(stderr, "%-14s %8s %12s %10s %6s\n", "op", "calls", "total_ms", "us/call", "%");
    for (int k = 0; k < c->n_tot; k++) { /* selection order: largest first */
        int best = k;
        for (int j = k + 1; j < c->n_tot; j++)
            if (c->tot[j].ms > c->tot[best].ms) best = j;
        struct cu_prof_tot t = c->tot[best];
        c->tot[best] = c->tot[k];
        c->tot[k] = t;
        fprintf(stderr, "%-14s %8ld %12.3f %10.1f %6.1f\n", t.name, t.calls, t.ms,
                t.calls ? 1e3 * t.ms / (double)t.calls : 0.0, all > 0 ? 100.0 * t.ms / all : 0.0);
    }
    fprintf(stderr, "%-14s %8s %12.3f\n", "total", "", all);
    return all;
}

/* For tools (bench layer): with DSI_CUDA_PROFILE=1, print the profile gathered since the last
 * call under `title` (if title is NULL, print nothing) and start a new one, so that warm-up
 * steps (lazy module loading, scratch growth, expert tables) can be left out. Synchronises the
 * stream. No-op without profiling or on another backend. */
extern "C" void dsi_cuda_profile_dump(struct dsi_backend *be, const char *title) {
    if (!be || !be->name || strcmp(be->name, "cuda") != 0) return;
    struct cu_ctx *c = cu_ctx_of(be);
    if (!c || !c->prof) return;
    cudaStreamSynchronize(c->stream);
    prof_harvest(c);
    double now = host_s();
    if (title && c->n_tot) {
        fprintf(stderr, "# profile: %s\n", title);
        double ops = prof_print(c), wall = 1e3 * (now - c->prof_t0);
        /* what the events do not cover: the GPU idle between ops (host-bound gaps, copies) and
           the caller's own work between the marks */
        fprintf(stderr,
                "%-14s %8s %12.3f  (host wall time between the marks; %.3f ms not in ops)\n",
                "wall", "", wall, wall - ops);
    }
    c->n_tot = 0;
    c->prof_t0 = now;
}

static int cuda_sync(struct dsi_backend *be, struct dsi_err *err) {
    struct cu_ctx *c = cu_ctx_of(be);
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) cu_fail(c, DSI_ERR_DEVICE, "%s", cudaGetErrorString(e));
    if (c->prof) prof_harvest(c);
    if (c->sticky) return dsi_errf(err, c->sticky, "cuda: %s", c->msg);
    return DSI_OK;
}

static int cuda_mem_info(struct dsi_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    if (cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess) return DSI_OK;
    cudaGetLastError();
    return DSI_ERR_DEVICE;
}

/* The per-thread scratch of the CPU backend has no meaning here; op scratch grows on demand. */
static int cuda_reserve(struct dsi_backend *be, int64_t bytes_per_thread, struct dsi_err *err) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (c->sticky) return dsi_errf(err, c->sticky, "cuda: %s", c->msg);
    return DSI_OK;
}

static void cuda_free(struct dsi_backend *be) {
    struct cu_ctx *c = cu_ctx_of(be);
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    cuda_graph_reset(be);
    if (c->prof) {
        prof_harvest(c);
        if (c->n_tot) prof_print(c);
        for (int i = 0; i < c->n_events; i++) {
            cudaEventDestroy(c->pairs[i].a);
            cudaEventDestroy(c->pairs[i].b);
        }
        free(c->pairs);
    }
    for (int i = 0; i < c->n_slabs; i++)
        cudaFree(c->slabs[i]);
    free(c->slabs);
    for (int i = 0; i < 4; i++)
        if (c->scratch[i]) cudaFree(c->scratch[i]);
    for (int i = 0; i < c->n_freq; i++)
        if (c->freq[i].dev) cudaFree(c->freq[i].dev);
    for (int i = 0; i < c->n_moe; i++) {
        cudaFree(c->moe[i].dev);
        free(c->moe[i].snap);
    }
    cu_lt_free(c->lt);
    cu_ltb_free(c->ltb);
    if (c->hc_cnt) cudaFree(c->hc_cnt);
    cu_l2pf_free(c);
    cu_moe_side_free(c);
    cudaStreamDestroy(c->stream);
    free(c);
    be->ctx = NULL;
}

int cu_fork_make(cudaStream_t *s, cudaEvent_t *fork, cudaEvent_t *join) {
    if (cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(join, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        cu_fork_free(s, fork, join);
        return -1;
    }
    return 0;
}

void cu_fork_free(cudaStream_t *s, cudaEvent_t *fork, cudaEvent_t *join) {
    if (*s) {
        cudaStreamSynchronize(*s);
        cudaStreamDestroy(*s);
    }
    if (*fork) cudaEventDestroy(*fork);
    if (*join) cudaEventDestroy(*join);
    *s = NULL;
    *fork = *join = NULL;
}

/* The ops' xbf16: the residual streams in bf16 (c->xbf16) for a step that hc_pre runs on the
 * TF32 mix (hc_tf.cu's kernels, which with k_hc_post, hc_pre's finish, the embedding and gather
 * are the ones that read or write the streams in bf16): hc = 4, dim % 16 == 0, from
 * c->hc_tf_min rows (past k_hc_pre_one's; hc_pre skips it for bf16 streams anyway). */
static bool cuda_xbf16_ok(struct dsi_backend *be, int64_t n, int64_t hc, int64_t dim) {
    const struct cu_ctx *c = cu_ctx_of(be);
    return c->xbf16 && hc == 4 && dim % 16 == 0 && c->hc_tf_min > 0 && n >= c->hc_tf_min;
}

static const struct dsi_backend_ops g_cuda_ops = {
    cuda_alloc,       cuda_mfree,       cuda_upload,    cuda_download,    cuda_import,
    cuda_sync,        cuda_reserve,     cuda_free,      cuda_gemm,        cuda_act_quant,
    cuda_hadamard_q4, cuda_embed,       cuda_add,       cuda_copy,        cuda_rms_norm,
    cuda_rope,        cuda_hc_pre,      cuda_hc_post,   cuda_hc_head,     cuda_attn,
    cuda_indexer,     cuda_kv_store,    cuda_comp_ape,  cuda_compress,    cuda_comp_store,
    cuda_entry_store, cuda_gather,      cuda_moe_route, cuda_moe,         cuda_sample,
    cuda_mem_info,    cuda_graph_begin, cuda_graph_end, cuda_graph_reset, cuda_prefetch,
    cuda_xbf16_ok,
};

#define PROF_OP(op, T)                                                                             \
    static void prof_##op(struct dsi_backend *be, const struct T *a) {                             \
        struct cu_ctx *c = cu_ctx_of(be);                                                          \
        int i = prof_begin(c, #op);                                                                \
        cuda_##op(be, a);                                                                          \
        prof_end(c, i);                                                                            \
    }
PROF_OP(gemm, dsi_gemm_args)
PROF_OP(act_quant, dsi_act_quant_args)
PROF_OP(hadamard_q4, dsi_hadamard_q4_args)
PROF_OP(embed, dsi_embed_args)
PROF_OP(add, dsi_add_args)
PROF_OP(copy, dsi_copy_args)
PROF_OP(rms_norm, dsi_rms_norm_args)
PROF_OP(rope, dsi_rope_args)
PROF_OP(hc_pre, dsi_hc_pre_args)
PROF_OP(hc_post, dsi_hc_post_args)
PROF_OP(hc_head, dsi_hc_head_args)
PROF_OP(attn, dsi_attn_args)
PROF_OP(indexer, dsi_indexer_args)
PROF_OP(kv_store, dsi_kv_store_args)
PROF_OP(comp_ape, dsi_comp_ape_args)
PROF_OP(compress, dsi_compress_args)
PROF_OP(comp_store, dsi_comp_store_args)
PROF_OP(entry_store, dsi_entry_store_args)
PROF_OP(gather, dsi_gather_args)
PROF_OP(moe_route, dsi_moe_route_args)
PROF_OP(moe, dsi_moe_args)
PROF_OP(sample, dsi_sample_args)

static const struct dsi_backend_ops g_cuda_prof_ops = {
    cuda_alloc,       cuda_mfree,       cuda_upload,    cuda_download,    cuda_import,
    cuda_sync,        cuda_reserve,     cuda_free,      prof_gemm,        prof_act_quant,
    prof_hadamard_q4, prof_embed,       prof_add,       prof_copy,        prof_rms_norm,
    prof_rope,        prof_hc_pre,      prof_hc_post,   prof_hc_head,     prof_attn,
    prof_indexer,     prof_kv_store,    prof_comp_ape,  prof_compress,    prof_comp_store,
    prof_entry_store, prof_gather,      prof_moe_route, prof_moe,         prof_sample,
    cuda_mem_info,    cuda_graph_begin, cuda_graph_end, cuda_graph_reset, cuda_prefetch,
    cuda_xbf16_ok,
};

extern "C" int dsi_backend_cuda_new(struct dsi_backend **out, int device, struct dsi_err *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return dsi_errf(err, DSI_ERR_DEVICE, "cuda: no device (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device < 0 || device >= n)
        return dsi_errf(err, DSI_ERR_INVALID, "cuda: device %d, have %d", device, n);
    cudaDeviceProp p;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&p, device)) != cudaSuccess)
        return dsi_errf(err, DSI_ERR_DEVICE, "cuda: device %d: %s", device, cudaGetErrorString(e));
    if (p.major < 9)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "cuda: device %d (%s) is sm_%d%d; this build is for sm_90a (Hopper)",
                        device, p.name, p.major, p.minor);
    struct dsi_backend *be = (struct dsi_backend *)dsi_calloc(1, sizeof(*be));
    struct cu_ctx *c = (struct cu_ctx *)dsi_calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    c->device = device;
    c->n_sms = p.multiProcessorCount;
    c->smem_optin = p.sharedMemPerBlockOptin;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(be);
        free(c);
        return dsi_errf(err, DSI_ERR_DEVICE, "cuda: stream: %s", cudaGetErrorString(e));
    }
    if ((e = cudaMalloc(&c->hc_cnt, CU_HC_ONE_MAX * sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(c->hc_cnt, 0, CU_HC_ONE_MAX * sizeof(int))) != cudaSuccess) {
        cudaGetLastError();
        if (c->hc_cnt) cudaFree(c->hc_cnt);
        cudaStreamDestroy(c->stream);
        free(be);
        free(c);
        return dsi_errf(err, DSI_ERR_DEVICE, "cuda: counters: %s", cudaGetErrorString(e));
    }
    int pf_bad = cu_l2pf_init(c), side_bad = pf_bad ? 0 : cu_moe_side_init(c);
    if (pf_bad || side_bad) {
        cu_l2pf_free(c);
        cu_moe_side_free(c);
        cudaFree(c->hc_cnt);
        cudaStreamDestroy(c->stream);
        free(be);
        free(c);
        return dsi_errf(err, DSI_ERR_DEVICE, "cuda: the %s",
                        pf_bad ? "prefetch stream (DSI_CUDA_L2PF)"
                               : "shared expert's stream (DSI_CUDA_MOE_SIDE)");
    }
    /* read once at start-up, never in a step */
    const char *pe = getenv("DSI_CUDA_PROFILE");
    c->prof = pe && *pe && *pe != '0';
    c->prof_shapes = c->prof && *pe == '2';
    c->prof_t0 = host_s();
    const char *ns = getenv("DSI_CUDA_NOSTAGE");
    c->xstage = !(ns && *ns && *ns != '0');
    const char *nv = getenv("DSI_CUDA_NOGEMV");
    c->gemv = !(nv && *nv && *nv != '0');
    const char *td = getenv("DSI_CUDA_TC_DENSE"), *tm = getenv("DSI_CUDA_TC_MOE");
    c->tc_dense_min = td && *td ? atoi(td) : 64;
    const char *tsp = getenv("DSI_CUDA_TC_SPLIT");
    c->tc_split = !(tsp && *tsp == '0');
    /* (step 25, compiled only: the next device run measures it against
       DSI_CUDA_TC_SPLIT_GROUPED=0) */
    const char *tsg = getenv("DSI_CUDA_TC_SPLIT_GROUPED");
    c->tc_split_grouped = !(tsg && *tsg == '0');
    /* routed experts on tc.cu from 8 rows per expert, below on gvf.cu (measured faster there
       since gvf.cu's bf16-pair decode: batch 128 -26%, 256 -5%; docs/cuda.md, step 15) */
    c->tc_moe_min = tm && *tm ? atof(tm) : 8.0;
    /* gvf.cu up to this many tokens: the routed experts (below tc_moe_min rows per expert); the
       dense GEMMs and the shared expert stop at 32 rows in any case (their tiles' limit) */
    const char *gf = getenv("DSI_CUDA_GVF");
    c->gvf_max = gf && *gf ? atoi(gf) : 512;
    /* dense GEMMs, the shared expert and the routed experts from 1 row (the routed experts from
       3 tokens until step 17: the exact persistent kernels of moe_gv.cu were faster at 1-2 in
       step 12, slower since step 13's gvf.cu walk; docs/cuda.md, step 17) */
    const char *gn = getenv("DSI_CUDA_GVF_MIN"), *gm = getenv("DSI_CUDA_GVF_MOE_MIN");
    c->gvf_min = gn && *gn ? atoi(gn) : 1;
    c->gvf_moe_min = gm && *gm ? atoi(gm) : 1;
    const char *gk = getenv("DSI_CUDA_GVF_KS"), *gi = getenv("DSI_CUDA_GVF_ILV");
    /* at least 2 warps along K, 16 MoE blocks per SM (was 1 and 32): measured together -5% at
       batch 8, -6% at 256, level at 1, 32 and 128, +0.6% at 48 (docs/cuda.md, step 21); since
       step 35 1 for the routed experts from DSI_CUDA_GVF_KS1_MIN tokens (192; 0: never), 0 (the
       default) meaning that rule, a number that number everywhere */
    c->gvf_ks_min = gk && *gk ? atoi(gk) : 0;
    const char *gk1 = getenv("DSI_CUDA_GVF_KS1_MIN");
    c->gvf_ks1_min = gk1 && *gk1 ? atoi(gk1) : 192;
    c->gvf_ilv = !(gi && *gi == '0');
    const char *gnb = getenv("DSI_CUDA_GVF_NBAR");
    c->gvf_nbar = gnb && *gnb == '1'; /* (step 33; measured level in step 35: off) */
    const char *gtl = getenv("DSI_CUDA_GVF_TAIL");
    c->gvf_tail = !(gtl && *gtl == '0');
    const char *gpr = getenv("DSI_CUDA_GVF_PAIR");
    c->gvf_pair = !(gpr && *gpr == '0');
    const char *gef = getenv("DSI_CUDA_GVF_EF");
    c->gvf_ef = gef && *gef == '1'; /* (measured level in step 36: off) */
    const char *pad = getenv("DSI_CUDA_PAD");
    c->pad = pad && atoi(pad) > 0 ? atoi(pad) : 0;
    if (c->pad > 8) c->pad = 8;
    const char *hpf = getenv("DSI_CUDA_HC_PF");
    /* (step 41: the first form +6.8% at batch 1; the second level at batch 1, -1.5% at batch 8
       and -0.5% at 32 on a 1-layer checkpoint, one fused site a step) */
    c->hc_pf = !(hpf && *hpf == '0');
    const char *htr = getenv("DSI_CUDA_HC_TREE");
    c->hc_tree = !(htr && *htr == '0'); /* (step 41: batch 1 -2.7%, 8 -1.6%, 32 -0.9%) */
    const char *hea = getenv("DSI_CUDA_HC_EARLY");
    c->hc_early = hea && *hea == '1'; /* (step 42: batch 1 -0.3%, 8 +1.5%, 32 +1.7%) */
    const char *nq = getenv("DSI_CUDA_NORM_Q");
    c->norm_q = !(nq && *nq == '0');
    const char *nr = getenv("DSI_CUDA_NORM_RQ"), *nb = getenv("DSI_CUDA_NORM_BLK1");
    /* off: measured level at batch 1 and 0.5% slower at batch 8 than the rope and act_quant
       launches (docs/cuda.md, step 19) */
    c->norm_rq = nr && *nr == '1';
    c->norm_blk1 = !(nb && *nb == '0');
    const char *gp = getenv("DSI_CUDA_GVF_PRE");
    c->gvf_pre = gp && *gp ? atoi(gp) : 1;
    if (c->gvf_pre > 256) c->gvf_pre = 256;
    const char *gmp = getenv("DSI_CUDA_GVF_MPRE"); /* (step 42: 1 +1.1% at batch 1, 4 +3.5-16%) */
    c->gvf_mpre = gmp && *gmp ? atoi(gmp) : 0;
    if (c->gvf_mpre < 0) c->gvf_mpre = 0;
    if (c->gvf_mpre > 64) c->gvf_mpre = 64;
    const char *hs = getenv("DSI_CUDA_HC_SPLIT");
    c->hc_split = hs && *hs && atoi(hs) > 0 ? atoi(hs) : 8;
    const char *tb = getenv("DSI_CUDA_TC_BN");
    c->tc_bn_max = tb && *tb ? atoi(tb) : 64; /* 128: 1 block per SM (200 registers); step 15 */
    if (c->tc_bn_max != 16 && c->tc_bn_max != 32 && c->tc_bn_max != 128) c->tc_bn_max = 64;
    const char *gt = getenv("DSI_CUDA_GVF_MOE_NT");
    c->gvf_moe_nt = gt && (*gt == '1' || *gt == '2' || *gt == '4') ? *gt - '0' : 0;
    const char *gb = getenv("DSI_CUDA_GVF_BLOCKS");
    /* 16 with gvf_ks_min 2 (step 21; 8 until step 20, then 32) */
    c->gvf_blocks = gb && atoi(gb) > 0 ? atoi(gb) : 16;
    /* step 39: the routed walks' grid as one balanced wave (compiled only: off) */
    const char *gl = getenv("DSI_CUDA_GVF_BAL");
    c->gvf_bal = gl && atoi(gl) > 0 ? atoi(gl) : 0;
    if (c->gvf_bal > 16) c->gvf_bal = 16;
    const char *gg = getenv("DSI_CUDA_GVF_BALG");
    c->gvf_bal_g = gg && atoi(gg) > 0 ? atoi(gg) : 4;
    const char *hm = getenv("DSI_CUDA_HC_MIX_MIN");
    c->hc_mix_min = hm && *hm ? atoi(hm) : 2; /* 512 until step 23 (the old k_hc_mix) */
    const char *hx = getenv("DSI_CUDA_HC_MIX_SPLIT");
    c->hc_mix_split = !(hx && *hx == '0');
    /* two rows per lane (step 25, compiled only: the next device run measures it against
       DSI_CUDA_HC_MIX_RPL=1, step 24's kernel) */
    const char *hr = getenv("DSI_CUDA_HC_MIX_RPL");
    c->hc_mix_rpl = hr && *hr ? atoi(hr) : 2;
    /* off until measured on a GPU (docs/cuda.md, plan after step 15) */
    const char *hf = getenv("DSI_CUDA_HC_FUSE");
    c->hc_fuse = hf && *hf == '1';
    /* step 32: the prefill's mix on the tensor cores with the sums of squares; from 128 rows
       since step 37 (batch 256 -1.2 to -1.7% a step; 512 before) */
    const char *ht = getenv("DSI_CUDA_HC_TF_MIN");
    c->hc_tf_min = ht && *ht ? atoi(ht) : 128;
    const char *hpt =
        getenv("DSI_CUDA_HC_PTF"); /* (step 47: 2 measured -0.7 ms at the 8k prefill) */
    c->hc_ptf = hpt && *hpt >= '0' && *hpt <= '3' ? *hpt - '0' : 2;
    /* hc_pre (and the norm after it) in one launch up to this many rows (step 19) */
    const char *ho = getenv("DSI_CUDA_HC_ONE");
    c->hc_one = ho && *ho ? atoi(ho) : 32;
    const char *hcl = getenv("DSI_CUDA_HC_CL");
    c->hc_cl = hcl && *hcl == '1';
    const char *hfn = getenv("DSI_CUDA_HC_FIN_NORM");
    c->hc_fin_norm = hfn && *hfn == '1'; /* (step 33; measured level in step 35: off) */
    if (c->hc_one > CU_HC_ONE_MAX) c->hc_one = CU_HC_ONE_MAX;
    /* wgmma for tc.cu's large tiles (prefill 8k: 163.9 -> 156.2 ms; docs/cuda.md, step 16) */
    const char *wg = getenv("DSI_CUDA_WG");
    c->wg = !(wg && *wg == '0');
    const char *wdm = getenv("DSI_CUDA_WG_DENSE_MIN");
    c->wg_dense_min = wdm && *wdm ? atoi(wdm) : 512;
    const char *wsm = getenv("DSI_CUDA_WG_SHARED_MIN");
    const char *wsb = getenv("DSI_CUDA_WG_SHARED_BN");
    c->wg_shared_min = wsm && *wsm ? atoi(wsm) : 128; /* (step 37; 512 before) */
    c->wg_shared_bn = wsb && *wsb ? atoi(wsb) : 64;
    const char *wgm = getenv("DSI_CUDA_WG_GROUPED_MIN");
    /* (128: the output projection's wo_a at batch 128-256 -0.9 to -1.9% a step; step 36) */
    c->wg_grouped_min = wgm && *wgm ? atoi(wgm) : 128;
    const char *wb = getenv("DSI_CUDA_WG_BN");
    /* (192 from step 16: the 8k prefill 154.5 -> 148.9 ms; 224 from step 48, with wgr.cu's
       TMA tiles: 66.9 -> 62.2 ms, most experts' rows in one tile, docs/cuda.md step 48) */
    c->wg_bn = wb && *wb ? atoi(wb) : 224;
    const char *wbf = getenv("DSI_CUDA_WG_BN_FIT");
    /* (step 49: on by default, prefills in chunks of 2560 rows -12.5%, of 5120 -1.6%, the 8k
       prefill level; 0: wgr_pick_bn's widths) */
    c->wg_bn_fit = !(wbf && *wbf == '0');
    /* (step 25, compiled only: the next device run measures it against DSI_CUDA_WG_DYN=0) */
    const char *wd = getenv("DSI_CUDA_WG_DYN");
    c->wg_dyn = !(wd && *wd == '0');
    /* wgr.cu's kernels, the weights in registers (step 26: the 8k prefill 115.5 -> 108.5 ms;
       DSI_CUDA_WG_RS=0: wg.cu's) */
    const char *wr = getenv("DSI_CUDA_WG_RS");
    c->wg_rs = !(wr && *wr == '0');
    /* wgr.cu's MoE activation tiles by TMA (step 30: the 8k prefill 106.9 -> 96.2 ms; off with
       DSI_CUDA_WGR_TMA=0, or where the driver lacks cuTensorMapEncodeTiled) */
    const char *wt = getenv("DSI_CUDA_WGR_TMA");
    c->wgr_tma = !(wt && *wt == '0');
    /* wgr.cu's routed blocks without the scale tests where cu_moe_table found none needed
       (step 51; DSI_CUDA_WGR_SB=0: the checked kernels) */
    const char *wrsb = getenv("DSI_CUDA_WGR_SB");
    c->wgr_sb = !(wrsb && *wrsb == '0');
    /* (step 52: the 8k prefill -0.8 ms with it; DSI_CUDA_WG_EXP=0: exp_nb's double) */
    const char *wgx = getenv("DSI_CUDA_WG_EXP");
    c->wg_exp = !(wgx && *wgx == '0');
    /* (step 52: the 8k prefill -1.15 ms with it; DSI_CUDA_XBF16=0: the streams in floats) */
    const char *xbf = getenv("DSI_CUDA_XBF16");
    c->xbf16 = !(xbf && *xbf == '0');
    c->tmap_encode = NULL;
    if (c->wgr_tma) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &c->tmap_encode, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            c->tmap_encode = NULL;
        cudaGetLastError();
        c->wgr_tma = c->tmap_encode != NULL;
    }
    const char *wq = getenv("DSI_CUDA_WG_Q8");
    c->wg_q8 = wq && *wq == '1';
    const char *wqm = getenv("DSI_CUDA_WGQ_MIN");
    c->wgq_min = wqm && *wqm ? atof(wqm) : 0.0;
    /* (the stagger lost: the 8k prefill 126.8 -> 119.1 ms without it, step 30) */
    const char *wqs = getenv("DSI_CUDA_WGQ_STG");
    c->wgq_stg = wqs && *wqs == '1';
    const char *wp = getenv("DSI_CUDA_WG_P");
    c->wg_p = wp && *wp == '1'; /* (off: step 40 measured the prefill +2.5%) */
    const char *wpc = getenv("DSI_CUDA_WGP_CF");
    c->wgp_cf = !(wpc && *wpc == '0'); /* (default on from step 40; =0: the producer fences) */
    const char *wcc = getenv("DSI_CUDA_WGP_CC");
    c->wgp_cc = wcc && *wcc == '1'; /* (step 42: the 8k prefill +8%) */
    const char *wcp = getenv("DSI_CUDA_WG_CP");
    c->wg_cp = !(wcp && *wcp == '0');
    const char *wtk = getenv("DSI_CUDA_WG_TOK"); /* the copy by position by token (step 47) */
    c->wg_tok = !(wtk && *wtk == '0');
    const char *ao = getenv("DSI_CUDA_ATTN_O16");
    c->attn_o16 = !(ao && *ao == '0');
    const char *aos = getenv("DSI_CUDA_ATTN_OSKIP");
    c->attn_oskip = !(aos && *aos == '0'); /* (step 45: with O16V the 8k prefill -2.0 ms) */
    const char *aov = getenv("DSI_CUDA_ATTN_O16V");
    c->attn_o16v = !(aov && *aov == '0'); /* (step 45: the 8k prefill -1.4 ms) */
    const char *aql = getenv("DSI_CUDA_ATTN_QN_LEAN");
    c->attn_qn_lean = !(aql && *aql == '0'); /* (on since step 46: the 8k prefill -1.0 ms) */
    const char *aq = getenv("DSI_CUDA_ATTN_Q16");
    c->attn_q16 = !(aq && *aq == '0');
    const char *ta = getenv("DSI_CUDA_TC_ATTN");
    c->tc_attn_min = ta && *ta ? atoi(ta) : 128;
    /* the fused attention of `fast` numerics from this many rows (0: off; attn_fa.cu, step 21:
       measured -5% at batch 32, 128 and 256, -7% at 48, prefill 8k -10%; from 1 row: +5% at
       batch 8, +25% at 1, unsplit); below a block per SM it splits along the keys
       (DSI_CUDA_ATTN_FA_SPLIT=0: never; step 24) */
    const char *fa = getenv("DSI_CUDA_ATTN_FA"), *fs = getenv("DSI_CUDA_ATTN_FA_SPLIT");
    c->attn_fa_min = fa && *fa ? atoi(fa) : 1;
    c->attn_fa_split = !(fs && *fs == '0');
    const char *f8 = getenv("DSI_CUDA_ATTN_FA_K8");
    c->attn_fa_k8 = !(f8 && *f8 == '0');
    /* the fused attention's heads per block (32 or 64), keys per tile (16 or 32), and whether
       it applies attn's per-head q norm (and RoPE) as it stages q (instead of a launch that
       reads and writes q once more) and the inverse RoPE as it writes out (instead of a rope
       launch): each forced by its variable, else chosen by the call's rows, the "big" choices
       (64, 32, both fused) from DSI_CUDA_ATTN_FA_BIG rows (192; measured on the H100: 32 heads
       -3% at batch 1 and 128, +0.5% at 256 and the prefill; 32 keys -0.6% at 256, -2.8% at the
       8k prefill, +1-2% at 1; the fusions -1.6% at 256, -1.7% at the prefill, +2% at 1, +0.4%
       at 128; docs/cuda.md step 35) */
    const char *fbig = getenv("DSI_CUDA_ATTN_FA_BIG");
    c->attn_fa_big = fbig && *fbig ? atoi(fbig) : 192;
    const char *fhb = getenv("DSI_CUDA_ATTN_FA_HB");
    c->attn_fa_hb = fhb && *fhb ? atoi(fhb) : 0;
    const char *fkt = getenv("DSI_CUDA_ATTN_FA_KT");
    c->attn_fa_kt = fkt && *fkt ? atoi(fkt) : 0;
    const char *fqn = getenv("DSI_CUDA_ATTN_FA_QN");
    c->attn_fa_qn = fqn && *fqn ? *fqn == '1' : -1;
    const char *forp = getenv("DSI_CUDA_ATTN_FA_OR");
    c->attn_fa_or = forp && *forp ? *forp == '1' : -1;
    const char *fe = getenv("DSI_CUDA_ATTN_FA_EXP");
    /* (step 46: expf by default, the 8k prefill -1.3 ms against exp_ref; 0: exp_ref) */
    c->attn_fa_exp = fe && *fe >= '0' && *fe <= '3' ? *fe - '0' : 1;
    const char *ti = getenv("DSI_CUDA_TC_IDX");
    c->tc_idx = !(ti && *ti == '0');
    /* (step 25, compiled only: several key tiles per block by default) */
    const char *it = getenv("DSI_CUDA_IDX_TPB");
    c->idx_tpb = it && *it ? atoi(it) : 0;
    /* dense FP8 GEMMs of `fast` numerics from 128 rows through cuBLASLt (lt.cu); the handle is
       made here, never in a step; without it the GEMMs stay on tc.cu */
    const char *lm = getenv("DSI_CUDA_LT_MIN"), *ll = getenv("DSI_CUDA_LT_LAYOUT");
    c->lt_min = lm && *lm ? atoi(lm) : 128;
    const char *lo = getenv("DSI_CUDA_LT_MIN_OUT");
    c->lt_min_out = lo && *lo ? atoi(lo) : 0;
    c->lt = c->lt_min > 0 ? cu_lt_new(ll && *ll ? atoi(ll) : 1) : NULL;
    /* a gemm pair's second call takes the first's copy of x (c->xc; step 47) */
    const char *xce = getenv("DSI_CUDA_XC");
    c->xc_on_env = !(xce && *xce == '0');
    /* the grouped wo_a from 2048 rows on cuBLASLt's bf16 matmul (ltb.cu; step 47) */
    const char *lb = getenv("DSI_CUDA_LTB_MIN");
    c->ltb_min = lb && *lb ? atoi(lb) : 2048;
    c->ltb = c->ltb_min > 0 ? cu_ltb_new() : NULL;
    const char *ml = getenv("DSI_CUDA_MOE_LT");
    c->moe_lt = !(ml && *ml == '0');
    const char *mo = getenv("DSI_CUDA_MOE_O16"); /* (step 47) */
    c->moe_o16 = !(mo && *mo == '0');
    /* programmatic dependent launch (sm_90 and later): kernels overlap their start with the
       previous kernel's end (common.cuh, cu_pdl_enter) */
    const char *pd = getenv("DSI_CUDA_PDL");
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    c->pdl_mode = major < 9 ? 0 : pd && *pd ? atoi(pd) : 1;
    c->pdl = c->pdl_mode == 2;
    const char *pm = getenv("DSI_CUDA_PDL_MAX");
    c->pdl_max = pm && *pm ? atoi(pm) : 32;
    const char *gr = getenv("DSI_CUDA_GROUPED");
    c->grouped = !(gr && *gr == '0');
    const char *ng = getenv("DSI_CUDA_NOGRAPH");
    c->use_graphs = !c->prof && !(ng && *ng && *ng != '0');
    c->cur_graph = -1;
    be->ops = c->prof ? &g_cuda_prof_ops : &g_cuda_ops;
    be->ctx = c;
    be->name = "cuda";
    /* FP8 cache rows (misc.cu's stores; attn_fa.cu's 16-byte chunks, the indexer's FP4 keys):
       the engine's auto format takes them (step 30: level with fp32 rows at context 4096, batch
       256 -7% at 65536, 3.5x less cache; DSI_CUDA_KV_FP8=0: fp32 rows) */
    const char *k8 = getenv("DSI_CUDA_KV_FP8");
    be->kv_fp8 = !(k8 && *k8 == '0');
    *out = be;
    return DSI_OK;
}
