/* cmd_eval.c - `dsinfer eval ppl`: perplexity of a text file (and the MTP layer's
 * next-next-token top-1 accuracy on the same windows). */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <math.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dsinfer eval ppl [-m DIR] FILE [--window N] [--max-windows N]\n"
               "               [--batch N] [--threads N] [--backend cpu|cuda]\n"
               "               [--numerics plain|reference|fast] [--kv-cache auto|f32|fp8]\n"
               "Tokenizes FILE (no special tokens), cuts it into non-overlapping windows of N-1\n"
               "tokens (default N = 256), prepends BOS to each, and reports the perplexity over\n"
               "every predicted token, and the MTP layer's next-next-token top-1 accuracy.\n");
}

int cmd_eval(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "ppl") != 0) {
        if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        return 2;
    }
    const char *backend = "cpu", *dir = DSI_DEFAULT_MODEL, *file = NULL;
    long long window = 256, batch = 8, threads = 0, max_windows = 0;
    int numerics = DSI_OPT_NUMERICS_PLAIN, kv_cache = DSI_OPT_KV_AUTO;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && v)
            dir = argv[++i];
        else if (!strcmp(a, "--backend") && v)
            backend = argv[++i];
        else if (!strcmp(a, "--window") && v) {
            if (args_int("eval", a, argv[++i], 3, 1 << 20, &window)) return 2;
        } else if (!strcmp(a, "--max-windows") && v) {
            if (args_int("eval", a, argv[++i], 0, 1LL << 40, &max_windows)) return 2;
        } else if (!strcmp(a, "--batch") && v) {
            if (args_int("eval", a, argv[++i], 1, 64, &batch)) return 2;
        } else if (!strcmp(a, "--threads") && v) {
            if (args_int("eval", a, argv[++i], 0, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--numerics") && v) {
            if (args_numerics("eval", argv[++i], &numerics)) return 2;
        } else if (!strcmp(a, "--kv-cache") && v) {
            if (args_kv_cache("eval", argv[++i], &kv_cache)) return 2;
        } else if (a[0] != '-' && !file)
            file = a;
        else {
            fprintf(stderr, "dsinfer eval: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    if (!file) {
        fprintf(stderr, "dsinfer eval ppl: give a text FILE\n");
        return 2;
    }
    struct dsi_err err = {0};
    char *text = NULL;
    size_t len = 0;
    if (dsi_read_file(file, &text, &len, &err)) {
        fprintf(stderr, "dsinfer eval: %s\n", err.msg);
        return 1;
    }
    struct dsi_engine_opts o = {.backend = backend,
                                .model_dir = dir,
                                .n_threads = (int)threads,
                                .max_rows = (int)(window * batch),
                                .max_ctx = window,
                                .max_seqs = (int)batch,
                                .numerics = numerics,
                                .kv_cache = kv_cache};
    struct dsi_engine *e = NULL;
    int rc = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    if (dsi_engine_open(&e, &o, &err) || dsi_engine_encode(e, text, len, false, &ids, &n, &err)) {
        fprintf(stderr, "dsinfer eval: %s\n", err.msg);
        goto out;
    }
    int64_t V = dsi_engine_vocab_size(e), W = window, per = W - 1;
    int64_t n_win = ((int64_t)n + per - 1) / per; /* the last window may be shorter */
    if (n_win < 1) {
        fprintf(stderr, "dsinfer eval: %s: no tokens\n", file);
        goto out;
    }
    if (max_windows > 0 && n_win > max_windows) n_win = max_windows;
    float *lg = malloc(sizeof(float) * (size_t)(batch * W * V));
    float *mt = malloc(sizeof(float) * (size_t)(batch * W * V));
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(batch * W));
    double nll = 0;
    int64_t count = 0, mtp_hit = 0, mtp_n = 0;
    int have_mtp = 1;
    double t0 = dsi_time_s();
    for (int64_t w0 = 0; w0 < n_win; w0 += batch) {
        int nb = (int)DSI_MIN(batch, n_win - w0);
        const int32_t *ps[64];
        int lens[64];
        for (int b = 0; b < nb; b++) {
            int32_t *p = buf + b * W;
            int64_t take = DSI_MIN(per, (int64_t)n - (w0 + b) * per);
            p[0] = dsi_engine_bos_id(e);
            memcpy(p + 1, ids + (w0 + b) * per, sizeof(int32_t) * (size_t)take);
            ps[b] = p;
            lens[b] = (int)(take + 1);
        }
        if (dsi_engine_prompt_logits(e, ps, lens, nb, 0, lg, have_mtp ? mt : NULL, &err)) {
            if (have_mtp && err.code == DSI_ERR_UNSUPPORTED) { /* no MTP layer */
                have_mtp = 0;
                w0 -= batch;
                continue;
            }
            fprintf(stderr, "dsinfer eval: %s\n", err.msg);
            goto out_free;
        }
        int64_t lo = 0, mo = 0; /* row offsets of window b in lg and mt */
        for (int b = 0; b < nb; lo += lens[b], mo += lens[b] - 1, b++)
            for (int64_t t = 0; t + 1 < lens[b]; t++) {
                const float *row = lg + (lo + t) * V;
                float mx = row[0];
                for (int64_t v = 1; v < V; v++)
                    mx = fmaxf(mx, row[v]);
                double z = 0;
                for (int64_t v = 0; v < V; v++)
                    z += exp((double)(row[v] - mx));
                nll += log(z) - (double)(row[ps[b][t + 1]] - mx);
                count++;
                if (have_mtp && t + 2 < lens[b]) { /* MTP row t predicts token t+2 */
                    const float *mr = mt + (mo + t) * V;
                    int64_t am = 0;
                    for (int64_t v = 1; v < V; v++)
                        if (mr[v] > mr[am]) am = v;
                    mtp_hit += am == ps[b][t + 2];
                    mtp_n++;
                }
            }
        fprintf(stderr, "\reval: %lld/%lld windows", (long long)DSI_MIN(w0 + nb, n_win),
                (long long)n_win);
    }
    fprintf(stderr, "\n");
    printf("file %s: %zu tokens, %lld windows of at most %lld (BOS + %lld), %lld predictions\n",
           file, n, (long long)n_win, (long long)W, (long long)per, (long long)count);
    printf("perplexity %.4f (mean nll %.6f) in %.1f s\n", exp(nll / (double)count),
           nll / (double)count, dsi_time_s() - t0);
    if (have_mtp && mtp_n)
        printf("mtp next-next-token top-1 accuracy %.4f (%lld / %lld)\n",
               (double)mtp_hit / (double)mtp_n, (long long)mtp_hit, (long long)mtp_n);
    rc = 0;
out_free:
    free(lg);
    free(mt);
    free(buf);
out:
    free(ids);
    free(text);
    dsi_engine_close(e);
    return rc;
}
