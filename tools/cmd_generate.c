/* cmd_generate.c - `dsinfer generate`: continue a prompt and print the continuation as it is
 * produced (text when the model has a tokenizer, else token ids). */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer generate [-m DIR] [-p] TEXT | --prompt-ids 1,2,3 [options]\n"
            "  -n N               tokens to generate (default 64)\n"
            "  --temperature T    0 = greedy; default from generation_config.json\n"
            "  --top-p P, --top-k K, --seed S\n"
            "  --chat             wrap TEXT as one user turn with the DeepSeek-V4 chat encoding\n"
            "  --think            thinking mode (with --chat)\n"
            "  --ids              print token ids instead of text\n"
            "  --threads N, --backend cpu|cuda\n"
            "Text prompts get BOS prepended. Default model: models/dsv4-tiny.\n");
}

struct printer {
    struct dsi_text_stream *ts;
    int first;
};

static int print_token(int32_t t, void *user) {
    struct printer *p = user;
    if (!p->ts) {
        printf(p->first ? "%d" : " %d", t);
    } else {
        const char *s;
        size_t n;
        if (dsi_text_stream_feed(p->ts, t, &s, &n, NULL) == 0) fwrite(s, 1, n, stdout);
    }
    p->first = 0;
    fflush(stdout);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    const char *backend = "cpu", *dir = DSI_DEFAULT_MODEL, *text = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1, chat = 0, think = 0, want_ids = 0;
    long long n_new = 64, top_k = -1, seed = 0, threads = 0;
    double temp = -1, top_p = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(ids);
            return 0;
        } else if (!strcmp(a, "-m") && v)
            dir = argv[++i];
        else if (!strcmp(a, "--backend") && v)
            backend = argv[++i];
        else if (!strcmp(a, "-p") && v)
            text = argv[++i];
        else if (!strcmp(a, "--chat"))
            chat = 1;
        else if (!strcmp(a, "--think"))
            think = 1;
        else if (!strcmp(a, "--ids"))
            want_ids = 1;
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
        } else if (a[0] != '-' && !text) {
            text = a;
        } else {
            fprintf(stderr, "dsinfer generate: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            goto out;
        }
    }
    if (!n_ids && !text) {
        fprintf(stderr, "dsinfer generate: give a prompt (TEXT, -p TEXT or --prompt-ids)\n");
        usage(stderr);
        goto out;
    }
    if ((chat || think) && !text) {
        fprintf(stderr, "dsinfer generate: --chat/--think need a text prompt\n");
        goto out;
    }
    struct dsi_engine_opts o = {.backend = backend,
                                .model_dir = dir,
                                .n_threads = (int)threads,
                                .max_ctx = 4096,
                                .max_seqs = 1};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    if (dsi_engine_open(&e, &o, &err)) {
        fprintf(stderr, "dsinfer generate: %s\n", err.msg);
        goto out;
    }
    struct printer pr = {.first = 1};
    if (text) {
        char *prompt = NULL;
        if (chat && dsi_engine_chat_prompt(e, text, think, &prompt, &err)) {
            fprintf(stderr, "dsinfer generate: %s\n", err.msg);
            goto out_engine;
        }
        size_t n = 0;
        int32_t *enc = NULL;
        int erc = dsi_engine_encode(e, chat ? prompt : text, strlen(chat ? prompt : text),
                                    chat != 0, &enc, &n, &err);
        free(prompt);
        if (erc) {
            fprintf(stderr, "dsinfer generate: prompt: %s\n", err.msg);
            goto out_engine;
        }
        free(ids);
        ids = malloc(sizeof(int32_t) * (n + 1));
        n_ids = 0;
        if (!chat) ids[n_ids++] = dsi_engine_bos_id(e);
        for (size_t i = 0; i < n; i++)
            ids[n_ids++] = enc[i];
        free(enc);
    }
    if (dsi_engine_has_tokenizer(e) && !want_ids && dsi_text_stream_new(&pr.ts, e, &err)) {
        fprintf(stderr, "dsinfer generate: %s\n", err.msg);
        goto out_engine;
    }
    struct dsi_sampling s = {.seed = (uint64_t)seed};
    dsi_engine_sampling_defaults(e, &s.temperature, &s.top_p, &s.top_k);
    if (temp >= 0) s.temperature = (float)temp;
    if (top_p >= 0) s.top_p = (float)top_p;
    if (top_k >= 0) s.top_k = (int)top_k;
    if (pr.ts && text && !chat) fputs(text, stdout);
    if (dsi_engine_generate(e, ids, n_ids, (int)n_new, &s, print_token, &pr, &err)) {
        fprintf(stderr, "\ndsinfer generate: %s\n", err.msg);
    } else {
        if (pr.ts) {
            const char *t;
            size_t n;
            dsi_text_stream_flush(pr.ts, &t, &n);
            fwrite(t, 1, n, stdout);
        }
        printf("\n");
        rc = 0;
    }
out_engine:
    dsi_text_stream_free(pr.ts);
    dsi_engine_close(e);
out:
    free(ids);
    return rc;
}
