/* cmd_sweep.c - `dsinfer bench sweep`: serving throughput against latency over concurrency
 * levels (1, 2, 4, ... by default). For each level c, c requests are kept in flight (closed
 * loop: a finished request is replaced at once) until `requests` (default 2c, at least 4)
 * have run, each a random prompt of input-len tokens and exactly output-len generated tokens
 * (ignore_eos, greedy). Reported per level: output tokens/s over the level's wall time,
 * tokens/s per request (mean of 1 / TPOT), TTFT and TPOT percentiles (p50, p90, p99; nearest
 * rank), and for the level's decode-only steps (no prefill rows) the mean step period (start
 * to the next step's start), the mean time inside the forward (head and sampling included) and
 * their ratio: the scheduler's visible overhead (issue 5's target: within 10% at c = 64 on the
 * GPU), and the share of all steps sampled on the device. Writes a CSV (first line: git SHA,
 * device, model, options) and an SVG chart of output tokens/s against TPOT p50, one labelled point
 * per level. A thin client of dsi_submit / dsi_poll. */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cmd_bench_sweep(int argc, char **argv);

#define MAX_LEVELS 32

struct level {
    int c, n_req;
    double wall, out_tps, req_tps;
    double ttft[3], tpot[3]; /* p50, p90, p99 in seconds */
    int64_t out_tok, preempt;
    int64_t steps, dec_steps, dev_steps; /* all, decode-only, sampled on the device */
    double step_ms, fwd_ms;              /* mean decode-only step period and forward time */
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer bench sweep [-m DIR] [options]\n"
            "  --concurrency LIST     levels, e.g. 1,2,4,8 (default: powers of 2 up to "
            "--max-concurrency)\n"
            "  --max-concurrency N    (default 256)\n"
            "  --input-len N          prompt tokens (default 128)\n"
            "  --output-len N         generated tokens per request (default 64)\n"
            "  --requests N           requests per level (default max(2c, 4))\n"
            "  --threads N --backend cpu|cuda --max-batch-tokens N --kv-mb N --sync\n"
            "  --numerics plain|reference|fast   (default plain)\n"
            "  --kv-cache auto|f32|fp8   the cache's key rows (default auto, as in `dsinfer run`)\n"
            "  --sampling auto|host|device   where tokens are drawn (default auto: device on "
            "CUDA)\n"
            "  --csv FILE             (default sweep.csv)\n"
            "  --svg FILE             (default sweep.svg)\n"
            "  --seed N               prompt generator seed (default 1)\n"
            "Default model: %s.\n",
            DSI_DEFAULT_MODEL);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, int n, double p) {
    if (n <= 0) return 0.0;
    int k = (int)ceil(p / 100.0 * n) - 1;
    return sorted[DSI_MAX(0, DSI_MIN(n - 1, k))];
}

