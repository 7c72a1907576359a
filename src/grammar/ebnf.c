/* ebnf.c - the EBNF front end (dialect in grammar.h): text -> rules of the IR.
 *
 *   grammar  := rule*
 *   rule     := NAME '::=' alt lookahead?        lookahead := '(' '=' alt ')'  (ignored)
 *   alt      := seq ('|' seq)*
 *   seq      := postfix*                          (ends at '|' ')' EOF or NAME '::=')
 *   postfix  := primary ('?' | '*' | '+' | '{' INT (',' INT?)? '}')*
 *   primary  := STRING | CLASS | NAME | '(' alt ')'
 *
 * Whitespace (newlines included) and # comments separate tokens. Errors carry line:column. */
#include "grammar/internal.h"

#include <ctype.h>

struct ep {
    struct dsi_grammar *g;
    const char *s;
    size_t n, i;
    struct dsi_err *err;
    int depth;
};

static int failc(struct ep *p, size_t at, int code, const char *what) {
    int line = 1, col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n')
            line++, col = 1;
        else
            col++;
    }
    return dsi_errf(p->err, code, "ebnf:%d:%d: %s", line, col, what);
}

static int fail(struct ep *p, size_t at, const char *what) {
    return failc(p, at, DSI_ERR_INVALID, what);
}

static void skip_ws(struct ep *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n')
                p->i++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->i++;
        } else {
            break;
        }
    }
}

static bool is_name0(char c) { return isalpha((unsigned char)c) || c == '_'; }
static bool is_name(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-'; }

static size_t name_len(const struct ep *p, size_t at) {
    if (at >= p->n || !is_name0(p->s[at])) return 0;
    size_t k = at + 1;
    while (k < p->n && is_name(p->s[k]))
        k++;
    return k - at;
}

/* Does a rule definition (NAME ::=) start at p->i? */
static bool at_rule_def(const struct ep *p) {
    size_t l = name_len(p, p->i);
    if (!l) return false;
    size_t k = p->i + l;
    while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t' || p->s[k] == '\n' || p->s[k] == '\r'))
        k++;
    return k + 3 <= p->n && !memcmp(p->s + k, "::=", 3);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One (possibly escaped) code point of a literal or class at p->i. */
static int read_cp(struct ep *p, uint32_t *cp) {
    size_t at = p->i;
    if (p->i >= p->n) return fail(p, at, "unterminated literal");
    unsigned char c = (unsigned char)p->s[p->i];
    if (c != '\\') {
        int l = gx_utf8_dec((const uint8_t *)p->s + p->i, p->n - p->i, cp);
        if (!l) return fail(p, at, "invalid UTF-8");
        p->i += (size_t)l;
        return 0;
    }
    if (p->i + 1 >= p->n) return fail(p, at, "unterminated escape");
    char e = p->s[p->i + 1];
    p->i += 2;
    int digits = 0;
    switch (e) {
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
    case 'b':
        *cp = '\b';
        return 0;
    case 'a':
        *cp = '\a';
        return 0;
    case 'e':
        *cp = 0x1B;
        return 0;
    case '0':
        *cp = 0;
        return 0;
    case 'x':
        digits = 2;
        break;
    case 'u':
        digits = 4;
        break;
    case 'U':
        digits = 8;
        break;
    default:
        if (strchr("\\\"'[]-^/.|()*+?{}$ ", e)) {
            *cp = (unsigned char)e;
            return 0;
        }
        return fail(p, at, "unknown escape");
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
        if (h < 0) return fail(p, at, "bad hex escape");
        v = v * 16 + (uint32_t)h;
        p->i++;
    }
    if (v > GX_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
        return fail(p, at, "escape is not a Unicode scalar value");
    *cp = v;
    return 0;
}

static int parse_string(struct ep *p, struct gx **out) {
    char q = p->s[p->i++]; /* " or ' */
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (p->i >= p->n) {
            rc = fail(p, p->i, "unterminated string literal");
            break;
        }
        if (p->s[p->i] == q) {
            p->i++;
            break;
        }
        uint32_t cp;
        if ((rc = read_cp(p, &cp))) break;
        if (n + 4 > cap) {
            cap = cap ? cap * 2 : 32;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                rc = dsi_errf(p->err, DSI_ERR_NOMEM, "ebnf: out of memory");
                break;
            }
            buf = nb;
        }
        n += (size_t)gx_utf8_enc(cp, buf + n);
    }
    if (!rc) *out = gx_bytes(p->g, buf, n);
    free(buf);
    return rc;
}

static int parse_class(struct ep *p, struct gx **out) {
    size_t at = p->i++;
    bool neg = false;
    if (p->i < p->n && p->s[p->i] == '^') neg = true, p->i++;
    uint32_t *pairs = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (p->i >= p->n) {
            rc = fail(p, at, "unterminated character class");
            break;
        }
        if (p->s[p->i] == ']') {
            p->i++;
            break;
        }
        uint32_t lo, hi;
        if ((rc = read_cp(p, &lo))) break;
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if ((rc = read_cp(p, &hi))) break;
            if (hi < lo) {
                rc = fail(p, at, "class range out of order");
                break;
            }
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint32_t *np = realloc(pairs, cap * 2 * sizeof(uint32_t));
            if (!np) {
                rc = dsi_errf(p->err, DSI_ERR_NOMEM, "ebnf: out of memory");
                break;
            }
            pairs = np;
        }
        pairs[2 * n] = lo;
        pairs[2 * n + 1] = hi;
        n++;
    }
    if (!rc) *out = gx_class(p->g, pairs, n, neg);
    free(pairs);
    return rc;
}

