/* cmd_bench_layer.c - `dsinfer bench layer`: time of one decode step of the main model (embed +
 * every layer, no head) for batch sizes 1..256 at a given context, against the bytes-moved
 * roofline with the device's copy bandwidth measured in the same run.
 *
 *   dsinfer bench layer -m DIR [--backend cuda|cpu] [--batch 1,2,4,...] [--ctx N] [--steps N]
 *                       [--numerics plain|reference]
 *
 * For a real-shape model without 280 GB of weights: python3 ref/make_checkpoint.py --preset flash
 * --layers 4 --out DIR (random weights, real shapes; layers 0-1 window only, 2 CSA, 3 HCA).
 *
 * The cache is not prefilled: each sequence is set to n_past = ctx with zeroed cache rows, so a
 * step reads exactly the rows a real decode at that context reads (window, CSA selection,
 * indexer keys, HCA entries); only the values differ. Bytes counted per step: every non-expert
 * weight of every layer once, each routed expert expected to be hit (E (1 - (1 - k/E)^B) experts
 * for B rows of uniform routing) once, and the cache rows each row reads (fp32). Activations are
 * not counted. The roofline is bytes / copy bandwidth (a large device copy through the backend's
 * copy op, counting bytes read plus written); "ratio" is measured time over that floor.
 *
 * This tool sits below the public API (it drives the forward pass directly); the lead hooks it
 * into `dsinfer bench layer`. */
#include "backend/backend.h"
#include "cache/kv.h"
#include "core/core.h"
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int cmd_bench_layer(int argc, char **argv);

#ifdef DSI_CUDA
/* The CUDA backend's profiler (src/backend/cuda/cuda.cu; DSI_CUDA_PROFILE=1): print the op
 * times gathered since the last call and start again. Weak, so that this tool also links
 * against a backend without it (A/B runs against an older build). */
void dsi_cuda_profile_dump(struct dsi_backend *be, const char *title) __attribute__((weak));
#endif

/* With DSI_CUDA_PROFILE=1: the profile of the timed steps only (warm-up left out). */
static void profile_mark(struct dsi_backend *be, const char *title) {
#ifdef DSI_CUDA
    if (dsi_cuda_profile_dump) dsi_cuda_profile_dump(be, title);
#else
    (void)be;
    (void)title;
#endif
}

static int64_t tbytes(const struct dsi_tensor *t) {
    if (!t->data) return 0;
    int64_t b = dsi_tensor_row_bytes(t) * (t->ne[1] > 0 ? t->ne[1] : 1);
    if (t->ne[2] > 1) b *= t->ne[2];
    if (t->ne[3] > 1) b *= t->ne[3];
    return b;
}

/* Bytes of the layer's weights outside the routed experts. */
static int64_t layer_bytes(const struct dsi_layer_w *L) {
    const struct dsi_tensor *ts[] = {&L->hc_attn.fn,    &L->hc_attn.base,
                                     &L->hc_attn.scale, &L->hc_ffn.fn,
                                     &L->hc_ffn.base,   &L->hc_ffn.scale,
                                     &L->attn_norm,     &L->ffn_norm,
                                     &L->attn_sink,     &L->wq_a,
                                     &L->q_norm,        &L->wq_b,
                                     &L->wkv,           &L->kv_norm,
                                     &L->wo_a,          &L->wo_b,
                                     &L->comp.wkv,      &L->comp.wgate,
                                     &L->comp.ape,      &L->comp.norm,
                                     &L->idx_wq_b,      &L->idx_weights_proj,
                                     &L->idx_comp.wkv,  &L->idx_comp.wgate,
                                     &L->idx_comp.ape,  &L->idx_comp.norm,
                                     &L->gate_w,        &L->gate_bias,
                                     &L->sh_w1,         &L->sh_w2,
                                     &L->sh_w3};
    int64_t b = 0;
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        b += tbytes(ts[i]);
    for (int i = 0; i < L->n_scales; i++)
        b += tbytes(&L->scales[i]);
    return b;
}

static int64_t expert_bytes(const struct dsi_layer_w *L) {
    int64_t b = tbytes(&L->ew1[0]) + tbytes(&L->ew2[0]) + tbytes(&L->ew3[0]);
    for (int i = 0; i < 3; i++)
        b += tbytes(&L->escales[i]);
    return b;
}

