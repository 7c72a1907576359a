/* cmd_bench_layer.c - `dsinfer bench layer`: the forward pass of a (random, real-shape) checkpoint
 * timed against the device's ceilings measured in the same run (issue 7, "Benchmark").
 *
 *   dsinfer bench layer -m DIR [--backend cuda|cpu] [--batch 1,2,4,...] [--ctx 4096,65536]
 *                       [--steps N] [--warmup N] [--prefill N] [--hf FILE] [...]  (see usage())
 *
 * For a real-shape model without 280 GB of weights: python3 ref/make_checkpoint.py --preset flash
 * --layers 4 --out DIR (random weights, real shapes; layers 0-1 window only, 2 CSA, 3 HCA;
 * layers 0-2 hash-routed, 3 learned).
 *
 * Ceilings, measured in this process: the device copy bandwidth (a 1 GiB copy through the
 * backend's copy op, bytes read + written) and, on CUDA, the FP8 tensor-core GEMM rate (cuBLASLt,
 * e4m3 x e4m3 -> bf16, fp32 accumulation, src/backend/cuda/peak.cu). For a step:
 *   bytes roofline = bytes it must move / copy bandwidth; bytes = every non-expert weight of every
 *     layer once, each routed expert expected to be hit (E (1 - (1 - k/E)^B) experts for B rows
 *     of uniform routing) once, and the cache rows each row reads (in the cache format used);
 *     activations not counted;
 *   FP8 roofline = FLOPs / FP8 rate; FLOPs = 2 x rows x (weights of the non-expert GEMMs + k
 *     routed experts + the shared expert), plus attention (4 x heads x head_dim per key read: the
 *     scores and P.V) and the CSA indexer (2 x index heads x index_head_dim per visible entry);
 *   the larger roofline = max of the two. "%bytes" / "%larger" = roofline time / measured time.
 *
 * Decode: per context and batch size, B sequences are set to n_past = ctx with the cache rows
 * left as zeros (no prefill), so a step reads exactly the rows a real decode at that context reads
 * (window, CSA selection, indexer keys, HCA entries); only the values differ. Step = embed + every
 * layer, no head; median of --steps steps after --warmup. Sizes whose cache and activations do not
 * fit in free device memory are skipped with a line saying so.
 *
 * Per layer (default; --no-split leaves it out): the forward runs all layers in one call, so the
 * tool times the first k layers for k = 0..L (it lowers the model's num_hidden_layers for those
 * runs); layer i's time = step(i + 1) - step(i), step(0) = embed and the step's fixed costs. The
 * MoE part = step - step with the backend's moe and moe_route ops replaced by no-ops (the gate
 * GEMM stays), spread evenly over the layers; the head = step with logits for every row (hc_head,
 * norm, LM head, logits copied to the host) - step. Each variant runs with its own forward object
 * (creating one drops the backend's recorded CUDA graphs, which are keyed by the step's shape
 * only). These feed the projection to the 43-layer V4-Flash (spec 2.4: 2 window, 21 CSA, 20 HCA
 * layers): embed + the per-kind layer times + the head less the logits' copy to the host (at the
 * download rate measured here; a device sampler copies token ids only), on one GPU and, simulated,
 * on two GPUs with the experts split in two (moe part halved + an all-to-all at --nvlink-gbs and
 * --a2a-us); with the memory the 43 layers' weights and this engine's fp32 cache would need.
 *
 * --leave-out OPS: each decode figure also timed with each listed backend op replaced by a no-op
 * (tools/bench_leave.c): step - that time = the op's cost inside the recorded step (launch gaps
 * and overlap included, unlike a per-kernel profile).
 *
 * Prefill: one prompt of --prefill tokens (default 8192) in chunks of --prefill-chunk rows (default
 * the whole prompt, halved until it fits), one warm-up then --prefill-reps timed; tokens/s and the
 * FLOP rate over the measured FP8 GEMM rate.
 *
 * HF transformers eager: ref/hf_layer_bench.py times the same layers (same shapes, bf16, random
 * weights) and writes JSON; --hf FILE prints "x faster than HF" beside each figure it has.
 *
 * This tool sits below the public API (it drives the forward pass directly). */
#include "args.h"
#include "backend/backend.h"
#include "bench_leave.h"
#include "cache/kv.h"
#include "core/core.h"
#include "dsinfer.h"
#include "model/forward.h"
#ifdef DSI_CUDA
#include "backend/cuda/peak.h"
#endif

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cmd_bench_layer(int argc, char **argv);

#ifdef DSI_CUDA
/* The CUDA backend's profiler (src/backend/cuda/cuda.cu; DSI_CUDA_PROFILE=1): print the op
 * times gathered since the last call and start again. Weak, so that this tool also links
 * against a backend without it (A/B runs against an older build). */
void dsi_cuda_profile_dump(struct dsi_backend *be, const char *title) __attribute__((weak));
#ifdef DSI_BENCH_LAYER_MAIN
/* Standalone builds (tests/ops/gpu_*.sh) may link against a library without peak.o (a baseline
 * tree): weak there; tests/ops/gpu_run.sh links peak.o explicitly. */
int dsi_cuda_fp8_gemm_tflops(int, int, int, int, int, double *, char *, size_t)
    __attribute__((weak));
int dsi_cuda_mem_info(int, size_t *, size_t *) __attribute__((weak));
int dsi_cuda_device_desc(int, char *, size_t) __attribute__((weak));
#define HAVE_PEAK(fn) ((fn) != NULL)
#else
#define HAVE_PEAK(fn) 1
#endif
#endif

/* V4-Flash's layer schedule (spec 2.4): 43 layers = 2 window-only + 21 CSA + 20 HCA. */
enum { FLASH_LAYERS = 43, FLASH_WINDOW = 2, FLASH_CSA = 21, FLASH_HCA = 20 };
/* Published figures (issue 7): SGLang on 4x H200 with V4-Flash. */
#define PUB_B1_MS   1.72  /* ms per output token, 1 request, speculative decoding */
#define PUB_B256_MS 104.5 /* TPOT ms, 256 requests, inputs up to 8k tokens */

#define MAX_LIST 32
#define MAX_HF   256

/* With DSI_CUDA_PROFILE=1: the profile of the timed steps only (warm-up left out). */
static void profile_mark(struct dsi_backend *be, const char *title) {
#ifdef DSI_CUDA
    if (dsi_cuda_profile_dump) dsi_cuda_profile_dump(be, title);
#else
    (void)be;
    (void)title;
#endif
}

/* ---- sizes, bytes and FLOPs ------------------------------------------------------------------ */

static int64_t tbytes(const struct dsi_tensor *t) {
    if (!t->data) return 0;
    int64_t b = dsi_tensor_row_bytes(t) * (t->ne[1] > 0 ? t->ne[1] : 1);
    if (t->ne[2] > 1) b *= t->ne[2];
    if (t->ne[3] > 1) b *= t->ne[3];
    return b;
}

