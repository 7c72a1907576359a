/* regex.c - the regex front end (dialect in grammar.h): a regex -> an IR expression.
 *
 * The regex always matches the whole output (or the whole JSON string value): a leading ^ and
 * a trailing $ of a top-level alternative are accepted and ignored; anchors elsewhere are
 * rejected. Classes follow ECMA-262 (JSON Schema's regex flavour) restricted to what Python's
 * re with re.ASCII also means: \d = [0-9], \w = [A-Za-z0-9_], \s = [\t\n\v\f\r ]; \D \W are
 * their complements; \S excludes every Unicode space as well, so no output of \S can be a
 * space under either reading.
 *
 * json_string mode: the regex constrains the decoded value of a JSON string; the expression
 * produced matches the encoded content. Code points that JSON requires to be escaped ("  \  and
 * U+0000..U+001F) are emitted in their short escape (\" \\ \b \f \n \r \t) or as \u00XX; every
 * other code point raw. This is a subset of all encodings of the same values (it never emits
 * \u escapes for other code points), so every output decodes to a matching value. */
#include "grammar/internal.h"

struct rp {
    struct dsi_grammar *g;
    const char *s;
    size_t n, i;
    bool json;
    struct dsi_err *err;
    int depth;
    struct u32buf {
        uint32_t *v;
        size_t n, cap;
    } cls; /* scratch pairs for one class */
};

static int fail(struct rp *p, size_t at, int code, const char *what) {
    return dsi_errf(p->err, code, "regex: %s at offset %zu", what, at);
}

static bool cpush(struct rp *p, uint32_t lo, uint32_t hi) {
    if (p->cls.n + 2 > p->cls.cap) {
        size_t cap = p->cls.cap ? p->cls.cap * 2 : 64;
        uint32_t *v = realloc(p->cls.v, cap * sizeof(uint32_t));
        if (!v) {
            p->g->oom = true;
            return false;
        }
        p->cls.v = v;
        p->cls.cap = cap;
    }
    p->cls.v[p->cls.n++] = lo;
    p->cls.v[p->cls.n++] = hi;
    return true;
}

static const uint32_t k_digit[] = {'0', '9'};
static const uint32_t k_word[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
static const uint32_t k_space[] = {'\t', '\r', ' ', ' '};
/* Unicode + ASCII spaces (ECMA-262 WhiteSpace/LineTerminator and Python's str.isspace). */
static const uint32_t k_allspace[] = {
    '\t',   '\r',   0x1C,   ' ',    0x85,   0x85,   0xA0,   0xA0,   0x1680, 0x1680, 0x2000,
    0x200A, 0x2028, 0x2029, 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};

/* Complement of a sorted, disjoint pair list into the class scratch. */
static bool push_complement(struct rp *p, const uint32_t *pairs, size_t n) {
    uint32_t next = 0;
    for (size_t i = 0; i < n; i++) {
        if (pairs[2 * i] > next && !cpush(p, next, pairs[2 * i] - 1)) return false;
        next = pairs[2 * i + 1] + 1;
    }
    return next > GX_MAX_CP || cpush(p, next, GX_MAX_CP);
}

static bool push_pairs(struct rp *p, const uint32_t *pairs, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!cpush(p, pairs[2 * i], pairs[2 * i + 1])) return false;
    return true;
}

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* After a backslash at p->i: a class shorthand (pushed into the scratch, *is_set = true) or a
 * single code point. in_class: inside [...] (\b is backspace there). */
