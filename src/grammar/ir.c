/* ir.c - the grammar IR: arena, rule table, node builders, UTF-8 helpers and the EBNF printer
 * (dsi_grammar_print). See internal.h. */
#include "grammar/internal.h"

#include <stdarg.h>

/* ---------------------------------------------------------------------------------------- */
/* Arena: chunks of at least 64 KiB, freed together with the grammar. */

struct gx_chunk {
    struct gx_chunk *prev;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *gx_alloc(struct dsi_grammar *g, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct gx_chunk *c = g->arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        struct gx_chunk *nc = malloc(sizeof(*nc) + cap);
        if (!nc) {
            g->oom = true;
            return NULL;
        }
        nc->prev = c;
        nc->used = 0;
        nc->cap = cap;
        g->arena = nc;
        c = nc;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *gx_strdup(struct dsi_grammar *g, const char *s, size_t n) {
    char *p = gx_alloc(g, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

struct dsi_grammar *gx_new(const struct dsi_grammar_opts *opts) {
    struct dsi_grammar *g = calloc(1, sizeof(*g));
    if (!g) return NULL;
    if (opts)
        g->opts = *opts;
    else
        dsi_grammar_opts_default(&g->opts);
    return g;
}

void dsi_grammar_free(struct dsi_grammar *g) {
    if (!g) return;
    struct gx_chunk *c = g->arena;
    while (c) {
        struct gx_chunk *p = c->prev;
        free(c);
        c = p;
    }
    free(g->rules);
    free(g);
}

void dsi_grammar_opts_default(struct dsi_grammar_opts *o) {
    memset(o, 0, sizeof(*o));
    o->ws = DSI_GRAMMAR_WS_FLEXIBLE;
    o->max_ws = 0;
    o->max_repeat = 10000;
    o->max_states = 200000;
}

/* ---------------------------------------------------------------------------------------- */
/* Rules. */

int32_t gx_rule_find(const struct dsi_grammar *g, const char *name) {
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (!strcmp(g->rules[i].name, name)) return (int32_t)i;
    return -1;
}

static uint32_t rule_add(struct dsi_grammar *g, char *name, uint32_t src_pos) {
    if (!name) return UINT32_MAX;
    if (g->n_rules == g->cap_rules) {
        uint32_t cap = g->cap_rules ? g->cap_rules * 2 : 32;
        struct gx_rule *r = realloc(g->rules, cap * sizeof(*r));
        if (!r) {
            g->oom = true;
            return UINT32_MAX;
        }
        g->rules = r;
        g->cap_rules = cap;
    }
    struct gx_rule *r = &g->rules[g->n_rules];
    r->name = name;
    r->body = NULL;
    r->src_pos = src_pos;
    return g->n_rules++;
}

uint32_t gx_rule_get(struct dsi_grammar *g, const char *name, size_t n, uint32_t src_pos) {
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (strlen(g->rules[i].name) == n && !memcmp(g->rules[i].name, name, n)) return i;
    return rule_add(g, gx_strdup(g, name, n), src_pos);
}

uint32_t gx_rule_new(struct dsi_grammar *g, const char *prefix) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", prefix);
    for (int k = 1; gx_rule_find(g, buf) >= 0; k++)
        snprintf(buf, sizeof(buf), "%s_%d", prefix, k);
    return rule_add(g, gx_strdup(g, buf, strlen(buf)), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Builders. */

static struct gx g_dummy = {.kind = GX_EMPTY};

static struct gx *node(struct dsi_grammar *g, int kind) {
    struct gx *x = gx_alloc(g, sizeof(*x));
    if (!x) return NULL;
    x->kind = (uint8_t)kind;
    return x;
}

struct gx *gx_empty(struct dsi_grammar *g) {
    struct gx *x = node(g, GX_EMPTY);
    return x ? x : &g_dummy;
}

struct gx *gx_bytes(struct dsi_grammar *g, const void *s, size_t n) {
    if (n == 0) return gx_empty(g);
    struct gx *x = node(g, GX_BYTES);
    uint8_t *b = gx_alloc(g, n);
    if (!x || !b) return &g_dummy;
    memcpy(b, s, n);
    x->u.bytes = b;
    x->n = (uint32_t)n;
    return x;
}

struct gx *gx_str(struct dsi_grammar *g, const char *s) {
    return gx_bytes(g, s, strlen(s));
}

struct gx *gx_cp(struct dsi_grammar *g, uint32_t cp) {
    uint8_t b[4];
    return gx_bytes(g, b, (size_t)gx_utf8_enc(cp, b));
}

static int cmp_pair(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

struct gx *gx_class(struct dsi_grammar *g, const uint32_t *pairs, size_t n, bool negate) {
    uint32_t *tmp = malloc((n + 1) * 2 * sizeof(uint32_t));
    if (!tmp) {
        g->oom = true;
        return &g_dummy;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = pairs[2 * i], hi = pairs[2 * i + 1];
        if (lo > hi || lo > GX_MAX_CP) continue;
        if (hi > GX_MAX_CP) hi = GX_MAX_CP;
        tmp[2 * m] = lo;
        tmp[2 * m + 1] = hi;
        m++;
    }
    qsort(tmp, m, 2 * sizeof(uint32_t), cmp_pair);
    size_t k = 0; /* merge overlapping / adjacent */
    for (size_t i = 0; i < m; i++) {
        if (k && tmp[2 * i] <= tmp[2 * (k - 1) + 1] + 1) {
            if (tmp[2 * i + 1] > tmp[2 * (k - 1) + 1]) tmp[2 * (k - 1) + 1] = tmp[2 * i + 1];
        } else {
            tmp[2 * k] = tmp[2 * i];
            tmp[2 * k + 1] = tmp[2 * i + 1];
            k++;
        }
    }
    if (negate) { /* complement in [0, GX_MAX_CP] */
        uint32_t *c = malloc((k + 1) * 2 * sizeof(uint32_t));
        if (!c) {
            free(tmp);
            g->oom = true;
            return &g_dummy;
        }
        size_t j = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < k; i++) {
            if (tmp[2 * i] > next) {
                c[2 * j] = next;
                c[2 * j + 1] = tmp[2 * i] - 1;
                j++;
            }
            next = tmp[2 * i + 1] + 1;
        }
        if (next <= GX_MAX_CP) {
            c[2 * j] = next;
            c[2 * j + 1] = GX_MAX_CP;
            j++;
        }
        free(tmp);
        tmp = c;
        k = j;
    }
    struct gx *x = node(g, GX_CLASS);
    uint32_t *r = gx_alloc(g, (k ? k : 1) * 2 * sizeof(uint32_t));
    if (!x || !r) {
        free(tmp);
        return &g_dummy;
    }
    memcpy(r, tmp, k * 2 * sizeof(uint32_t));
    free(tmp);
    x->u.ranges = r;
    x->n = (uint32_t)k;
    return x;
}

struct gx *gx_range(struct dsi_grammar *g, uint32_t lo, uint32_t hi) {
    uint32_t p[2] = {lo, hi};
    return gx_class(g, p, 1, false);
}

/* SEQ/ALT node: nested nodes of the same kind are flattened; a SEQ drops empty parts. */
static struct gx *list_node(struct dsi_grammar *g, int kind, struct gx *const *k, size_t n) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (kind == GX_SEQ && k[i]->kind == GX_EMPTY) continue;
        m += k[i]->kind == kind ? k[i]->n : 1;
    }
    if (m == 0) return gx_empty(g);
    if (m == 1)
        for (size_t i = 0; i < n; i++) {
            if (kind == GX_SEQ && k[i]->kind == GX_EMPTY) continue;
            return k[i]->kind == kind ? k[i]->u.kids[0] : k[i];
        }
    struct gx *x = node(g, kind);
    struct gx **kids = gx_alloc(g, m * sizeof(*kids));
    if (!x || !kids) return &g_dummy;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (kind == GX_SEQ && k[i]->kind == GX_EMPTY) continue;
        if (k[i]->kind == kind) {
            memcpy(kids + j, k[i]->u.kids, k[i]->n * sizeof(*kids));
            j += k[i]->n;
        } else {
            kids[j++] = k[i];
        }
    }
    x->u.kids = kids;
    x->n = (uint32_t)m;
    return x;
}

struct gx *gx_seq(struct dsi_grammar *g, struct gx *const *k, size_t n) {
    return list_node(g, GX_SEQ, k, n);
}
struct gx *gx_alt(struct dsi_grammar *g, struct gx *const *k, size_t n) {
    return list_node(g, GX_ALT, k, n);
}
struct gx *gx_seq2(struct dsi_grammar *g, struct gx *a, struct gx *b) {
    struct gx *k[2] = {a, b};
    return gx_seq(g, k, 2);
}
struct gx *gx_seq3(struct dsi_grammar *g, struct gx *a, struct gx *b, struct gx *c) {
    struct gx *k[3] = {a, b, c};
    return gx_seq(g, k, 3);
}
struct gx *gx_alt2(struct dsi_grammar *g, struct gx *a, struct gx *b) {
    struct gx *k[2] = {a, b};
    return gx_alt(g, k, 2);
}

struct gx *gx_rep(struct dsi_grammar *g, struct gx *x, uint32_t min, uint32_t max) {
    if (max == 0) return gx_empty(g);
    if (min == 1 && max == 1) return x;
    struct gx *r = node(g, GX_REP);
    if (!r) return &g_dummy;
    r->u.kid = x;
    r->min = min;
    r->max = max;
    return r;
}

struct gx *gx_ref(struct dsi_grammar *g, uint32_t rule) {
    struct gx *x = node(g, GX_REF);
    if (!x) return &g_dummy;
    x->n = rule;
    return x;
}

void gx_list_push(struct dsi_grammar *g, struct gx_list *l, struct gx *x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        struct gx **v = realloc(l->v, cap * sizeof(*v));
        if (!v) {
            g->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

struct gx *gx_list_seq(struct dsi_grammar *g, struct gx_list *l) {
    struct gx *x = gx_seq(g, l->v, l->n);
    free(l->v);
    memset(l, 0, sizeof(*l));
    return x;
}

struct gx *gx_list_alt(struct dsi_grammar *g, struct gx_list *l) {
    struct gx *x = gx_alt(g, l->v, l->n);
    free(l->v);
    memset(l, 0, sizeof(*l));
    return x;
}

/* ---------------------------------------------------------------------------------------- */
/* UTF-8. */

int gx_utf8_enc(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int gx_utf8_dec(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > GX_MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

/* ---------------------------------------------------------------------------------------- */
/* Printer. */

struct pbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void put(struct pbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void putf(struct pbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct pbuf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0) put(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* One code point inside "..." (in_class: inside [...]). */
static void put_cp(struct pbuf *b, uint32_t cp, bool in_class) {
    switch (cp) {
    case '\n':
        put(b, "\\n", 2);
        return;
    case '\r':
        put(b, "\\r", 2);
        return;
    case '\t':
        put(b, "\\t", 2);
        return;
    case '\\':
        put(b, "\\\\", 2);
        return;
    default:
        break;
    }
    if (cp < 0x20 || cp == 0x7F) {
        putf(b, "\\x%02x", cp);
        return;
    }
    if ((!in_class && cp == '"') ||
        (in_class && (cp == ']' || cp == '-' || cp == '^' || cp == '['))) {
        char e[2] = {'\\', (char)cp};
        put(b, e, 2);
        return;
    }
    uint8_t u[4];
    put(b, (const char *)u, (size_t)gx_utf8_enc(cp, u));
}

static void print_class(struct pbuf *b, const struct gx *x) {
    /* Print the shorter of the class and its complement. */
    size_t nc = x->n + 1;
    if (x->n && x->u.ranges[0] == 0) nc--;
    if (x->n && x->u.ranges[2 * x->n - 1] == GX_MAX_CP) nc--;
    bool neg = x->n > 0 && nc < x->n;
    put(b, neg ? "[^" : "[", neg ? 2 : 1);
    if (!neg) {
        for (uint32_t i = 0; i < x->n; i++) {
            put_cp(b, x->u.ranges[2 * i], true);
            if (x->u.ranges[2 * i + 1] != x->u.ranges[2 * i]) {
                put(b, "-", 1);
                put_cp(b, x->u.ranges[2 * i + 1], true);
            }
        }
    } else {
        uint32_t next = 0;
        for (uint32_t i = 0; i <= x->n; i++) {
            uint32_t lo = i < x->n ? x->u.ranges[2 * i] : GX_MAX_CP + 1;
            if (lo > next) {
                put_cp(b, next, true);
                if (lo - 1 != next) {
                    put(b, "-", 1);
                    put_cp(b, lo - 1, true);
                }
            }
            if (i < x->n) next = x->u.ranges[2 * i + 1] + 1;
        }
    }
    put(b, "]", 1);
}

static void print_x(struct pbuf *b, const struct dsi_grammar *g, const struct gx *x, int prec);

/* prec: 0 = alternation allowed, 1 = inside a sequence, 2 = operand of a postfix operator */
static void print_x(struct pbuf *b, const struct dsi_grammar *g, const struct gx *x, int prec) {
    switch (x->kind) {
    case GX_EMPTY:
        put(b, "\"\"", 2);
        break;
    case GX_BYTES: {
        put(b, "\"", 1);
        for (uint32_t i = 0; i < x->n;) {
            uint32_t cp;
            int l = gx_utf8_dec(x->u.bytes + i, x->n - i, &cp);
            if (l == 0) { /* not UTF-8: cannot be written in the dialect; keep it visible */
                putf(b, "\\x%02x", x->u.bytes[i]);
                i++;
                continue;
            }
            put_cp(b, cp, false);
            i += (uint32_t)l;
        }
        put(b, "\"", 1);
        break;
    }
    case GX_CLASS:
        print_class(b, x);
        break;
    case GX_REF:
        put(b, g->rules[x->n].name, strlen(g->rules[x->n].name));
        break;
    case GX_SEQ:
    case GX_ALT: {
        bool alt = x->kind == GX_ALT;
        bool paren = alt ? prec > 0 : prec > 1;
        if (paren) put(b, "(", 1);
        for (uint32_t i = 0; i < x->n; i++) {
            if (i) put(b, alt ? " | " : " ", alt ? 3 : 1);
            print_x(b, g, x->u.kids[i], alt ? 1 : 2);
        }
        if (paren) put(b, ")", 1);
        break;
    }
    case GX_REP:
        print_x(b, g, x->u.kid, 2);
        if (x->min == 0 && x->max == GX_INF)
            put(b, "*", 1);
        else if (x->min == 1 && x->max == GX_INF)
            put(b, "+", 1);
        else if (x->min == 0 && x->max == 1)
            put(b, "?", 1);
        else if (x->max == GX_INF)
            putf(b, "{%u,}", x->min);
        else if (x->min == x->max)
            putf(b, "{%u}", x->min);
        else
            putf(b, "{%u,%u}", x->min, x->max);
        break;
    default:
        break;
    }
}

static void print_rule(struct pbuf *b, const struct dsi_grammar *g, uint32_t i) {
    const struct gx_rule *r = &g->rules[i];
    put(b, r->name, strlen(r->name));
    put(b, " ::= ", 5);
    if (r->body)
        print_x(b, g, r->body, 0);
    else
        put(b, "\"\"", 2);
    put(b, "\n", 1);
}

/* Rules referenced by x, in order of appearance, appended to the queue if new. */
static void enqueue_refs(const struct gx *x, uint32_t *queue, uint32_t *nq, uint8_t *seen) {
    switch (x->kind) {
    case GX_REF:
        if (!seen[x->n]) seen[x->n] = 1, queue[(*nq)++] = x->n;
        break;
    case GX_SEQ:
    case GX_ALT:
        for (uint32_t i = 0; i < x->n; i++)
            enqueue_refs(x->u.kids[i], queue, nq, seen);
        break;
    case GX_REP:
        enqueue_refs(x->u.kid, queue, nq, seen);
        break;
    default:
        break;
    }
}

/* Root first, then rules in breadth-first order of first reference (so printing the parse of
 * the output gives the same text), then unreachable rules. */
char *dsi_grammar_print(const struct dsi_grammar *g) {
    struct pbuf b = {0};
    put(&b, "", 0);
    uint32_t *queue = malloc(((size_t)g->n_rules + 1) * sizeof(uint32_t));
    uint8_t *seen = calloc((size_t)g->n_rules + 1, 1);
    if (!queue || !seen) {
        free(queue);
        free(seen);
        free(b.p);
        return NULL;
    }
    uint32_t nq = 0;
    queue[nq++] = g->root;
    seen[g->root] = 1;
    for (uint32_t k = 0; k < nq; k++) {
        print_rule(&b, g, queue[k]);
        if (g->rules[queue[k]].body) enqueue_refs(g->rules[queue[k]].body, queue, &nq, seen);
    }
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (!seen[i]) print_rule(&b, g, i);
    free(queue);
    free(seen);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