/* Logical elements of a weight (FP4: ne[0] counts elements). */
static double telems(const struct dsi_tensor *t) {
    if (!t->data) return 0;
    double e = (double)t->ne[0] * (double)(t->ne[1] > 0 ? t->ne[1] : 1);
    if (t->ne[2] > 1) e *= (double)t->ne[2];
    if (t->ne[3] > 1) e *= (double)t->ne[3];
    return e;
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

/* Weights one row multiplies in the layer's non-expert GEMMs (mHC mixes, attention projections,
 * compressors, indexer, gate, shared expert). */
static double layer_gemm_elems(const struct dsi_layer_w *L) {
    const struct dsi_tensor *ts[] = {&L->hc_attn.fn,
                                     &L->hc_ffn.fn,
                                     &L->wq_a,
                                     &L->wq_b,
                                     &L->wkv,
                                     &L->wo_a,
                                     &L->wo_b,
                                     &L->comp.wkv,
                                     &L->comp.wgate,
                                     &L->idx_wq_b,
                                     &L->idx_weights_proj,
                                     &L->idx_comp.wkv,
                                     &L->idx_comp.wgate,
                                     &L->gate_w,
                                     &L->sh_w1,
                                     &L->sh_w2,
                                     &L->sh_w3};
    double e = 0;
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        e += telems(ts[i]);
    return e;
}

static double expert_elems(const struct dsi_layer_w *L) {
    return telems(&L->ew1[0]) + telems(&L->ew2[0]) + telems(&L->ew3[0]);
}

/* The cache's key-row format (--kv-cache, resolved once the backend exists). */
static int g_kvd = DSI_KV_F32;
static int64_t key_row_bytes(const struct dsi_config *c) {
    return dsi_kv_row_total(g_kvd, (int)c->head_dim,
                            g_kvd == DSI_KV_FP8 ? (int)c->qk_rope_head_dim : 0);
}

static int64_t index_row_bytes(const struct dsi_config *c) {
    return dsi_kv_row_total(dsi_kv_ikey_dtype(c, g_kvd), (int)c->index_head_dim, 0);
}

/* Cache bytes one row at position t reads in layer il (key rows and indexer keys in g_kvd's
 * formats). */
static int64_t cache_bytes(const struct dsi_config *c, int il, int64_t t) {
    const struct dsi_layer_info *li = &c->layers[il];
    int64_t rb = key_row_bytes(c), win = DSI_MIN(t + 1, (int64_t)c->sliding_window);
    int64_t b = win * rb;
    if (li->kind == DSI_ATTN_CSA) {
        int64_t vis = (t + 1) / li->ratio;
        b += DSI_MIN(vis, (int64_t)c->index_topk) * rb + vis * index_row_bytes(c);
    } else if (li->ratio) {
        b += (t + 1) / li->ratio * rb;
    }
    return b;
}

/* Attention FLOPs of one row at position t in layer il: scores + P.V over the keys it reads,
 * and the CSA indexer's scores over the visible entries. */
static double attn_flops(const struct dsi_config *c, int il, int64_t t) {
    const struct dsi_layer_info *li = &c->layers[il];
    double keys = (double)DSI_MIN(t + 1, (int64_t)c->sliding_window), idx = 0;
    if (li->kind == DSI_ATTN_CSA) {
        int64_t vis = (t + 1) / li->ratio;
        keys += (double)DSI_MIN(vis, (int64_t)c->index_topk);
        idx = 2.0 * c->index_n_heads * c->index_head_dim * (double)vis;
    } else if (li->ratio) {
        keys += (double)((t + 1) / li->ratio);
    }
    return 4.0 * c->num_attention_heads * c->head_dim * keys + idx;
}

/* Cache pool bytes of a layer schedule (kinds[i], ratios[i]) as cache/kv.c lays it out. */
static double kv_pool_bytes(const struct dsi_config *c,
                            const int *kinds,
                            const int *ratios,
                            int n,
                            int64_t seqs,
                            int64_t max_ctx,
                            int64_t max_rows) {
    int64_t l = 1;
    for (int i = 0; i < n; i++)
        if (ratios[i]) {
            int64_t a = l, b = ratios[i];
            while (b) {
                int64_t t = a % b;
                a = b;
                b = t;
            }
            l = l / a * ratios[i];
        }
    int64_t page = l * ((256 + l - 1) / l), pages = (max_ctx + page - 1) / page;
    double S = (double)seqs, n_pages = (double)pages * S, hd = c->head_dim;
    double krow = (double)key_row_bytes(c) / 4; /* a key row, in floats */
    double ihd = c->index_head_dim, ring = c->sliding_window - 1 + (double)max_rows;
    double f = S * (double)pages; /* page table (int32) */
    for (int i = 0; i < n; i++) {
        f += S * ring * krow;
        if (!ratios[i]) continue;
        bool csa = kinds[i] == DSI_ATTN_CSA;
        double slots = (csa ? 2 : 1) * ratios[i], width = (csa ? 2 : 1) * hd;
        double per_page = (double)(page / ratios[i]);
        f += 2 * S * slots * width + n_pages * per_page * krow;
        if (csa) f += 2 * S * slots * 2 * ihd + n_pages * per_page * (double)index_row_bytes(c) / 4;
    }
    return f * 4;
}

static double kv_bytes_model(const struct dsi_config *c, int64_t seqs, int64_t ctx, int64_t rows) {
    int kinds[DSI_MAX_LAYERS], ratios[DSI_MAX_LAYERS];
    for (int i = 0; i < c->n_layers_total; i++) {
        kinds[i] = c->layers[i].kind;
        ratios[i] = c->layers[i].ratio;
    }
    return kv_pool_bytes(c, kinds, ratios, c->n_layers_total, seqs, ctx, rows);
}

/* The forward's activations for `rows` rows (model/forward.c's dsi_fwd_new), bytes. */
static double fwd_bytes(const struct dsi_config *c, int64_t rows) {
    double D = c->hidden_size, HD = (double)c->num_attention_heads * c->head_dim;
    double ql = c->q_lora_rank, hd = c->head_dim, ihd = c->index_head_dim,
           K = c->num_experts_per_tok;
    double widest = DSI_MAX(DSI_MAX(D, ql), DSI_MAX((double)c->wo_b_in, HD));
    double nk = K, inter = c->moe_intermediate_size;
    double work = nk * D + nk + 2 * nk * inter + (nk + 1) * D + nk;
    double per = 2.0 * c->hc_dim + 3 * D + DSI_MAX(widest, (double)c->hc_dim) + c->hc_mult +
                 (double)c->hc_mult * c->hc_mult + 2 * ql + 2 * HD + hd + c->wo_b_in + 4 * hd +
                 4 * ihd + (double)c->index_n_heads * ihd + c->index_n_heads + c->n_routed_experts +
                 2 * K + work + hd + ihd + c->vocab_size + c->index_topk + 8;
    return per * 4 * (double)rows;
}

/* ---- options ----------------------------------------------------------------------------------
 */

static int parse_list(const char *s, int64_t *out, int cap, int64_t lo, int64_t hi) {
    int n = 0;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < lo || v > hi || n == cap || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: dsinfer bench layer -m DIR [options]\n"
        "decode step time (embed + all layers, no head) per batch size and context, and prefill\n"
        "throughput, beside rooflines measured in the same run (copy bandwidth; FP8 GEMM rate\n"
        "through cuBLASLt) and HF transformers eager figures; per-layer times and a projection to\n"
        "the 43-layer V4-Flash on one and two GPUs (simulation).\n"
        "  -m DIR                 checkpoint (e.g. ref/make_checkpoint.py --preset flash --layers "
        "4)\n"
        "  --backend cuda|cpu     backend (default cuda)\n"
        "  --batch LIST           batch sizes (default 1,2,4,8,16,32,64,128,256)\n"
        "  --ctx LIST             decode contexts in tokens (default 4096; e.g. 4096,65536)\n"
        "  --steps N              timed decode steps per figure, median (default 10)\n"
        "  --warmup N             untimed steps before them (default 2: with CUDA graphs the "
        "first\n"
        "                         step of a shape runs eagerly, the second is captured)\n"
        "  --numerics plain|reference|fast   (default plain; fast: reference rounding, tensor "
        "cores)\n"
        "  --kv-cache auto|f32|fp8   the cache's key rows (default auto: fp8 where the numerics\n"
        "                         and the backend have it; the bytes roofline counts their bytes)\n"
        "  --no-split             leave out the per-layer, MoE and head timings and the "
        "projection\n"
        "  --prefill N            prefill a prompt of N tokens (default 8192; 0 = no prefill)\n"
        "  --prefill-chunk N      rows per forward call (default: the whole prompt, halved until\n"
        "                         it fits in free memory)\n"
        "  --prefill-reps N       timed prefills after one warm-up, median (default 2)\n"
        "  --hf FILE              JSON of ref/hf_layer_bench.py: print x faster than HF eager\n"
        "  --fp8-tflops X         use X TFLOP/s as the FP8 rate instead of measuring it (the only\n"
        "                         way to get the FP8 roofline on the cpu backend)\n"
        "  --fp8-size N           M = N = K of the measured FP8 GEMM (default 8192)\n"
        "  --nvlink-gbs X         two-GPU projection: all-to-all bandwidth per direction, GB/s\n"
        "                         (default 450, H200 NVLink 4)\n"
        "  --a2a-us X             two-GPU projection: latency per all-to-all, us (default 10)\n"
        "  --budget S             seconds: start no decode figure after 75%% of S and no prefill\n"
        "                         after S (default 0: no limit)\n"
        "  --leave-out LIST       also time each decode step without each of these backend ops\n"
        "                         (no-ops: the numbers are garbage, the time is what the op costs\n"
        "                         inside the step; at batch > 1 an op feeding the routing also\n"
        "                         changes the MoE's work); LIST: op names, comma-separated, or "
        "all:\n"
        "                         %s\n"
        "environment (cuda): DSI_CUDA_PROFILE=1 prints each op's GPU time over the timed steps\n"
        "and prefills (graphs off); =2 also each gemm call's shape. docs/cuda.md lists the\n"
        "backend's other switches (A/B measurements).\n",
        bench_leave_names());
}

