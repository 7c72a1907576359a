/* fsm.c - IR rules -> one byte-level DFA per rule (struct gm, internal.h).
 *
 * 1. Thompson NFA per rule: literals as byte chains, code-point classes as UTF-8 byte-range
 *    sequences (surrogates excluded), rule references as symbol edges, x{m,n} unrolled.
 * 2. Byte classes: the partition of 0..255 by every range boundary (usually a few dozen).
 * 3. Subset construction per rule over byte classes + rule symbols, capped by opts.max_states
 *    and a work budget so pathological regexes fail fast with an error instead of blowing up.
 * 4. Trim: rules that derive no string and states that cannot reach acceptance are removed
 *    (so every Earley item can complete: a non-empty column means a viable prefix), and so is
 *    everything unreachable from root.
 * 5. Nullable rules, continuation points of each rule (the mask cache's "any context"), and
 *    walk-equivalence classes: Moore refinement for
 *    max_token_len + 2 rounds (or until stable). States in one class behave the same for every
 *    byte string a token can hold, so the mask cache computes each class once; this is what
 *    keeps x{0,5000} or "maxLength": 5000 from costing 5000 vocabulary walks. */
#include "grammar/internal.h"

enum { NE_EPS = 0, NE_BYTE = 1, NE_RULE = 2 };

struct nfa_edge {
    uint32_t next, target, rule;
    uint8_t kind, lo, hi;
};

struct nfa {
    uint32_t *head; /* first edge + 1 */
    uint32_t n_states, cap_states;
    struct nfa_edge *e;
    uint32_t n_edges, cap_edges;
    uint32_t limit;
    bool over, oom;
};

static uint32_t nfa_new_state(struct nfa *a) {
    if (a->over || a->oom) return 0;
    if (a->n_states >= a->limit) {
        a->over = true;
        return 0;
    }
    if (a->n_states == a->cap_states) {
        uint32_t cap = a->cap_states ? a->cap_states * 2 : 1024;
        uint32_t *h = realloc(a->head, cap * sizeof(*h));
        if (!h) {
            a->oom = true;
            return 0;
        }
        a->head = h;
        a->cap_states = cap;
    }
    a->head[a->n_states] = 0;
    return a->n_states++;
}

static void nfa_add(
    struct nfa *a, uint32_t from, int kind, uint32_t to, uint8_t lo, uint8_t hi, uint32_t rule) {
    if (a->over || a->oom) return;
    if (a->n_edges == a->cap_edges) {
        uint32_t cap = a->cap_edges ? a->cap_edges * 2 : 4096;
        struct nfa_edge *e = realloc(a->e, cap * sizeof(*e));
        if (!e) {
            a->oom = true;
            return;
        }
        a->e = e;
        a->cap_edges = cap;
    }
    struct nfa_edge *e = &a->e[a->n_edges];
    e->next = a->head[from];
    e->target = to;
    e->rule = rule;
    e->kind = (uint8_t)kind;
    e->lo = lo;
    e->hi = hi;
    a->head[from] = ++a->n_edges;
}

