/* earley.c - the Earley chart over per-rule DFAs (internal.h).
 *
 * An item is (DFA state, origin column). Scanning a byte moves every item of the last column
 * along its byte edge into a new column; the closure then predicts (a rule edge q adds q's
 * start state with origin = this column; when q is nullable the edge is also taken at once,
 * Aycock-Horspool) and completes (an accepting item advances the items of its origin column
 * waiting on its rule). Columns form a stack, so rollback and the mask walks are O(1) pops.
 * Items of one column are deduplicated through a generation-stamped hash table.
 * An item with origin EY_TOP stands alone (mask precompute): when it completes, the column is
 * flagged done instead of completing parents. */
#include "grammar/internal.h"

void ey_init(struct ey_chart *c) { memset(c, 0, sizeof(*c)); }

void ey_free(struct ey_chart *c) {
    if (!c) return;
    free(c->items);
    free(c->col);
    free(c->done);
    free(c->own);
    free(c->hash);
    free(c->hgen);
    memset(c, 0, sizeof(*c));
}

static bool reserve_cols(struct ey_chart *c, uint32_t n) {
    if (n + 1 < c->cap_cols) return true;
    uint32_t cap = c->cap_cols ? c->cap_cols * 2 : 256;
    while (cap <= n + 1)
        cap *= 2;
    uint32_t *col = realloc(c->col, (size_t)cap * sizeof(*col));
    if (!col) return false;
    c->col = col;
    uint8_t *done = realloc(c->done, cap);
    if (!done) return false;
    c->done = done;
    uint8_t *own = realloc(c->own, cap);
    if (!own) return false;
    c->own = own;
    c->cap_cols = cap;
    return true;
}

static inline uint32_t hslot(uint32_t state, uint32_t origin, uint32_t mask) {
    uint32_t h = state * 0x9E3779B1u ^ (origin + 0x7F4A7C15u) * 0x85EBCA77u;
    return (h ^ (h >> 15)) & mask;
}

static bool rehash(struct ey_chart *c, uint32_t first) {
    uint32_t cap = c->hcap ? c->hcap * 2 : 64;
    uint32_t *h = calloc(cap, sizeof(*h)), *g = calloc(cap, sizeof(*g));
    if (!h || !g) {
        free(h);
        free(g);
        return false;
    }
    free(c->hash);
    free(c->hgen);
    c->hash = h;
    c->hgen = g;
    c->hcap = cap;
    c->gen = 1;
    for (uint32_t i = first; i < c->n_items; i++) {
        uint32_t j = hslot(c->items[i].state, c->items[i].origin, cap - 1);
        while (c->hgen[j] == c->gen)
            j = (j + 1) & (cap - 1);
        c->hgen[j] = c->gen;
        c->hash[j] = i;
    }
    return true;
}

/* Add (state, origin) to the column being built (items from `first`). */
static void add(struct ey_chart *c, uint32_t first, uint32_t state, uint32_t origin) {
    if ((c->n_items - first + 1) * 2 > c->hcap && !rehash(c, first)) {
        c->oom = true;
        return;
    }
    uint32_t mask = c->hcap - 1;
    uint32_t j = hslot(state, origin, mask);
    while (c->hgen[j] == c->gen) {
        const struct ey_item *it = &c->items[c->hash[j]];
        if (it->state == state && it->origin == origin) return;
        j = (j + 1) & mask;
    }
    if (c->n_items == c->cap_items) {
        uint32_t cap = c->cap_items ? c->cap_items * 2 : 1024;
        struct ey_item *it = realloc(c->items, (size_t)cap * sizeof(*it));
        if (!it) {
            c->oom = true;
            return;
        }
        c->items = it;
        c->cap_items = cap;
    }
    c->hgen[j] = c->gen;
    c->hash[j] = c->n_items;
    c->items[c->n_items].state = state;
    c->items[c->n_items].origin = origin;
    c->n_items++;
}

static void new_column(struct ey_chart *c) {
    if (++c->gen == 0) { /* wrapped: clear the stamps */
        memset(c->hgen, 0, (size_t)c->hcap * sizeof(uint32_t));
        c->gen = 1;
    }
}

static inline bool in_ctx(uint32_t origin) {
    return origin == EY_CTX || (origin != EY_TOP && (origin & EY_CTXBIT));
}

/* Every continuation point of `rule`, in the EY_CTX world. */
static void inject(const struct gm *m, struct ey_chart *c, uint32_t first, uint32_t rule) {
    for (uint32_t i = m->cont_off[rule]; i < m->cont_off[rule + 1]; i++)
        add(c, first, m->cont[i], EY_CTX);
}

