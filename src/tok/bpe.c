/* bpe.c - encoding and decoding with a loaded struct dsi_bpe. See bpe.h.
 *
 * encode: added tokens (trie, leftmost-longest, two passes) -> pre-tokenizer pieces -> for each
 * piece either the whole-piece map (a vocabulary entry that BPE maps to itself: one hash
 * probe) or the merge loop. The merge loop is HF's: repeatedly merge the adjacent pair of
 * lowest rank, leftmost first. Small pieces use a rank array scanned for its minimum, large
 * ones the priority queue of HF's word.rs; both give identical output (tested).
 *
 * All scratch memory belongs to the call, so one struct dsi_bpe serves many threads. */
#include "tok/bpe_internal.h"
#include "tok/utf8.h"

#include <string.h>

#define SCAN_MAX 96 /* pieces of up to this many symbols use the rank scan */

/* ---------------------------------------------------------------------------------------- */
/* Merging                                                                                  */

static size_t
merge_scan(const struct dsi_bpe *b, int32_t *sym, size_t m, int32_t *out, int32_t *scratch) {
    uint32_t *rk = (uint32_t *)scratch;
    int32_t *nw = scratch + m;
    for (size_t i = 0; i + 1 < m; i++)
        if (!bpe_pair_get(&b->pairs, sym[i], sym[i + 1], &rk[i], &nw[i])) rk[i] = UINT32_MAX;
    while (m > 1) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rk[i] < best) best = rk[i], bi = i;
        if (best == UINT32_MAX) break;
        sym[bi] = nw[bi];
        if (m - bi - 2 > 0) memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof(*sym));
        if (m >= bi + 3 && m - bi - 3 > 0) {
            memmove(rk + bi + 1, rk + bi + 2, (m - bi - 3) * sizeof(*rk));
            memmove(nw + bi + 1, nw + bi + 2, (m - bi - 3) * sizeof(*nw));
        }
        m--;
        if (bi + 1 < m && !bpe_pair_get(&b->pairs, sym[bi], sym[bi + 1], &rk[bi], &nw[bi]))
            rk[bi] = UINT32_MAX;
        if (bi > 0 && !bpe_pair_get(&b->pairs, sym[bi - 1], sym[bi], &rk[bi - 1], &nw[bi - 1]))
            rk[bi - 1] = UINT32_MAX;
    }
    memcpy(out, sym, m * sizeof(*out));
    return m;
}

/* Min-heap of (rank << 32 | position). */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

/* HF word.rs merge_all: symbols as a linked list; stale queue entries are skipped (a pair's
 * rank identifies the pair, so comparing ranks is the same check as HF's new-id check). */
static size_t
merge_heap(const struct dsi_bpe *b, int32_t *sym, size_t m, int32_t *out, int32_t *scratch) {
    int32_t *next = scratch, *prev = scratch + m;
    uintptr_t hp = ((uintptr_t)(scratch + 2 * m) + 7) & ~(uintptr_t)7; /* 8-byte aligned */
    uint64_t *heap = (uint64_t *)hp;
    size_t hn = 0;
    uint32_t r;
    int32_t nw;
    for (size_t i = 0; i < m; i++) {
        next[i] = i + 1 < m ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
        if (i + 1 < m && bpe_pair_get(&b->pairs, sym[i], sym[i + 1], &r, &nw))
            heap_push(heap, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        size_t pos = (uint32_t)top;
        uint32_t rank = (uint32_t)(top >> 32);
        if (sym[pos] < 0 || next[pos] < 0) continue;
        size_t nx = (size_t)next[pos];
        if (!bpe_pair_get(&b->pairs, sym[pos], sym[nx], &r, &nw) || r != rank) continue;
        sym[pos] = nw;
        sym[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0 && bpe_pair_get(&b->pairs, sym[prev[pos]], sym[pos], &r, &nw))
            heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && bpe_pair_get(&b->pairs, sym[pos], sym[next[pos]], &r, &nw))
            heap_push(heap, &hn, (uint64_t)r << 32 | pos);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i])
        out[k++] = sym[i];
    return k;
}

size_t dsi_bpe_merge_piece(
    const struct dsi_bpe *b, const char *s, size_t n, int method, int32_t *out, int32_t *scratch) {
    /* scratch layout: [n] symbols, then the method's own arrays */
    int32_t *sym = scratch;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = b->byte_id[(uint8_t)s[i]];
        if (id >= 0) sym[m++] = id; /* a byte without a symbol is dropped, as in HF */
    }
    if (m <= 1) {
        if (m) out[0] = sym[0];
        return m;
    }
    if (method == 0) method = m <= SCAN_MAX ? 1 : 2;
    return method == 1 ? merge_scan(b, sym, m, out, scratch + n)
                       : merge_heap(b, sym, m, out, scratch + n);
}

/* ---------------------------------------------------------------------------------------- */
/* Encoding                                                                                 */

