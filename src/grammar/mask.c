/* mask.c - the adaptive token-mask cache (XGrammar's idea) and the per-step mask.
 *
 * Compile time (ms_build): for every walk-equivalence class of DFA states (fsm.c) with an
 * outgoing edge, walk the token trie with an Earley chart that starts from that state alone
 * (origin EY_TOP, so nothing outside the rule is known). A token is
 *   accepted   if its bytes can be consumed inside the rule (sub-rules included): true in any
 *              context, since the item is in the real chart;
 *   uncertain  if the rule can complete before the token's end and the rest of the token
 *              survives in some context where the rule is used (earley.c's EY_CTX world,
 *              an over-approximation of every real context): the context decides;
 *   rejected   otherwise: false in any context.
 * Accepted sets are stored as an id list, a complement list or a bitset, whichever is smallest;
 * uncertain tokens as a rank list in trie order.
 *
 * Step time (ms_fill): OR the accepted sets of the last column's items (items that were only
 * predicted are covered by their predictor and skipped), then check the uncertain tokens of
 * those items against the real chart in trie order: consecutive tokens share the prefix already
 * scanned, and a byte that fails skips every later token with the same prefix. EOS is set when
 * the root is complete. Exact: every mask equals the brute-force definition. */
#include "grammar/internal.h"

#define LIST_MAX 512u /* longest id list before a bitset (16 KiB for 129k ids) is cheaper */

struct u32v {
    uint32_t *v;
    uint32_t n, cap;
};

