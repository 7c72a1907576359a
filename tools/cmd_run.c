/* cmd_run.c - `dsinfer run`: offline batch inference. JSONL requests in (one object per line,
 * OpenAI / vLLM parameter names: include/dsinfer.h, dsi_jsonl_parse), JSONL results out in
 * input order, a progress line on stderr. A bad line becomes an error line in the output and
 * does not disturb the other requests. A thin client of dsi_submit / dsi_poll. */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cmd_run(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer run [-m DIR] --input FILE --output FILE [options]\n"
            "  -m DIR                 model directory (default %s)\n"
            "  --input FILE           JSONL requests ('-': stdin)\n"
            "  --output FILE          JSONL results, in input order ('-': stdout)\n"
            "  --threads N            CPU threads (default: all cores)\n"
            "  --backend cpu|cuda     (default cpu)\n"
            "  --numerics plain|reference|fast   arithmetic profile (default plain; fast: the\n"
            "                         reference rounding points, GEMMs on tensor cores)\n"
            "  --kv-cache auto|f32|fp8   the cache's key rows (default auto: fp8 with reference\n"
            "                         or fast numerics, where they are exact; else f32)\n"
            "  --max-seqs N           sequences in flight (default 16)\n"
            "  --max-ctx N            positions per sequence (default 4096)\n"
            "  --max-batch-tokens N   token budget per step (default 256)\n"
            "  --kv-mb N              cache page pool budget in MiB (default: every sequence at "
            "max-ctx)\n"
            "  --tokenizer DIR        tokenizer.json from DIR (default: the model directory)\n"
            "  --sync                 turn asynchronous scheduling off\n"
            "  --no-progress          no progress line\n"
            "Each input line: {\"prompt\": \"text\" | [ids], \"prompt_token_ids\": [ids] or "
            "\"messages\": [...],\n"
            "  \"max_tokens\", \"temperature\", \"top_p\", \"top_k\", \"min_p\", \"stop\", "
            "\"stop_token_ids\", \"seed\", \"n\",\n"
            "  \"logprobs\", \"top_logprobs\", \"presence_penalty\", \"frequency_penalty\", "
            "\"repetition_penalty\",\n"
            "  \"ignore_eos\", \"response_format\" (json_object, json_schema, regex, grammar),\n"
            "  \"id\" / \"custom_id\" (echoed)}\n"
            "Each output line: {\"line\", ids, \"seed\", \"choices\": [{\"text\", \"token_ids\", "
            "\"finish_reason\",\n"
            "  \"stop_reason\", \"logprobs\"}], \"usage\", \"timings\"} or {\"line\", ids, "
            "\"error\": {\"code\", \"message\"}}\n",
            DSI_DEFAULT_MODEL);
}

struct item {
    struct dsi_jsonl_req *r;
    char *out;    /* the output line once known */
    long line_no; /* in the input file, 1-based */
};

struct run {
    struct item *it;
    long n, cap, flushed; /* items read, allocated, written */
    FILE *out;
    long n_err, n_done, total;
    int64_t prompt_tok, gen_tok;
    double t0, t_prog;
    bool progress, tty;
};

static int add_item(struct run *R) {
    if (R->n == R->cap) {
        long nc = R->cap ? 2 * R->cap : 1024;
        struct item *p = realloc(R->it, sizeof(*p) * (size_t)nc);
        if (!p) return -1;
        R->it = p;
        R->cap = nc;
    }
    R->it[R->n++] = (struct item){0};
    return 0;
}

/* Write every finished line at the front, in input order. */
static int flush_ready(struct run *R) {
    while (R->flushed < R->n && R->it[R->flushed].out) {
        struct item *x = &R->it[R->flushed++];
        if (fputs(x->out, R->out) == EOF || fputc('\n', R->out) == EOF) return -1;
        free(x->out);
        dsi_jsonl_req_free(x->r);
        x->out = NULL;
        x->r = NULL;
    }
    return 0;
}