static int read_escape(struct rp *p, bool in_class, uint32_t *cp, bool *is_set) {
    size_t at = p->i - 1;
    *is_set = false;
    if (p->i >= p->n) return fail(p, at, DSI_ERR_INVALID, "trailing backslash");
    char e = p->s[p->i++];
    switch (e) {
    case 'd':
        *is_set = true;
        return push_pairs(p, k_digit, 1) ? 0 : DSI_ERR_NOMEM;
    case 'D':
        *is_set = true;
        return push_complement(p, k_digit, 1) ? 0 : DSI_ERR_NOMEM;
    case 'w':
        *is_set = true;
        return push_pairs(p, k_word, 4) ? 0 : DSI_ERR_NOMEM;
    case 'W':
        *is_set = true;
        return push_complement(p, k_word, 4) ? 0 : DSI_ERR_NOMEM;
    case 's':
        *is_set = true;
        return push_pairs(p, k_space, 2) ? 0 : DSI_ERR_NOMEM;
    case 'S':
        *is_set = true;
        return push_complement(p, k_allspace, 11) ? 0 : DSI_ERR_NOMEM;
    case 'n':
        *cp = '\n';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 't':
        *cp = '\t';
        return 0;
    case 'f':
        *cp = '\f';
        return 0;
    case 'v':
        *cp = '\v';
        return 0;
    case '0':
        *cp = 0;
        return 0;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        return fail(p, at, DSI_ERR_UNSUPPORTED, "word boundary \\b unsupported");
    case 'B':
        return fail(p, at, DSI_ERR_UNSUPPORTED, "\\B unsupported");
    case 'x':
    case 'u': {
        uint32_t v = 0;
        if (e == 'u' && p->i < p->n && p->s[p->i] == '{') {
            p->i++;
            int nd = 0;
            while (p->i < p->n && hexv(p->s[p->i]) >= 0 && nd < 7)
                v = v * 16 + (uint32_t)hexv(p->s[p->i++]), nd++;
            if (!nd || p->i >= p->n || p->s[p->i] != '}')
                return fail(p, at, DSI_ERR_INVALID, "bad \\u{...} escape");
            p->i++;
        } else {
            int nd = e == 'x' ? 2 : 4;
            for (int k = 0; k < nd; k++) {
                int h = p->i < p->n ? hexv(p->s[p->i]) : -1;
                if (h < 0) return fail(p, at, DSI_ERR_INVALID, "bad hex escape");
                v = v * 16 + (uint32_t)h;
                p->i++;
            }
        }
        if (v > GX_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
            return fail(p, at, DSI_ERR_UNSUPPORTED, "escape outside the Unicode scalar values");
        *cp = v;
        return 0;
    }
    case 'c':
    case 'k':
    case 'p':
    case 'P':
        return fail(p, at, DSI_ERR_UNSUPPORTED, "escape unsupported (\\c, \\k, \\p, \\P)");
    default:
        if (e >= '1' && e <= '9')
            return fail(p, at, DSI_ERR_UNSUPPORTED, "backreference unsupported");
        if ((unsigned char)e >= 0x80 || !((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))) {
            /* identity escape of punctuation (or a UTF-8 lead byte: decode it) */
            p->i--;
            int l = gx_utf8_dec((const uint8_t *)p->s + p->i, p->n - p->i, cp);
            if (!l) return fail(p, p->i, DSI_ERR_INVALID, "invalid UTF-8");
            p->i += (size_t)l;
            return 0;
        }
        return fail(p, at, DSI_ERR_UNSUPPORTED, "unknown escape");
    }
}

/* The expression for a code-point set (pairs in the scratch, any order). */
static struct gx *set_expr(struct rp *p, bool negate) {
    struct gx *cls = gx_class(p->g, p->cls.v, p->cls.n / 2, negate);
    p->cls.n = 0;
    if (!p->json || p->g->oom) return cls;
    /* JSON-encode: raw part without " \ and controls; those three groups as escapes. */
    static const uint32_t unsafe[] = {0, 0x1F, '"', '"', '\\', '\\'};
    struct gx_list alts = {0};
    uint32_t *pairs = malloc(((size_t)cls->n + 4) * 2 * sizeof(uint32_t));
    if (!pairs) {
        p->g->oom = true;
        return cls;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < cls->n; i++) {
        uint32_t lo = cls->u.ranges[2 * i], hi = cls->u.ranges[2 * i + 1];
        for (uint32_t c = lo; c <= hi && c < 0x80; c++) { /* escapes for unsafe members */
            if (c > 0x1F && c != '"' && c != '\\') continue;
            char buf[8];
            switch (c) {
            case '"':
                strcpy(buf, "\\\"");
                break;
            case '\\':
                strcpy(buf, "\\\\");
                break;
            case '\b':
                strcpy(buf, "\\b");
                break;
            case '\f':
                strcpy(buf, "\\f");
                break;
            case '\n':
                strcpy(buf, "\\n");
                break;
            case '\r':
                strcpy(buf, "\\r");
                break;
            case '\t':
                strcpy(buf, "\\t");
                break;
            default:
                snprintf(buf, sizeof(buf), "\\u%04x", c);
            }
            gx_list_push(p->g, &alts, gx_str(p->g, buf));
        }
        pairs[2 * k] = lo;
        pairs[2 * k + 1] = hi;
        k++;
    }
    /* raw part: cls minus unsafe */
    struct gx *raw = gx_class(p->g, pairs, k, false);
    free(pairs);
    {
        uint32_t *rp2 = malloc(((size_t)raw->n + 8) * 2 * sizeof(uint32_t));
        if (!rp2) {
            p->g->oom = true;
            free(alts.v);
            return cls;
        }
        size_t m = 0;
        for (uint32_t i = 0; i < raw->n; i++) {
            uint32_t lo = raw->u.ranges[2 * i], hi = raw->u.ranges[2 * i + 1];
            for (int u = 0; u < 3 && lo <= hi; u++) {
                uint32_t ulo = unsafe[2 * u], uhi = unsafe[2 * u + 1];
                if (uhi < lo || ulo > hi) continue;
                if (ulo > lo) {
                    rp2[2 * m] = lo;
                    rp2[2 * m + 1] = ulo - 1;
                    m++;
                }
                lo = uhi + 1;
            }
            if (lo <= hi) {
                rp2[2 * m] = lo;
                rp2[2 * m + 1] = hi;
                m++;
            }
        }
        if (m) gx_list_push(p->g, &alts, gx_class(p->g, rp2, m, false));
        free(rp2);
    }
    if (alts.n == 0) { /* the set holds nothing encodable: an empty class (matches nothing) */
        free(alts.v);
        return gx_class(p->g, NULL, 0, false);
    }
    return gx_list_alt(p->g, &alts);
}

static int parse_class(struct rp *p, struct gx **out) {
    size_t at = p->i++;
    bool neg = false;
    if (p->i < p->n && p->s[p->i] == '^') neg = true, p->i++;
    p->cls.n = 0;
    bool first = true;
    for (;;) {
        if (p->i >= p->n) return fail(p, at, DSI_ERR_INVALID, "unterminated class");
        char c = p->s[p->i];
        if (c == ']' && !first) {
            p->i++;
            break;
        }
        if (c == ']' && first) { /* ECMA: [] matches nothing, [^] anything */
            p->i++;
            break;
        }
        first = false;
        uint32_t lo;
        bool is_set = false;
        if (c == '\\') {
            p->i++;
            int rc = read_escape(p, true, &lo, &is_set);
            if (rc) return rc;
        } else {
            int l = gx_utf8_dec((const uint8_t *)p->s + p->i, p->n - p->i, &lo);
            if (!l) return fail(p, p->i, DSI_ERR_INVALID, "invalid UTF-8");
            p->i += (size_t)l;
        }
        if (is_set) continue;
        uint32_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            size_t rat = p->i;
            p->i++;
            bool set2 = false;
            if (p->s[p->i] == '\\') {
                p->i++;
                int rc = read_escape(p, true, &hi, &set2);
                if (rc) return rc;
                if (set2) return fail(p, rat, DSI_ERR_INVALID, "class shorthand as a range end");
            } else {
                int l = gx_utf8_dec((const uint8_t *)p->s + p->i, p->n - p->i, &hi);
                if (!l) return fail(p, p->i, DSI_ERR_INVALID, "invalid UTF-8");
                p->i += (size_t)l;
            }
            if (hi < lo) return fail(p, rat, DSI_ERR_INVALID, "class range out of order");
        }
        if (!cpush(p, lo, hi)) return DSI_ERR_NOMEM;
    }
    *out = set_expr(p, neg);
    return 0;
}