static bool push(struct u32v *a, uint32_t x) {
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? a->cap * 2 : 1024;
        uint32_t *p = realloc(a->v, (size_t)cap * sizeof(*p));
        if (!p) return false;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Walk the trie from `state` alone; ranks of accepted and uncertain tokens in trie order.
 * part 0: tokens of at most VT_SHORT bytes (no descent below that depth); part 1: longer
 * tokens only (subtrees without one are skipped). */
/* The bytes some item of the last column can scan. */
static void column_bytes(const struct gm *m, const struct ey_chart *c, uint64_t *out) {
    uint32_t k = c->n_cols - 1;
    out[0] = out[1] = out[2] = out[3] = 0;
    for (uint32_t i = c->col[k]; i < c->col[k + 1]; i++) {
        const uint64_t *b = m->bytes[c->items[i].state];
        out[0] |= b[0], out[1] |= b[1], out[2] |= b[2], out[3] |= b[3];
    }
}

static int walk(const struct gm *m,
                const struct dsi_grammar_vocab *v,
                struct ey_chart *c,
                uint32_t state,
                int part,
                uint64_t (*viable)[4],
                struct u32v *acc,
                struct u32v *unc) {
    int rc = ey_start(m, c, state, EY_TOP);
    if (rc) return rc;
    column_bytes(m, c, viable[0]);
    uint32_t n = 1;
    while (n < v->n_nodes) {
        const struct vt_node *x = &v->nodes[n];
        uint32_t d = x->depth;
        if ((part == 0 ? d > VT_SHORT : x->max_below <= VT_SHORT) ||
            !(viable[d - 1][x->byte >> 6] >> (x->byte & 63) & 1)) { /* no item scans the byte */
            n = x->next;
            continue;
        }
        ey_pop_to(c, d);
        rc = ey_scan(m, c, x->byte);
        if (rc < 0) return rc;
        if (rc == 0) { /* dead in every context: the whole subtree is rejected */
            n = x->next;
            continue;
        }
        if ((part == 0) == (d <= VT_SHORT)) {
            struct u32v *dst = c->own[d] ? acc : unc;
            for (uint32_t k = 0; k < x->n_here; k++)
                if (!push(dst, x->rank_begin + k)) return DSI_ERR_NOMEM;
        }
        if (x->next != n + 1) column_bytes(m, c, viable[d]); /* only nodes with children */
        n++;
    }
    return 0;
}

static int store(struct ms_set *s,
                 const struct dsi_grammar_vocab *v,
                 int part,
                 struct u32v *acc,
                 struct u32v *unc,
                 size_t *bytes) {
    uint32_t words = (uint32_t)dsi_grammar_mask_words(v->n_vocab);
    uint32_t n_acc = acc->n, n_not = v->n_part[part] - acc->n;
    s->part = (uint8_t)part;
    if (unc->n) {
        s->unc = malloc((size_t)unc->n * sizeof(uint32_t));
        if (!s->unc) return DSI_ERR_NOMEM;
        memcpy(s->unc, unc->v, (size_t)unc->n * sizeof(uint32_t));
        s->n_unc = unc->n;
        *bytes += (size_t)unc->n * 4;
    }
    if (n_acc == 0) {
        s->kind = MS_NONE;
        return 0;
    }
    if (n_acc <= LIST_MAX || n_not <= LIST_MAX) {
        bool neg = n_acc > LIST_MAX;
        uint32_t n = neg ? n_not : n_acc;
        s->ids = malloc(((size_t)n + 1) * sizeof(uint32_t));
        if (!s->ids) return DSI_ERR_NOMEM;
        if (!neg) {
            for (uint32_t i = 0; i < n; i++)
                s->ids[i] = (uint32_t)v->rank_id[acc->v[i]];
        } else { /* ranks of the part not in acc (acc is sorted) */
            uint32_t j = 0, k = 0;
            for (uint32_t r = 0; r < v->n_text; r++) {
                int32_t id = v->rank_id[r];
                if (!(v->part_mask[part][id >> 5] >> (id & 31) & 1)) continue;
                if (j < acc->n && acc->v[j] == r) {
                    j++;
                    continue;
                }
                s->ids[k++] = (uint32_t)id;
            }
        }
        qsort(s->ids, n, sizeof(uint32_t), cmp_u32);
        s->kind = neg ? MS_NOTLIST : MS_LIST;
        s->n = n;
        *bytes += (size_t)n * 4;
        return 0;
    }
    s->ids = calloc(words, sizeof(uint32_t));
    if (!s->ids) return DSI_ERR_NOMEM;
    for (uint32_t i = 0; i < n_acc; i++) {
        uint32_t id = (uint32_t)v->rank_id[acc->v[i]];
        s->ids[id >> 5] |= 1u << (id & 31);
    }
    s->kind = MS_BITS;
    s->n = n_acc;
    *bytes += (size_t)words * 4;
    return 0;
}

/* Sets: one per short-token class (eqshort) and one per long-token class (eqclass) among the
 * states with an outgoing edge. */
int ms_build(struct dsi_grammar_compiled *cg, struct dsi_err *err) {
    struct gm *m = &cg->m;
    const struct dsi_grammar_vocab *v = cg->vocab;
    uint32_t *rep_long = malloc(((size_t)m->n_eqclass + 1) * sizeof(uint32_t));
    uint32_t *rep_short = malloc(((size_t)m->n_eqshort + 1) * sizeof(uint32_t));
    uint32_t *who = NULL; /* set -> state to walk from, and which part (high bit: short) */
    uint64_t(*viable)[4] = malloc(((size_t)v->max_len + 2) * sizeof(*viable));
    struct ey_chart c;
    struct u32v acc = {0}, unc = {0};
    int rc = DSI_ERR_NOMEM;
    ey_init(&c);
    if (!rep_long || !rep_short || !viable) goto out;
    for (uint32_t k = 0; k < m->n_eqclass; k++)
        rep_long[k] = UINT32_MAX;
    for (uint32_t k = 0; k < m->n_eqshort; k++)
        rep_short[k] = UINT32_MAX;
    cg->n_sets = 0;
    for (uint32_t s = 0; s < m->n_states; s++) {
        struct gm_state *st = &m->states[s];
        if (!st->has_bytes && !st->n_redge) continue;
        uint32_t k = m->eqclass[s], ks = m->eqshort[s];
        if (rep_long[k] == UINT32_MAX) rep_long[k] = cg->n_sets++;
        if (rep_short[ks] == UINT32_MAX) rep_short[ks] = cg->n_sets++;
        st->mask_set = rep_long[k];
        st->mask_short = rep_short[ks];
    }
    cg->sets = calloc((size_t)cg->n_sets + 1, sizeof(*cg->sets));
    who = malloc(((size_t)cg->n_sets + 1) * sizeof(uint32_t));
    if (!cg->sets || !who) goto out;
    for (uint32_t k = 0; k < cg->n_sets; k++)
        who[k] = UINT32_MAX;
    for (uint32_t s = 0; s < m->n_states; s++) {
        const struct gm_state *st = &m->states[s];
        if (st->mask_set == UINT32_MAX) continue;
        if (who[st->mask_set] == UINT32_MAX) who[st->mask_set] = s;
        if (who[st->mask_short] == UINT32_MAX) who[st->mask_short] = s | 0x80000000u;
    }
    size_t bytes = 0;
    int64_t n_unc = 0;
    for (uint32_t k = 0; k < cg->n_sets; k++) {
        acc.n = unc.n = 0;
        uint32_t s = who[k] & 0x7FFFFFFFu;
        int part = who[k] >> 31 ? 0 : 1;
        if ((rc = walk(m, v, &c, s, part, viable, &acc, &unc))) goto out;
        if ((rc = store(&cg->sets[k], v, part, &acc, &unc, &bytes))) goto out;
        n_unc += unc.n;
    }
    cg->stats.n_mask_sets = (int)cg->n_sets;
    cg->stats.n_unc = n_unc;
    cg->stats.mask_bytes = bytes;
    rc = 0;
out:
    if (rc) dsi_errf(err, rc, "grammar: out of memory building the mask cache");
    ey_free(&c);
    free(rep_long);
    free(rep_short);
    free(viable);
    free(who);
    free(acc.v);
    free(unc.v);
    return rc;
}

void ms_free(struct dsi_grammar_compiled *cg) {
    if (!cg->sets) return;
    for (uint32_t i = 0; i < cg->n_sets; i++) {
        free(cg->sets[i].ids);
        free(cg->sets[i].unc);
    }
    free(cg->sets);
    cg->sets = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Step time. */

static void clear_ids(uint32_t *dst, const struct ms_set *s) {
    for (uint32_t i = 0; i < s->n; i++)
        dst[s->ids[i] >> 5] &= ~(1u << (s->ids[i] & 31));
}

/* mask = union of the accepted sets of act[0..n). Complement lists are the costly kind (a whole
 * mask each): the first one of each part is applied in place (the parts are disjoint), both at
 * once from the all-text mask when both parts have one; further ones go through tmp. */
static bool apply_sets(uint32_t *mask,
                       const struct ms_set *const *act,
                       uint32_t n,
                       const struct dsi_grammar_vocab *v,
                       uint32_t *tmp,
                       size_t words) {
    const struct ms_set *first_not[2] = {NULL, NULL};
    bool any = false;
    for (uint32_t j = 0; j < n; j++) {
        const struct ms_set *x = act[j];
        if (x->kind == MS_NOTLIST && !first_not[x->part]) first_not[x->part] = x;
        any |=
            x->kind != MS_NONE && x->n > 0 && (x->kind != MS_NOTLIST || x->n < v->n_part[x->part]);
    }
    if (first_not[0] && first_not[1])
        memcpy(mask, v->text_mask, words * sizeof(uint32_t));
    else if (first_not[0] || first_not[1])
        memcpy(mask, v->part_mask[first_not[0] ? 0 : 1], words * sizeof(uint32_t));
    else
        memset(mask, 0, words * sizeof(uint32_t));
    for (int p = 0; p < 2; p++)
        if (first_not[p]) clear_ids(mask, first_not[p]);
    for (uint32_t j = 0; j < n; j++) {
        const struct ms_set *x = act[j];
        switch (x->kind) {
        case MS_LIST:
            for (uint32_t i = 0; i < x->n; i++)
                mask[x->ids[i] >> 5] |= 1u << (x->ids[i] & 31);
            break;
        case MS_NOTLIST:
            if (x == first_not[x->part]) break;
            memcpy(tmp, v->part_mask[x->part], words * sizeof(uint32_t));
            clear_ids(tmp, x);
            for (size_t w = 0; w < words; w++)
                mask[w] |= tmp[w];
            break;
        case MS_BITS:
            for (size_t w = 0; w < words; w++)
                mask[w] |= x->ids[w];
            break;
        default:
            break;
        }
    }
    return any;
}

/* Merge the uncertain lists of the active sets (sorted, deduplicated). */
static const uint32_t *merged_unc(struct ms_scratch *s, uint32_t n_act, uint32_t *n_out) {
    uint32_t total = 0, with = 0, last = 0;
    for (uint32_t i = 0; i < n_act; i++)
        if (s->act[i]->n_unc) total += s->act[i]->n_unc, with++, last = i;
    *n_out = total;
    if (with <= 1) return with ? s->act[last]->unc : NULL;
    if (total > s->cap_merge) {
        uint32_t *p = realloc(s->merge, (size_t)total * 2 * sizeof(uint32_t));
        if (!p) return NULL;
        s->merge = p;
        s->cap_merge = total;
    }
    /* pairwise merges: acc in merge[0..), scratch in merge[total..) */
    uint32_t *a = s->merge, *b = s->merge + total, n = 0;
    for (uint32_t i = 0; i < n_act; i++) {
        const struct ms_set *x = s->act[i];
        if (!x->n_unc) continue;
        uint32_t p = 0, q = 0, k = 0;
        while (p < n || q < x->n_unc) {
            uint32_t val;
            if (q >= x->n_unc || (p < n && a[p] < x->unc[q]))
                val = a[p++];
            else if (p >= n || x->unc[q] < a[p])
                val = x->unc[q++];
            else
                val = a[p++], q++;
            b[k++] = val;
        }
        memcpy(a, b, (size_t)k * sizeof(uint32_t));
        n = k;
    }
    *n_out = n;
    return a;
}

/* First index >= i whose rank is >= end (galloping search in the sorted list). */
static uint32_t skip_to(const uint32_t *a, uint32_t i, uint32_t n, uint32_t end) {
    uint32_t step = 1, lo = i;
    while (i < n && a[i] < end) {
        lo = i;
        i += step;
        step *= 2;
    }
    if (i > n) i = n;
    while (lo < i) { /* a[lo] < end; find the first >= end in (lo, i] */
        uint32_t mid = lo + (i - lo) / 2;
        if (a[mid] < end)
            lo = mid + 1;
        else
            i = mid;
    }
    return i;
}

int ms_fill(const struct dsi_grammar_compiled *cg,
            struct ey_chart *c,
            struct ms_scratch *s,
            uint32_t *mask) {
    const struct gm *m = &cg->m;
    const struct dsi_grammar_vocab *v = cg->vocab;
    size_t words = dsi_grammar_mask_words(v->n_vocab);
    uint32_t k = c->n_cols - 1, n_act = 0;
    for (uint32_t i = c->col[k]; i < c->col[k + 1]; i++) {
        const struct ey_item *it = &c->items[i];
        const struct gm_state *st = &m->states[it->state];
        if (st->mask_set == UINT32_MAX) continue;
        const struct gm_rule *r = &m->rules[st->rule];
        if (it->origin == k && it->state == r->start && !(k == 0 && st->rule == m->root)) continue;
        for (int part = 0; part < 2; part++) {
            const struct ms_set *set = &cg->sets[part ? st->mask_set : st->mask_short];
            if (set->kind == MS_NONE && !set->n_unc) continue;
            bool dup = false;
            for (uint32_t j = 0; j < n_act && !dup; j++)
                dup = s->act[j] == set;
            if (dup) continue;
            if (n_act == s->cap_act) {
                uint32_t cap = s->cap_act ? s->cap_act * 2 : 32;
                const struct ms_set **p = realloc(s->act, (size_t)cap * sizeof(*p));
                if (!p) return DSI_ERR_NOMEM;
                s->act = p;
                s->cap_act = cap;
            }
            s->act[n_act++] = set;
        }
    }
    bool any = apply_sets(mask, s->act, n_act, v, s->tmp, words);
    /* uncertain tokens against the real chart (or the memo of the same column) */
    uint32_t n_unc;
    const uint32_t *unc = merged_unc(s, n_act, &n_unc);
    if (n_unc && !unc) return DSI_ERR_NOMEM;
    uint32_t col_n = c->col[k + 1] - c->col[k];
    if (n_unc && s->memo_valid && s->memo_n == col_n &&
        !memcmp(s->memo_items, c->items + c->col[k], (size_t)col_n * sizeof(struct ey_item))) {
        for (uint32_t i = 0; i < s->memo_n_ids; i++)
            mask[s->memo_ids[i] >> 5] |= 1u << (s->memo_ids[i] & 31);
        any |= s->memo_n_ids > 0;
        n_unc = 0;
    } else if (n_unc) { /* record this column; the accepted tokens are appended below */
        s->memo_valid = false;
        if (col_n > s->cap_memo_items) {
            struct ey_item *p = realloc(s->memo_items, (size_t)col_n * sizeof(*p));
            if (!p) return DSI_ERR_NOMEM;
            s->memo_items = p;
            s->cap_memo_items = col_n;
        }
        memcpy(s->memo_items, c->items + c->col[k], (size_t)col_n * sizeof(struct ey_item));
        s->memo_n = col_n;
        s->memo_n_ids = 0;
        if (n_unc > s->cap_memo_ids) {
            uint32_t *p = realloc(s->memo_ids, (size_t)n_unc * sizeof(*p));
            if (!p) return DSI_ERR_NOMEM;
            s->memo_ids = p;
            s->cap_memo_ids = n_unc;
        }
        s->memo_valid = true;
    }
    uint32_t base = c->n_cols, depth = 0;
    uint8_t *path = s->path;
    for (uint32_t i = 0; i < n_unc;) {
        uint32_t r = unc[i];
        int32_t id = v->rank_id[r];
        if (mask[id >> 5] >> (id & 31) & 1) {
            i++;
            continue;
        }
        const uint8_t *b = (const uint8_t *)v->bytes + v->off[id];
        uint32_t len = (uint32_t)(v->off[id + 1] - v->off[id]);
        uint32_t l = 0;
        while (l < depth && l < len && path[l] == b[l])
            l++;
        ey_pop_to(c, base + l);
        depth = l;
        bool ok = true;
        while (depth < len) {
            int rc = ey_scan(m, c, b[depth]);
            if (rc < 0) {
                ey_pop_to(c, base);
                return rc;
            }
            if (rc == 0) {
                uint32_t node = v->path[v->path_off[r] + depth];
                uint32_t end = v->nodes[node].rank_end;
                i = skip_to(unc, i, n_unc, end);
                ok = false;
                break;
            }
            path[depth] = b[depth];
            depth++;
        }
        if (ok) {
            mask[id >> 5] |= 1u << (id & 31);
            s->memo_ids[s->memo_n_ids++] = (uint32_t)id;
            any = true;
            i++;
        }
    }
    ey_pop_to(c, base);
    if (ey_root_done(m, c)) {
        mask[v->eos >> 5] |= 1u << (v->eos & 31);
        any = true;
    }
    return any ? 0 : DSI_ERR_INVALID;
}
