/* json_rules.c - the lexical pieces of JSON as IR, shared by the JSON Schema compiler
 * (schema.c) and json_object: whitespace, strings, numbers, integer ranges, the string formats,
 * any-JSON rules, and object keys that avoid a set of names.
 *
 * The language follows XGrammar's JSON (so masks can be compared on the same schemas):
 *   string  "\"" ([^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
 *   number  "-"? ("0" | [1-9][0-9]*) ("." [0-9]+)? ([eE] [+-]? [0-9]+)?
 *   integer "0" | "-"? [1-9][0-9]*            (no "-0", no exponent)
 *   object  "{" ws "}" | "{" ws string ws ":" ws value (ws "," ws string ws ":" ws value)* ws "}"
 *   array   "[" ws "]" | "[" ws value (ws "," ws value)* ws "]"
 * with ws = [ \n\r\t]* (flexible; {0,max_ws} when bounded) or nothing (compact). */
#include "grammar/json_rules.h"

#include <math.h>

struct gx *jr_ws(struct jr *j) {
    struct dsi_grammar *g = j->g;
    if (g->opts.ws == DSI_GRAMMAR_WS_COMPACT) return gx_empty(g);
    static const uint32_t ws[] = {'\t', '\n', '\r', '\r', ' ', ' '};
    uint32_t max = g->opts.max_ws > 0 ? (uint32_t)g->opts.max_ws : GX_INF;
    return gx_rep(g, gx_class(g, ws, 3, false), 0, max);
}

/* ws "c" ws */
struct gx *jr_punct(struct jr *j, const char *c) {
    return gx_seq3(j->g, jr_ws(j), gx_str(j->g, c), jr_ws(j));
}

/* One character of a JSON string: a raw safe code point or an escape. surrogates: allow
 * \uD800-\uDFFF escapes (false where lengths are counted: a surrogate pair is one code point
 * for a validator but two escapes here). */
struct gx *jr_char(struct jr *j, bool surrogates) {
    struct dsi_grammar *g = j->g;
    static const uint32_t unsafe[] = {0, 0x1F, '"', '"', '\\', '\\'};
    struct gx *raw = gx_class(g, unsafe, 3, true);
    static const uint32_t hex[] = {'0', '9', 'A', 'F', 'a', 'f'};
    struct gx *h = gx_class(g, hex, 3, false);
    struct gx *u;
    if (surrogates) {
        u = gx_rep(g, h, 4, 4);
    } else { /* 4 hex digits not D800..DFFF: first digit not d/D, or d/D then [0-7] */
        static const uint32_t notd[] = {'0', '9', 'A', 'C', 'E', 'F', 'a', 'c', 'e', 'f'};
        static const uint32_t d[] = {'D', 'D', 'd', 'd'};
        struct gx *a = gx_seq2(g, gx_class(g, notd, 5, false), gx_rep(g, h, 3, 3));
        struct gx *b =
            gx_seq3(g, gx_class(g, d, 2, false), gx_range(g, '0', '7'), gx_rep(g, h, 2, 2));
        u = gx_alt2(g, a, b);
    }
    static const uint32_t short_esc[] = {'"', '"', '/', '/', '\\', '\\', 'b', 'b',
                                         'f', 'f', 'n', 'n', 'r',  'r',  't', 't'};
    struct gx *esc =
        gx_seq2(g, gx_str(g, "\\"),
                gx_alt2(g, gx_class(g, short_esc, 8, false), gx_seq2(g, gx_str(g, "u"), u)));
    return gx_alt2(g, raw, esc);
}

static uint32_t lazy_rule(struct jr *j, uint32_t *slot, const char *name) {
    if (*slot != UINT32_MAX) return *slot;
    *slot = gx_rule_new(j->g, name);
    return *slot;
}

uint32_t jr_string(struct jr *j) {
    if (j->r_string != UINT32_MAX) return j->r_string;
    uint32_t r = lazy_rule(j, &j->r_string, "json_string");
    if (r == UINT32_MAX) return r;
    struct dsi_grammar *g = j->g;
    g->rules[r].body =
        gx_seq3(g, gx_str(g, "\""), gx_rep(g, jr_char(j, true), 0, GX_INF), gx_str(g, "\""));
    return r;
}