static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* One level: keep c requests in flight until n have finished. */
static int
run_level(struct dsi_engine *e, struct level *L, int in_len, int out_len, uint64_t *rng) {
    int V = dsi_engine_vocab_size(e), eos = dsi_engine_eos_id(e);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)in_len);
    double *ttft = malloc(sizeof(double) * (size_t)L->n_req);
    double *tpot = malloc(sizeof(double) * (size_t)L->n_req);
    if (!prompt || !ttft || !tpot) return -1;
    struct dsi_batch_stats st0, st1;
    dsi_batch_get_stats(e, &st0);
    int submitted = 0, done = 0, rc = 0;
    double req_tps = 0.0;
    double t0 = dsi_time_s();
    while (done < L->n_req && !rc) {
        while (submitted - done < L->c && submitted < L->n_req) {
            for (int i = 0; i < in_len; i++) {
                prompt[i] = (int32_t)(xs(rng) % (uint64_t)V);
                if (prompt[i] == eos) prompt[i] = (eos + 1) % V;
            }
            struct dsi_request q;
            dsi_request_init(&q);
            q.prompt_ids = prompt;
            q.n_prompt_ids = in_len;
            q.max_tokens = out_len;
            q.temperature = 0.0f;
            q.ignore_eos = true;
            struct dsi_err err = {0};
            if (dsi_submit(e, &q, NULL, &err)) {
                fprintf(stderr, "dsinfer bench sweep: %s\n", err.msg);
                rc = -1;
                break;
            }
            submitted++;
        }
        struct dsi_event ev[32];
        int n = rc ? 0 : dsi_poll(e, ev, 32, 60000);
        if (n < 0) rc = -1;
        for (int i = 0; i < n; i++) {
            if (ev[i].kind != DSI_EVENT_DONE) continue;
            struct dsi_result *r = ev[i].result;
            if (r->status) {
                fprintf(stderr, "dsinfer bench sweep: request failed: %s\n", r->error);
                rc = -1;
            }
            const struct dsi_completion *c = &r->c[0];
            ttft[done] = r->t_first_token;
            tpot[done] = c->n_tokens > 1 ? (c->t_last - c->t_first) / (c->n_tokens - 1) : 0.0;
            if (tpot[done] > 0.0) req_tps += 1.0 / tpot[done];
            L->out_tok += r->n_completion_tokens;
            done++;
            dsi_result_free(r);
        }
    }
    L->wall = dsi_time_s() - t0;
    dsi_batch_get_stats(e, &st1);
    L->preempt = st1.preemptions - st0.preemptions;
    L->steps = st1.steps - st0.steps;
    L->dec_steps = st1.decode_steps - st0.decode_steps;
    L->dev_steps = st1.device_sampled_steps - st0.device_sampled_steps;
    if (L->dec_steps > 0) {
        L->step_ms = (st1.decode_period_s - st0.decode_period_s) / (double)L->dec_steps * 1e3;
        L->fwd_ms = (st1.decode_fwd_s - st0.decode_fwd_s) / (double)L->dec_steps * 1e3;
    }
    L->out_tps = L->wall > 0 ? (double)L->out_tok / L->wall : 0.0;
    L->req_tps = done ? req_tps / done : 0.0;
    qsort(ttft, (size_t)done, sizeof(double), cmp_double);
    qsort(tpot, (size_t)done, sizeof(double), cmp_double);
    static const double ps[3] = {50, 90, 99};
    for (int k = 0; k < 3; k++) {
        L->ttft[k] = pct(ttft, done, ps[k]);
        L->tpot[k] = pct(tpot, done, ps[k]);
    }
    free(prompt);
    free(ttft);
    free(tpot);
    return rc;
}

/* ---- provenance ---------------------------------------------------------------------------- */

static void git_sha(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
    if (!p) return;
    char line[128];
    if (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\r\n")] = 0;
        if (*line) snprintf(buf, n, "%s", line);
    }
    pclose(p);
}

static void cpu_name(char *buf, size_t n) {
    snprintf(buf, n, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "model name", 10)) {
            char *v = strchr(line, ':');
            if (v) {
                v += 1 + strspn(v + 1, " \t");
                v[strcspn(v, "\r\n")] = 0;
                snprintf(buf, n, "%s", v);
            }
            break;
        }
    fclose(f);
}

/* ---- chart ------------------------------------------------------------------------------------
 */

/* A "nice" tick step (1, 2 or 5 times a power of ten) for about `want` ticks over [0, hi]. */
static double nice_step(double hi, int want) {
    double raw = hi / want, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * p;
}

static void svg_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else
            fputc(*s, f);
    }
}

static int write_svg(const char *path,
                     const struct level *L,
                     int n,
                     const char *title,
                     const char *sub1,
                     const char *sub2) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const double W = 860, H = 560, ml = 90, mr = 40, mt = 90, mb = 70;
    double xmax = 0, ymax = 0;
    for (int i = 0; i < n; i++) {
        xmax = fmax(xmax, L[i].tpot[0] * 1e3);
        ymax = fmax(ymax, L[i].out_tps);
    }
    if (xmax <= 0) xmax = 1;
    if (ymax <= 0) ymax = 1;
    double xs_ = nice_step(xmax * 1.1, 6), ys_ = nice_step(ymax * 1.1, 6);
    xmax = ceil(xmax * 1.1 / xs_) * xs_;
    ymax = ceil(ymax * 1.1 / ys_) * ys_;
    double pw = W - ml - mr, ph = H - mt - mb;