/* ---- the HF figures (ref/hf_layer_bench.py) ----------------------------------------------- */

struct hf {
    bool ok;
    int n, np;
    int64_t ctx[MAX_HF], ptok[16];
    int batch[MAX_HF];
    double ms[MAX_HF], pms[16];
    int64_t pchunk[16];
    char desc[512];
};

static void hf_load(struct hf *h, const char *path) {
    memset(h, 0, sizeof(*h));
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root || !json_is_object(root)) {
        snprintf(h->desc, sizeof(h->desc), "cannot read %s: %s (no HF column)", path,
                 root ? "not a JSON object" : je.text);
        json_decref(root);
        return;
    }
    json_t *dec = json_object_get(root, "decode"), *pre = json_object_get(root, "prefill"), *e;
    size_t i;
    json_array_foreach(dec, i, e) {
        json_t *ms = json_object_get(e, "ms");
        if (h->n == MAX_HF || !json_is_number(ms)) continue;
        h->ctx[h->n] = json_integer_value(json_object_get(e, "ctx"));
        h->batch[h->n] = (int)json_integer_value(json_object_get(e, "batch"));
        h->ms[h->n++] = json_number_value(ms);
    }
    json_array_foreach(pre, i, e) {
        json_t *ms = json_object_get(e, "ms");
        if (h->np == 16 || !json_is_number(ms)) continue;
        h->ptok[h->np] = json_integer_value(json_object_get(e, "tokens"));
        h->pchunk[h->np] = json_integer_value(json_object_get(e, "chunk"));
        h->pms[h->np++] = json_number_value(ms);
    }
    const char *dev = json_string_value(json_object_get(root, "device"));
    const char *ex = json_string_value(json_object_get(root, "experts_implementation"));
    const char *tv = json_string_value(json_object_get(root, "transformers"));
    const char *how = json_string_value(json_object_get(root, "cache"));
    snprintf(h->desc, sizeof(h->desc),
             "%s: transformers %s, bf16, attention eager, experts %s, on %s; %d decode and %d "
             "prefill figures; decode cache: %s",
             path, tv ? tv : "?", ex ? ex : "?", dev ? dev : "?", h->n, h->np, how ? how : "?");
    h->ok = true;
    json_decref(root);
}

static double hf_decode(const struct hf *h, int64_t ctx, int B) {
    for (int i = 0; h->ok && i < h->n; i++)
        if (h->ctx[i] == ctx && h->batch[i] == B) return h->ms[i];
    return 0;
}

static double hf_prefill(const struct hf *h, int64_t tokens, int64_t *chunk) {
    for (int i = 0; h->ok && i < h->np; i++)
        if (h->ptok[i] == tokens) {
            *chunk = h->pchunk[i];
            return h->pms[i];
        }
    return 0;
}

/* ---- the run ----------------------------------------------------------------------------------
 */

struct bench {
    struct dsi_model *m;
    struct dsi_backend *be;
    const struct dsi_config *c;
    enum dsi_numerics num;
    int L, steps, warmup;
    bool cuda, split;
    double bw, fp8;   /* GB/s (copy, read+write); TFLOP/s (0: unknown) */
    double d2h;       /* GB/s of the backend's download into pageable host memory */
    double mem_total; /* device (host for cpu) memory, bytes */
    double lbytes[DSI_MAX_LAYERS], ebytes, top_bytes;
    double lgemm[DSI_MAX_LAYERS], eelems;
    double nvlink_gbs, a2a_us;
    double t0, budget;     /* start (dsi_time_s), --budget seconds (0: none) */
    char leave[512];       /* --leave-out: op names, comma-separated ("" none) */
    const char *leave_now; /* the op time_set's SET_LEAVE replaces */
    struct hf hf;
    uint64_t rng;
};

/* One (context, batch) figure. */
struct res {
    int64_t ctx;
    int B;
    bool ok, split;
    double t, bytes, flops;         /* s, per step */
    double pre[DSI_MAX_LAYERS + 1]; /* first k layers, s */
    double nomoe, head;             /* s */
};

static double mem_free(struct bench *b) {
#ifdef DSI_CUDA
    if (b->cuda && HAVE_PEAK(dsi_cuda_mem_info)) {
        size_t fr = 0, tot = 0;
        if (!dsi_cuda_mem_info(0, &fr, &tot)) return (double)fr;
        return -1;
    }
#endif
    long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    return pages > 0 && ps > 0 ? (double)pages * (double)ps : -1;
}

/* Bytes a run needs beyond the weights: cache pool + activations (+ half again for the backend's
 * own scratch) + 1 GiB. */
static double need_bytes(const struct bench *b, int64_t seqs, int64_t ctx, int64_t rows) {
    return kv_bytes_model(b->c, seqs, ctx, rows) + 1.5 * fwd_bytes(b->c, rows) + (double)(1 << 30);
}

static double hit_experts(const struct dsi_config *c, double rows) {
    double E = c->n_routed_experts, K = c->num_experts_per_tok;
    return E * (1.0 - pow(1.0 - K / E, rows));
}

static double step_bytes(const struct bench *b, int B, int64_t ctx) {
    const struct dsi_config *c = b->c;
    double bytes = hit_experts(c, B) * b->ebytes * b->L;
    for (int il = 0; il < b->L; il++)
        bytes += b->lbytes[il] + (double)B * (double)cache_bytes(c, il, ctx);
    return bytes;
}

static double row_flops(const struct bench *b, int64_t t) {
    const struct dsi_config *c = b->c;
    double f = 0;
    for (int il = 0; il < b->L; il++)
        f += 2.0 * (b->lgemm[il] + c->num_experts_per_tok * b->eelems) + attn_flops(c, il, t);
    return f;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, d = *(const double *)y;
    return (a > d) - (a < d);
}

static int32_t rand_token(struct bench *b) {
    uint64_t x = b->rng;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b->rng = x;
    return (int32_t)(3 + x % (uint64_t)(b->c->vocab_size - 3));
}

static void noop_moe(struct dsi_backend *be, const struct dsi_moe_args *a) {
    (void)be;
    (void)a;
}
static void noop_route(struct dsi_backend *be, const struct dsi_moe_route_args *a) {
    (void)be;
    (void)a;
}

enum { SET_STEP, SET_NOMOE, SET_HEAD, SET_LEAVE };

/* Median time of --steps decode steps of B sequences at context ctx, running the first n_layers
 * layers; SET_NOMOE without the moe ops, SET_HEAD with logits for every row, SET_LEAVE without
 * the op b->leave_now (bench_leave.h). Each set gets its own
 * forward object: creating one drops the steps the backend recorded (CUDA graphs, keyed by the
 * step's shape only), so a variant never replays another's graph; the warm-up steps cover the
 * eager first step and the captured second. */