uint32_t jr_number(struct jr *j) {
    if (j->r_number != UINT32_MAX) return j->r_number;
    uint32_t r = lazy_rule(j, &j->r_number, "json_number");
    if (r == UINT32_MAX) return r;
    struct dsi_grammar *g = j->g;
    struct gx *digits = gx_rep(g, gx_range(g, '0', '9'), 1, GX_INF);
    struct gx *intp =
        gx_alt2(g, gx_str(g, "0"),
                gx_seq2(g, gx_range(g, '1', '9'), gx_rep(g, gx_range(g, '0', '9'), 0, GX_INF)));
    struct gx *frac = gx_rep(g, gx_seq2(g, gx_str(g, "."), digits), 0, 1);
    static const uint32_t e[] = {'E', 'E', 'e', 'e'};
    static const uint32_t pm[] = {'+', '+', '-', '-'};
    struct gx *exp =
        gx_rep(g,
               gx_seq3(g, gx_class(g, e, 2, false), gx_rep(g, gx_class(g, pm, 2, false), 0, 1),
                       gx_rep(g, gx_range(g, '0', '9'), 1, GX_INF)),
               0, 1);
    struct gx *k[4] = {gx_rep(g, gx_str(g, "-"), 0, 1), intp, frac, exp};
    g->rules[r].body = gx_seq(g, k, 4);
    return r;
}

uint32_t jr_integer(struct jr *j) {
    if (j->r_integer != UINT32_MAX) return j->r_integer;
    uint32_t r = lazy_rule(j, &j->r_integer, "json_integer");
    if (r == UINT32_MAX) return r;
    struct dsi_grammar *g = j->g;
    struct gx *nz = gx_seq3(g, gx_rep(g, gx_str(g, "-"), 0, 1), gx_range(g, '1', '9'),
                            gx_rep(g, gx_range(g, '0', '9'), 0, GX_INF));
    g->rules[r].body = gx_alt2(g, gx_str(g, "0"), nz);
    return r;
}

uint32_t jr_value(struct jr *j) {
    if (j->r_value != UINT32_MAX) return j->r_value;
    struct dsi_grammar *g = j->g;
    uint32_t r = lazy_rule(j, &j->r_value, "json_value");
    uint32_t ro = lazy_rule(j, &j->r_object, "json_object");
    uint32_t ra = lazy_rule(j, &j->r_array, "json_array");
    uint32_t rs = jr_string(j), rn = jr_number(j);
    if (r == UINT32_MAX || ro == UINT32_MAX || ra == UINT32_MAX || rs == UINT32_MAX ||
        rn == UINT32_MAX)
        return UINT32_MAX;
    struct gx *k[7] = {gx_ref(g, ro),     gx_ref(g, ra),      gx_ref(g, rs),    gx_ref(g, rn),
                       gx_str(g, "true"), gx_str(g, "false"), gx_str(g, "null")};
    g->rules[r].body = gx_alt(g, k, 7);
    struct gx *pair = gx_seq3(g, gx_ref(g, rs), jr_punct(j, ":"), gx_ref(g, r));
    struct gx *pairs = gx_seq2(g, pair, gx_rep(g, gx_seq2(g, jr_punct(j, ","), pair), 0, GX_INF));
    g->rules[ro].body = gx_alt2(
        g, gx_seq3(g, gx_str(g, "{"), jr_ws(j), gx_str(g, "}")),
        gx_seq(g, (struct gx *[]){gx_str(g, "{"), jr_ws(j), pairs, jr_ws(j), gx_str(g, "}")}, 5));
    struct gx *elems =
        gx_seq2(g, gx_ref(g, r), gx_rep(g, gx_seq2(g, jr_punct(j, ","), gx_ref(g, r)), 0, GX_INF));
    g->rules[ra].body = gx_alt2(
        g, gx_seq3(g, gx_str(g, "["), jr_ws(j), gx_str(g, "]")),
        gx_seq(g, (struct gx *[]){gx_str(g, "["), jr_ws(j), elems, jr_ws(j), gx_str(g, "]")}, 5));
    return r;
}