#define PX(v) (ml + (v) / xmax * pw)
#define PY(v) (mt + ph - (v) / ymax * ph)
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"13\">\n",
            W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"28\" font-size=\"17\" text-anchor=\"middle\">", W / 2);
    svg_escape(f, title);
    fprintf(f,
            "</text>\n<text x=\"%.0f\" y=\"50\" font-size=\"12\" fill=\"#555\" "
            "text-anchor=\"middle\">",
            W / 2);
    svg_escape(f, sub1);
    fprintf(f,
            "</text>\n<text x=\"%.0f\" y=\"68\" font-size=\"12\" fill=\"#555\" "
            "text-anchor=\"middle\">",
            W / 2);
    svg_escape(f, sub2);
    fprintf(f, "</text>\n");
    for (double v = 0; v <= xmax + 1e-9; v += xs_) { /* x grid and ticks */
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                PX(v), mt, PX(v), mt + ph);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", PX(v),
                mt + ph + 20, v);
    }
    for (double v = 0; v <= ymax + 1e-9; v += ys_) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ml,
                PY(v), ml + pw, PY(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ml - 8, PY(v) + 4,
                v);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", ml,
            mt + ph, ml + pw, mt + ph);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", ml, mt,
            ml, mt + ph);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">latency: time per output token, "
            "p50 (ms)</text>\n",
            ml + pw / 2, H - 20);
    fprintf(f,
            "<text transform=\"translate(22 %.1f) rotate(-90)\" text-anchor=\"middle\">"
            "throughput: output tokens/s</text>\n",
            mt + ph / 2);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"");
    for (int i = 0; i < n; i++)
        fprintf(f, "%.1f,%.1f ", PX(L[i].tpot[0] * 1e3), PY(L[i].out_tps));
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++) {
        double x = PX(L[i].tpot[0] * 1e3), y = PY(L[i].out_tps);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#1f77b4\"/>\n", x, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#333\">c=%d</text>\n", x + 8, y - 8, L[i].c);
    }
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    return fclose(f) ? -1 : 0;
}

/* ---- main -------------------------------------------------------------------------------------
 */