/* Cache bytes one decode row at context ctx reads in layer il (fp32 rows). */
static int64_t cache_bytes(const struct dsi_config *c, int il, int64_t ctx) {
    const struct dsi_layer_info *li = &c->layers[il];
    int64_t t = ctx, hd = c->head_dim, win = DSI_MIN(t + 1, (int64_t)c->sliding_window);
    int64_t b = win * hd * 4;
    if (li->kind == DSI_ATTN_CSA) {
        int64_t vis = (t + 1) / li->ratio;
        b += DSI_MIN(vis, (int64_t)c->index_topk) * hd * 4 + vis * c->index_head_dim * 4;
    } else if (li->ratio) {
        b += (t + 1) / li->ratio * hd * 4;
    }
    return b;
}

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static void usage(FILE *f) {
    fprintf(f, "usage: dsinfer bench layer -m DIR [--backend cuda|cpu] [--batch 1,2,4,...]\n"
               "                          [--ctx N] [--steps N] [--numerics plain|reference]\n"
               "decode step time (embed + all layers, no head) per batch size, against the\n"
               "bytes-moved roofline at the measured device copy bandwidth.\n");
}

/* Copy bandwidth through the backend's copy op: GB/s counting bytes read + written. */
static double copy_bw(struct dsi_backend *be, struct dsi_err *err) {
    int64_t dim = 1 << 20, rows = 256; /* 1 GiB each way */
    float *a = be->ops->alloc(be, (size_t)(dim * rows * 4)),
          *b = be->ops->alloc(be, (size_t)(dim * rows * 4));
    double best = 0;
    if (a && b) {
        struct dsi_copy_args ca = {a, b, rows, dim, dim, dim};
        be->ops->copy(be, &ca);
        be->ops->sync(be, err);
        for (int i = 0; i < 5; i++) {
            double t0 = dsi_time_s();
            be->ops->copy(be, &ca);
            be->ops->sync(be, err);
            double s = dsi_time_s() - t0;
            double bw = 2.0 * (double)(dim * rows * 4) / s / 1e9;
            if (bw > best) best = bw;
        }
    }
    if (a) be->ops->mfree(be, a);
    if (b) be->ops->mfree(be, b);
    return best;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int cmd_bench_layer(int argc, char **argv) {
    const char *dir = NULL, *backend = "cuda";
    int batches[32] = {1, 2, 4, 8, 16, 32, 64, 128, 256}, nb = 9, steps = 10, warmup = 2;
    int64_t ctx = 4096;
    enum dsi_numerics num = DSI_NUMERICS_PLAIN;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "layer")) {
            continue;
        } else if (!strcmp(a, "-m") && v) {
            dir = argv[++i];
        } else if (!strcmp(a, "--backend") && v) {
            backend = argv[++i];
        } else if (!strcmp(a, "--batch") && v) {
            nb = parse_list(argv[++i], batches, 32);
            if (nb < 1) {
                fprintf(stderr, "dsinfer bench layer: --batch: want a list like 1,2,4, got '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--ctx") && v) {
            ctx = atoll(argv[++i]);
        } else if (!strcmp(a, "--steps") && v) {
            steps = atoi(argv[++i]);
        } else if (!strcmp(a, "--numerics") && v) {
            num = !strcmp(argv[++i], "reference") ? DSI_NUMERICS_REFERENCE : DSI_NUMERICS_PLAIN;
        } else {
            fprintf(stderr, "dsinfer bench layer: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || ctx < 1 || steps < 1) {
        usage(stderr);
        return 2;
    }
    int max_b = 1;
    for (int i = 0; i < nb; i++)
        max_b = DSI_MAX(max_b, batches[i]);
    struct dsi_err err = {0};
    struct dsi_model *m = NULL;
    struct dsi_backend *be = NULL;
    struct dsi_kv *kv = NULL;
    struct dsi_fwd *f = NULL;
    int rc = 1;
    int32_t *tok = NULL, *pos = NULL, *slot = NULL;
    double t_load = dsi_time_s();
    if (dsi_model_load(&m, dir, &err)) goto fail;
    if (!strcmp(backend, "cuda")) {
#ifdef DSI_CUDA
        if (dsi_backend_cuda_new(&be, 0, &err)) goto fail;
#else
        dsi_errf(&err, DSI_ERR_UNSUPPORTED, "backend cuda: this build has no CUDA (make CUDA=1)");
        goto fail;
#endif
    } else if (dsi_backend_cpu_new(&be, 0, &err)) {
        goto fail;
    }
    if (dsi_model_import(m, be, &err) || be->ops->sync(be, &err)) goto fail;
    t_load = dsi_time_s() - t_load;
    const struct dsi_config *c = &m->cfg;
    struct dsi_kv_opts ko = {.max_seqs = max_b, .max_ctx = ctx + warmup + steps + 1, .max_rows = 1};
    if (dsi_kv_new(&kv, c, be, &ko, &err)) goto fail;
    if (dsi_fwd_new(&f, m, be, kv, max_b, num, &err)) goto fail;
    double bw = copy_bw(be, &err);
    int64_t wbytes = 0, ebytes = 0;
    for (int il = 0; il < c->num_hidden_layers; il++)
        wbytes += layer_bytes(&m->layers[il]);
    ebytes = expert_bytes(&m->layers[0]);
    printf("# dsinfer bench layer: %s, %d layers, backend %s, ctx %lld, numerics %s\n", dir,
           c->num_hidden_layers, be->name, (long long)ctx, num ? "reference" : "plain");
    printf(
        "# load+import %.1f s; copy bandwidth %.0f GB/s (read+write); non-expert weights %.1f MB "
        "per step, %.1f MB per expert\n",
        t_load, bw, (double)wbytes / 1e6, (double)ebytes / 1e6);
    printf("%6s %10s %10s %10s %10s %9s %10s %8s\n", "batch", "step_ms", "layer_ms", "tok/s",
           "MB/step", "GB/s", "roof_ms", "ratio");
    tok = malloc(sizeof(int32_t) * (size_t)max_b);
    pos = malloc(sizeof(int32_t) * (size_t)max_b);
    slot = malloc(sizeof(int32_t) * (size_t)max_b);
    if (!tok || !pos || !slot) goto fail;
    uint64_t x = 88172645463325252ull;
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        for (int r = 0; r < B; r++) {
            if (dsi_kv_seq_new(kv, &slot[r], &err) ||
                dsi_kv_reserve(kv, slot[r], ctx + warmup + steps + 1, &err))
                goto fail;
            kv->seqs[slot[r]].n_past = ctx; /* skip the prefill: zeroed cache rows */
        }
        double *ts = malloc(sizeof(double) * (size_t)steps);
        if (!ts) goto fail;
        for (int s = 0; s < warmup + steps; s++) {
            for (int r = 0; r < B; r++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                tok[r] = (int32_t)(3 + x % (uint64_t)(c->vocab_size - 3));
                pos[r] = (int32_t)kv->seqs[slot[r]].n_past;
            }
            struct dsi_batch b = {.n = B, .tokens = tok, .pos = pos, .slot = slot};
            if (s == warmup) profile_mark(be, NULL);
            double t0 = dsi_time_s();
            if (dsi_forward(f, &b, NULL, NULL, &err)) {
                free(ts);
                goto fail;
            }
            if (s >= warmup) ts[s - warmup] = dsi_time_s() - t0;
        }
        char title[96];
        snprintf(title, sizeof(title), "batch %d, %d steps (warm-up left out)", B, steps);
        profile_mark(be, title);
        qsort(ts, (size_t)steps, sizeof(double), cmp_double);
        double t = ts[steps / 2];
        free(ts);
        int E = c->n_routed_experts, K = c->num_experts_per_tok;
        double hit = E * (1.0 - pow(1.0 - (double)K / E, B));
        double bytes = (double)wbytes + hit * (double)ebytes * c->num_hidden_layers;
        for (int il = 0; il < c->num_hidden_layers; il++)
            bytes += (double)B * (double)cache_bytes(c, il, ctx);
        double roof = bw > 0 ? bytes / (bw * 1e9) : 0;
        printf("%6d %10.3f %10.3f %10.1f %10.1f %9.0f %10.3f %8.2f\n", B, t * 1e3,
               t * 1e3 / c->num_hidden_layers, B / t, bytes / 1e6, bytes / t / 1e9, roof * 1e3,
               roof > 0 ? t / roof : 0);
        fflush(stdout);
        for (int r = 0; r < B; r++)
            dsi_kv_seq_free(kv, slot[r]);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "dsinfer bench layer: %s\n", err.msg);
    free(tok);
    free(pos);
    free(slot);
    dsi_fwd_free(f);
    dsi_kv_free(kv);
    dsi_backend_free(be);
    dsi_model_free(m);
    return rc;
}

#ifdef DSI_BENCH_LAYER_MAIN
int main(int argc, char **argv) { return cmd_bench_layer(argc, argv); }
#endif