static int parse_alt(struct rp *p, struct gx **out, bool top);

static int parse_count(struct rp *p, uint32_t *v) {
    uint64_t x = 0;
    size_t at = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (x > 1000000000) return fail(p, at, DSI_ERR_UNSUPPORTED, "repetition count too large");
    }
    *v = (uint32_t)x;
    return 0;
}

/* Is there a {m}, {m,} or {m,n} quantifier at p->i? */
static bool at_brace_quant(const struct rp *p) {
    size_t k = p->i + 1;
    if (k >= p->n || p->s[k] < '0' || p->s[k] > '9') return false;
    while (k < p->n && p->s[k] >= '0' && p->s[k] <= '9')
        k++;
    if (k < p->n && p->s[k] == ',') {
        k++;
        while (k < p->n && p->s[k] >= '0' && p->s[k] <= '9')
            k++;
    }
    return k < p->n && p->s[k] == '}';
}

static int parse_atom(struct rp *p, struct gx **out) {
    size_t at = p->i;
    char c = p->s[p->i];
    switch (c) {
    case '(': {
        if (++p->depth > 200) return fail(p, at, DSI_ERR_UNSUPPORTED, "groups nested too deep");
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':')
                p->i += 2;
            else if (p->i + 1 < p->n && (p->s[p->i + 1] == '<' || p->s[p->i + 1] == 'P') &&
                     !(p->i + 2 < p->n && (p->s[p->i + 2] == '=' || p->s[p->i + 2] == '!'))) {
                while (p->i < p->n && p->s[p->i] != '>')
                    p->i++;
                if (p->i >= p->n) return fail(p, at, DSI_ERR_INVALID, "unterminated group name");
                p->i++;
            } else {
                return fail(p, at, DSI_ERR_UNSUPPORTED, "lookaround or inline flags unsupported");
            }
        }
        int rc = parse_alt(p, out, false);
        if (rc) return rc;
        if (p->i >= p->n || p->s[p->i] != ')') return fail(p, at, DSI_ERR_INVALID, "missing ')'");
        p->i++;
        p->depth--;
        return 0;
    }
    case '[':
        return parse_class(p, out);
    case '.':
        p->i++;
        p->cls.n = 0;
        if (!cpush(p, '\n', '\n') || !cpush(p, '\r', '\r')) return DSI_ERR_NOMEM;
        *out = set_expr(p, true);
        return 0;
    case '\\': {
        p->i++;
        uint32_t cp;
        bool is_set;
        p->cls.n = 0;
        int rc = read_escape(p, false, &cp, &is_set);
        if (rc) return rc;
        if (!is_set && !cpush(p, cp, cp)) return DSI_ERR_NOMEM;
        *out = set_expr(p, false);
        return 0;
    }
    case '*':
    case '+':
    case '?':
        return fail(p, at, DSI_ERR_INVALID, "quantifier without an operand");
    case ')':
        return fail(p, at, DSI_ERR_INVALID, "unmatched ')'");
    case '^':
    case '$':
        return fail(p, at, DSI_ERR_UNSUPPORTED, "anchor inside the regex unsupported");
    default: {
        if (c == '{' && at_brace_quant(p))
            return fail(p, at, DSI_ERR_INVALID, "quantifier without an operand");
        uint32_t cp;
        int l = gx_utf8_dec((const uint8_t *)p->s + p->i, p->n - p->i, &cp);
        if (!l) return fail(p, at, DSI_ERR_INVALID, "invalid UTF-8");
        p->i += (size_t)l;
        p->cls.n = 0;
        if (!cpush(p, cp, cp)) return DSI_ERR_NOMEM;
        *out = set_expr(p, false);
        return 0;
    }
    }
}