int cmd_bench_sweep(int argc, char **argv) {
    const char *dir = DSI_DEFAULT_MODEL, *backend = "cpu", *csv = "sweep.csv", *svg = "sweep.svg";
    int numerics = DSI_OPT_NUMERICS_PLAIN, kv_cache = DSI_OPT_KV_AUTO;
    long long maxc = 256, in_len = 128, out_len = 64, n_req = 0, threads = 0, mbt = 256, kv_mb = 0,
              seed = 1;
    bool sync = false;
    int sampling = DSI_BATCH_SAMPLE_AUTO;
    int levels[MAX_LEVELS], n_lv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && v)
            dir = argv[++i];
        else if (!strcmp(a, "--backend") && v)
            backend = argv[++i];
        else if (!strcmp(a, "--numerics") && v) {
            if (args_numerics("bench sweep", argv[++i], &numerics)) return 2;
        } else if (!strcmp(a, "--kv-cache") && v) {
            if (args_kv_cache("bench sweep", argv[++i], &kv_cache)) return 2;
        } else if (!strcmp(a, "--csv") && v)
            csv = argv[++i];
        else if (!strcmp(a, "--svg") && v)
            svg = argv[++i];
        else if (!strcmp(a, "--sync"))
            sync = true;
        else if (!strcmp(a, "--sampling") && v) {
            const char *m = argv[++i];
            if (!strcmp(m, "auto"))
                sampling = DSI_BATCH_SAMPLE_AUTO;
            else if (!strcmp(m, "host"))
                sampling = DSI_BATCH_SAMPLE_HOST;
            else if (!strcmp(m, "device"))
                sampling = DSI_BATCH_SAMPLE_DEVICE;
            else {
                fprintf(stderr,
                        "dsinfer bench sweep: --sampling: want auto, host or device, got "
                        "'%s'\n",
                        m);
                return 2;
            }
        } else if (!strcmp(a, "--concurrency") && v) {
            int32_t *ids = NULL;
            int k = args_parse_ids(argv[++i], &ids);
            if (k < 0) return 2;
            n_lv = 0;
            for (int j = 0; j < k && n_lv < MAX_LEVELS; j++)
                if (ids[j] >= 1 && ids[j] <= 4096) levels[n_lv++] = ids[j];
            free(ids);
            if (n_lv < k) {
                fprintf(stderr,
                        "dsinfer bench sweep: --concurrency: want at most %d levels in "
                        "1..4096\n",
                        MAX_LEVELS);
                return 2;
            }
        } else if (!strcmp(a, "--max-concurrency") && v) {
            if (args_int("bench sweep", a, argv[++i], 1, 4096, &maxc)) return 2;
        } else if (!strcmp(a, "--input-len") && v) {
            if (args_int("bench sweep", a, argv[++i], 1, 1 << 20, &in_len)) return 2;
        } else if (!strcmp(a, "--output-len") && v) {
            if (args_int("bench sweep", a, argv[++i], 1, 1 << 20, &out_len)) return 2;
        } else if (!strcmp(a, "--requests") && v) {
            if (args_int("bench sweep", a, argv[++i], 1, 1 << 24, &n_req)) return 2;
        } else if (!strcmp(a, "--threads") && v) {
            if (args_int("bench sweep", a, argv[++i], 0, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--max-batch-tokens") && v) {
            if (args_int("bench sweep", a, argv[++i], 1, 1 << 20, &mbt)) return 2;
        } else if (!strcmp(a, "--kv-mb") && v) {
            if (args_int("bench sweep", a, argv[++i], 1, 1LL << 30, &kv_mb)) return 2;
        } else if (!strcmp(a, "--seed") && v) {
            if (args_int("bench sweep", a, argv[++i], 0, 1LL << 62, &seed)) return 2;
        } else {
            fprintf(stderr, "dsinfer bench sweep: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!n_lv)
        for (int c = 1; c <= maxc && n_lv < MAX_LEVELS; c *= 2)
            levels[n_lv++] = c;
    int cmax = 1;
    for (int i = 0; i < n_lv; i++)
        cmax = DSI_MAX(cmax, levels[i]);
    struct dsi_engine_opts eo = {.model_dir = dir,
                                 .backend = backend,
                                 .numerics = numerics,
                                 .kv_cache = kv_cache,
                                 .n_threads = (int)threads,
                                 .max_rows = (int)mbt,
                                 .max_ctx = in_len + out_len + 1,
                                 .max_seqs = cmax};
    struct dsi_batch_opts bo = {
        .sync = sync, .kv_bytes = kv_mb << 20, .max_batch_tokens = (int)mbt, .sampling = sampling};
    struct dsi_engine *e = NULL;
    struct dsi_err err = {0};
    if (dsi_batch_open(&e, &eo, &bo, &err)) {
        fprintf(stderr, "dsinfer bench sweep: %s\n", err.msg);
        return 1;
    }
    char sha[128], cpu[256], dev[600], opts[512];
    git_sha(sha, sizeof(sha));
    cpu_name(cpu, sizeof(cpu));
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(dev, sizeof(dev), "%s backend, %s, %ld cores, %lld threads", backend, cpu, ncpu,
             threads ? threads : (long long)ncpu);
    snprintf(opts, sizeof(opts),
             "input_len=%lld output_len=%lld max_batch_tokens=%lld max_seqs=%d kv_mb=%lld "
             "async=%s sampling=%s greedy ignore_eos",
             in_len, out_len, mbt, cmax, kv_mb, sync ? "off" : "on",
             sampling == DSI_BATCH_SAMPLE_HOST     ? "host"
             : sampling == DSI_BATCH_SAMPLE_DEVICE ? "device"
                                                   : "auto");
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)seed;
    if (!rng) rng = 1;
    struct level L[MAX_LEVELS];
    memset(L, 0, sizeof(L));
    int rc = 0;
    { /* warm-up (page faults, thread start) */
        struct level w = {.c = 1, .n_req = 1};
        rc = run_level(e, &w, (int)DSI_MIN(in_len, 16), (int)DSI_MIN(out_len, 4), &rng);
    }
    printf("%-6s %-6s %10s %10s %9s %9s %9s %9s %9s %9s %6s %9s %9s %7s %7s\n", "conc", "reqs",
           "out_tok/s", "req_tok/s", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90",
           "tpot_p99", "preempt", "step", "fwd", "step/fw", "dev%");
    for (int i = 0; i < n_lv && !rc; i++) {
        L[i].c = levels[i];
        L[i].n_req = n_req > 0 ? (int)n_req : DSI_MAX(2 * levels[i], 4);
        rc = run_level(e, &L[i], (int)in_len, (int)out_len, &rng);
        printf("%-6d %-6d %10.1f %10.1f %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %6lld "
               "%7.2fms %7.2fms %7.3f %6.0f%%\n",
               L[i].c, L[i].n_req, L[i].out_tps, L[i].req_tps, L[i].ttft[0] * 1e3,
               L[i].ttft[1] * 1e3, L[i].ttft[2] * 1e3, L[i].tpot[0] * 1e3, L[i].tpot[1] * 1e3,
               L[i].tpot[2] * 1e3, (long long)L[i].preempt, L[i].step_ms, L[i].fwd_ms,
               L[i].fwd_ms > 0 ? L[i].step_ms / L[i].fwd_ms : 0.0,
               L[i].steps > 0 ? 100.0 * (double)L[i].dev_steps / (double)L[i].steps : 0.0);
        fflush(stdout);
    }
    dsi_batch_close(e);
    if (rc) return 1;
    FILE *f = fopen(csv, "w");
    if (!f) {
        fprintf(stderr, "dsinfer bench sweep: %s: cannot open for writing\n", csv);
        return 1;
    }
    fprintf(f, "# git=%s; device=%s; model=%s; options=%s\n", sha, dev, dir, opts);
    fprintf(f, "concurrency,requests,input_len,output_len,wall_s,output_tok_s,req_tok_s,"
               "ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms,"
               "preemptions,decode_steps,decode_step_ms,decode_fwd_ms\n");
    for (int i = 0; i < n_lv; i++)
        fprintf(
            f, "%d,%d,%lld,%lld,%.3f,%.2f,%.2f,%.2f,%.2f,%.2f,%.3f,%.3f,%.3f,%lld,%lld,%.3f,%.3f\n",
            L[i].c, L[i].n_req, in_len, out_len, L[i].wall, L[i].out_tps, L[i].req_tps,
            L[i].ttft[0] * 1e3, L[i].ttft[1] * 1e3, L[i].ttft[2] * 1e3, L[i].tpot[0] * 1e3,
            L[i].tpot[1] * 1e3, L[i].tpot[2] * 1e3, (long long)L[i].preempt,
            (long long)L[i].dec_steps, L[i].step_ms, L[i].fwd_ms);
    if (fclose(f)) {
        fprintf(stderr, "dsinfer bench sweep: %s: write error\n", csv);
        return 1;
    }
    char title[600];
    snprintf(title, sizeof(title), "dsinfer serving sweep: %s (git %s)", dir, sha);
    if (write_svg(svg, L, n_lv, title, dev, opts)) {
        fprintf(stderr, "dsinfer bench sweep: %s: cannot write\n", svg);
        return 1;
    }
    fprintf(stderr, "dsinfer bench sweep: wrote %s and %s\n", csv, svg);
    return 0;
}