static int time_set(struct bench *b,
                    struct dsi_kv *kv,
                    const int32_t *slot,
                    int32_t *tok,
                    int32_t *pos,
                    float *logits,
                    int B,
                    int64_t ctx,
                    int n_layers,
                    int mode,
                    const char *profile_title,
                    double *out,
                    struct dsi_err *err) {
    struct dsi_fwd *f = NULL;
    int rc = dsi_fwd_new(&f, b->m, b->be, kv, B, b->num, err);
    if (rc) return rc;
    double *ts = calloc((size_t)b->steps, sizeof(double));
    if (!ts) {
        dsi_fwd_free(f);
        return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    struct dsi_backend_ops ops = *b->be->ops;
    const struct dsi_backend_ops *orig = b->be->ops;
    if (mode == SET_NOMOE) {
        ops.moe = noop_moe;
        ops.moe_route = noop_route;
        b->be->ops = &ops;
    }
    if (mode == SET_LEAVE) {
        if (bench_leave_set(&ops, b->leave_now)) { /* checked at the options */
            free(ts);
            dsi_fwd_free(f);
            return dsi_errf(err, DSI_ERR_INVALID, "--leave-out: no op '%s'", b->leave_now);
        }
        b->be->ops = &ops;
    }
    int keep = b->m->cfg.num_hidden_layers;
    b->m->cfg.num_hidden_layers = n_layers;
    for (int r = 0; r < B; r++)
        kv->seqs[slot[r]].n_past = ctx;
    for (int s = 0; s < b->warmup + b->steps && !rc; s++) {
        for (int r = 0; r < B; r++) {
            tok[r] = rand_token(b);
            pos[r] = (int32_t)kv->seqs[slot[r]].n_past;
        }
        struct dsi_batch bt = {.n = B, .tokens = tok, .pos = pos, .slot = slot};
        if (s == b->warmup && profile_title) profile_mark(b->be, NULL);
        double t0 = dsi_time_s();
        rc = dsi_forward(f, &bt, mode == SET_HEAD ? logits : NULL, NULL, err);
        if (s >= b->warmup) ts[s - b->warmup] = dsi_time_s() - t0;
    }
    if (!rc && profile_title) profile_mark(b->be, profile_title);
    b->m->cfg.num_hidden_layers = keep;
    b->be->ops = orig;
    qsort(ts, (size_t)b->steps, sizeof(double), cmp_double);
    *out = ts[b->steps / 2];
    free(ts);
    dsi_fwd_free(f);
    return rc;
}

static const char *kind_name(int kind) {
    return kind == DSI_ATTN_CSA ? "CSA" : kind == DSI_ATTN_HCA ? "HCA" : "win";
}

static void fmt_ms(char *buf, size_t n, double ms, int width) {
    if (ms > 0)
        snprintf(buf, n, "%*.3f", width, ms);
    else
        snprintf(buf, n, "%*s", width, "-");
}

static void print_decode_header(const struct bench *b, int64_t ctx) {
    printf("\n## decode, context %lld: step = embed + %d layers (no head), median of %d steps "
           "after %d warm-up\n",
           (long long)ctx, b->L, b->steps, b->warmup);
    printf("%6s %9s %9s %10s %9s %10s %9s %9s %7s %7s %10s %7s\n", "batch", "step_ms", "layer_ms",
           "tok/s", "MB/step", "GFLOP/step", "bytes_ms", "fp8_ms", "%bytes", "%larger", "hf_ms",
           "x_hf");
}

static void print_decode_row(const struct bench *b, const struct res *r) {
    double t = r->t * 1e3, broof = b->bw > 0 ? r->bytes / (b->bw * 1e9) * 1e3 : 0;
    double froof = b->fp8 > 0 ? r->flops / (b->fp8 * 1e12) * 1e3 : 0;
    double hf = hf_decode(&b->hf, r->ctx, r->B);
    char fr[32], hs[32], xs[32], ps[32];
    fmt_ms(fr, sizeof(fr), froof, 9);
    fmt_ms(hs, sizeof(hs), hf, 10);
    if (hf > 0)
        snprintf(xs, sizeof(xs), "%7.1f", hf / t);
    else
        snprintf(xs, sizeof(xs), "%7s", "-");
    if (broof > 0)
        snprintf(ps, sizeof(ps), "%6.1f%% %6.1f%%", 100 * broof / t,
                 100 * DSI_MAX(broof, froof) / t);
    else
        snprintf(ps, sizeof(ps), "%7s %7s", "-", "-");
    printf("%6d %9.3f %9.3f %10.1f %9.1f %10.2f %9.3f %s %s %s %s\n", r->B, t, t / b->L,
           r->B / r->t, r->bytes / 1e6, r->flops / 1e9, broof, fr, ps, hs, xs);
    fflush(stdout);
}

/* Decode at one context for every batch size; results in rs[0..nb). */
static int decode_ctx(struct bench *b,
                      int64_t ctx,
                      const int64_t *batches,
                      int nb,
                      struct res *rs,
                      struct dsi_err *err) {
    const struct dsi_config *c = b->c;
    int64_t max_ctx = ctx + b->warmup + b->steps + 1;
    double fr = mem_free(b);
    int S = 0;
    for (int i = 0; i < nb; i++) {
        rs[i] = (struct res){.ctx = ctx, .B = (int)batches[i]};
        if (fr < 0 || need_bytes(b, batches[i], max_ctx, batches[i]) <= fr)
            S = DSI_MAX(S, (int)batches[i]);
    }
    print_decode_header(b, ctx);
    struct dsi_kv *kv = NULL;
    int32_t *tok = NULL, *pos = NULL, *slot = NULL;
    int rc = DSI_OK;
    if (S > 0) {
        struct dsi_kv_opts ko = {.max_seqs = S, .max_ctx = max_ctx, .max_rows = 1, .dtype = g_kvd};
        rc = dsi_kv_new(&kv, c, b->be, &ko, err);
        if (rc == DSI_ERR_NOMEM) {
            printf("# context %lld: %s: skipped\n", (long long)ctx, err->msg);
            S = 0;
            rc = DSI_OK;
        }
        tok = malloc(sizeof(int32_t) * (size_t)DSI_MAX(S, 1));
        pos = malloc(sizeof(int32_t) * (size_t)DSI_MAX(S, 1));
        slot = malloc(sizeof(int32_t) * (size_t)DSI_MAX(S, 1));
        if (!rc && (!tok || !pos || !slot)) rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    for (int bi = 0; bi < nb && !rc; bi++) {
        struct res *r = &rs[bi];
        int B = r->B;
        if (b->budget > 0 && dsi_time_s() - b->t0 > 0.75 * b->budget) {
            printf("%6d skipped: time budget (--budget %g s: decode stops at 75%%)\n", B,
                   b->budget);
            continue;
        }
        if (B > S) {
            printf("%6d skipped: needs ~%.1f GB for the cache and activations at context %lld, "
                   "%.1f GB free\n",
                   B, need_bytes(b, B, max_ctx, B) / 1e9, (long long)ctx, fr / 1e9);
            continue;
        }
        int made = 0;
        while (made < B && !rc) {
            rc = dsi_kv_seq_new(kv, &slot[made], err);
            if (rc) break;
            made++;
            rc = dsi_kv_reserve(kv, slot[made - 1], max_ctx - 1, err);
        }
        char title[96];
        snprintf(title, sizeof(title), "ctx %lld, batch %d, %d steps (warm-up left out)",
                 (long long)ctx, B, b->steps);
        if (!rc)
            rc = time_set(b, kv, slot, tok, pos, NULL, B, ctx, b->L, SET_STEP, title, &r->t, err);
        if (!rc) {
            r->ok = true;
            r->bytes = step_bytes(b, B, ctx);
            r->flops = (double)B * row_flops(b, ctx);
            r->pre[b->L] = r->t;
            print_decode_row(b, r);
        }
        if (!rc && b->leave[0]) { /* --leave-out: the step without each op */
            char list[sizeof(b->leave)], *save = NULL;
            memcpy(list, b->leave, sizeof(list));
            for (char *op = strtok_r(list, ",", &save); op && !rc;
                 op = strtok_r(NULL, ",", &save)) {
                double tl = 0;
                b->leave_now = op;
                rc = time_set(b, kv, slot, tok, pos, NULL, B, ctx, b->L, SET_LEAVE, NULL, &tl, err);
                if (!rc)
                    printf("#   batch %d without %-12s %9.3f ms: the op costs %+.3f ms of the "
                           "step%s\n",
                           B, op, tl * 1e3, (r->t - tl) * 1e3,
                           !strcmp(op, "moe_route")
                               ? " (not its cost: the expert indices stay as they were)"
                               : "");
            }
            if (!rc && B > 1)
                printf("#   (batch > 1: without an op whose output reaches a router, the rows pick "
                       "other experts, so its figure includes a change of the MoE's work)\n");
            fflush(stdout);
        }
        if (!rc && b->split) {
            float *logits = malloc(sizeof(float) * (size_t)B * (size_t)c->vocab_size);
            if (!logits) rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory for logits");
            for (int k = 0; k < b->L && !rc; k++)
                rc = time_set(b, kv, slot, tok, pos, NULL, B, ctx, k, SET_STEP, NULL, &r->pre[k],
                              err);
            if (!rc)
                rc = time_set(b, kv, slot, tok, pos, NULL, B, ctx, b->L, SET_NOMOE, NULL, &r->nomoe,
                              err);
            double th = 0;
            if (!rc)
                rc =
                    time_set(b, kv, slot, tok, pos, logits, B, ctx, b->L, SET_HEAD, NULL, &th, err);
            r->head = th - r->t;
            r->split = !rc;
            free(logits);
        }
        for (int i = 0; i < made; i++)
            dsi_kv_seq_free(kv, slot[i]);
    }
    free(tok);
    free(pos);
    free(slot);
    dsi_kv_free(kv);
    return rc;
}

/* Per-kind layer times (s) of one figure: mean over the checkpoint's layers of each kind; a kind
 * the checkpoint lacks gets the mean of all layers (*missing gets a bit per kind). A negative
 * difference (timing noise) counts as 0 and the layers are rescaled to add up to the measured
 * step less embed. */
static void kind_times(const struct bench *b, const struct res *r, double kt[3], int *missing) {
    double sum[3] = {0}, all = 0, lt[DSI_MAX_LAYERS];
    int n[3] = {0};
    for (int il = 0; il < b->L; il++) {
        lt[il] = DSI_MAX(0.0, r->pre[il + 1] - r->pre[il]);
        all += lt[il];
    }
    double scale = all > 0 ? DSI_MAX(0.0, r->t - r->pre[0]) / all : 0;
    all = 0;
    for (int il = 0; il < b->L; il++) {
        int k = b->c->layers[il].kind;
        sum[k] += lt[il] * scale;
        n[k]++;
        all += lt[il] * scale;
    }
    *missing = 0;
    for (int k = 0; k < 3; k++) {
        kt[k] = n[k] ? sum[k] / n[k] : all / b->L;
        if (!n[k]) *missing |= 1 << k;
    }
}

static double kind_bytes(const struct bench *b, int kind) {
    double s = 0, all = 0;
    int n = 0;
    for (int il = 0; il < b->L; il++) {
        all += b->lbytes[il];
        if (b->c->layers[il].kind == kind) s += b->lbytes[il], n++;
    }
    return n ? s / n : all / b->L;
}

struct proj {
    double t1, t2, mem1, mem2; /* s per step; bytes (per GPU for 2) */
};

/* The host copy of B rows of logits inside the measured head: a device sampler copies back
 * token ids only, so the projection leaves it out. */
static double logits_copy_s(const struct bench *b, int B) {
    return b->d2h > 0 ? (double)B * b->c->vocab_size * 4 / (b->d2h * 1e9) : 0;
}

/* The 43-layer V4-Flash step from one figure's per-layer times (see the header comment). */
static struct proj project(const struct bench *b, const struct res *r, int *missing) {
    const struct dsi_config *c = b->c;
    double kt[3];
    kind_times(b, r, kt, missing);
    const int nk[3] = {FLASH_WINDOW, FLASH_CSA, FLASH_HCA};
    double moe = DSI_MAX(0.0, (r->t - r->nomoe) / b->L);
    double a2a =
        2.0 * (b->a2a_us * 1e-6 + (double)r->B * c->hidden_size * 2 / (b->nvlink_gbs * 1e9));
    double head = DSI_MAX(0.0, r->head - logits_copy_s(b, r->B));
    struct proj p = {r->pre[0] + head, r->pre[0] + head, 0, 0};
    double nonexp = 0;
    for (int k = 0; k < 3; k++) {
        p.t1 += nk[k] * kt[k];
        p.t2 += nk[k] * (DSI_MAX(kt[k] - moe / 2, kt[k] / 2) + a2a);
        nonexp += nk[k] * kind_bytes(b, k);
    }
    /* the cache of the 43 layers + MTP at this context and batch, in g_kvd's layout */
    int kinds[FLASH_LAYERS + 1], ratios[FLASH_LAYERS + 1];
    for (int i = 0; i <= FLASH_LAYERS; i++) {
        bool win = i < 2 || i == FLASH_LAYERS, csa = !win && i % 2 == 0;
        kinds[i] = win ? DSI_ATTN_WINDOW : csa ? DSI_ATTN_CSA : DSI_ATTN_HCA;
        ratios[i] = win ? 0 : csa ? 4 : 128;
    }
    double kvb = kv_pool_bytes(c, kinds, ratios, FLASH_LAYERS + 1, r->B, r->ctx + 1, 1);
    double act = 1.5 * fwd_bytes(c, r->B) + (double)(1 << 30);
    double experts = (double)FLASH_LAYERS * c->n_routed_experts * b->ebytes;
    p.mem1 = b->top_bytes + nonexp + experts + kvb + act;
    p.mem2 = b->top_bytes + nonexp + experts / 2 + kvb + act;
    return p;
}

static void print_split(const struct bench *b, const struct res *rs, int nb, int64_t ctx) {
    bool any = false;
    for (int i = 0; i < nb; i++)
        any |= rs[i].split;
    if (!any) return;
    printf("\n## per layer at context %lld (ms): the first k layers timed for k = 0..%d, a layer = "
           "the difference; embed = k = 0 (embed + the step's fixed costs); moe/layer = (step - "
           "step without the moe ops) / %d; head = step with logits of every row (hc_head, norm, "
           "LM head, copy to host) - step\n",
           (long long)ctx, b->L, b->L);
    printf("%6s %9s", "batch", "embed");
    for (int il = 0; il < b->L; il++) {
        char h[24];
        snprintf(h, sizeof(h), "L%d:%s", il, kind_name(b->c->layers[il].kind));
        printf(" %9s", h);
    }
    printf(" %10s %9s\n", "moe/layer", "head");
    for (int i = 0; i < nb; i++) {
        const struct res *r = &rs[i];
        if (!r->split) continue;
        printf("%6d %9.3f", r->B, r->pre[0] * 1e3);
        for (int il = 0; il < b->L; il++)
            printf(" %9.3f", (r->pre[il + 1] - r->pre[il]) * 1e3);
        printf(" %10.3f %9.3f\n", (r->t - r->nomoe) / b->L * 1e3, r->head * 1e3);
    }
    printf(
        "\n## projection to the 43-layer V4-Flash at context %lld (SIMULATION from the per-layer "
        "figures above: %d window + %d CSA + %d HCA layers at the measured per-kind times "
        "(negative differences, noise, count as 0; the layers rescaled to the measured step), + "
        "embed + head as measured less the copy of the logits to the host (%.1f GB/s measured; a "
        "device sampler copies token ids only); no MTP, no speculative decoding; random weights "
        "with uniform routing)\n",
        (long long)ctx, FLASH_WINDOW, FLASH_CSA, FLASH_HCA, b->d2h);
    printf(
        "#   2 GPUs (simulated): experts split in two, attention and shared weights replicated: "
        "each layer's moe part halved (an even split: optimistic at small batch, where the busier "
        "GPU gets more than half of a row's experts) + all-to-all (dispatch + combine, batch x %d "
        "bf16 each way at %.0f GB/s + %.0f us each); memory per GPU = non-expert weights + half "
        "the experts + the whole cache\n",
        b->c->hidden_size, b->nvlink_gbs, b->a2a_us);
    printf("#   memory: weights + cache of 43 layers (+ MTP window) in this engine's layout (%s) + "
           "activations, against %.1f GB per device\n",
           g_kvd == DSI_KV_FP8 ? "fp8" : "fp32", b->mem_total / 1e9);
    printf("%6s %10s %11s %9s %5s %10s %11s %9s %5s\n", "batch", "1gpu_ms", "1gpu_tok/s", "mem_GB",
           "fits", "2gpu_ms", "2gpu_tok/s", "GB/gpu", "fits");
    int miss_all = 0;
    for (int i = 0; i < nb; i++) {
        const struct res *r = &rs[i];
        if (!r->split) continue;
        int miss = 0;
        struct proj p = project(b, r, &miss);
        miss_all |= miss;
        printf("%6d %10.3f %11.1f %9.1f %5s %10.3f %11.1f %9.1f %5s\n", r->B, p.t1 * 1e3,
               r->B / p.t1, p.mem1 / 1e9, p.mem1 <= b->mem_total ? "yes" : "no", p.t2 * 1e3,
               r->B / p.t2, p.mem2 / 1e9, p.mem2 <= b->mem_total ? "yes" : "no");
    }
    for (int k = 0; k < 3; k++)
        if (miss_all & (1 << k))
            printf("#   this checkpoint has no %s layer: the mean layer time stands in for it\n",
                   kind_name(k));
    fflush(stdout);
}

/* The published figures beside the projections that come closest (issue 7: like with like). */
static void print_published(const struct bench *b, const struct res *rs, int n) {
    const struct res *b1 = NULL, *b256 = NULL;
    for (int i = 0; i < n; i++) {
        const struct res *r = &rs[i];
        if (!r->split) continue;
        /* context nearest to the published runs' (short chat turns; inputs up to 8k) */
        if (r->B == 1 && (!b1 || llabs(r->ctx - 4096) < llabs(b1->ctx - 4096))) b1 = r;
        if (r->B == 256 && (!b256 || llabs(r->ctx - 8192) < llabs(b256->ctx - 8192))) b256 = r;
    }
    printf("\n## beside published figures (SGLang, 4x H200, V4-Flash, real weights); only like "
           "with like\n");
    int miss;
    if (b1) {
        struct proj p = project(b, b1, &miss);
        printf(
            "#  1 request: published %.2f ms per output token WITH speculative decoding (MTP: "
            "several tokens accepted per forward) on 4 GPUs. Here (simulated 43 layers, batch 1, "
            "context %lld, one token per forward): %.3f ms per token on 1 GPU, %.3f on 2. NOT "
            "like for like: speculation (divide our figure by the mean accepted length to "
            "compare), 4 GPUs vs 1-2, real vs random routing; our step has no sampling.\n",
            PUB_B1_MS, (long long)b1->ctx, p.t1 * 1e3, p.t2 * 1e3);
    } else {
        printf("#  1 request (published %.2f ms/token, speculative, 4 GPUs): no batch-1 projection "
               "in this run\n",
               PUB_B1_MS);
    }
    if (b256) {
        struct proj p = project(b, b256, &miss);
        printf(
            "#  256 requests: published TPOT %.1f ms, inputs up to 8k tokens, 4 GPUs. Here "
            "(simulated 43 layers, batch 256, context %lld): %.3f ms per step on 1 GPU, %.3f on "
            "2 (= TPOT if every step decodes all 256). Closest like for like (same concurrency), "
            "but: our context is fixed at %lld vs up to 8k + outputs, no prefill interleaved "
            "with the decode steps (a served TPOT includes it), 1-2 GPUs vs 4, random "
            "routing.\n",
            PUB_B256_MS, (long long)b256->ctx, p.t1 * 1e3, p.t2 * 1e3, (long long)b256->ctx);
    } else {
        printf("#  256 requests (published TPOT %.1f ms, 4 GPUs): no batch-256 projection in this "
               "run\n",
               PUB_B256_MS);
    }
}

struct pre_res {
    bool ok;
    int P, chunk;
    double t, flops, bytes;
};

/* Prefill of one prompt of P tokens in chunks. */
static int
prefill(struct bench *b, int P, int chunk, int reps, struct pre_res *out, struct dsi_err *err) {
    const struct dsi_config *c = b->c;
    if (b->budget > 0 && dsi_time_s() - b->t0 > b->budget) {
        printf("\n## prefill of %d tokens skipped: time budget (--budget %g s)\n", P, b->budget);
        return DSI_OK;
    }
    double fr = mem_free(b);
    int want = chunk > 0 ? DSI_MIN(chunk, P) : P;
    chunk = want;
    while (fr >= 0 && chunk > 64 && need_bytes(b, 1, P + 1, chunk) > fr)
        chunk = (chunk + 1) / 2;
    printf("\n## prefill: one prompt of %d tokens in chunks of %d rows (one forward call each), "
           "one warm-up, median of %d\n",
           P, chunk, reps);
    if (chunk < want)
        printf("#   chunk lowered from %d to %d rows to fit in %.1f GB of free memory\n", want,
               chunk, fr / 1e9);
    if (fr >= 0 && need_bytes(b, 1, P + 1, chunk) > fr) {
        printf("#   skipped: needs ~%.1f GB, %.1f GB free\n", need_bytes(b, 1, P + 1, chunk) / 1e9,
               fr / 1e9);
        return DSI_OK;
    }
    struct dsi_kv *kv = NULL;
    struct dsi_fwd *f = NULL;
    struct dsi_kv_opts ko = {.max_seqs = 1, .max_ctx = P + 1, .max_rows = chunk, .dtype = g_kvd};
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)P), *pos = malloc(sizeof(int32_t) * (size_t)P);
    int32_t *slot = calloc((size_t)chunk, sizeof(int32_t));
    double *ts = calloc((size_t)reps, sizeof(double));
    int rc = !tok || !pos || !slot || !ts ? dsi_errf(err, DSI_ERR_NOMEM, "out of memory") : DSI_OK;
    if (!rc) rc = dsi_kv_new(&kv, c, b->be, &ko, err);
    if (!rc) rc = dsi_fwd_new(&f, b->m, b->be, kv, chunk, b->num, err);
    if (rc == DSI_ERR_NOMEM) {
        printf("#   skipped: %s\n", err->msg);
        rc = DSI_OK;
        goto done;
    }
    for (int i = 0; i < P && !rc; i++) {
        tok[i] = rand_token(b);
        pos[i] = i;
    }
    for (int rep = 0; rep < reps + 1 && !rc; rep++) {
        int s = 0;
        rc = dsi_kv_seq_new(kv, &s, err);
        if (!rc) rc = dsi_kv_reserve(kv, s, P + 1, err);
        for (int i = 0; i < chunk; i++)
            slot[i] = s;
        if (rep == 1) profile_mark(b->be, NULL); /* the timed prefills only */
        double t0 = dsi_time_s();
        for (int at = 0; at < P && !rc; at += chunk) {
            struct dsi_batch bt = {
                .n = DSI_MIN(chunk, P - at), .tokens = tok + at, .pos = pos + at, .slot = slot};
            rc = dsi_forward(f, &bt, NULL, NULL, err);
        }
        if (rep > 0) ts[rep - 1] = dsi_time_s() - t0;
        dsi_kv_seq_free(kv, s);
    }
    if (!rc) profile_mark(b->be, "prefill");
    if (!rc) {
        qsort(ts, (size_t)reps, sizeof(double), cmp_double);
        out->ok = true;
        out->P = P;
        out->chunk = chunk;
        out->t = ts[reps / 2];
        out->flops = 0;
        out->bytes = 0;
        for (int at = 0; at < P; at += chunk) {
            int n = DSI_MIN(chunk, P - at);
            out->bytes += hit_experts(c, n) * b->ebytes * b->L;
            for (int il = 0; il < b->L; il++)
                out->bytes += b->lbytes[il];
        }
        for (int64_t p = 0; p < P; p++) {
            out->flops += row_flops(b, p);
            for (int il = 0; il < b->L; il++)
                out->bytes += (double)cache_bytes(c, il, p);
        }
        double t = out->t, broof = b->bw > 0 ? out->bytes / (b->bw * 1e9) : 0;
        double froof = b->fp8 > 0 ? out->flops / (b->fp8 * 1e12) : 0;
        int64_t hf_chunk = 0;
        double hf = hf_prefill(&b->hf, P, &hf_chunk);
        char fs[32], ps[32], hs[32], xs[32];
        fmt_ms(fs, sizeof(fs), froof * 1e3, 9);
        if (b->fp8 > 0)
            snprintf(ps, sizeof(ps), "%6.1f%%", 100 * out->flops / t / (b->fp8 * 1e12));
        else
            snprintf(ps, sizeof(ps), "%7s", "-");
        fmt_ms(hs, sizeof(hs), hf, 10);
        if (hf > 0)
            snprintf(xs, sizeof(xs), "%7.1f", hf / (t * 1e3));
        else
            snprintf(xs, sizeof(xs), "%7s", "-");
        printf("%7s %6s %10s %10s %8s %9s %7s %9s %9s %7s %10s %7s\n", "tokens", "chunk", "ms",
               "tok/s", "TFLOP", "TFLOP/s", "%fp8", "bytes_ms", "fp8_ms", "%larger", "hf_ms",
               "x_hf");
        printf("%7d %6d %10.1f %10.1f %8.3f %9.3f %s %9.3f %s %6.1f%% %s %s\n", P, chunk, t * 1e3,
               P / t, out->flops / 1e12, out->flops / t / 1e12, ps, broof * 1e3, fs,
               100 * DSI_MAX(broof, froof) / t, hs, xs);
        printf("#   %%fp8 = FLOPs of the prefill / time / measured FP8 GEMM rate (issue 7 target: "
               ">= 60%%); bytes = the weights once per chunk (experts hit by its rows) + the cache "
               "rows each row reads (an upper bound)\n");
        if (hf > 0)
            printf("#   HF eager prefill: the same %d tokens in chunks of %lld (one forward call "
                   "each)\n",
                   P, (long long)hf_chunk);
    }
done:
    free(tok);
    free(pos);
    free(slot);
    free(ts);
    dsi_fwd_free(f);
    dsi_kv_free(kv);
    return rc;
}

