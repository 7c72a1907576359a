/* cmd_generate.c - `dsinfer generate`: continue a prompt and print the tokens as they come. */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dsinfer generate [-m DIR] --prompt-ids 1,2,3 [-n N] [--temperature T]\n"
               "                        [--top-p P] [--top-k K] [--seed S] [--threads N] [--backend cpu|cuda]\n"
               "Prints the generated token ids, space-separated, as they are produced.\n"
               "Sampling defaults come from the model's generation_config.json; --temperature 0\n"
               "is greedy. Default model: " DSI_DEFAULT_MODEL ".\n");
}

static int print_token(int32_t t, void *user) {
    int *first = user;
    printf(*first ? "%d" : " %d", t);
    *first = 0;
    fflush(stdout);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    const char *backend = "cpu";
    const char *dir = DSI_DEFAULT_MODEL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    long long n_new = 32, top_k = -1, seed = 0, threads = 0;
    double temp = -1, top_p = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(ids);
            return 0;
        } else if (!strcmp(a, "-m") && v) dir = argv[++i];
        else if (!strcmp(a, "--backend") && v) backend = argv[++i];
        else if (!strcmp(a, "--prompt-ids") && v) {
            free(ids);
            if ((n_ids = args_parse_ids(argv[++i], &ids)) < 0) return 1;
        } else if (!strcmp(a, "-n") && v) {
            if (args_int("generate", a, argv[++i], 1, 1 << 20, &n_new)) goto out;
        } else if (!strcmp(a, "--temperature") && v) {
            if (args_float("generate", a, argv[++i], &temp)) goto out;
        } else if (!strcmp(a, "--top-p") && v) {
            if (args_float("generate", a, argv[++i], &top_p)) goto out;
        } else if (!strcmp(a, "--top-k") && v) {
            if (args_int("generate", a, argv[++i], 0, 1 << 30, &top_k)) goto out;
        } else if (!strcmp(a, "--seed") && v) {
            if (args_int("generate", a, argv[++i], 0, (1LL << 62), &seed)) goto out;
        } else if (!strcmp(a, "--threads") && v) {
            if (args_int("generate", a, argv[++i], 0, 1024, &threads)) goto out;
        } else {
            fprintf(stderr, "dsinfer generate: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            goto out;
        }
    }
    if (!n_ids) {
        fprintf(stderr, "dsinfer generate: give a prompt with --prompt-ids\n");
        usage(stderr);
        goto out;
    }
    struct dsi_engine_opts o = {.backend = backend, .model_dir = dir, .n_threads = (int)threads,
                                .max_ctx = n_ids + n_new};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    if (dsi_engine_open(&e, &o, &err)) {
        fprintf(stderr, "dsinfer generate: %s\n", err.msg);
        goto out;
    }
    struct dsi_sampling s = {.seed = (uint64_t)seed};
    dsi_engine_sampling_defaults(e, &s.temperature, &s.top_p, &s.top_k);
    if (temp >= 0) s.temperature = (float)temp;
    if (top_p >= 0) s.top_p = (float)top_p;
    if (top_k >= 0) s.top_k = (int)top_k;
    int first = 1;
    if (dsi_engine_generate(e, ids, n_ids, (int)n_new, &s, print_token, &first, &err)) {
        fprintf(stderr, "\ndsinfer generate: %s\n", err.msg);
    } else {
        printf("\n");
        rc = 0;
    }
    dsi_engine_close(e);
out:
    free(ids);
    return rc;
}
