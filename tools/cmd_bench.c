/* cmd_bench.c - `dsinfer bench`: CPU prefill and decode tokens/s for a model and thread count.
 * (bench tokenize lives with the tokenizer.) */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <string.h>

static int count_token(int32_t t, void *user) {
    (*(int *)user)++;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer bench [model] [-m DIR] [--threads N] [--backend cpu|cuda] [--prompt N] "
            "[--decode N]\n"
            "       dsinfer bench tokenize [options]\n"
            "       dsinfer bench sweep [options]   serving throughput vs latency over concurrency "
            "(CSV + SVG)\n"
            "       dsinfer bench layer [options]   (CUDA: decode step time vs the roofline)\n"
            "model: prefill tokens/s of a random prompt of N tokens and greedy decode "
            "tokens/s.\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "tokenize")) return dsi_bench_tokenize(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "layer")) return cmd_bench_layer(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "sweep")) return cmd_bench_sweep(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "grammar")) return dsi_bench_grammar(argc - 1, argv + 1);
    const char *backend = "cpu";
    const char *dir = DSI_DEFAULT_MODEL;
    long long threads = 0, n_prompt = 128, n_decode = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "model"))
            continue;
        else if (!strcmp(a, "-m") && v)
            dir = argv[++i];
        else if (!strcmp(a, "--backend") && v)
            backend = argv[++i];
        else if (!strcmp(a, "--threads") && v) {
            if (args_int("bench", a, argv[++i], 0, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--prompt") && v) {
            if (args_int("bench", a, argv[++i], 1, 1 << 20, &n_prompt)) return 2;
        } else if (!strcmp(a, "--decode") && v) {
            if (args_int("bench", a, argv[++i], 1, 1 << 20, &n_decode)) return 2;
        } else {
            fprintf(stderr, "dsinfer bench: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    struct dsi_engine_opts o = {.backend = backend,
                                .model_dir = dir,
                                .n_threads = (int)threads,
                                .max_rows = (int)DSI_MIN(n_prompt, 512),
                                .max_ctx = n_prompt + n_decode + 1};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    if (dsi_engine_open(&e, &o, &err)) {
        fprintf(stderr, "dsinfer bench: %s\n", err.msg);
        return 1;
    }
    int V = dsi_engine_vocab_size(e), eos = dsi_engine_eos_id(e);
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n_prompt);
    uint64_t x = 88172645463325252ull;
    for (long long i = 0; i < n_prompt; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(x % (uint64_t)V);
        if (p[i] == eos) p[i] = (eos + 1) % V;
    }
    struct dsi_sampling s = {0};
    int got = 0, rc = 0;
    double t0 = dsi_time_s();
    if (dsi_engine_generate(e, p, (int)n_prompt, 1, &s, count_token, &got, &err)) rc = 1;
    double t1 = dsi_time_s();
    got = 0;
    if (!rc && dsi_engine_generate(e, p, (int)n_prompt, (int)n_decode, &s, count_token, &got, &err))
        rc = 1;
    double t2 = dsi_time_s();
    if (rc)
        fprintf(stderr, "dsinfer bench: %s\n", err.msg);
    else {
        double prefill = t1 - t0, decode = (t2 - t1) - prefill;
        printf("model %s threads %lld\n", dir, threads);
        printf("prefill: %lld tokens in %.3f s = %.1f tokens/s\n", n_prompt, prefill,
               (double)n_prompt / prefill);
        if (got > 1)
            printf("decode:  %d tokens in %.3f s = %.1f tokens/s (greedy, batch 1)\n", got - 1,
                   decode, (double)(got - 1) / decode);
    }
    free(p);
    dsi_engine_close(e);
    return rc;
}