static int parse_quant(struct rp *p, struct gx **out) {
    int rc = parse_atom(p, out);
    if (rc) return rc;
    bool quantified = false;
    while (p->i < p->n) {
        size_t at = p->i;
        char c = p->s[p->i];
        uint32_t lo, hi;
        if (c == '*')
            lo = 0, hi = GX_INF, p->i++;
        else if (c == '+')
            lo = 1, hi = GX_INF, p->i++;
        else if (c == '?')
            lo = 0, hi = 1, p->i++;
        else if (c == '{' && at_brace_quant(p)) {
            p->i++;
            if ((rc = parse_count(p, &lo))) return rc;
            hi = lo;
            if (p->s[p->i] == ',') {
                p->i++;
                hi = GX_INF;
                if (p->s[p->i] != '}' && (rc = parse_count(p, &hi))) return rc;
            }
            p->i++; /* } */
            if (hi < lo) return fail(p, at, DSI_ERR_INVALID, "repetition {m,n} with n < m");
            uint32_t lim = (uint32_t)p->g->opts.max_repeat;
            if (lo > lim || (hi != GX_INF && hi > lim)) {
                char msg[80];
                snprintf(msg, sizeof(msg), "repetition count above the limit %u", lim);
                return fail(p, at, DSI_ERR_UNSUPPORTED, msg);
            }
        } else {
            break;
        }
        if (quantified)
            return fail(p, at, DSI_ERR_INVALID, "nothing to repeat (double quantifier)");
        quantified = true;
        if (p->i < p->n && p->s[p->i] == '?')
            p->i++; /* lazy: same language */
        else if (p->i < p->n && p->s[p->i] == '+')
            return fail(p, p->i, DSI_ERR_UNSUPPORTED, "possessive quantifier unsupported");
        *out = gx_rep(p->g, *out, lo, hi);
    }
    return 0;
}