static int parse_alt(struct ep *p, struct gx **out);

static int parse_uint(struct ep *p, uint32_t *v) {
    skip_ws(p);
    size_t at = p->i;
    uint64_t x = 0;
    while (p->i < p->n && isdigit((unsigned char)p->s[p->i])) {
        x = x * 10 + (uint64_t)(p->s[p->i] - '0');
        if (x > UINT32_MAX / 2) return fail(p, at, "repetition count too large");
        p->i++;
    }
    if (p->i == at) return fail(p, at, "expected a number");
    *v = (uint32_t)x;
    return 0;
}

static int parse_primary(struct ep *p, struct gx **out) {
    skip_ws(p);
    size_t at = p->i;
    if (p->i >= p->n) return fail(p, at, "expected an expression");
    char c = p->s[p->i];
    if (c == '"' || c == '\'') return parse_string(p, out);
    if (c == '[') return parse_class(p, out);
    if (c == '(') {
        if (++p->depth > 200) return fail(p, at, "nesting too deep");
        p->i++;
        int rc = parse_alt(p, out);
        if (rc) return rc;
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ')') return fail(p, at, "missing ')'");
        p->i++;
        p->depth--;
        return 0;
    }
    if (c == '.') { /* any code point */
        p->i++;
        *out = gx_range(p->g, 0, GX_MAX_CP);
        return 0;
    }
    size_t l = name_len(p, p->i);
    if (!l) return fail(p, at, "expected a literal, class, rule name or '('");
    uint32_t r = gx_rule_get(p->g, p->s + p->i, l, (uint32_t)p->i);
    if (r == UINT32_MAX) return dsi_errf(p->err, DSI_ERR_NOMEM, "ebnf: out of memory");
    p->i += l;
    *out = gx_ref(p->g, r);
    return 0;
}

static int parse_postfix(struct ep *p, struct gx **out) {
    int rc = parse_primary(p, out);
    if (rc) return rc;
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n) return 0;
        char c = p->s[p->i];
        size_t at = p->i;
        uint32_t lo, hi;
        if (c == '*')
            lo = 0, hi = GX_INF;
        else if (c == '+')
            lo = 1, hi = GX_INF;
        else if (c == '?')
            lo = 0, hi = 1;
        else if (c == '{') {
            p->i++;
            if ((rc = parse_uint(p, &lo))) return rc;
            skip_ws(p);
            hi = lo;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                skip_ws(p);
                hi = GX_INF;
                if (p->i < p->n && p->s[p->i] != '}') {
                    if (p->s[p->i] == '-') { /* XGrammar prints {m, -1} for unbounded */
                        if (p->i + 1 < p->n && p->s[p->i + 1] == '1')
                            p->i += 2;
                        else
                            return fail(p, at, "bad repetition bound");
                    } else if ((rc = parse_uint(p, &hi))) {
                        return rc;
                    }
                }
                skip_ws(p);
            }
            if (p->i >= p->n || p->s[p->i] != '}') return fail(p, at, "missing '}' in repetition");
            if (hi < lo) return fail(p, at, "repetition {m,n} with n < m");
            uint32_t lim = (uint32_t)p->g->opts.max_repeat;
            if (lo > lim || (hi != GX_INF && hi > lim)) {
                char msg[80];
                snprintf(msg, sizeof(msg), "repetition count above the limit %u", lim);
                return failc(p, at, DSI_ERR_UNSUPPORTED, msg);
            }
        } else {
            return 0;
        }
        p->i++;
        *out = gx_rep(p->g, *out, lo, hi);
    }
}