static void fmt_time(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

static void progress(struct run *R, bool final) {
    if (!R->progress) return;
    double now = dsi_time_s();
    if (!final && now - R->t_prog < (R->tty ? 0.2 : 5.0)) return;
    R->t_prog = now;
    double el = now - R->t0, tps = el > 0 ? (double)R->gen_tok / el : 0.0;
    char eta[32] = "?", bar[32];
    long tot = R->total > 0 ? R->total : 0;
    int fill = tot ? (int)(20 * R->n_done / tot) : 0;
    for (int i = 0; i < 20; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[20] = 0;
    if (tot && R->n_done)
        fmt_time(el / (double)R->n_done * (double)(tot - R->n_done), eta, sizeof(eta));
    if (tot)
        fprintf(stderr, "%s[%s] %ld/%ld requests (%ld errors)  %.1f tok/s  ETA %s   %s",
                R->tty ? "\r" : "", bar, R->n_done, tot, R->n_err, tps, final ? "0s" : eta,
                R->tty && !final ? "" : "\n");
    else
        fprintf(stderr, "%s%ld requests done (%ld errors)  %.1f tok/s   %s", R->tty ? "\r" : "",
                R->n_done, R->n_err, tps, R->tty && !final ? "" : "\n");
}

static long count_lines(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long n = 0; /* lines with something other than white space */
    bool text = false;
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof(buf), f)) > 0)
        for (size_t i = 0; i < k; i++) {
            char c = buf[i];
            if (c == '\n') {
                n += text;
                text = false;
            } else if (c != ' ' && c != '\t' && c != '\r') {
                text = true;
            }
        }
    n += text;
    fclose(f);
    return n;
}

static bool blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return false;
    return true;
}

/* Take finished results (wait up to timeout_ms). */
static int take_events(struct run *R, struct dsi_engine *e, int timeout_ms) {
    struct dsi_event ev[64];
    int n = dsi_poll(e, ev, 64, timeout_ms);
    if (n < 0) return n;
    for (int i = 0; i < n; i++) {
        if (ev[i].kind != DSI_EVENT_DONE) continue;
        struct dsi_result *res = ev[i].result;
        struct item *x = &R->it[(long)ev[i].tag];
        x->out = dsi_jsonl_result(x->r, x->line_no, res);
        if (res->status) R->n_err++;
        R->prompt_tok += res->n_prompt_tokens;
        R->gen_tok += res->n_completion_tokens;
        R->n_done++;
        dsi_result_free(res);
        if (!x->out) return DSI_ERR_NOMEM;
    }
    return n;
}