static int parse_seq(struct rp *p, struct gx **out, bool top) {
    struct gx_list l = {0};
    if (top && p->i < p->n && p->s[p->i] == '^') p->i++;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        if (top && p->s[p->i] == '$' &&
            (p->i + 1 == p->n || p->s[p->i + 1] == '|')) { /* trailing anchor */
            p->i++;
            break;
        }
        struct gx *x;
        int rc = parse_quant(p, &x);
        if (rc) {
            free(l.v);
            return rc;
        }
        gx_list_push(p->g, &l, x);
    }
    *out = gx_list_seq(p->g, &l);
    return 0;
}

static int parse_alt(struct rp *p, struct gx **out, bool top) {
    struct gx_list l = {0};
    for (;;) {
        struct gx *x;
        int rc = parse_seq(p, &x, top);
        if (rc) {
            free(l.v);
            return rc;
        }
        gx_list_push(p->g, &l, x);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    *out = gx_list_alt(p->g, &l);
    return 0;
}

int gx_parse_regex(struct dsi_grammar *g,
                   const char *re,
                   size_t len,
                   bool json_string,
                   struct gx **out,
                   struct dsi_err *err) {
    struct rp p = {.g = g, .s = re, .n = len, .json = json_string, .err = err};
    int rc = parse_alt(&p, out, true);
    if (!rc && p.i < p.n) rc = fail(&p, p.i, DSI_ERR_INVALID, "unmatched ')'");
    free(p.cls.v);
    if (!rc && g->oom) rc = dsi_errf(err, DSI_ERR_NOMEM, "regex: out of memory");
    if (rc == DSI_ERR_NOMEM) dsi_errf(err, rc, "regex: out of memory");
    return rc;
}
