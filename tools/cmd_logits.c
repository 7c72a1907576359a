/* cmd_logits.c - `dsinfer logits`: write float32 logits of every prompt position to a file. */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer logits -m DIR --prompt-ids 1,2,3 [--prompt-ids ...] --out FILE\n"
            "                      [--chunk N] [--numerics plain|reference|fast] [--mtp-out FILE]\n"
            "                      [--threads N] [--backend cpu|cuda] [--kv-cache auto|f32|fp8]\n"
            "Writes float32 little-endian logits, one row of vocab_size per prompt position\n"
            "(row i predicts token i+1), prompts in order. Several --prompt-ids run as several\n"
            "sequences in one batch. --chunk N feeds N tokens of each prompt per step (1 = the\n"
            "decode path); default: whole prompts. --mtp-out writes the MTP layer's logits\n"
            "(len-1 rows per prompt; row t predicts token t+2).\n");
}

int cmd_logits(int argc, char **argv) {
    const char *backend = "cpu";
    const char *dir = DSI_DEFAULT_MODEL, *outp = NULL, *mtpp = NULL;
    int32_t *prompts[64];
    int lens[64], n_prompts = 0, rc = 1;
    long long chunk = 0, threads = 0;
    int numerics = DSI_OPT_NUMERICS_PLAIN, kv_cache = DSI_OPT_KV_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && v)
            dir = argv[++i];
        else if (!strcmp(a, "--backend") && v)
            backend = argv[++i];
        else if (!strcmp(a, "--out") && v)
            outp = argv[++i];
        else if (!strcmp(a, "--mtp-out") && v)
            mtpp = argv[++i];
        else if (!strcmp(a, "--prompt-ids") && v) {
            if (n_prompts == 64) {
                fprintf(stderr, "dsinfer logits: at most 64 prompts\n");
                goto out;
            }
            lens[n_prompts] = args_parse_ids(argv[++i], &prompts[n_prompts]);
            if (lens[n_prompts] < 0) goto out;
            n_prompts++;
        } else if (!strcmp(a, "--chunk") && v) {
            if (args_int("logits", a, argv[++i], 0, 1 << 20, &chunk)) goto out;
        } else if (!strcmp(a, "--threads") && v) {
            if (args_int("logits", a, argv[++i], 0, 1024, &threads)) goto out;
        } else if (!strcmp(a, "--numerics") && v) {
            if (args_numerics("logits", argv[++i], &numerics)) goto out;
        } else if (!strcmp(a, "--kv-cache") && v) {
            if (args_kv_cache("logits", argv[++i], &kv_cache)) goto out;
        } else {
            fprintf(stderr, "dsinfer logits: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            goto out;
        }
    }
    if (!n_prompts || !outp) {
        fprintf(stderr, "dsinfer logits: --prompt-ids and --out are required\n");
        usage(stderr);
        goto out;
    }
    int64_t total = 0, max_len = 0;
    for (int p = 0; p < n_prompts; p++) {
        total += lens[p];
        max_len = DSI_MAX(max_len, lens[p]);
    }
    int rows = (int)(chunk > 0 ? chunk * n_prompts : total);
    struct dsi_engine_opts o = {.backend = backend,
                                .model_dir = dir,
                                .n_threads = (int)threads,
                                .max_rows = rows,
                                .max_ctx = max_len,
                                .numerics = numerics,
                                .kv_cache = kv_cache};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    if (dsi_engine_open(&e, &o, &err)) {
        fprintf(stderr, "dsinfer logits: %s\n", err.msg);
        goto out;
    }
    int64_t V = dsi_engine_vocab_size(e);
    float *lg = malloc(sizeof(float) * (size_t)(total * V));
    float *mt = mtpp ? malloc(sizeof(float) * (size_t)((total - n_prompts + 1) * V)) : NULL;
    if (!lg || (mtpp && !mt)) {
        fprintf(stderr, "dsinfer logits: out of memory\n");
    } else if (dsi_engine_prompt_logits(e, (const int32_t *const *)prompts, lens, n_prompts,
                                        (int)chunk, lg, mt, &err)) {
        fprintf(stderr, "dsinfer logits: %s\n", err.msg);
    } else {
        FILE *f = fopen(outp, "wb");
        if (!f || fwrite(lg, sizeof(float), (size_t)(total * V), f) != (size_t)(total * V) ||
            fclose(f) != 0)
            fprintf(stderr, "dsinfer logits: %s: cannot write\n", outp);
        else
            rc = 0;
        if (!rc && mt) {
            size_t nm = (size_t)((total - n_prompts) * V);
            f = fopen(mtpp, "wb");
            if (!f || fwrite(mt, sizeof(float), nm, f) != nm || fclose(f) != 0) {
                fprintf(stderr, "dsinfer logits: %s: cannot write\n", mtpp);
                rc = 1;
            }
        }
    }
    free(lg);
    free(mt);
    dsi_engine_close(e);
out:
    for (int p = 0; p < n_prompts; p++)
        free(prompts[p]);
    return rc;
}