/* UTF-8 byte-range sequences of code points lo..hi, all of one encoded length. */
static void utf8_split(struct nfa *a, uint32_t s, uint32_t f, uint32_t lo, uint32_t hi) {
    int n = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(a, s, f, lo, lo | m);
                utf8_split(a, s, f, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(a, s, f, lo, (hi & ~m) - 1);
                utf8_split(a, s, f, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t x[4], y[4];
    gx_utf8_enc(lo, x);
    gx_utf8_enc(hi, y);
    uint32_t cur = s;
    for (int j = 0; j < n; j++) {
        uint32_t t = j == n - 1 ? f : nfa_new_state(a);
        nfa_add(a, cur, NE_BYTE, t, x[j], y[j], 0);
        cur = t;
    }
}

static void build_class(struct nfa *a, const struct gx *x, uint32_t s, uint32_t f) {
    static const uint32_t piece[5][2] = {
        {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (uint32_t i = 0; i < x->n; i++) {
        uint32_t lo = x->u.ranges[2 * i], hi = x->u.ranges[2 * i + 1];
        for (int k = 0; k < 5; k++) {
            uint32_t l = lo > piece[k][0] ? lo : piece[k][0];
            uint32_t h = hi < piece[k][1] ? hi : piece[k][1];
            if (l <= h) utf8_split(a, s, f, l, h);
        }
    }
}

/* Build x between existing states s and f: adds edges out of s and into f only (never into
 * s or out of f), plus fresh states, so fragments compose without stray paths. */
static void build(struct nfa *a, const struct gx *x, uint32_t s, uint32_t f, int depth) {
    if (a->over || a->oom) return;
    if (depth > 10000) {
        a->over = true;
        return;
    }
    switch (x->kind) {
    case GX_EMPTY:
        nfa_add(a, s, NE_EPS, f, 0, 0, 0);
        break;
    case GX_BYTES: {
        uint32_t cur = s;
        for (uint32_t i = 0; i < x->n; i++) {
            uint32_t t = i + 1 == x->n ? f : nfa_new_state(a);
            nfa_add(a, cur, NE_BYTE, t, x->u.bytes[i], x->u.bytes[i], 0);
            cur = t;
        }
        break;
    }
    case GX_CLASS:
        build_class(a, x, s, f);
        break;
    case GX_SEQ: {
        uint32_t cur = s;
        for (uint32_t i = 0; i < x->n; i++) {
            uint32_t t = i + 1 == x->n ? f : nfa_new_state(a);
            build(a, x->u.kids[i], cur, t, depth + 1);
            cur = t;
        }
        break;
    }
    case GX_ALT:
        for (uint32_t i = 0; i < x->n; i++)
            build(a, x->u.kids[i], s, f, depth + 1);
        break;
    case GX_REP: {
        uint32_t cur = s;
        for (uint32_t i = 0; i < x->min && !a->over && !a->oom; i++) {
            uint32_t t = nfa_new_state(a);
            build(a, x->u.kid, cur, t, depth + 1);
            cur = t;
        }
        if (x->max == GX_INF) {
            uint32_t m = nfa_new_state(a);
            nfa_add(a, cur, NE_EPS, m, 0, 0, 0);
            build(a, x->u.kid, m, m, depth + 1);
            nfa_add(a, m, NE_EPS, f, 0, 0, 0);
        } else {
            for (uint32_t i = x->min; i < x->max && !a->over && !a->oom; i++) {
                nfa_add(a, cur, NE_EPS, f, 0, 0, 0);
                uint32_t t = nfa_new_state(a);
                build(a, x->u.kid, cur, t, depth + 1);
                cur = t;
            }
            nfa_add(a, cur, NE_EPS, f, 0, 0, 0);
        }
        break;
    }
    case GX_REF:
        nfa_add(a, s, NE_RULE, f, 0, 0, x->n);
        break;
    default:
        break;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Subset construction. */

struct u32vec {
    uint32_t *v;
    uint32_t n, cap;
};

static bool vpush(struct u32vec *v, uint32_t x) {
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 64;
        uint32_t *p = realloc(v->v, (size_t)cap * sizeof(*p));
        if (!p) return false;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

/* Growing global automaton before trimming. */
struct raw {
    uint32_t nbc;
    struct u32vec trans; /* n_states * nbc */
    struct u32vec acc, rule_of;
    struct u32vec re; /* triples (state, rule, target) */
    uint32_t n_states;
};

struct subset {
    const struct nfa *a;
    uint32_t *stamp, gen;
    struct u32vec stack;
    struct u32vec pool; /* sets, concatenated */
    struct u32vec off;  /* per DFA state (local): offset into pool; off[n] = end */
    uint32_t *ht;       /* local DFA id + 1 */
    uint32_t hcap;
    uint64_t work, work_limit;
};

static uint64_t hash_set(const uint32_t *s, uint32_t n) {
    uint64_t h = 1469598103934665603ull ^ n;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x9E3779B97F4A7C15ull, h ^= h >> 32;
    h ^= h >> 33; /* murmur3 finaliser: every input bit reaches the low bits used as index */
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 33);
}

static int cmp_pair2(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Epsilon closure of seeds (in ss->stack) appended to ss->pool as a sorted set. */
static bool closure(struct subset *ss, uint32_t *seeds, uint32_t n_seeds) {
    const struct nfa *a = ss->a;
    if (++ss->gen == 0) {
        memset(ss->stamp, 0, (size_t)a->n_states * sizeof(uint32_t));
        ss->gen = 1;
    }
    uint32_t start = ss->pool.n;
    ss->stack.n = 0;
    for (uint32_t i = 0; i < n_seeds; i++) {
        if (ss->stamp[seeds[i]] == ss->gen) continue;
        ss->stamp[seeds[i]] = ss->gen;
        if (!vpush(&ss->stack, seeds[i])) return false;
    }
    while (ss->stack.n) {
        uint32_t q = ss->stack.v[--ss->stack.n];
        if (!vpush(&ss->pool, q)) return false;
        for (uint32_t e = a->head[q]; e; e = a->e[e - 1].next) {
            const struct nfa_edge *ed = &a->e[e - 1];
            ss->work++;
            if (ed->kind != NE_EPS || ss->stamp[ed->target] == ss->gen) continue;
            ss->stamp[ed->target] = ss->gen;
            if (!vpush(&ss->stack, ed->target)) return false;
        }
    }
    qsort(ss->pool.v + start, ss->pool.n - start, sizeof(uint32_t), cmp_u32);
    return true;
}

/* Find or add the set just appended at pool[start..]. Returns local id, or UINT32_MAX on OOM. */
static uint32_t intern(struct subset *ss, uint32_t start, bool *added) {
    uint32_t n = ss->pool.n - start;
    const uint32_t *s = ss->pool.v + start;
    uint32_t n_dfa = ss->off.n;
    if ((n_dfa + 1) * 2 > ss->hcap) {
        uint32_t cap = ss->hcap ? ss->hcap * 2 : 1024;
        uint32_t *ht = calloc(cap, sizeof(*ht));
        if (!ht) return UINT32_MAX;
        for (uint32_t i = 0; i < ss->hcap; i++) {
            if (!ss->ht[i]) continue;
            uint32_t d = ss->ht[i] - 1;
            uint32_t e = d + 1 < n_dfa ? ss->off.v[d + 1] : start;
            uint64_t h = hash_set(ss->pool.v + ss->off.v[d], e - ss->off.v[d]);
            uint32_t j = (uint32_t)h & (cap - 1);
            while (ht[j])
                j = (j + 1) & (cap - 1);
            ht[j] = d + 1;
        }
        free(ss->ht);
        ss->ht = ht;
        ss->hcap = cap;
    }
    uint32_t j = (uint32_t)hash_set(s, n) & (ss->hcap - 1);
    while (ss->ht[j]) {
        uint32_t d = ss->ht[j] - 1;
        uint32_t e = d + 1 < n_dfa ? ss->off.v[d + 1] : start;
        if (e - ss->off.v[d] == n && !memcmp(ss->pool.v + ss->off.v[d], s, n * sizeof(uint32_t))) {
            ss->pool.n = start; /* drop the duplicate */
            *added = false;
            return d;
        }
        j = (j + 1) & (ss->hcap - 1);
    }
    ss->ht[j] = n_dfa + 1;
    if (!vpush(&ss->off, start)) return UINT32_MAX;
    *added = true;
    return n_dfa;
}

struct fsm_ctx {
    const struct dsi_grammar *g;
    struct nfa a;
    uint32_t *nstart, *nfinal; /* per IR rule */
    uint8_t cls_of[256];
    uint32_t nbc;
    uint32_t max_states;
    struct raw r;
    uint32_t *rule_start; /* per IR rule: global raw state id of its DFA start */
    struct dsi_err *err;
};

static int too_complex(struct fsm_ctx *c, uint32_t rule, const char *what) {
    return dsi_errf(c->err, DSI_ERR_UNSUPPORTED,
                    "grammar too complex: rule '%s' needs %s (pathological regex or repetition?)",
                    c->g->rules[rule].name, what);
}

static int dfa_rule(struct fsm_ctx *c, struct subset *ss, uint32_t rule) {
    const struct nfa *a = &c->a;
    uint32_t nbc = c->nbc;
    int rc = DSI_ERR_NOMEM;
    ss->pool.n = 0;
    ss->off.n = 0;
    if (ss->hcap) memset(ss->ht, 0, ss->hcap * sizeof(uint32_t));
    struct u32vec *bucket = calloc(nbc, sizeof(*bucket));
    struct u32vec rsyms = {0}; /* pairs (rule, target) */
    struct u32vec tg = {0};
    if (!bucket) return dsi_errf(c->err, DSI_ERR_NOMEM, "grammar: out of memory");
    uint32_t base = c->r.n_states;
    bool added;
    uint32_t seed = c->nstart[rule];
    uint32_t st0 = ss->pool.n;
    if (!closure(ss, &seed, 1) || intern(ss, st0, &added) == UINT32_MAX) goto out;
    for (uint32_t d = 0; d < ss->off.n; d++) {
        if (base + d >= c->max_states) {
            char what[64];
            snprintf(what, sizeof(what), "more than %u automaton states", c->max_states);
            rc = too_complex(c, rule, what);
            goto out;
        }
        if (ss->work > ss->work_limit) {
            rc = too_complex(c, rule, "too much work to determinise");
            goto out;
        }
        /* The set of d (it may move as the pool grows: index, not pointer). */
        uint32_t so = ss->off.v[d];
        uint32_t se = d + 1 < ss->off.n ? ss->off.v[d + 1] : ss->pool.n;
        bool acc = false;
        rsyms.n = 0;
        for (uint32_t k = so; k < se; k++) {
            uint32_t q = ss->pool.v[k];
            if (q == c->nfinal[rule]) acc = true;
            for (uint32_t e = a->head[q]; e; e = a->e[e - 1].next) {
                const struct nfa_edge *ed = &a->e[e - 1];
                ss->work++;
                if (ed->kind == NE_BYTE) {
                    for (uint32_t cl = c->cls_of[ed->lo]; cl <= c->cls_of[ed->hi]; cl++)
                        if (!vpush(&bucket[cl], ed->target)) goto out;
                } else if (ed->kind == NE_RULE) {
                    if (!vpush(&rsyms, ed->rule) || !vpush(&rsyms, ed->target)) goto out;
                }
            }
        }
        /* Row of the global table. */
        uint32_t gid = base + d;
        while (c->r.trans.n < (gid + 1) * nbc)
            if (!vpush(&c->r.trans, 0)) goto out;
        if (!vpush(&c->r.acc, acc) || !vpush(&c->r.rule_of, rule)) goto out;
        for (uint32_t cl = 0; cl < nbc; cl++) {
            if (!bucket[cl].n) continue;
            uint32_t start = ss->pool.n;
            if (!closure(ss, bucket[cl].v, bucket[cl].n)) goto out;
            bucket[cl].n = 0;
            uint32_t t = intern(ss, start, &added);
            if (t == UINT32_MAX) goto out;
            c->r.trans.v[(size_t)gid * nbc + cl] = base + t + 1;
        }
        /* Rule symbols: group targets by rule (pairs sorted by rule). */
        if (rsyms.n > 2) qsort(rsyms.v, rsyms.n / 2, 2 * sizeof(uint32_t), cmp_pair2);
        for (uint32_t i = 0; i < rsyms.n;) {
            uint32_t q = rsyms.v[i];
            tg.n = 0;
            for (; i < rsyms.n && rsyms.v[i] == q; i += 2)
                if (!vpush(&tg, rsyms.v[i + 1])) goto out;
            uint32_t start = ss->pool.n;
            if (!closure(ss, tg.v, tg.n)) goto out;
            uint32_t t = intern(ss, start, &added);
            if (t == UINT32_MAX) goto out;
            if (!vpush(&c->r.re, gid) || !vpush(&c->r.re, q) || !vpush(&c->r.re, base + t))
                goto out;
        }
    }
    c->r.n_states = base + ss->off.n;
    c->rule_start[rule] = base;
    rc = 0;
out:
    for (uint32_t cl = 0; cl < nbc; cl++)
        free(bucket[cl].v);
    free(bucket);
    free(rsyms.v);
    free(tg.v);
    if (rc == DSI_ERR_NOMEM) dsi_errf(c->err, rc, "grammar: out of memory");
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Trim, renumber, analyse. */

static int cmp_re(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    if (a[1] != b[1]) return a[1] < b[1] ? -1 : 1;
    return a[2] < b[2] ? -1 : a[2] > b[2];
}

/* live[s]: s can reach acceptance; prod[rule]: the rule derives some string. Worklist over
 * reverse edges; rule edges wait until their rule becomes productive. */
static int liveness(struct fsm_ctx *c, uint8_t *live, uint8_t *prod, uint32_t n_ir_rules) {
    struct raw *r = &c->r;
    uint32_t n = r->n_states, nbc = c->nbc;
    int rc = DSI_ERR_NOMEM;
    /* reverse adjacency for byte edges and rule edges: counts then fill */
    uint32_t *rb_off = calloc((size_t)n + 1, sizeof(uint32_t));
    uint32_t *rr_off = calloc((size_t)n + 1, sizeof(uint32_t));
    uint32_t *byr_off = calloc((size_t)n_ir_rules + 2, sizeof(uint32_t));
    uint32_t *rb = NULL, *rr = NULL, *stack = NULL, *fill = NULL, *byr = NULL;
    if (!rb_off || !rr_off || !byr_off) goto out;
    for (uint32_t i = 0; i < r->re.n; i += 3)
        byr_off[r->re.v[i + 1] + 1]++;
    for (uint32_t q = 0; q < n_ir_rules; q++)
        byr_off[q + 1] += byr_off[q];
    byr = malloc(((size_t)r->re.n / 3 + 1) * sizeof(uint32_t));
    if (!byr) goto out;
    {
        uint32_t *f2 = calloc((size_t)n_ir_rules + 1, sizeof(uint32_t));
        if (!f2) goto out;
        for (uint32_t i = 0; i < r->re.n; i += 3) {
            uint32_t q = r->re.v[i + 1];
            byr[byr_off[q] + f2[q]++] = i;
        }
        free(f2);
    }
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t cl = 0; cl < nbc; cl++) {
            uint32_t t = r->trans.v[(size_t)s * nbc + cl];
            if (t) rb_off[t - 1 + 1]++;
        }
    for (uint32_t i = 0; i < r->re.n; i += 3)
        rr_off[r->re.v[i + 2] + 1]++;
    for (uint32_t s = 0; s < n; s++)
        rb_off[s + 1] += rb_off[s], rr_off[s + 1] += rr_off[s];
    rb = malloc(((size_t)rb_off[n] + 1) * sizeof(uint32_t));
    rr = malloc(((size_t)rr_off[n] + 1) * sizeof(uint32_t));
    fill = calloc((size_t)n + 1, sizeof(uint32_t));
    stack = malloc(((size_t)n + 1) * sizeof(uint32_t));
    if (!rb || !rr || !fill || !stack) goto out;
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t cl = 0; cl < nbc; cl++) {
            uint32_t t = r->trans.v[(size_t)s * nbc + cl];
            if (t) rb[rb_off[t - 1] + fill[t - 1]++] = s;
        }
    memset(fill, 0, ((size_t)n + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < r->re.n; i += 3) {
        uint32_t t = r->re.v[i + 2];
        rr[rr_off[t] + fill[t]++] = i; /* index of the triple */
    }
    uint32_t sp = 0;
    for (uint32_t s = 0; s < n; s++)
        if (r->acc.v[s]) live[s] = 1, stack[sp++] = s;
    while (sp) {
        uint32_t s = stack[--sp];
        uint32_t rule = r->rule_of.v[s];
        if (c->rule_start[rule] == s && !prod[rule]) {
            prod[rule] = 1;
            /* rule edges on this rule whose target is live: their sources become live */
            for (uint32_t k = byr_off[rule]; k < byr_off[rule + 1]; k++) {
                uint32_t i = byr[k];
                if (!live[r->re.v[i + 2]]) continue;
                uint32_t src = r->re.v[i];
                if (!live[src]) live[src] = 1, stack[sp++] = src;
            }
        }
        for (uint32_t k = rb_off[s]; k < rb_off[s + 1]; k++)
            if (!live[rb[k]]) live[rb[k]] = 1, stack[sp++] = rb[k];
        for (uint32_t k = rr_off[s]; k < rr_off[s + 1]; k++) {
            uint32_t i = rr[k];
            uint32_t src = r->re.v[i];
            if (!live[src] && prod[r->re.v[i + 1]]) live[src] = 1, stack[sp++] = src;
        }
    }
    rc = 0;
out:
    free(byr_off);
    free(byr);
    free(rb_off);
    free(rr_off);
    free(rb);
    free(rr);
    free(fill);
    free(stack);
    if (rc) dsi_errf(c->err, rc, "grammar: out of memory");
    return rc;
}

/* Moore refinement: eqclass after `rounds` rounds or when stable, eqshort after short_rounds.
 * Transitions are compressed into runs of byte classes with the same target. */
static int equivalence(struct gm *m,
                       uint32_t rounds,
                       uint32_t short_rounds,
                       const uint8_t *rule_has_nullable_edge) {
    uint32_t n = m->n_states, nbc = m->n_bclass;
    uint32_t *cls = malloc((size_t)n * sizeof(uint32_t));
    uint32_t *ncls = malloc((size_t)n * sizeof(uint32_t));
    uint32_t *scls = malloc((size_t)n * sizeof(uint32_t));
    uint32_t *run_off = malloc(((size_t)n + 1) * sizeof(uint32_t));
    uint32_t *runs = NULL; /* pairs (first class, target) */
    uint32_t *sig = NULL, *siglen = malloc((size_t)n * sizeof(uint32_t));
    size_t *sig_off = malloc(((size_t)n + 1) * sizeof(size_t)); /* signatures, packed */
    uint32_t n_runs = 0;
    uint32_t hcap = 16;
    while (hcap < 2 * n)
        hcap *= 2;
    uint32_t *ht = malloc((size_t)hcap * sizeof(uint32_t));
    int rc = DSI_ERR_NOMEM;
    if (!cls || !ncls || !scls || !run_off || !siglen || !sig_off || !ht) goto out;
    for (int pass = 0; pass < 2; pass++) {
        n_runs = 0;
        for (uint32_t s = 0; s < n; s++) {
            run_off[s] = n_runs;
            uint32_t prev_t = 0;
            for (uint32_t c = 0; c < nbc; c++) {
                uint32_t t = m->trans[(size_t)s * nbc + c];
                if (t != prev_t) {
                    if (pass) runs[2 * n_runs] = c, runs[2 * n_runs + 1] = t;
                    n_runs++;
                }
                prev_t = t;
            }
        }
        run_off[n] = n_runs;
        if (!pass && !(runs = malloc(((size_t)n_runs + 1) * 2 * sizeof(uint32_t)))) goto out;
    }
    sig_off[0] = 0;
    for (uint32_t s = 0; s < n; s++)
        sig_off[s + 1] = sig_off[s] + 2 + 2 * (size_t)(run_off[s + 1] - run_off[s]) +
                         2 * (size_t)m->states[s].n_redge;
    sig = malloc((sig_off[n] + 1) * sizeof(uint32_t));
    if (!sig) goto out;
    /* round 0: (rule, accept) */
    uint32_t n_cls = 0, prev = 0, n_short = 0;
    bool stable = false, have_short = false;
    for (uint32_t round = 0; round <= rounds; round++) {
        memset(ht, 0, (size_t)hcap * sizeof(uint32_t));
        uint32_t nc = 0;
        for (uint32_t s = 0; s < n; s++) {
            uint32_t *v = sig + sig_off[s], k = 0;
            const struct gm_state *st = &m->states[s];
            v[k++] = st->rule;
            v[k++] = round == 0 ? st->accept : cls[s];
            if (round > 0) {
                for (uint32_t r = run_off[s]; r < run_off[s + 1]; r++) {
                    uint32_t t = runs[2 * r + 1];
                    v[k++] = runs[2 * r];
                    v[k++] = t ? cls[t - 1] : UINT32_MAX;
                }
                for (uint32_t e = 0; e < st->n_redge; e++) {
                    v[k++] = m->redges[st->redge_off + e].rule;
                    v[k++] = cls[m->redges[st->redge_off + e].target];
                }
            }
            siglen[s] = k;
            uint64_t h = hash_set(v, k);
            uint32_t j = (uint32_t)h & (hcap - 1);
            for (;;) {
                if (!ht[j]) {
                    ht[j] = s + 1;
                    ncls[s] = nc++;
                    break;
                }
                uint32_t o = ht[j] - 1;
                if (siglen[o] == k && !memcmp(sig + sig_off[o], v, k * sizeof(uint32_t))) {
                    ncls[s] = ncls[o];
                    break;
                }
                j = (j + 1) & (hcap - 1);
            }
        }
        memcpy(cls, ncls, (size_t)n * sizeof(uint32_t));
        n_cls = nc;
        if (round > 0 && nc == prev) {
            stable = true;
            break;
        }
        prev = nc;
        if (round == short_rounds) {
            memcpy(scls, cls, (size_t)n * sizeof(uint32_t));
            n_short = nc;
            have_short = true;
        }
    }
    /* have_short: scls is the partition after short_rounds, depth-bounded. Otherwise the final
     * one serves both. Depth-bounded classes are valid only where no nullable rule edge exists:
     * states of other rules get singleton classes. */
    if (!have_short) {
        memcpy(scls, cls, (size_t)n * sizeof(uint32_t));
        n_short = n_cls;
    }
    bool short_bounded = have_short || !stable;
    for (uint32_t s = 0; s < n; s++) {
        if (!rule_has_nullable_edge[m->states[s].rule]) continue;
        if (!stable) cls[s] = n_cls++;
        if (short_bounded) scls[s] = n_short++;
    }
    m->eqclass = cls;
    m->eqshort = scls;
    cls = scls = NULL;
    m->n_eqclass = n_cls;
    m->n_eqshort = n_short;
    rc = 0;
out:
    free(cls);
    free(scls);
    free(ncls);
    free(run_off);
    free(runs);
    free(sig_off);
    free(sig);
    free(siglen);
    free(ht);
    return rc;
}

/* dist[s]: fewest bytes from s to acceptance (rule edges cost their rule's shortest string).
 * Relaxation sweeps; capped, so values are upper bounds on pathological automata (only tools
 * use them, to steer random walks to an end). */
static int distances(struct gm *m) {
    uint32_t n = m->n_states, nbc = m->n_bclass;
    m->dist = malloc(((size_t)n + 1) * sizeof(uint32_t));
    if (!m->dist) return DSI_ERR_NOMEM;
    const uint32_t inf = UINT32_MAX / 4;
    for (uint32_t s = 0; s < n; s++)
        m->dist[s] = m->states[s].accept ? 0 : inf;
    for (int it = 0; it < 2000; it++) {
        bool ch = false;
        for (uint32_t s = n; s-- > 0;) {
            const struct gm_state *st = &m->states[s];
            uint32_t best = m->dist[s];
            for (uint32_t cl = 0; cl < nbc && st->has_bytes; cl++) {
                uint32_t t = m->trans[(size_t)s * nbc + cl];
                if (t && m->dist[t - 1] + 1 < best) best = m->dist[t - 1] + 1;
            }
            for (uint32_t e = 0; e < st->n_redge; e++) {
                const struct gm_redge *re = &m->redges[st->redge_off + e];
                uint32_t d = m->dist[m->rules[re->rule].start] + m->dist[re->target];
                if (d < best) best = d;
            }
            if (best < m->dist[s]) m->dist[s] = best, ch = true;
        }
        if (!ch) break;
    }
    return 0;
}

static int cmp_u32b(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Replace each rule's continuation points by the transitive set: following the completion of
 * accepting ones (the parent rule may complete too), keeping only states with an outgoing edge
 * (states without one only relay the completion). Long chains of nullable rules (optional
 * object properties) then inject a handful of states instead of the whole chain. */
static int transitive_continuations(struct gm *m) {
    uint32_t nr = m->n_rules, n = m->n_states;
    uint32_t *off = calloc((size_t)nr + 2, sizeof(uint32_t));
    uint32_t *stamp = calloc((size_t)n + 1, sizeof(uint32_t));
    uint32_t *rstamp = calloc((size_t)nr + 1, sizeof(uint32_t));
    uint32_t *stack = malloc(((size_t)nr + 1) * sizeof(uint32_t));
    uint32_t *list = NULL, n_list = 0, cap = 0;
    int rc = DSI_ERR_NOMEM;
    if (!off || !stamp || !rstamp || !stack) goto out;
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t gen = r + 1, sp = 0;
        stack[sp++] = r;
        rstamp[r] = gen;
        while (sp) {
            uint32_t q = stack[--sp];
            for (uint32_t i = m->cont_off[q]; i < m->cont_off[q + 1]; i++) {
                uint32_t t = m->cont[i];
                const struct gm_state *st = &m->states[t];
                if ((st->has_bytes || st->n_redge) && stamp[t] != gen) {
                    stamp[t] = gen;
                    if (n_list == cap) {
                        cap = cap ? cap * 2 : 1024;
                        uint32_t *p = realloc(list, (size_t)cap * sizeof(uint32_t));
                        if (!p) goto out;
                        list = p;
                    }
                    list[n_list++] = t;
                }
                if (st->accept && rstamp[st->rule] != gen) {
                    rstamp[st->rule] = gen;
                    stack[sp++] = st->rule;
                }
            }
        }
        off[r + 1] = n_list;
    }
    free(m->cont);
    free(m->cont_off);
    m->cont = list ? list : malloc(sizeof(uint32_t));
    m->cont_off = off;
    list = NULL;
    off = NULL;
    rc = m->cont ? 0 : DSI_ERR_NOMEM;
out:
    free(off);
    free(stamp);
    free(rstamp);
    free(stack);
    free(list);
    return rc;
}

/* bytes[s]: the bytes with a transition from s. */
static int byte_sets(struct gm *m) {
    m->bytes = calloc((size_t)m->n_states + 1, sizeof(*m->bytes));
    if (!m->bytes) return DSI_ERR_NOMEM;
    for (uint32_t s = 0; s < m->n_states; s++) {
        if (!m->states[s].has_bytes) continue;
        for (int b = 0; b < 256; b++)
            if (gm_step(m, s, (uint8_t)b)) m->bytes[s][b >> 6] |= 1ull << (b & 63);
    }
    return 0;
}

/* cont: for each rule, the distinct targets of the edges on it (continuation points). */
static int continuations(struct gm *m) {
    uint32_t nr = m->n_rules;
    m->cont_off = calloc((size_t)nr + 2, sizeof(uint32_t));
    m->cont = malloc(((size_t)m->n_redges + 1) * sizeof(uint32_t));
    uint32_t *fill = calloc((size_t)nr + 1, sizeof(uint32_t));
    if (!m->cont_off || !m->cont || !fill) {
        free(fill);
        return DSI_ERR_NOMEM;
    }
    for (uint32_t e = 0; e < m->n_redges; e++)
        m->cont_off[m->redges[e].rule + 1]++;
    for (uint32_t r = 0; r < nr; r++)
        m->cont_off[r + 1] += m->cont_off[r];
    for (uint32_t e = 0; e < m->n_redges; e++) {
        uint32_t r = m->redges[e].rule;
        m->cont[m->cont_off[r] + fill[r]++] = m->redges[e].target;
    }
    /* dedup in place per rule, then compact */
    uint32_t w = 0;
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t b = m->cont_off[r], e = m->cont_off[r + 1];
        qsort(m->cont + b, e - b, sizeof(uint32_t), cmp_u32b);
        m->cont_off[r] = w;
        for (uint32_t i = b; i < e; i++)
            if (i == b || m->cont[i] != m->cont[i - 1]) m->cont[w++] = m->cont[i];
    }
    m->cont_off[nr] = w;
    free(fill);
    return transitive_continuations(m);
}

/* Nullable rules (derive the empty string), then the walk-equivalence classes, distances and
 * continuation points. nend[s]: s reaches acceptance through nullable rule edges only. */
static int analyse(struct gm *m, uint32_t eq_rounds) {
    uint32_t n = m->n_states, nr = m->n_rules;
    uint8_t *nend = calloc((size_t)n + 1, 1);
    uint8_t *hasnull = calloc((size_t)nr + 1, 1);
    int rc = DSI_ERR_NOMEM;
    if (!nend || !hasnull) goto out;
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t s = n; s-- > 0;) {
            const struct gm_state *st = &m->states[s];
            bool v = st->accept;
            for (uint32_t e = 0; e < st->n_redge && !v; e++) {
                const struct gm_redge *re = &m->redges[st->redge_off + e];
                if (m->rules[re->rule].nullable && nend[re->target]) v = true;
            }
            if (v && !nend[s]) nend[s] = 1, ch = true;
        }
        for (uint32_t q = 0; q < nr; q++)
            if (!m->rules[q].nullable && nend[m->rules[q].start])
                m->rules[q].nullable = true, ch = true;
    }
    for (uint32_t s = 0; s < n; s++) {
        const struct gm_state *st = &m->states[s];
        for (uint32_t e = 0; e < st->n_redge; e++)
            if (m->rules[m->redges[st->redge_off + e].rule].nullable) hasnull[st->rule] = 1;
    }
    rc = equivalence(m, eq_rounds, VT_SHORT + 2 < eq_rounds ? VT_SHORT + 2 : eq_rounds, hasnull);
    if (!rc) rc = distances(m);
    if (!rc) rc = continuations(m);
    if (!rc) rc = byte_sets(m);
out:
    free(nend);
    free(hasnull);
    return rc;
}

void gm_free(struct gm *m) {
    if (!m) return;
    if (m->rules)
        for (uint32_t i = 0; i < m->n_rules; i++)
            free(m->rules[i].name);
    free(m->rules);
    free(m->states);
    free(m->redges);
    free(m->trans);
    free(m->eqclass);
    free(m->eqshort);
    free(m->dist);
    free(m->bytes);
    free(m->cont_off);
    free(m->cont);
    memset(m, 0, sizeof(*m));
}

/* Keep live states reachable from root (through byte edges, rule edges and predictions),
 * renumber them rule by rule, and fill m. */
static int assemble(struct fsm_ctx *c, struct gm *m, const uint8_t *live, const uint8_t *prod) {
    struct raw *r = &c->r;
    const struct dsi_grammar *g = c->g;
    uint32_t n = r->n_states, nbc = c->nbc, nir = g->n_rules;
    uint32_t *newid = malloc(((size_t)n + 1) * sizeof(uint32_t));
    uint32_t *newrule = malloc(((size_t)nir + 1) * sizeof(uint32_t));
    uint8_t *reach = calloc((size_t)n + 1, 1);
    uint32_t *stack = malloc(((size_t)n + 1) * sizeof(uint32_t));
    uint32_t *re_off = calloc((size_t)n + 1, sizeof(uint32_t));
    int rc = DSI_ERR_NOMEM;
    if (!newid || !newrule || !reach || !stack || !re_off) goto out;
    for (uint32_t i = 0; i + 3 <= r->re.n; i += 3)
        re_off[r->re.v[i] + 1]++;
    for (uint32_t s = 0; s < n; s++)
        re_off[s + 1] += re_off[s];
    uint32_t sp = 0;
    uint32_t rs = c->rule_start[g->root];
    reach[rs] = 1;
    stack[sp++] = rs;
    while (sp) {
        uint32_t s = stack[--sp];
        for (uint32_t cl = 0; cl < nbc; cl++) {
            uint32_t t = r->trans.v[(size_t)s * nbc + cl];
            if (t && live[t - 1] && !reach[t - 1]) reach[t - 1] = 1, stack[sp++] = t - 1;
        }
        for (uint32_t k = re_off[s]; k < re_off[s + 1]; k++) {
            const uint32_t *e = &r->re.v[3 * k];
            if (!prod[e[1]] || !live[e[2]]) continue;
            uint32_t st = c->rule_start[e[1]];
            if (!reach[st]) reach[st] = 1, stack[sp++] = st;
            if (!reach[e[2]]) reach[e[2]] = 1, stack[sp++] = e[2];
        }
    }
    /* rules in use, in IR order */
    memset(m, 0, sizeof(*m));
    uint32_t nr = 0;
    for (uint32_t q = 0; q < nir; q++)
        newrule[q] = prod[q] && reach[c->rule_start[q]] ? nr++ : UINT32_MAX;
    uint32_t ns = 0;
    for (uint32_t s = 0; s < n; s++)
        newid[s] = reach[s] ? ns++ : UINT32_MAX;
    m->rules = calloc(nr, sizeof(*m->rules));
    m->states = calloc(ns, sizeof(*m->states));
    m->trans = calloc((size_t)ns * nbc, sizeof(uint32_t));
    m->redges = malloc(((size_t)r->re.n / 3 + 1) * sizeof(*m->redges));
    if (!m->rules || !m->states || !m->trans || !m->redges) goto out;
    m->n_rules = nr;
    m->n_states = ns;
    m->n_bclass = nbc;
    memcpy(m->bclass, c->cls_of, 256);
    m->root = newrule[g->root];
    for (uint32_t q = 0; q < nir; q++) {
        if (newrule[q] == UINT32_MAX) continue;
        struct gm_rule *mr = &m->rules[newrule[q]];
        mr->name = strdup(g->rules[q].name);
        if (!mr->name) goto out;
        mr->start = newid[c->rule_start[q]];
        mr->first_state = UINT32_MAX;
    }
    for (uint32_t s = 0; s < n; s++) {
        if (!reach[s]) continue;
        uint32_t id = newid[s];
        struct gm_state *st = &m->states[id];
        uint32_t q = newrule[r->rule_of.v[s]];
        st->rule = q;
        st->accept = (uint8_t)r->acc.v[s];
        st->mask_set = st->mask_short = UINT32_MAX;
        if (m->rules[q].first_state == UINT32_MAX) m->rules[q].first_state = id;
        m->rules[q].n_states++;
        for (uint32_t cl = 0; cl < nbc; cl++) {
            uint32_t t = r->trans.v[(size_t)s * nbc + cl];
            if (t && reach[t - 1]) {
                m->trans[(size_t)id * nbc + cl] = newid[t - 1] + 1;
                st->has_bytes = 1;
            }
        }
        st->redge_off = m->n_redges;
        for (uint32_t k = re_off[s]; k < re_off[s + 1]; k++) {
            const uint32_t *e = &r->re.v[3 * k];
            if (!prod[e[1]] || !reach[e[2]]) continue;
            m->redges[m->n_redges].rule = newrule[e[1]];
            m->redges[m->n_redges].target = newid[e[2]];
            m->n_redges++;
            st->n_redge++;
        }
    }
    rc = 0;
out:
    free(newid);
    free(newrule);
    free(reach);
    free(stack);
    free(re_off);
    if (rc) dsi_errf(c->err, rc, "grammar: out of memory");
    return rc;
}

int gm_build(struct gm *m,
             const struct dsi_grammar *g,
             const struct dsi_grammar_opts *opts,
             uint32_t max_token_len,
             struct dsi_err *err) {
    struct fsm_ctx c = {.g = g, .err = err};
    struct subset ss = {0};
    uint8_t *live = NULL, *prod = NULL;
    int rc = DSI_ERR_NOMEM;
    memset(m, 0, sizeof(*m));
    c.max_states = opts && opts->max_states > 0 ? (uint32_t)opts->max_states : 200000;
    c.a.limit = c.max_states * 8u;
    c.nstart = malloc(((size_t)g->n_rules + 1) * sizeof(uint32_t));
    c.nfinal = malloc(((size_t)g->n_rules + 1) * sizeof(uint32_t));
    c.rule_start = malloc(((size_t)g->n_rules + 1) * sizeof(uint32_t));
    if (!c.nstart || !c.nfinal || !c.rule_start) goto out;
    /* 1. NFA */
    for (uint32_t q = 0; q < g->n_rules; q++) {
        c.nstart[q] = nfa_new_state(&c.a);
        c.nfinal[q] = nfa_new_state(&c.a);
        if (g->rules[q].body) build(&c.a, g->rules[q].body, c.nstart[q], c.nfinal[q], 0);
        if (c.a.over) {
            char what[64];
            snprintf(what, sizeof(what), "more than %u NFA states", c.a.limit);
            rc = too_complex(&c, q, what);
            goto out;
        }
        if (c.a.oom) goto out;
    }
    /* 2. byte classes */
    uint8_t mark[257] = {0};
    mark[0] = 1;
    for (uint32_t i = 0; i < c.a.n_edges; i++)
        if (c.a.e[i].kind == NE_BYTE) mark[c.a.e[i].lo] = 1, mark[c.a.e[i].hi + 1] = 1;
    uint32_t cl = 0;
    for (int b = 0; b < 256; b++) {
        if (mark[b] && b) cl++;
        c.cls_of[b] = (uint8_t)cl;
    }
    c.nbc = cl + 1;
    c.r.nbc = c.nbc;
    /* 3. subset construction */
    ss.a = &c.a;
    ss.stamp = calloc((size_t)c.a.n_states + 1, sizeof(uint32_t));
    if (!ss.stamp) goto out;
    ss.work_limit = (uint64_t)c.max_states * 2000u;
    for (uint32_t q = 0; q < g->n_rules; q++)
        if ((rc = dfa_rule(&c, &ss, q))) goto out;
    rc = DSI_ERR_NOMEM;
    if (c.r.re.n) qsort(c.r.re.v, c.r.re.n / 3, 3 * sizeof(uint32_t), cmp_re);
    /* 4. trim */
    live = calloc((size_t)c.r.n_states + 1, 1);
    prod = calloc((size_t)g->n_rules + 1, 1);
    if (!live || !prod) goto out;
    if ((rc = liveness(&c, live, prod, g->n_rules))) goto out;
    if (!prod[g->root]) {
        rc = dsi_errf(err, DSI_ERR_INVALID,
                      "grammar: rule '%s' matches no string (every "
                      "alternative needs a rule that never terminates)",
                      g->rules[g->root].name);
        goto out;
    }
    if ((rc = assemble(&c, m, live, prod))) goto out;
    /* 5. analysis */
    if ((rc = analyse(m, max_token_len + 2))) {
        dsi_errf(err, rc, "grammar: out of memory");
        goto out;
    }
    rc = 0;
out:
    if (rc == DSI_ERR_NOMEM) dsi_errf(err, rc, "grammar: out of memory");
    if (rc) gm_free(m);
    free(c.nstart);
    free(c.nfinal);
    free(c.rule_start);
    free(c.a.head);
    free(c.a.e);
    free(c.r.trans.v);
    free(c.r.acc.v);
    free(c.r.rule_of.v);
    free(c.r.re.v);
    free(ss.stamp);
    free(ss.stack.v);
    free(ss.pool.v);
    free(ss.off.v);
    free(ss.ht);
    free(live);
    free(prod);
    return rc;
}