static bool seq_end(struct ep *p) {
    skip_ws(p);
    if (p->i >= p->n) return true;
    char c = p->s[p->i];
    if (c == '|' || c == ')') return true;
    if (c == '(' && p->i + 1 < p->n && p->s[p->i + 1] == '=') return true; /* lookahead */
    return at_rule_def(p);
}

static int parse_seq(struct ep *p, struct gx **out) {
    struct gx_list l = {0};
    while (!seq_end(p)) {
        struct gx *x;
        int rc = parse_postfix(p, &x);
        if (rc) {
            free(l.v);
            return rc;
        }
        gx_list_push(p->g, &l, x);
    }
    *out = gx_list_seq(p->g, &l);
    return 0;
}

static int parse_alt(struct ep *p, struct gx **out) {
    struct gx_list l = {0};
    for (;;) {
        struct gx *x;
        int rc = parse_seq(p, &x);
        if (rc) {
            free(l.v);
            return rc;
        }
        gx_list_push(p->g, &l, x);
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    *out = gx_list_alt(p->g, &l);
    return 0;
}

int gx_parse_ebnf(struct dsi_grammar *g, const char *src, size_t len, struct dsi_err *err) {
    struct ep p = {.g = g, .s = src, .n = len, .err = err};
    char msg[200];
    for (;;) {
        skip_ws(&p);
        if (p.i >= p.n) break;
        size_t at = p.i;
        size_t l = name_len(&p, p.i);
        if (!l || !at_rule_def(&p))
            return fail(&p, at, "expected a rule definition 'name ::= ...'");
        uint32_t r = gx_rule_get(g, src + at, l, (uint32_t)at);
        if (r == UINT32_MAX) return dsi_errf(err, DSI_ERR_NOMEM, "ebnf: out of memory");
        if (g->rules[r].body) {
            snprintf(msg, sizeof(msg), "rule '%s' defined twice", g->rules[r].name);
            return fail(&p, at, msg);
        }
        g->rules[r].src_pos = (uint32_t)at;
        p.i += l;
        skip_ws(&p);
        p.i += 3; /* ::= */
        struct gx *body;
        int rc = parse_alt(&p, &body);
        if (rc) return rc;
        g->rules[r].body = body;
        skip_ws(&p);
        if (p.i + 1 < p.n && p.s[p.i] == '(' && p.s[p.i + 1] == '=') { /* lookahead: ignored */
            size_t la = p.i;
            p.i += 2;
            struct gx *ignored;
            if ((rc = parse_alt(&p, &ignored))) return rc;
            skip_ws(&p);
            if (p.i >= p.n || p.s[p.i] != ')') return fail(&p, la, "missing ')' after lookahead");
            p.i++;
        }
        skip_ws(&p);
        if (p.i < p.n && !at_rule_def(&p)) return fail(&p, p.i, "unexpected text after rule");
        if (g->oom) return dsi_errf(err, DSI_ERR_NOMEM, "ebnf: out of memory");
    }
    for (uint32_t i = 0; i < g->n_rules; i++) {
        if (!g->rules[i].body) {
            snprintf(msg, sizeof(msg), "rule '%s' is used but not defined", g->rules[i].name);
            return fail(&p, g->rules[i].src_pos, msg);
        }
    }
    int32_t root = gx_rule_find(g, "root");
    if (root < 0)
        return dsi_errf(err, DSI_ERR_INVALID, "ebnf: no rule named 'root' (the start rule)");
    g->root = (uint32_t)root;
    return 0;
}
