/* cpu.c - the CPU backend object: thread pool, per-thread scratch, op table. */
#include "cpu_impl.h"

#include <pthread.h>
#include <string.h>

void *cpu_scratch(struct dsi_backend *be, int tid, int64_t bytes) {
    struct cpu_ctx *c = cpu_ctx(be);
    DSI_ASSERT(tid >= 0 && tid < c->n_threads && bytes <= c->scratch_bytes);
    return c->scratch[tid];
}

static int cpu_reserve(struct dsi_backend *be, int64_t bytes, struct dsi_err *err) {
    struct cpu_ctx *c = cpu_ctx(be);
    if (bytes <= c->scratch_bytes) return DSI_OK;
    for (int i = 0; i < c->n_threads; i++) {
        free(c->scratch[i]);
        c->scratch[i] = dsi_aligned_alloc((size_t)bytes);
        if (!c->scratch[i]) {
            c->scratch_bytes = 0;
            return dsi_errf(err, DSI_ERR_NOMEM, "cpu backend: cannot reserve %lld bytes of scratch",
                            (long long)bytes);
        }
    }
    c->scratch_bytes = bytes;
    return DSI_OK;
}

static void cpu_free(struct dsi_backend *be) {
    struct cpu_ctx *c = cpu_ctx(be);
    for (int i = 0; i < c->n_threads; i++)
        free(c->scratch[i]);
    free(c->scratch);
    dsi_pool_free(c->pool);
    free(c);
}

static void *cpu_alloc(struct dsi_backend *be, size_t bytes) { return dsi_aligned_alloc(bytes); }
static void cpu_mfree(struct dsi_backend *be, void *p) { free(p); }
static void cpu_copy_bytes(struct dsi_backend *be, void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
}
static const void *cpu_import(struct dsi_backend *be, const void *host, size_t bytes) {
    return host; /* weights stay in the mmap */
}
static int cpu_sync(struct dsi_backend *be, struct dsi_err *err) { return DSI_OK; }

static const struct dsi_backend_ops g_cpu_ops = {
    .alloc = cpu_alloc,
    .mfree = cpu_mfree,
    .upload = cpu_copy_bytes,
    .download = cpu_copy_bytes,
    .import = cpu_import,
    .sync = cpu_sync,
    .reserve = cpu_reserve,
    .free = cpu_free,
    .gemm = cpu_gemm,
    .act_quant = cpu_act_quant,
    .hadamard_q4 = cpu_hadamard_q4,
    .embed = cpu_embed,
    .add = cpu_add,
    .copy = cpu_copy,
    .rms_norm = cpu_rms_norm,
    .rope = cpu_rope,
    .hc_pre = cpu_hc_pre,
    .hc_post = cpu_hc_post,
    .hc_head = cpu_hc_head,
    .attn = cpu_attn,
    .indexer = cpu_indexer,
    .kv_store = cpu_kv_store,
    .comp_ape = cpu_comp_ape,
    .compress = cpu_compress,
    .comp_store = cpu_comp_store,
    .entry_store = cpu_entry_store,
    .gather = cpu_gather,
    .moe_route = cpu_moe_route,
    .moe = cpu_moe,
    .sample = cpu_sample,
};

int dsi_backend_cpu_new(struct dsi_backend **out, int n_threads, struct dsi_err *err) {
    *out = NULL;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cpu_tables_init);
    struct dsi_backend *be = dsi_calloc(1, sizeof(*be));
    struct cpu_ctx *c = dsi_calloc(1, sizeof(*c));
    if (!be || !c) goto fail;
    c->pool = dsi_pool_new(n_threads);
    if (!c->pool) goto fail;
    c->n_threads = dsi_pool_size(c->pool);
    c->scratch = dsi_calloc((size_t)c->n_threads, sizeof(char *));
    if (!c->scratch) goto fail;
    be->ops = &g_cpu_ops;
    be->ctx = c;
    be->name = "cpu";
    be->kv_fp8 = true;
    *out = be;
    return DSI_OK;
fail:
    if (c) dsi_pool_free(c->pool);
    free(c);
    free(be);
    return dsi_errf(err, DSI_ERR_NOMEM, "cpu backend: out of memory");
}

void dsi_backend_free(struct dsi_backend *be) {
    if (!be) return;
    be->ops->free(be);
    free(be);
}