/* Closure of column k = c->n_cols (items from c->col[k]); then commit it. */
static void close_column(const struct gm *m, struct ey_chart *c) {
    uint32_t k = c->n_cols, first = c->col[k];
    uint8_t own = 0;
    c->done[k] = 0;
    for (uint32_t i = first; i < c->n_items && !c->oom; i++) {
        struct ey_item it = c->items[i];
        const struct gm_state *st = &m->states[it.state];
        bool ctx = in_ctx(it.origin);
        own |= !ctx;
        for (uint32_t e = 0; e < st->n_redge; e++) {
            const struct gm_redge *re = &m->redges[st->redge_off + e];
            const struct gm_rule *q = &m->rules[re->rule];
            add(c, first, q->start, ctx ? k | EY_CTXBIT : k);
            if (q->nullable) add(c, first, re->target, it.origin);
        }
        if (!st->accept) continue;
        if (it.origin >= EY_CTX) { /* EY_TOP or EY_CTX: the context is unknown */
            if (it.origin == EY_TOP) c->done[k] = 1;
            inject(m, c, first, st->rule);
            continue;
        }
        uint32_t o = it.origin & ~EY_CTXBIT;
        if (o == k) continue; /* empty completion: covered by the nullable shortcut */
        uint32_t rule = st->rule;
        for (uint32_t j = c->col[o]; j < c->col[o + 1]; j++) {
            const struct ey_item p = c->items[j];
            if (in_ctx(p.origin) != ctx) continue;
            const struct gm_state *ps = &m->states[p.state];
            for (uint32_t e = 0; e < ps->n_redge; e++) {
                const struct gm_redge *re = &m->redges[ps->redge_off + e];
                if (re->rule == rule) add(c, first, re->target, p.origin);
            }
        }
    }
    c->own[k] = own;
    c->n_cols = k + 1;
    c->col[k + 1] = c->n_items;
}

int ey_start(const struct gm *m, struct ey_chart *c, uint32_t state, uint32_t origin) {
    c->oom = false;
    if (!reserve_cols(c, 1)) return DSI_ERR_NOMEM;
    c->n_cols = 0;
    c->n_items = 0;
    c->col[0] = 0;
    new_column(c);
    add(c, 0, state, origin);
    close_column(m, c);
    return c->oom ? DSI_ERR_NOMEM : 0;
}

int ey_scan(const struct gm *m, struct ey_chart *c, uint8_t byte) {
    uint32_t k = c->n_cols;
    if (!reserve_cols(c, k + 1)) return DSI_ERR_NOMEM;
    uint32_t from = c->col[k - 1], to = c->col[k];
    if (to - from == 1) { /* one item: a plain DFA step when the target needs no closure */
        const struct ey_item it = c->items[from];
        uint32_t t = m->states[it.state].has_bytes ? gm_step(m, it.state, byte) : 0;
        if (!t) return 0;
        const struct gm_state *ts = &m->states[t - 1];
        if (!ts->n_redge && !ts->accept && to < c->cap_items) {
            c->items[to].state = t - 1;
            c->items[to].origin = it.origin;
            c->n_items = to + 1;
            c->done[k] = 0;
            c->own[k] = !in_ctx(it.origin);
            c->n_cols = k + 1;
            c->col[k + 1] = to + 1;
            return 1;
        }
    }
    new_column(c);
    uint32_t cls = m->bclass[byte], nbc = m->n_bclass;
    for (uint32_t i = from; i < to; i++) {
        uint32_t s = c->items[i].state;
        if (!m->states[s].has_bytes) continue;
        uint32_t t = m->trans[(size_t)s * nbc + cls];
        if (t) add(c, to, t - 1, c->items[i].origin);
    }
    if (c->oom) {
        c->n_items = to;
        return DSI_ERR_NOMEM;
    }
    if (c->n_items == to) return 0;
    close_column(m, c);
    if (c->oom) {
        ey_pop_to(c, k);
        return DSI_ERR_NOMEM;
    }
    return 1;
}

bool ey_root_done(const struct gm *m, const struct ey_chart *c) {
    uint32_t k = c->n_cols - 1;
    for (uint32_t i = c->col[k]; i < c->col[k + 1]; i++) {
        const struct ey_item *it = &c->items[i];
        const struct gm_state *st = &m->states[it->state];
        if (st->accept && it->origin == 0 && st->rule == m->root) return true;
    }
    return false;
}

bool ey_can_scan(const struct gm *m, const struct ey_chart *c) {
    uint32_t k = c->n_cols - 1;
    for (uint32_t i = c->col[k]; i < c->col[k + 1]; i++)
        if (m->states[c->items[i].state].has_bytes) return true;
    return false;
}