uint32_t jr_object(struct jr *j) {
    if (jr_value(j) == UINT32_MAX) return UINT32_MAX;
    return j->r_object;
}

uint32_t jr_array(struct jr *j) {
    if (jr_value(j) == UINT32_MAX) return UINT32_MAX;
    return j->r_array;
}

/* ---------------------------------------------------------------------------------------- */
/* Integer ranges: canonical decimal integers in [lo, hi] (JR_NEG_INF / JR_POS_INF = open). */

static struct gx *digit_range(struct dsi_grammar *g, int a, int b) {
    if (a == b) {
        char c = (char)('0' + a);
        return gx_bytes(g, &c, 1);
    }
    return gx_range(g, (uint32_t)('0' + a), (uint32_t)('0' + b));
}

static int ndigits(uint64_t v) {
    int n = 1;
    while (v >= 10)
        v /= 10, n++;
    return n;
}

static uint64_t pow10u(int n) {
    uint64_t p = 1;
    while (n-- > 0)
        p *= 10;
    return p;
}

/* Numbers of exactly len digits in [a, b] (a, b of that length; leading digit may be 0 inside
 * the recursion). */
static struct gx *same_len(struct dsi_grammar *g, uint64_t a, uint64_t b, int len) {
    if (len == 1) return digit_range(g, (int)a, (int)b);
    uint64_t p = pow10u(len - 1);
    int da = (int)(a / p), db = (int)(b / p);
    uint64_t ra = a % p, rb = b % p;
    if (da == db) return gx_seq2(g, digit_range(g, da, da), same_len(g, ra, rb, len - 1));
    struct gx_list l = {0};
    int lo_full = da, hi_full = db; /* first digits whose rest spans every value */
    if (ra != 0) {
        gx_list_push(g, &l, gx_seq2(g, digit_range(g, da, da), same_len(g, ra, p - 1, len - 1)));
        lo_full = da + 1;
    }
    if (rb != p - 1) hi_full = db - 1;
    if (lo_full <= hi_full)
        gx_list_push(
            g, &l,
            gx_seq2(g, digit_range(g, lo_full, hi_full),
                    gx_rep(g, gx_range(g, '0', '9'), (uint32_t)len - 1, (uint32_t)len - 1)));
    if (rb != p - 1)
        gx_list_push(g, &l, gx_seq2(g, digit_range(g, db, db), same_len(g, 0, rb, len - 1)));
    return gx_list_alt(g, &l);
}

/* Non-negative canonical integers in [lo, hi] (hi == UINT64_MAX: unbounded). */
static struct gx *nonneg(struct dsi_grammar *g, uint64_t lo, uint64_t hi) {
    struct gx_list l = {0};
    int dl = ndigits(lo);
    int dh = hi == UINT64_MAX ? dl : ndigits(hi);
    for (int len = dl; len <= dh; len++) {
        uint64_t a = len == 1 ? 0 : pow10u(len - 1);
        uint64_t b = pow10u(len) - 1;
        if (a < lo) a = lo;
        if (hi != UINT64_MAX && b > hi) b = hi;
        if (a <= b) gx_list_push(g, &l, same_len(g, a, b, len));
    }
    if (hi == UINT64_MAX) /* every longer number */
        gx_list_push(g, &l,
                     gx_seq2(g, gx_range(g, '1', '9'),
                             gx_rep(g, gx_range(g, '0', '9'), (uint32_t)dl, GX_INF)));
    return gx_list_alt(g, &l);
}