struct enc {
    const struct dsi_bpe *b;
    int32_t *ids;
    size_t n, cap;
    int32_t *scratch;
    size_t scratch_cap; /* in int32 */
    struct dsi_pretok_scratch ps;
    struct dsi_err *err;
};

static int enc_reserve(struct enc *e, size_t extra) {
    if (e->n + extra > e->cap) {
        size_t nc = e->cap * 2;
        while (nc < e->n + extra)
            nc *= 2;
        int32_t *p = realloc(e->ids, nc * sizeof(int32_t));
        if (!p) return dsi_errf(e->err, DSI_ERR_NOMEM, "tokenizer: out of memory");
        e->ids = p;
        e->cap = nc;
    }
    return DSI_OK;
}

static int enc_piece(void *user, const char *s, size_t n) {
    struct enc *e = user;
    const struct dsi_bpe *b = e->b;
    int rc = enc_reserve(e, n);
    if (rc) return rc;
    int32_t id = b->ignore_merges ? dsi_bpe_map_find(&b->vocab, s, n) : -1;
    if (id < 0) id = dsi_bpe_map_find(&b->whole, s, n);
    if (id >= 0) {
        e->ids[e->n++] = id;
        return DSI_OK;
    }
    size_t need = DSI_BPE_SCRATCH(n);
    if (need > e->scratch_cap) {
        free(e->scratch);
        e->scratch = malloc(need * sizeof(int32_t));
        e->scratch_cap = e->scratch ? need : 0;
        if (!e->scratch) return dsi_errf(e->err, DSI_ERR_NOMEM, "tokenizer: out of memory");
    }
    e->n += dsi_bpe_merge_piece(b, s, n, 0, e->ids + e->n, e->scratch);
    return DSI_OK;
}

static int enc_plain(struct enc *e, const char *s, size_t n) {
    return dsi_pretok_split(&e->b->pretok, &e->ps, s, n, enc_piece, e, e->err);
}

/* Cut the added tokens of pass cls out of s; gaps go to pass 1 (after pass 0) or to BPE. */
static int enc_added(struct enc *e, const char *s, size_t n, int cls) {
    const struct bpe_trie *t = &e->b->trie;
    const unsigned char *u = (const unsigned char *)s;
    size_t pos = 0, gap = 0;
    int rc;
    while (pos < n) {
        if (!(t->first[u[pos]] & (1u << cls))) {
            pos++;
            continue;
        }
        int32_t node = 0, best = -1;
        size_t best_len = 0;
        for (size_t j = pos; j < n; j++) {
            uint64_t k = (uint64_t)node << 8 | u[j];
            size_t i = bpe_mix64(k) & t->edge_mask;
            while (t->edge_keys[i] != k && t->edge_keys[i] != UINT64_MAX)
                i = (i + 1) & t->edge_mask;
            if (t->edge_keys[i] == UINT64_MAX) break;
            node = t->edge_vals[i];
            if (t->node_tok[node] >= 0 && t->node_cls[node] == cls) {
                best = t->node_tok[node];
                best_len = j - pos + 1;
            }
        }
        if (best < 0) {
            pos++;
            continue;
        }
        if (pos > gap) {
            rc = cls == 0 ? enc_added(e, s + gap, pos - gap, 1) : enc_plain(e, s + gap, pos - gap);
            if (rc) return rc;
        }
        if ((rc = enc_reserve(e, 1))) return rc;
        e->ids[e->n++] = best;
        pos += best_len;
        gap = pos;
    }
    if (n > gap)
        return cls == 0 ? enc_added(e, s + gap, n - gap, 1) : enc_plain(e, s + gap, n - gap);
    return DSI_OK;
}

int dsi_bpe_encode(const struct dsi_bpe *b,
                   const char *text,
                   size_t len,
                   bool parse_special,
                   int32_t **ids,
                   size_t *n,
                   struct dsi_err *err) {
    *ids = NULL;
    *n = 0;
    size_t ok = dsi_utf8_valid_len(text, len);
    if (ok != len)
        return dsi_errf(err, DSI_ERR_INVALID, "text is not valid UTF-8 (byte %zu of %zu: 0x%02x)",
                        ok, len, (unsigned char)text[ok]);
    struct enc e = {.b = b, .err = err};
    e.cap = len / 3 + 16;
    e.ids = malloc(e.cap * sizeof(int32_t));
    if (!e.ids) return dsi_errf(err, DSI_ERR_NOMEM, "tokenizer: out of memory");
    int rc = dsi_pretok_scratch_init(&b->pretok, &e.ps, err);
    if (!rc)
        rc = parse_special && b->trie.n_nodes > 1 ? enc_added(&e, text, len, 0)
                                                  : enc_plain(&e, text, len);
    dsi_pretok_scratch_free(&e.ps);
    free(e.scratch);
    if (!rc && b->vocab_limit < b->n_ids) {
        for (size_t i = 0; i < e.n && !rc; i++)
            if (e.ids[i] >= b->vocab_limit)
                rc = dsi_errf(err, DSI_ERR_INVALID,
                              "text encodes to token id %d, which is not "
                              "below the model's vocab_size %lld",
                              e.ids[i], (long long)b->vocab_limit);
    }
    if (rc) {
        free(e.ids);
        return rc;
    }
    *ids = e.ids;
    *n = e.n;
    return DSI_OK;
}