int cmd_run(int argc, char **argv) {
    const char *dir = DSI_DEFAULT_MODEL, *in_path = NULL, *out_path = NULL, *backend = "cpu";
    int numerics = DSI_OPT_NUMERICS_PLAIN, kv_cache = DSI_OPT_KV_AUTO;
    const char *tok_dir = NULL;
    long long threads = 0, max_seqs = 16, max_ctx = 4096, mbt = 256, kv_mb = 0;
    bool sync = false, prog = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && v)
            dir = argv[++i];
        else if (!strcmp(a, "--input") && v)
            in_path = argv[++i];
        else if (!strcmp(a, "--output") && v)
            out_path = argv[++i];
        else if (!strcmp(a, "--backend") && v)
            backend = argv[++i];
        else if (!strcmp(a, "--numerics") && v) {
            if (args_numerics("run", argv[++i], &numerics)) return 2;
        } else if (!strcmp(a, "--kv-cache") && v) {
            if (args_kv_cache("run", argv[++i], &kv_cache)) return 2;
        } else if (!strcmp(a, "--tokenizer") && v)
            tok_dir = argv[++i];
        else if (!strcmp(a, "--threads") && v) {
            if (args_int("run", a, argv[++i], 0, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--max-seqs") && v) {
            if (args_int("run", a, argv[++i], 1, 4096, &max_seqs)) return 2;
        } else if (!strcmp(a, "--max-ctx") && v) {
            if (args_int("run", a, argv[++i], 1, 1 << 24, &max_ctx)) return 2;
        } else if (!strcmp(a, "--max-batch-tokens") && v) {
            if (args_int("run", a, argv[++i], 1, 1 << 20, &mbt)) return 2;
        } else if (!strcmp(a, "--kv-mb") && v) {
            if (args_int("run", a, argv[++i], 1, 1LL << 30, &kv_mb)) return 2;
        } else if (!strcmp(a, "--sync"))
            sync = true;
        else if (!strcmp(a, "--no-progress"))
            prog = false;
        else {
            fprintf(stderr, "dsinfer run: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!in_path || !out_path) {
        fprintf(stderr, "dsinfer run: give --input FILE and --output FILE\n");
        usage(stderr);
        return 2;
    }
    FILE *in = strcmp(in_path, "-") ? fopen(in_path, "rb") : stdin;
    if (!in) {
        fprintf(stderr, "dsinfer run: %s: cannot open for reading\n", in_path);
        return 1;
    }
    struct run R = {.out = strcmp(out_path, "-") ? fopen(out_path, "wb") : stdout,
                    .progress = prog,
                    .tty = isatty(2) != 0};
    if (!R.out) {
        fprintf(stderr, "dsinfer run: %s: cannot open for writing\n", out_path);
        if (in != stdin) fclose(in);
        return 1;
    }
    R.total = in != stdin ? count_lines(in_path) : -1;
    struct dsi_engine_opts eo = {.model_dir = dir,
                                 .backend = backend,
                                 .numerics = numerics,
                                 .kv_cache = kv_cache,
                                 .n_threads = (int)threads,
                                 .max_rows = (int)mbt,
                                 .max_ctx = max_ctx,
                                 .max_seqs = (int)max_seqs};
    struct dsi_batch_opts bo = {.sync = sync,
                                .kv_bytes = kv_mb << 20,
                                .max_batch_tokens = (int)mbt,
                                .tokenizer_dir = tok_dir};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    int rc = 1;
    char *line = NULL;
    size_t cap = 0;
    if (dsi_batch_open(&e, &eo, &bo, &err)) {
        fprintf(stderr, "dsinfer run: %s\n", err.msg);
        goto out;
    }
    long window = DSI_MAX(4 * max_seqs, 64), inflight = 0;
    R.t0 = dsi_time_s();
    ssize_t len;
    long line_no = 0;
    bool io_err = false;
    while (!io_err && (len = getline(&line, &cap, in)) >= 0) {
        line_no++;
        if (blank(line)) continue;
        if (add_item(&R)) break;
        long k = R.n - 1;
        struct item *x = &R.it[k];
        x->line_no = line_no;
        struct dsi_err pe = {0};
        uint64_t id = 0;
        int prc = dsi_jsonl_parse(&x->r, line, (size_t)len, &pe);
        if (!prc) {
            struct dsi_request q = *dsi_jsonl_request(x->r);
            q.tag = (uint64_t)k;
            prc = dsi_submit(e, &q, &id, &pe);
        }
        if (prc) {
            x->out = dsi_jsonl_error(x->r, line_no, prc, pe.msg);
            R.n_err++;
            R.n_done++;
        } else {
            inflight++;
        }
        while (inflight >= window) {
            long before = R.n_done;
            if (take_events(&R, e, 200) < 0) break;
            inflight -= R.n_done - before;
        }
        if (flush_ready(&R)) io_err = true;
        progress(&R, false);
    }
    if (ferror(in)) {
        fprintf(stderr, "dsinfer run: %s: read error\n", in_path);
        io_err = true;
    }
    while (!io_err && inflight > 0) {
        long before = R.n_done;
        if (take_events(&R, e, 200) < 0) break;
        inflight -= R.n_done - before;
        if (flush_ready(&R)) io_err = true;
        progress(&R, false);
    }
    if (!io_err && (flush_ready(&R) || fflush(R.out))) io_err = true;
    if (io_err) fprintf(stderr, "dsinfer run: %s: write error\n", out_path);
    if (R.progress) progress(&R, true);
    double el = dsi_time_s() - R.t0;
    fprintf(stderr,
            "dsinfer run: %ld requests (%ld errors) in %.2f s: %lld prompt + %lld completion "
            "tokens, %.1f completion tokens/s\n",
            R.n_done, R.n_err, el, (long long)R.prompt_tok, (long long)R.gen_tok,
            el > 0 ? (double)R.gen_tok / el : 0.0);
    rc = io_err ? 1 : 0;
out:
    dsi_batch_close(e);
    for (long i = R.flushed; i < R.n; i++) {
        free(R.it[i].out);
        dsi_jsonl_req_free(R.it[i].r);
    }
    free(R.it);
    free(line);
    if (in != stdin) fclose(in);
    if (R.out != stdout) fclose(R.out);
    return rc;
}
