/* grammar.c - the module's entry points: parse (dispatch to the front ends), compile (automata +
 * mask cache) and the per-request matcher. See grammar.h. */
#include "grammar/internal.h"

int dsi_grammar_parse(struct dsi_grammar **out,
                      enum dsi_grammar_kind kind,
                      const char *src,
                      size_t len,
                      const struct dsi_grammar_opts *opts,
                      struct dsi_err *err) {
    *out = NULL;
    struct dsi_grammar *g = gx_new(opts);
    if (!g) return dsi_errf(err, DSI_ERR_NOMEM, "grammar: out of memory");
    int rc;
    switch (kind) {
    case DSI_GRAMMAR_EBNF:
        rc = gx_parse_ebnf(g, src, len, err);
        break;
    case DSI_GRAMMAR_REGEX: {
        struct gx *x = NULL;
        rc = gx_parse_regex(g, src, len, false, &x, err);
        if (!rc) {
            uint32_t r = gx_rule_new(g, "root");
            if (r == UINT32_MAX)
                rc = DSI_ERR_NOMEM;
            else
                g->rules[r].body = x, g->root = r;
        }
        break;
    }
    case DSI_GRAMMAR_JSON_SCHEMA:
        rc = gx_parse_schema(g, src, len, err);
        break;
    case DSI_GRAMMAR_JSON_OBJECT:
    case DSI_GRAMMAR_JSON_VALUE: {
        uint32_t r = gx_rule_new(g, "root");
        uint32_t body = r == UINT32_MAX                   ? r
                        : kind == DSI_GRAMMAR_JSON_OBJECT ? gx_json_object_rule(g)
                                                          : gx_json_value_rule(g);
        if (r == UINT32_MAX || body == UINT32_MAX)
            rc = DSI_ERR_NOMEM;
        else {
            g->rules[r].body = gx_ref(g, body);
            g->root = r;
            rc = 0;
        }
        break;
    }
    default:
        rc = dsi_errf(err, DSI_ERR_INVALID, "grammar: unknown kind %d", (int)kind);
    }
    if (!rc && g->oom) rc = DSI_ERR_NOMEM;
    if (rc == DSI_ERR_NOMEM) dsi_errf(err, rc, "grammar: out of memory");
    if (rc) {
        dsi_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int dsi_grammar_compile(struct dsi_grammar_compiled **out,
                        const struct dsi_grammar *g,
                        const struct dsi_grammar_vocab *vocab,
                        const struct dsi_grammar_opts *opts,
                        struct dsi_err *err) {
    *out = NULL;
    double t0 = dsi_time_s();
    struct dsi_grammar_compiled *cg = calloc(1, sizeof(*cg));
    if (!cg) return dsi_errf(err, DSI_ERR_NOMEM, "grammar: out of memory");
    cg->vocab = vocab;
    int rc = gm_build(&cg->m, g, opts ? opts : &g->opts, vocab->max_len, err);
    if (!rc) rc = ms_build(cg, err);
    if (rc) {
        dsi_grammar_compiled_free(cg);
        return rc;
    }
    cg->stats.n_rules = (int)cg->m.n_rules;
    cg->stats.n_states = (int)cg->m.n_states;
    cg->stats.compile_s = dsi_time_s() - t0;
    *out = cg;
    return 0;
}

void dsi_grammar_compiled_free(struct dsi_grammar_compiled *cg) {
    if (!cg) return;
    ms_free(cg);
    gm_free(&cg->m);
    free(cg);
}

void dsi_grammar_compiled_stats(const struct dsi_grammar_compiled *cg,
                                struct dsi_grammar_stats *s) {
    *s = cg->stats;
}

/* ---------------------------------------------------------------------------------------- */
/* Matcher. */

struct dsi_grammar_matcher {
    const struct dsi_grammar_compiled *cg;
    struct ey_chart chart;
    uint32_t *hist; /* hist[i]: number of columns before token i */
    uint32_t n_tok, cap_tok;
    bool terminated; /* the last token of hist is EOS */
    struct ms_scratch s;
};

void dsi_grammar_matcher_free(struct dsi_grammar_matcher *m) {
    if (!m) return;
    ey_free(&m->chart);
    free(m->hist);
    free(m->s.tmp);
    free(m->s.merge);
    free(m->s.act);
    free(m->s.path);
    free(m->s.memo_items);
    free(m->s.memo_ids);
    free(m);
}

void dsi_grammar_matcher_reset(struct dsi_grammar_matcher *m) {
    ey_pop_to(&m->chart, 1);
    m->s.memo_valid = false;
    m->n_tok = 0;
    m->terminated = false;
}

int dsi_grammar_matcher_new(struct dsi_grammar_matcher **out,
                            const struct dsi_grammar_compiled *cg,
                            struct dsi_err *err) {
    *out = NULL;
    struct dsi_grammar_matcher *m = calloc(1, sizeof(*m));
    if (!m) return dsi_errf(err, DSI_ERR_NOMEM, "grammar matcher: out of memory");
    m->cg = cg;
    ey_init(&m->chart);
    m->s.tmp = malloc(dsi_grammar_mask_words(cg->vocab->n_vocab) * sizeof(uint32_t));
    m->s.path = malloc((size_t)cg->vocab->max_len + 1);
    if (!m->s.tmp || !m->s.path || ey_start(&cg->m, &m->chart, cg->m.rules[cg->m.root].start, 0)) {
        dsi_grammar_matcher_free(m);
        return dsi_errf(err, DSI_ERR_NOMEM, "grammar matcher: out of memory");
    }
    *out = m;
    return 0;
}

int dsi_grammar_matcher_fill_mask(struct dsi_grammar_matcher *m, uint32_t *mask) {
    if (m->terminated) {
        memset(mask, 0, dsi_grammar_mask_words(m->cg->vocab->n_vocab) * sizeof(uint32_t));
        return 0;
    }
    return ms_fill(m->cg, &m->chart, &m->s, mask);
}

static int push_hist(struct dsi_grammar_matcher *m, uint32_t n_cols) {
    if (m->n_tok == m->cap_tok) {
        uint32_t cap = m->cap_tok ? m->cap_tok * 2 : 256;
        uint32_t *h = realloc(m->hist, (size_t)cap * sizeof(*h));
        if (!h) return DSI_ERR_NOMEM;
        m->hist = h;
        m->cap_tok = cap;
    }
    m->hist[m->n_tok++] = n_cols;
    return 0;
}

static int advance(
    struct dsi_grammar_matcher *m, const uint8_t *b, size_t len, struct dsi_err *err, int32_t id) {
    const struct gm *g = &m->cg->m;
    uint32_t before = m->chart.n_cols;
    if (m->terminated)
        return dsi_errf(err, DSI_ERR_INVALID, "grammar: output already terminated by EOS");
    for (size_t i = 0; i < len; i++) {
        int rc = ey_scan(g, &m->chart, b[i]);
        if (rc == 1) continue;
        ey_pop_to(&m->chart, before);
        if (rc < 0) return dsi_errf(err, rc, "grammar matcher: out of memory");
        if (id >= 0)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "grammar: token %d not allowed here (byte %zu of %zu)", id, i, len);
        return dsi_errf(err, DSI_ERR_INVALID, "grammar: byte %zu (0x%02x) not allowed here", i,
                        b[i]);
    }
    if (push_hist(m, before)) {
        ey_pop_to(&m->chart, before);
        return dsi_errf(err, DSI_ERR_NOMEM, "grammar matcher: out of memory");
    }
    return 0;
}

int dsi_grammar_matcher_accept_token(struct dsi_grammar_matcher *m,
                                     int32_t id,
                                     struct dsi_err *err) {
    const struct dsi_grammar_vocab *v = m->cg->vocab;
    if (id < 0 || id >= v->n_vocab)
        return dsi_errf(err, DSI_ERR_INVALID, "grammar: token %d out of range [0, %d)", id,
                        v->n_vocab);
    if (m->terminated)
        return dsi_errf(err, DSI_ERR_INVALID, "grammar: output already terminated by EOS");
    if (id == v->eos) {
        if (!ey_root_done(&m->cg->m, &m->chart))
            return dsi_errf(err, DSI_ERR_INVALID,
                            "grammar: EOS not allowed: the output is incomplete");
        if (push_hist(m, m->chart.n_cols))
            return dsi_errf(err, DSI_ERR_NOMEM, "grammar matcher: out of memory");
        m->terminated = true;
        return 0;
    }
    if (v->id_rank[id] < 0)
        return dsi_errf(err, DSI_ERR_INVALID,
                        "grammar: token %d is special or empty: never allowed", id);
    return advance(m, (const uint8_t *)v->bytes + v->off[id], (size_t)(v->off[id + 1] - v->off[id]),
                   err, id);
}

int dsi_grammar_matcher_accept_bytes(struct dsi_grammar_matcher *m,
                                     const char *bytes,
                                     size_t len,
                                     struct dsi_err *err) {
    return advance(m, (const uint8_t *)bytes, len, err, -1);
}

int dsi_grammar_matcher_rollback(struct dsi_grammar_matcher *m, int k, struct dsi_err *err) {
    if (k < 0 || (uint32_t)k > m->n_tok)
        return dsi_errf(err, DSI_ERR_INVALID, "grammar: cannot roll back %d of %u tokens", k,
                        m->n_tok);
    if (k == 0) return 0;
    m->n_tok -= (uint32_t)k;
    ey_pop_to(&m->chart, m->hist[m->n_tok]);
    m->s.memo_valid = false; /* columns after this one will be rebuilt */
    m->terminated = false;
    return 0;
}

int dsi_grammar_matcher_n_tokens(const struct dsi_grammar_matcher *m) { return (int)m->n_tok; }

bool dsi_grammar_matcher_is_complete(const struct dsi_grammar_matcher *m) {
    return ey_root_done(&m->cg->m, &m->chart);
}

bool dsi_grammar_matcher_is_final(const struct dsi_grammar_matcher *m) {
    return ey_root_done(&m->cg->m, &m->chart) && !ey_can_scan(&m->cg->m, &m->chart);
}

bool dsi_grammar_matcher_is_terminated(const struct dsi_grammar_matcher *m) {
    return m->terminated;
}

/* ---------------------------------------------------------------------------------------- */
/* Distance to an end: F(s, o) = dist[s] + G(rule(s), o), where G(r, o) is the cheapest way to
 * finish once r completes at origin o: min over the items of column o waiting on r of
 * F(target, their origin); G(root, 0) also allows 0 (the whole output). Memoised on (r, o). */

struct dmemo {
    uint64_t *key;
    uint32_t *val;
    uint32_t cap;
};

static uint32_t g_finish(const struct gm *m,
                         const struct ey_chart *c,
                         struct dmemo *mm,
                         uint32_t r,
                         uint32_t o,
                         int depth);

static uint32_t f_item(const struct gm *m,
                       const struct ey_chart *c,
                       struct dmemo *mm,
                       uint32_t s,
                       uint32_t o,
                       int depth) {
    uint32_t d = m->dist[s];
    if (d >= UINT32_MAX / 4) return UINT32_MAX / 4;
    uint32_t gdist = g_finish(m, c, mm, m->states[s].rule, o, depth + 1);
    return d + gdist < UINT32_MAX / 4 ? d + gdist : UINT32_MAX / 4;
}

static uint32_t g_finish(const struct gm *m,
                         const struct ey_chart *c,
                         struct dmemo *mm,
                         uint32_t r,
                         uint32_t o,
                         int depth) {
    const uint32_t inf = UINT32_MAX / 4;
    if (r == m->root && o == 0) return 0;
    if (o == EY_TOP || depth > 100000) return inf;
    uint64_t key = ((uint64_t)o << 32 | r) + 1;
    uint32_t j = (uint32_t)(key * 0x9E3779B97F4A7C15ull >> 40) & (mm->cap - 1);
    while (mm->key[j]) {
        if (mm->key[j] == key) return mm->val[j];
        j = (j + 1) & (mm->cap - 1);
    }
    mm->key[j] = key;
    mm->val[j] = inf; /* cycles: not better than anything else */
    uint32_t best = inf;
    for (uint32_t i = c->col[o]; i < c->col[o + 1]; i++) {
        const struct ey_item *p = &c->items[i];
        const struct gm_state *ps = &m->states[p->state];
        for (uint32_t e = 0; e < ps->n_redge; e++) {
            const struct gm_redge *re = &m->redges[ps->redge_off + e];
            if (re->rule != r) continue;
            uint32_t v = f_item(m, c, mm, re->target, p->origin, depth + 1);
            if (v < best) best = v;
        }
    }
    j = (uint32_t)(key * 0x9E3779B97F4A7C15ull >> 40) & (mm->cap - 1);
    while (mm->key[j] != key)
        j = (j + 1) & (mm->cap - 1);
    mm->val[j] = best;
    return best;
}

int64_t dsi_grammar_matcher_bytes_to_end(const struct dsi_grammar_matcher *m) {
    if (m->terminated) return -1;
    const struct gm *g = &m->cg->m;
    const struct ey_chart *c = &m->chart;
    uint32_t k = c->n_cols - 1;
    struct dmemo mm = {0};
    mm.cap = 1024;
    while (mm.cap < 4 * (c->n_items + 16))
        mm.cap *= 2;
    mm.key = calloc(mm.cap, sizeof(uint64_t));
    mm.val = calloc(mm.cap, sizeof(uint32_t));
    if (!mm.key || !mm.val) {
        free(mm.key);
        free(mm.val);
        return -1;
    }
    uint32_t best = UINT32_MAX / 4;
    for (uint32_t i = c->col[k]; i < c->col[k + 1]; i++) {
        uint32_t v = f_item(g, c, &mm, c->items[i].state, c->items[i].origin, 0);
        if (v < best) best = v;
    }
    free(mm.key);
    free(mm.val);
    return best;
}