int dsi_bpe_encode_lossy(const struct dsi_bpe *b,
                         const char *text,
                         size_t len,
                         bool parse_special,
                         int32_t **ids,
                         size_t *n,
                         struct dsi_err *err) {
    if (dsi_utf8_valid_len(text, len) == len)
        return dsi_bpe_encode(b, text, len, parse_special, ids, n, err);
    char *fixed;
    size_t fl;
    int rc = dsi_utf8_lossy(text, len, &fixed, &fl, err);
    if (rc) return rc;
    rc = dsi_bpe_encode(b, fixed, fl, parse_special, ids, n, err);
    free(fixed);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Decoding and lookups                                                                     */

int dsi_bpe_token_bytes(
    const struct dsi_bpe *b, int32_t id, const char **bytes, size_t *len, struct dsi_err *err) {
    if (id < 0 || id >= b->vocab_limit)
        return dsi_errf(err, DSI_ERR_INVALID, "token id %d is out of range (vocab size %lld)", id,
                        (long long)b->vocab_limit);
    if (id >= b->n_ids || !(b->tok_flags[id] & TOKF_PRESENT))
        return dsi_errf(err, DSI_ERR_INVALID, "token id %d has no token in tokenizer.json", id);
    *bytes = b->tok_bytes + b->tok_off[id];
    *len = b->tok_off[id + 1] - b->tok_off[id];
    return DSI_OK;
}

int dsi_bpe_decode(const struct dsi_bpe *b,
                   const int32_t *ids,
                   size_t n,
                   unsigned flags,
                   char *buf,
                   size_t cap,
                   size_t *len,
                   struct dsi_err *err) {
    size_t total = 0;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t tl;
        int rc = dsi_bpe_token_bytes(b, ids[i], &t, &tl, err);
        if (rc) return rc;
        if (!((flags & DSI_DECODE_SKIP_SPECIAL) && (b->tok_flags[ids[i]] & TOKF_SPECIAL)))
            total += tl;
    }
    char *raw = malloc(total + 1);
    if (!raw) return dsi_errf(err, DSI_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & DSI_DECODE_SKIP_SPECIAL) && (b->tok_flags[ids[i]] & TOKF_SPECIAL)) continue;
        size_t tl = b->tok_off[ids[i] + 1] - b->tok_off[ids[i]];
        memcpy(raw + k, b->tok_bytes + b->tok_off[ids[i]], tl);
        k += tl;
    }
    char *res = raw;
    if ((flags & DSI_DECODE_LOSSY) && dsi_utf8_valid_len(raw, k) != k) {
        int rc = dsi_utf8_lossy(raw, k, &res, &k, err);
        free(raw);
        if (rc) return rc;
    }
    if (cap) {
        size_t c = DSI_MIN(k, cap);
        memcpy(buf, res, c);
        if (c < cap) buf[c] = 0;
    }
    *len = k;
    free(res);
    return DSI_OK;
}

int32_t dsi_bpe_token_id(const struct dsi_bpe *b, const char *name, struct dsi_err *err) {
    int32_t id = dsi_bpe_map_find(&b->by_name, name, strlen(name));
    if (id < 0) dsi_errf(err, DSI_ERR_INVALID, "unknown token '%.200s'", name);
    return id;
}

bool dsi_bpe_is_special(const struct dsi_bpe *b, int32_t id) {
    return id >= 0 && id < b->n_ids && (b->tok_flags[id] & TOKF_SPECIAL);
}

bool dsi_bpe_is_added(const struct dsi_bpe *b, int32_t id) {
    return id >= 0 && id < b->n_ids && (b->tok_flags[id] & TOKF_ADDED);
}

int32_t dsi_bpe_bos_id(const struct dsi_bpe *b) { return b->bos_id; }
int32_t dsi_bpe_eos_id(const struct dsi_bpe *b) { return b->eos_id; }
int32_t dsi_bpe_pad_id(const struct dsi_bpe *b) { return b->pad_id; }
int64_t dsi_bpe_vocab_size(const struct dsi_bpe *b) { return b->vocab_limit; }

void dsi_bpe_get_info(const struct dsi_bpe *b, struct dsi_bpe_info *info) {
    memset(info, 0, sizeof(*info));
    info->n_ids = b->n_ids;
    info->n_model = b->n_model;
    info->n_merges = b->n_merges;
    info->n_added = b->n_added;
    info->n_special = b->n_special;
    info->n_split_steps = b->pretok.n_steps;
    info->jit = true;
    for (int i = 0; i < b->pretok.n_steps; i++)
        info->jit = info->jit && b->pretok.jit[i];
}