static void
print_targets(const struct bench *b, const struct res *rs, int n, const struct pre_res *pr) {
    printf("\n## targets (issue 7)\n");
    for (int i = 0; i < n; i++) {
        const struct res *r = &rs[i];
        if (!r->ok) continue;
        double broof = b->bw > 0 ? r->bytes / (b->bw * 1e9) : 0;
        double froof = b->fp8 > 0 ? r->flops / (b->fp8 * 1e12) : 0;
        if (r->B == 1 && broof > 0)
            printf("#  batch-1 decode >= 80%% of the bytes roofline: context %lld: %.1f%% (%s)\n",
                   (long long)r->ctx, 100 * broof / r->t, broof / r->t >= 0.8 ? "met" : "not met");
        if (r->B == 256 && broof > 0)
            printf(
                "#  batch-256 decode >= 70%% of the larger roofline: context %lld: %.1f%% (%s%s)\n",
                (long long)r->ctx, 100 * DSI_MAX(broof, froof) / r->t,
                DSI_MAX(broof, froof) / r->t >= 0.7 ? "met" : "not met",
                froof > 0 ? "" : "; no FP8 rate: bytes roofline only");
        double hf = hf_decode(&b->hf, r->ctx, r->B);
        if (r->B == 1 && hf > 0)
            printf("#  batch-1 decode >= 20x faster than HF eager: context %lld: %.1fx (%s)\n",
                   (long long)r->ctx, hf / (r->t * 1e3),
                   hf / (r->t * 1e3) >= 20 ? "met" : "not met");
    }
    if (pr->ok && b->fp8 > 0) {
        double e = pr->flops / pr->t / (b->fp8 * 1e12);
        printf("#  prefill >= 60%% of the measured FP8 GEMM rate: %d tokens: %.1f%% (%s)\n", pr->P,
               100 * e, e >= 0.6 ? "met" : "not met");
    }
}