struct gx *jr_int_range(struct jr *j, int64_t lo, int64_t hi) {
    struct dsi_grammar *g = j->g;
    struct gx_list l = {0};
    if (lo < 0) { /* negative part: -[max(1,-hi) .. -lo] */
        uint64_t nlo = hi < 0 ? (uint64_t)(-(hi + 1)) + 1 : 1;
        uint64_t nhi = lo == JR_NEG_INF ? UINT64_MAX : (uint64_t)(-(lo + 1)) + 1;
        gx_list_push(g, &l, gx_seq2(g, gx_str(g, "-"), nonneg(g, nlo, nhi)));
    }
    if (hi >= 0)
        gx_list_push(
            g, &l,
            nonneg(g, lo < 0 ? 0 : (uint64_t)lo, hi == JR_POS_INF ? UINT64_MAX : (uint64_t)hi));
    return gx_list_alt(g, &l);
}

/* ---------------------------------------------------------------------------------------- */
/* Formats. */

static const struct {
    const char *name, *re;
} k_formats[] = {
    {"date",
     "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-"
     "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
     "02-(?:0[1-9]|1[0-9]|2[0-8]))"
     "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29"},
    {"time", "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2["
             "0-3]):[0-5][0-9])"},
    {"email", "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
              "@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
              "[A-Za-z0-9])?)+"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
};

int jr_format(struct jr *j, const char *name, struct gx **out, struct dsi_err *err) {
    struct dsi_grammar *g = j->g;
    if (!strcmp(name, "date-time")) {
        struct gx *d, *t;
        int rc = jr_format(j, "date", &d, err);
        if (!rc) rc = jr_format(j, "time", &t, err);
        if (rc) return rc;
        *out = gx_seq3(g, d, gx_str(g, "T"), t);
        return 0;
    }
    for (size_t i = 0; i < sizeof(k_formats) / sizeof(k_formats[0]); i++)
        if (!strcmp(name, k_formats[i].name))
            return gx_parse_regex(g, k_formats[i].re, strlen(k_formats[i].re), true, out, err);
    return dsi_errf(
        err, DSI_ERR_UNSUPPORTED,
        "json schema: unsupported format '%s' (supported: date, time, date-time, email, uuid)",
        name);
}

/* ---------------------------------------------------------------------------------------- */
/* Keys other than a set of names: a JSON string of raw characters (no escapes, so each key has
 * one spelling and a declared name cannot come back escaped) that differs from every name.
 * A trie of the names' code points: at each node the key may end (unless a name ends there),
 * continue along a child, or leave the trie with any other character. */

static struct gx *key_node(struct jr *j,
                           const uint32_t *const *names,
                           const size_t *lens,
                           size_t n,
                           size_t depth,
                           struct gx *raw,
                           struct gx *free_tail) {
    struct dsi_grammar *g = j->g;
    struct gx_list alts = {0};
    bool ends_here = false;
    for (size_t i = 0; i < n; i++)
        if (lens[i] == depth) ends_here = true;
    if (!ends_here) gx_list_push(g, &alts, gx_str(g, "\""));
    /* children: distinct code points at this depth (names are sorted) */
    uint32_t *kids = malloc((n + 1) * 2 * sizeof(uint32_t));
    size_t nk = 0;
    if (!kids) {
        g->oom = true;
        return gx_empty(g);
    }
    for (size_t i = 0; i < n;) {
        if (lens[i] <= depth) {
            i++;
            continue;
        }
        uint32_t c = names[i][depth];
        size_t k = i;
        while (k < n && lens[k] > depth && names[k][depth] == c)
            k++;
        gx_list_push(g, &alts,
                     gx_seq2(g, gx_cp(g, c),
                             key_node(j, names + i, lens + i, k - i, depth + 1, raw, free_tail)));
        kids[2 * nk] = kids[2 * nk + 1] = c;
        nk++;
        i = k;
    }
    /* any other raw character, then anything */
    struct gx *others = gx_class(g, kids, nk, true);
    free(kids);
    /* others ∩ raw: raw is [^"\\\x00-\x1f]; intersect by removing those from others */
    static const uint32_t unsafe[] = {0, 0x1F, '"', '"', '\\', '\\'};
    uint32_t *pairs = malloc(((size_t)others->n + 4) * 2 * sizeof(uint32_t));
    if (!pairs) {
        g->oom = true;
        free(alts.v);
        return gx_empty(g);
    }
    size_t m = 0;
    for (uint32_t i = 0; i < others->n; i++) {
        uint32_t lo = others->u.ranges[2 * i], hi = others->u.ranges[2 * i + 1];
        for (int u = 0; u < 3 && lo <= hi; u++) {
            if (unsafe[2 * u + 1] < lo || unsafe[2 * u] > hi) continue;
            if (unsafe[2 * u] > lo) pairs[2 * m] = lo, pairs[2 * m + 1] = unsafe[2 * u] - 1, m++;
            lo = unsafe[2 * u + 1] + 1;
        }
        if (lo <= hi) pairs[2 * m] = lo, pairs[2 * m + 1] = hi, m++;
    }
    if (m) gx_list_push(g, &alts, gx_seq2(g, gx_class(g, pairs, m, false), free_tail));
    free(pairs);
    (void)raw;
    return gx_list_alt(g, &alts);
}

struct name_ref {
    const uint32_t *cp;
    size_t len;
};

static int cmp_nref(const void *a, const void *b) {
    const struct name_ref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    for (size_t i = 0; i < n; i++)
        if (x->cp[i] != y->cp[i]) return x->cp[i] < y->cp[i] ? -1 : 1;
    return x->len < y->len ? -1 : x->len > y->len;
}

uint32_t jr_other_key(struct jr *j, const char *const *names, size_t n) {
    struct dsi_grammar *g = j->g;
    uint32_t r = gx_rule_new(g, "json_other_key");
    if (r == UINT32_MAX) return r;
    static const uint32_t unsafe[] = {0, 0x1F, '"', '"', '\\', '\\'};
    struct gx *raw = gx_class(g, unsafe, 3, true);
    struct gx *free_tail = gx_seq2(g, gx_rep(g, raw, 0, GX_INF), gx_str(g, "\""));
    /* decode names to code points; names that need escapes cannot be spelled raw: skip */
    struct name_ref *refs = calloc(n + 1, sizeof(*refs));
    uint32_t *pool = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += strlen(names[i]);
    pool = malloc((total + 1) * sizeof(uint32_t));
    if (!refs || !pool) {
        free(refs);
        free(pool);
        g->oom = true;
        return UINT32_MAX;
    }
    size_t used = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)names[i];
        size_t len = strlen(names[i]), k = 0, start = used;
        bool ok = true;
        while (k < len) {
            uint32_t cp;
            int l = gx_utf8_dec(s + k, len - k, &cp);
            if (!l || cp < 0x20 || cp == '"' || cp == '\\') {
                ok = false;
                break;
            }
            pool[used++] = cp;
            k += (size_t)l;
        }
        if (!ok) {
            used = start;
            continue;
        }
        refs[m].cp = pool + start;
        refs[m].len = used - start;
        m++;
    }
    qsort(refs, m, sizeof(*refs), cmp_nref);
    const uint32_t **np = malloc((m + 1) * sizeof(*np));
    size_t *lens = malloc((m + 1) * sizeof(*lens));
    if (!np || !lens) {
        g->oom = true;
    } else {
        for (size_t i = 0; i < m; i++)
            np[i] = refs[i].cp, lens[i] = refs[i].len;
        g->rules[r].body = gx_seq2(g, gx_str(g, "\""), key_node(j, np, lens, m, 0, raw, free_tail));
    }
    free(np);
    free(lens);
    free(refs);
    free(pool);
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* A JSON value as a literal (enum, const): compact, keys in document order, non-ASCII raw. */
struct gx *jr_literal(struct jr *j, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    if (!s) {
        j->g->oom = true;
        return gx_empty(j->g);
    }
    struct gx *x = gx_str(j->g, s);
    free(s);
    return x;
}

void jr_init(struct jr *j, struct dsi_grammar *g) {
    memset(j, 0, sizeof(*j));
    j->g = g;
    j->r_string = j->r_number = j->r_integer = j->r_value = j->r_object = j->r_array = UINT32_MAX;
}