int cmd_bench_layer(int argc, char **argv) {
    const char *dir = NULL, *backend = "cuda", *hf_path = NULL;
    int64_t batches[MAX_LIST] = {1, 2, 4, 8, 16, 32, 64, 128, 256}, ctxs[MAX_LIST] = {4096};
    int nb = 9, nc = 1, prefill_n = 8192, prefill_chunk = 0, prefill_reps = 2, fp8_size = 8192,
        kv_opt = DSI_OPT_KV_AUTO;
    double fp8_given = 0;
    struct bench b = {.steps = 10,
                      .warmup = 2,
                      .split = true,
                      .num = DSI_NUMERICS_PLAIN,
                      .nvlink_gbs = 450,
                      .a2a_us = 10,
                      .rng = 88172645463325252ull};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "layer")) {
            continue;
        } else if (!strcmp(a, "--no-split")) {
            b.split = false;
            continue;
        } else if (!v) {
            fprintf(stderr, "dsinfer bench layer: unknown or incomplete option '%s' (see --help)\n",
                    a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m")) {
            dir = v;
        } else if (!strcmp(a, "--backend")) {
            if (strcmp(v, "cuda") && strcmp(v, "cpu")) {
                fprintf(stderr, "dsinfer bench layer: --backend: want cuda or cpu, got '%s'\n", v);
                return 2;
            }
            backend = v;
        } else if (!strcmp(a, "--batch")) {
            nb = parse_list(v, batches, MAX_LIST, 1, 4096);
            if (nb < 1) {
                fprintf(stderr,
                        "dsinfer bench layer: --batch: want a list like 1,8,32 (1..4096, at most "
                        "%d), got '%s'\n",
                        MAX_LIST, v);
                return 2;
            }
        } else if (!strcmp(a, "--ctx")) {
            nc = parse_list(v, ctxs, MAX_LIST, 1, (int64_t)1 << 24);
            if (nc < 1) {
                fprintf(stderr,
                        "dsinfer bench layer: --ctx: want a list like 4096,65536 (1..16777216), "
                        "got '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--steps") || !strcmp(a, "--warmup") ||
                   !strcmp(a, "--prefill-reps")) {
            bool warm = !strcmp(a, "--warmup");
            if (!parse_num(v, warm ? 0 : 1, 100000, &x) || x != floor(x)) {
                fprintf(stderr, "dsinfer bench layer: %s: want an integer >= %d, got '%s'\n", a,
                        warm ? 0 : 1, v);
                return 2;
            }
            if (warm)
                b.warmup = (int)x;
            else if (!strcmp(a, "--steps"))
                b.steps = (int)x;
            else
                prefill_reps = (int)x;
        } else if (!strcmp(a, "--kv-cache")) {
            if (args_kv_cache("bench layer", v, &kv_opt)) return 2;
        } else if (!strcmp(a, "--numerics")) {
            int num;
            if (args_numerics("bench layer", v, &num)) return 2;
            b.num = (enum dsi_numerics)num; /* the same values as enum dsi_numerics_opt */
        } else if (!strcmp(a, "--prefill") || !strcmp(a, "--prefill-chunk")) {
            bool p = !strcmp(a, "--prefill");
            if (!parse_num(v, p ? 0 : 1, 1 << 22, &x) || x != floor(x)) {
                fprintf(stderr, "dsinfer bench layer: %s: want an integer %s, got '%s'\n", a,
                        p ? "0..4194304 (0 = no prefill)" : "1..4194304", v);
                return 2;
            }
            if (p)
                prefill_n = (int)x;
            else
                prefill_chunk = (int)x;
        } else if (!strcmp(a, "--leave-out")) {
            const char *list = !strcmp(v, "all") ? bench_leave_names() : v;
            if (strlen(list) >= sizeof(b.leave)) {
                fprintf(stderr, "dsinfer bench layer: --leave-out: list too long\n");
                return 2;
            }
            char tmp[sizeof(b.leave)], *save = NULL;
            struct dsi_backend_ops probe;
            memset(&probe, 0, sizeof(probe));
            strcpy(tmp, list);
            for (char *op = strtok_r(tmp, ",", &save); op; op = strtok_r(NULL, ",", &save))
                if (bench_leave_set(&probe, op)) {
                    fprintf(stderr,
                            "dsinfer bench layer: --leave-out: no op '%s' (want some of %s, or "
                            "all)\n",
                            op, bench_leave_names());
                    return 2;
                }
            strcpy(b.leave, list);
        } else if (!strcmp(a, "--hf")) {
            hf_path = v;
        } else if (!strcmp(a, "--fp8-tflops")) {
            if (!parse_num(v, 1e-6, 1e6, &fp8_given)) {
                fprintf(stderr,
                        "dsinfer bench layer: --fp8-tflops: want a positive number, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--fp8-size")) {
            if (!parse_num(v, 256, 65536, &x) || fmod(x, 256) != 0) {
                fprintf(
                    stderr,
                    "dsinfer bench layer: --fp8-size: want a multiple of 256 in 256..65536, got "
                    "'%s'\n",
                    v);
                return 2;
            }
            fp8_size = (int)x;
        } else if (!strcmp(a, "--nvlink-gbs")) {
            if (!parse_num(v, 1e-3, 1e6, &b.nvlink_gbs)) {
                fprintf(stderr,
                        "dsinfer bench layer: --nvlink-gbs: want a positive number, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--budget")) {
            if (!parse_num(v, 0, 1e7, &b.budget)) {
                fprintf(stderr, "dsinfer bench layer: --budget: want seconds >= 0, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--a2a-us")) {
            if (!parse_num(v, 0, 1e6, &b.a2a_us)) {
                fprintf(stderr, "dsinfer bench layer: --a2a-us: want a number >= 0, got '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "dsinfer bench layer: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "dsinfer bench layer: -m DIR is required (see --help)\n");
        return 2;
    }
    b.cuda = !strcmp(backend, "cuda");
    struct dsi_err err = {0};
    struct res *rs = NULL;
    struct pre_res pr = {0};
    int rc = 1, nres = 0;
    double t_load = b.t0 = dsi_time_s();
    if (dsi_model_load(&b.m, dir, &err)) goto fail;
    if (b.cuda) {
#ifdef DSI_CUDA
        if (dsi_backend_cuda_new(&b.be, 0, &err)) goto fail;
#else
        dsi_errf(&err, DSI_ERR_UNSUPPORTED, "backend cuda: this build has no CUDA (make CUDA=1)");
        goto fail;
#endif
    } else if (dsi_backend_cpu_new(&b.be, 0, &err)) {
        goto fail;
    }
    if (dsi_model_import(b.m, b.be, &err) || b.be->ops->sync(b.be, &err)) goto fail;
    t_load = dsi_time_s() - t_load;
    b.c = &b.m->cfg;
    {
        bool qat = b.num != DSI_NUMERICS_PLAIN,
             fits = dsi_kv_fp8_ok((int)b.c->head_dim, (int)b.c->qk_rope_head_dim);
        if (kv_opt == DSI_OPT_KV_FP8 && !(qat && fits && b.be->kv_fp8)) {
            dsi_errf(&err, DSI_ERR_INVALID,
                     "--kv-cache fp8: needs reference or fast numerics, a config whose nope dims "
                     "are 64-blocks and a backend with FP8 rows (cuda: DSI_CUDA_KV_FP8=1)");
            goto fail;
        }
        g_kvd =
            kv_opt == DSI_OPT_KV_FP8 || (kv_opt == DSI_OPT_KV_AUTO && qat && fits && b.be->kv_fp8)
                ? DSI_KV_FP8
                : DSI_KV_F32;
    }
    b.L = b.c->num_hidden_layers;
    const struct dsi_config *c = b.c;
    for (int il = 0; il < b.L; il++) {
        b.lbytes[il] = (double)layer_bytes(&b.m->layers[il]);
        b.lgemm[il] = layer_gemm_elems(&b.m->layers[il]);
    }
    b.ebytes = (double)expert_bytes(&b.m->layers[0]);
    b.eelems = expert_elems(&b.m->layers[0]);
    b.top_bytes = (double)(tbytes(&b.m->embed) + tbytes(&b.m->head) + tbytes(&b.m->norm) +
                           tbytes(&b.m->hc_head.fn) + tbytes(&b.m->hc_head.base) +
                           tbytes(&b.m->hc_head.scale));
    for (int i = 0; i < b.m->n_top_scales; i++)
        b.top_bytes += (double)tbytes(&b.m->top_scales[i]);

    /* ---- ceilings and the header ---- */
    char dev[256] = "", fp8_note[256] = "";
    b.mem_total = 0;
    {
        long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
        if (pages > 0 && ps > 0) b.mem_total = (double)pages * (double)ps;
    }
#ifdef DSI_CUDA
    if (b.cuda) {
        size_t fr = 0, tot = 0;
        if (HAVE_PEAK(dsi_cuda_device_desc)) dsi_cuda_device_desc(0, dev, sizeof(dev));
        if (HAVE_PEAK(dsi_cuda_mem_info) && !dsi_cuda_mem_info(0, &fr, &tot))
            b.mem_total = (double)tot;
        if (fp8_given > 0) {
            b.fp8 = fp8_given;
            snprintf(fp8_note, sizeof(fp8_note), "%.0f TFLOP/s (given by --fp8-tflops)", b.fp8);
        } else if (HAVE_PEAK(dsi_cuda_fp8_gemm_tflops)) {
            char msg[256] = "";
            if (dsi_cuda_fp8_gemm_tflops(0, fp8_size, fp8_size, fp8_size, 20, &b.fp8, msg,
                                         sizeof(msg)))
                snprintf(fp8_note, sizeof(fp8_note), "unavailable (%s)", msg);
            else
                snprintf(fp8_note, sizeof(fp8_note),
                         "%.0f TFLOP/s (cuBLASLt e4m3 x e4m3 -> bf16, fp32 accumulation, "
                         "%dx%dx%d, median of 20)",
                         b.fp8, fp8_size, fp8_size, fp8_size);
        } else {
            snprintf(fp8_note, sizeof(fp8_note), "unavailable (this build has no peak.o)");
        }
    }
#else
    (void)fp8_size;
#endif
    if (!b.cuda) {
        snprintf(dev, sizeof(dev), "host CPU, %ld cores", sysconf(_SC_NPROCESSORS_ONLN));
        b.fp8 = fp8_given;
        if (fp8_given > 0)
            snprintf(fp8_note, sizeof(fp8_note), "%.0f TFLOP/s (given by --fp8-tflops)", b.fp8);
        else
            snprintf(fp8_note, sizeof(fp8_note),
                     "not measured on the cpu backend (--fp8-tflops X to supply one)");
    }
    {
        int64_t dim = 1 << 20, rows = 256; /* 1 GiB each way */
        float *x = b.be->ops->alloc(b.be, (size_t)(dim * rows * 4)),
              *y = b.be->ops->alloc(b.be, (size_t)(dim * rows * 4));
        if (x && y) {
            struct dsi_copy_args ca = {x, y, rows, dim, dim, dim};
            b.be->ops->copy(b.be, &ca);
            b.be->ops->sync(b.be, &err);
            for (int i = 0; i < 5; i++) {
                double t0 = dsi_time_s();
                b.be->ops->copy(b.be, &ca);
                b.be->ops->sync(b.be, &err);
                double s = dsi_time_s() - t0, bw = 2.0 * (double)(dim * rows * 4) / s / 1e9;
                if (bw > b.bw) b.bw = bw;
            }
        }
        /* download into pageable host memory, as the forward's logits copy */
        size_t nd = (size_t)64 << 20;
        float *h = x ? malloc(nd * 4) : NULL;
        if (h) {
            b.be->ops->download(b.be, h, x, nd * 4);
            for (int i = 0; i < 3; i++) {
                double t0 = dsi_time_s();
                b.be->ops->download(b.be, h, x, nd * 4);
                b.be->ops->sync(b.be, &err);
                double s = dsi_time_s() - t0;
                if (s > 0 && (double)nd * 4 / s / 1e9 > b.d2h) b.d2h = (double)nd * 4 / s / 1e9;
            }
            free(h);
        }
        if (x) b.be->ops->mfree(b.be, x);
        if (y) b.be->ops->mfree(b.be, y);
    }
    if (hf_path) hf_load(&b.hf, hf_path);
    double wsum = 0;
    for (int il = 0; il < b.L; il++)
        wsum += b.lbytes[il];
    printf("# dsinfer bench layer: %s, %d layers (", dir, b.L);
    for (int il = 0; il < b.L; il++)
        printf("%s%s%s", il ? ", " : "", kind_name(c->layers[il].kind),
               c->layers[il].hash_routed ? "/hash" : "");
    printf("), backend %s, numerics %s, kv cache %s\n", b.be->name,
           b.num == DSI_NUMERICS_REFERENCE ? "reference"
           : b.num == DSI_NUMERICS_FAST    ? "fast"
                                           : "plain",
           g_kvd == DSI_KV_FP8 ? "fp8" : "f32");
    printf("# device: %s\n", dev[0] ? dev : "?");
    printf(
        "# load+import %.1f s; copy bandwidth %.0f GB/s (read+write); download to host %.1f GB/s; "
        "FP8 GEMM: %s\n",
        t_load, b.bw, b.d2h, fp8_note);
    printf("# weights: non-expert %.1f MB per step (all layers), %.2f MB per routed expert (%d per "
           "layer, top-%d); embed/head %.1f MB\n",
           wsum / 1e6, b.ebytes / 1e6, c->n_routed_experts, c->num_experts_per_tok,
           b.top_bytes / 1e6);
    if (hf_path) printf("# HF eager: %s\n", b.hf.desc);
    fflush(stdout);

    /* ---- decode ---- */
    rs = calloc((size_t)(nb * nc), sizeof(*rs));
    if (!rs) {
        dsi_errf(&err, DSI_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int ci = 0; ci < nc; ci++) {
        if (decode_ctx(&b, ctxs[ci], batches, nb, rs + ci * nb, &err)) goto fail;
        nres += nb;
        print_split(&b, rs + ci * nb, nb, ctxs[ci]);
    }
    if (b.split) print_published(&b, rs, nres);

    /* ---- prefill ---- */
    if (prefill_n > 0 && prefill(&b, prefill_n, prefill_chunk, prefill_reps, &pr, &err)) goto fail;
    print_targets(&b, rs, nres, &pr);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "dsinfer bench layer: %s\n", err.msg);
    free(rs);
    dsi_backend_free(b.be);
    dsi_model_free(b.m);
    return rc;
}

#ifdef DSI_BENCH_LAYER_MAIN
int main(int argc, char **argv) { return cmd_bench_layer(argc, argv); }
#endif
