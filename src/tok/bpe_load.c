/* bpe_load.c - tokenizer.json / tokenizer_config.json -> struct dsi_bpe. See bpe.h.
 *
 * Accepted: model BPE (no dropout, no subword prefix/suffix), no normalizer or an empty
 * Sequence, a pre-tokenizer that pretok.c supports, decoder ByteLevel, added tokens without
 * lstrip/rstrip/single_word. Anything else is refused with DSI_ERR_UNSUPPORTED and the name
 * of the feature, so a tokenizer is never silently mis-read. Every id and index taken from the
 * file is range-checked before use (the loader is fuzzed). */
#include "tok/bpe_internal.h"
#include "tok/utf8.h"

#include <jansson.h>
#include <string.h>

#define MAX_IDS (1 << 24) /* ids beyond this are refused (no real vocabulary comes close) */

uint64_t dsi_bpe_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0x100000001b3ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = bpe_mix64(h ^ w);
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return bpe_mix64(h ^ w ^ ((uint64_t)n << 56));
}

int32_t dsi_bpe_map_find(const struct bpe_bytes_map *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    for (size_t i = dsi_bpe_hash(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        size_t kl = m->off[id + 1] - m->off[id];
        if (kl == n && !memcmp(m->blob + m->off[id], s, n)) return id;
    }
}

static size_t pow2_for(size_t n) {
    size_t c = 16;
    while (c < 2 * n + 1)
        c *= 2;
    return c;
}

static int map_init(struct bpe_bytes_map *m, size_t n, const uint32_t *off, const char *blob) {
    size_t cap = pow2_for(n);
    m->slots = malloc(cap * sizeof(int32_t));
    if (!m->slots) return -1;
    memset(m->slots, 0xff, cap * sizeof(int32_t));
    m->mask = cap - 1;
    m->off = off;
    m->blob = blob;
    return 0;
}

/* Insert id; an existing equal key keeps its id unless replace is set. */
static void map_put(struct bpe_bytes_map *m, int32_t id, bool replace) {
    const char *s = m->blob + m->off[id];
    size_t n = m->off[id + 1] - m->off[id];
    for (size_t i = dsi_bpe_hash(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t cur = m->slots[i];
        if (cur < 0) {
            m->slots[i] = id;
            return;
        }
        size_t kl = m->off[cur + 1] - m->off[cur];
        if (kl == n && !memcmp(m->blob + m->off[cur], s, n)) {
            if (replace) m->slots[i] = id;
            return;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Load state                                                                               */

struct loader {
    struct dsi_bpe *b;
    int16_t c2b[324];  /* byte-level alphabet: code point -> byte or -1 */
    uint16_t b2c[256]; /* byte -> code point */
    json_t *root, *vocab, *added;
    struct dsi_err *err;
};

/* Bytes of a token string as HF's ByteLevel decoder gives them: the inverse byte map if every
 * character is in the byte alphabet, else the string's own UTF-8. Writes to out (>= n bytes). */
static size_t bytelevel_decode(const int16_t *c2b, const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        if (dsi_utf8_scan(u + i, n - i, &len) != DSI_UTF8_OK) goto raw;
        uint32_t cp = u[i];
        if (len == 2)
            cp = ((u[i] & 0x1fu) << 6) | (u[i + 1] & 0x3fu);
        else if (len > 2)
            goto raw; /* the alphabet lies below U+0800 */
        int b = cp < 324 ? c2b[cp] : -1;
        if (b < 0) goto raw;
        out[k++] = (char)b;
        i += len;
    }
    return k;
raw:
    memcpy(out, s, n);
    return n;
}

static int check_supported(struct loader *L) {
    struct dsi_err *err = L->err;
    const json_t *norm = json_object_get(L->root, "normalizer");
    if (norm && !json_is_null(norm)) {
        const char *t = json_string_value(json_object_get(norm, "type"));
        const json_t *list = json_object_get(norm, "normalizers");
        if (!t || strcmp(t, "Sequence") || !json_is_array(list) || json_array_size(list))
            return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                            "tokenizer.json: normalizer '%s' "
                            "(only none or an empty Sequence)",
                            t ? t : "?");
    }
    const json_t *dec = json_object_get(L->root, "decoder");
    const char *dt = json_string_value(json_object_get(dec, "type"));
    if (!dt || strcmp(dt, "ByteLevel"))
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "tokenizer.json: decoder '%s' (only "
                        "ByteLevel)",
                        dt ? dt : "none");
    const json_t *m = json_object_get(L->root, "model");
    if (!json_is_object(m)) return dsi_errf(err, DSI_ERR_FORMAT, "tokenizer.json: no model");
    const char *mt = json_string_value(json_object_get(m, "type"));
    if (mt && strcmp(mt, "BPE"))
        return dsi_errf(err, DSI_ERR_UNSUPPORTED, "tokenizer.json: model type '%s' (only BPE)", mt);
    static const char *const must_be_null[] = {"dropout", "continuing_subword_prefix",
                                               "end_of_word_suffix"};
    for (size_t i = 0; i < 3; i++) {
        const json_t *v = json_object_get(m, must_be_null[i]);
        if (v && !json_is_null(v))
            return dsi_errf(err, DSI_ERR_UNSUPPORTED, "tokenizer.json: BPE %s is set",
                            must_be_null[i]);
    }
    L->vocab = json_object_get(m, "vocab");
    if (!json_is_object(L->vocab))
        return dsi_errf(err, DSI_ERR_FORMAT, "tokenizer.json: model.vocab is not an object");
    if (!json_is_array(json_object_get(m, "merges")))
        return dsi_errf(err, DSI_ERR_FORMAT, "tokenizer.json: model.merges is not a list");
    L->b->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    L->added = json_object_get(L->root, "added_tokens");
    if (L->added && !json_is_null(L->added) && !json_is_array(L->added))
        return dsi_errf(err, DSI_ERR_FORMAT, "tokenizer.json: added_tokens is not a list");
    return DSI_OK;
}

/* Pass 1: find n_ids and check the ids. */
static int scan_ids(struct loader *L) {
    struct dsi_bpe *b = L->b;
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(L->vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_IDS)
            return dsi_errf(L->err, DSI_ERR_FORMAT,
                            "tokenizer.json: vocab entry '%.60s' has a "
                            "bad id",
                            key);
        max_id = DSI_MAX(max_id, (int64_t)json_integer_value(v));
    }
    size_t i;
    json_array_foreach(L->added, i, v) {
        const json_t *id = json_object_get(v, "id");
        const json_t *c = json_object_get(v, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_IDS)
            return dsi_errf(L->err, DSI_ERR_FORMAT,
                            "tokenizer.json: added token %zu has a bad "
                            "id",
                            i);
        if (!json_is_string(c) || json_string_length(c) == 0)
            return dsi_errf(L->err, DSI_ERR_FORMAT,
                            "tokenizer.json: added token %zu has no "
                            "content",
                            i);
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (size_t f = 0; f < 3; f++)
            if (json_is_true(json_object_get(v, flags[f])))
                return dsi_errf(L->err, DSI_ERR_UNSUPPORTED,
                                "tokenizer.json: added token "
                                "'%.60s' uses %s",
                                json_string_value(c), flags[f]);
        max_id = DSI_MAX(max_id, (int64_t)json_integer_value(id));
    }
    if (max_id < 0) return dsi_errf(L->err, DSI_ERR_FORMAT, "tokenizer.json: empty vocabulary");
    b->n_ids = (int32_t)(max_id + 1);
    b->n_model = (int64_t)json_object_size(L->vocab);
    b->n_added = (int64_t)json_array_size(L->added);
    return DSI_OK;
}

/* Pass 2: per-id strings, flags, bytes and names. */
static int build_ids(struct loader *L) {
    struct dsi_bpe *b = L->b;
    size_t n = (size_t)b->n_ids;
    const char **name = calloc(n, sizeof(*name));
    size_t *name_len = calloc(n, sizeof(*name_len));
    b->tok_flags = calloc(n, 1);
    b->tok_off = calloc(n + 1, sizeof(uint32_t));
    b->name_off = calloc(n + 1, sizeof(uint32_t));
    int rc = DSI_OK;
    if (!name || !name_len || !b->tok_flags || !b->tok_off || !b->name_off) goto oom;
    const char *key;
    json_t *v;
    json_object_foreach(L->vocab, key, v) {
        size_t id = (size_t)json_integer_value(v);
        if (b->tok_flags[id]) {
            rc = dsi_errf(L->err, DSI_ERR_FORMAT,
                          "tokenizer.json: id %zu is given to two vocab "
                          "entries ('%.40s' and '%.40s')",
                          id, name[id], key);
            goto out;
        }
        b->tok_flags[id] = TOKF_PRESENT;
        name[id] = key;
        name_len[id] = json_object_iter_key_len(json_object_key_to_iter(key));
    }
    size_t i;
    json_array_foreach(L->added, i, v) {
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        if (b->tok_flags[id] & TOKF_ADDED) {
            rc = dsi_errf(L->err, DSI_ERR_FORMAT,
                          "tokenizer.json: added token id %zu appears "
                          "twice",
                          id);
            goto out;
        }
        b->tok_flags[id] = TOKF_PRESENT | TOKF_ADDED;
        if (json_is_true(json_object_get(v, "special"))) {
            b->tok_flags[id] |= TOKF_SPECIAL;
            b->n_special++;
        }
        const json_t *c = json_object_get(v, "content");
        name[id] = json_string_value(c);
        name_len[id] = json_string_length(c);
    }
    size_t total = 0;
    for (size_t k = 0; k < n; k++) {
        total += name_len[k];
        if (total > UINT32_MAX) {
            rc = dsi_errf(L->err, DSI_ERR_FORMAT, "tokenizer.json: token strings too large");
            goto out;
        }
    }
    b->tok_bytes = malloc(total + 1);
    b->name_blob = malloc(total + 1);
    if (!b->tok_bytes || !b->name_blob) goto oom;
    uint32_t to = 0, no = 0;
    for (size_t k = 0; k < n; k++) {
        b->tok_off[k] = to;
        b->name_off[k] = no;
        if (!name[k]) continue;
        memcpy(b->name_blob + no, name[k], name_len[k]);
        no += (uint32_t)name_len[k];
        to += (uint32_t)bytelevel_decode(L->c2b, name[k], name_len[k], b->tok_bytes + to);
    }
    b->tok_off[n] = to;
    b->name_off[n] = no;
    if (map_init(&b->by_name, n, b->name_off, b->name_blob)) goto oom;
    /* vocab entries first, added tokens override (their content wins a name clash) */
    for (size_t k = 0; k < n; k++)
        if ((b->tok_flags[k] & (TOKF_PRESENT | TOKF_ADDED)) == TOKF_PRESENT)
            map_put(&b->by_name, (int32_t)k, false);
    for (size_t k = 0; k < n; k++)
        if (b->tok_flags[k] & TOKF_ADDED) map_put(&b->by_name, (int32_t)k, true);
    goto out;
oom:
    rc = dsi_errf(L->err, DSI_ERR_NOMEM, "tokenizer: out of memory");
out:
    free(name);
    free(name_len);
    return rc;
}

/* Vocab id of a token string, or -1. Added tokens are not BPE symbols. */
static int32_t vocab_id(struct loader *L, const char *s, size_t n) {
    const json_t *v = json_object_getn(L->vocab, s, n);
    return v ? (int32_t)json_integer_value(v) : -1;
}

static int build_merges(struct loader *L) {
    struct dsi_bpe *b = L->b;
    for (int c = 0; c < 256; c++) {
        char u[4];
        int n = dsi_utf8_put(L->b2c[c], u);
        b->byte_id[c] = vocab_id(L, u, (size_t)n);
    }
    const json_t *merges = json_object_get(json_object_get(L->root, "model"), "merges");
    size_t nm = json_array_size(merges);
    if (nm >= UINT32_MAX / 2)
        return dsi_errf(L->err, DSI_ERR_FORMAT,
                        "tokenizer.json: too many "
                        "merges");
    size_t cap = pow2_for(nm);
    b->pairs.keys = malloc(cap * sizeof(uint64_t));
    b->pairs.vals = malloc(cap * sizeof(uint64_t));
    if (!b->pairs.keys || !b->pairs.vals)
        return dsi_errf(L->err, DSI_ERR_NOMEM, "tokenizer: out of memory");
    memset(b->pairs.keys, 0xff, cap * sizeof(uint64_t));
    b->pairs.mask = cap - 1;
    char *cat = NULL;
    size_t cat_cap = 0;
    int rc = DSI_OK;
    for (size_t r = 0; r < nm && !rc; r++) {
        const json_t *m = json_array_get(merges, r);
        const char *a, *bb;
        size_t al, bl;
        if (json_is_string(m)) { /* "a b" */
            a = json_string_value(m);
            const char *sp = memchr(a, ' ', json_string_length(m));
            if (!sp || memchr(sp + 1, ' ', json_string_length(m) - (size_t)(sp + 1 - a))) {
                rc = dsi_errf(L->err, DSI_ERR_FORMAT,
                              "tokenizer.json: merge %zu '%.60s' is not "
                              "two tokens",
                              r, a);
                break;
            }
            al = (size_t)(sp - a);
            bb = sp + 1;
            bl = json_string_length(m) - al - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            al = json_string_length(json_array_get(m, 0));
            bb = json_string_value(json_array_get(m, 1));
            bl = json_string_length(json_array_get(m, 1));
        } else {
            rc = dsi_errf(L->err, DSI_ERR_FORMAT, "tokenizer.json: merge %zu is malformed", r);
            break;
        }
        if (al + bl > cat_cap) {
            cat_cap = 2 * (al + bl) + 64;
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                rc = dsi_errf(L->err, DSI_ERR_NOMEM, "tokenizer: out of memory");
                break;
            }
            cat = nc;
        }
        memcpy(cat, a, al);
        memcpy(cat + al, bb, bl);
        int32_t ia = vocab_id(L, a, al), ib = vocab_id(L, bb, bl), im = vocab_id(L, cat, al + bl);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = dsi_errf(L->err, DSI_ERR_FORMAT,
                          "tokenizer.json: merge %zu ('%.*s' + '%.*s') "
                          "uses a token that is not in the vocab",
                          r, (int)DSI_MIN(al, 40), a, (int)DSI_MIN(bl, 40), bb);
            break;
        }
        /* a repeated pair keeps the later rank, as HF's map construction does */
        uint64_t k = bpe_pair_key(ia, ib);
        size_t s = bpe_mix64(k) & b->pairs.mask;
        while (b->pairs.keys[s] != UINT64_MAX && b->pairs.keys[s] != k)
            s = (s + 1) & b->pairs.mask;
        b->pairs.keys[s] = k;
        b->pairs.vals[s] = (uint64_t)r << 32 | (uint32_t)im;
    }
    free(cat);
    b->n_merges = (int64_t)nm;
    return rc;
}

/* Entries whose own bytes merge back to exactly themselves go to the whole-piece map. */
static int build_whole(struct loader *L) {
    struct dsi_bpe *b = L->b;
    const char *key;
    json_t *v;
    size_t maxlen = 0;
    if (map_init(&b->whole, (size_t)b->n_model, b->tok_off, b->tok_bytes)) goto oom;
    if (b->ignore_merges && map_init(&b->vocab, (size_t)b->n_model, b->tok_off, b->tok_bytes))
        goto oom;
    for (int32_t id = 0; id < b->n_ids; id++)
        maxlen = DSI_MAX(maxlen, (size_t)(b->tok_off[id + 1] - b->tok_off[id]));
    int32_t *out = malloc((maxlen + 1) * sizeof(int32_t));
    int32_t *scratch = malloc(DSI_BPE_SCRATCH(maxlen) * sizeof(int32_t));
    if (!out || !scratch) {
        free(out);
        free(scratch);
        goto oom;
    }
    json_object_foreach(L->vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (b->tok_flags[id] & TOKF_ADDED) continue;
        const char *s = b->tok_bytes + b->tok_off[id];
        size_t n = b->tok_off[id + 1] - b->tok_off[id];
        /* only entries spelled in the byte alphabet are reachable by BPE */
        char tmp[8];
        size_t kl = json_object_iter_key_len(json_object_key_to_iter(key)), kk = 0, ok = 1;
        for (size_t i = 0; i < n && ok; i++) {
            int w = dsi_utf8_put(L->b2c[(uint8_t)s[i]], tmp);
            ok = kk + (size_t)w <= kl && !memcmp(key + kk, tmp, (size_t)w);
            kk += (size_t)w;
        }
        if (!ok || kk != kl || n == 0) continue;
        if (b->ignore_merges) map_put(&b->vocab, id, false);
        if (dsi_bpe_merge_piece(b, s, n, 0, out, scratch) == 1 && out[0] == id)
            map_put(&b->whole, id, false);
    }
    free(out);
    free(scratch);
    return DSI_OK;
oom:
    return dsi_errf(L->err, DSI_ERR_NOMEM, "tokenizer: out of memory");
}

/* ---------------------------------------------------------------------------------------- */
/* Added-token trie                                                                         */

static int trie_child(struct bpe_trie *t, int32_t node, uint8_t c, bool create) {
    uint64_t k = (uint64_t)node << 8 | c;
    size_t i = bpe_mix64(k) & t->edge_mask;
    for (;; i = (i + 1) & t->edge_mask) {
        if (t->edge_keys[i] == k) return t->edge_vals[i];
        if (t->edge_keys[i] == UINT64_MAX) break;
    }
    if (!create) return -1;
    t->edge_keys[i] = k;
    t->edge_vals[i] = t->n_nodes;
    t->node_tok[t->n_nodes] = -1;
    return t->n_nodes++;
}

static int build_trie(struct loader *L) {
    struct dsi_bpe *b = L->b;
    struct bpe_trie *t = &b->trie;
    size_t total = 1, i;
    json_t *v;
    json_array_foreach(L->added, i, v) total += json_string_length(json_object_get(v, "content"));
    size_t cap = pow2_for(total);
    t->node_tok = malloc(total * sizeof(int32_t));
    t->node_cls = calloc(total, 1);
    t->edge_keys = malloc(cap * sizeof(uint64_t));
    t->edge_vals = malloc(cap * sizeof(int32_t));
    if (!t->node_tok || !t->node_cls || !t->edge_keys || !t->edge_vals)
        return dsi_errf(L->err, DSI_ERR_NOMEM, "tokenizer: out of memory");
    memset(t->edge_keys, 0xff, cap * sizeof(uint64_t));
    t->edge_mask = cap - 1;
    t->n_nodes = 1;
    t->node_tok[0] = -1;
    json_array_foreach(L->added, i, v) {
        const json_t *c = json_object_get(v, "content");
        const unsigned char *s = (const unsigned char *)json_string_value(c);
        size_t n = json_string_length(c);
        int cls = json_is_true(json_object_get(v, "normalized")) ? 1 : 0;
        int32_t node = 0;
        for (size_t k = 0; k < n; k++)
            node = trie_child(t, node, s[k], true);
        t->node_tok[node] = (int32_t)json_integer_value(json_object_get(v, "id"));
        t->node_cls[node] = (uint8_t)cls;
        t->first[s[0]] |= (uint8_t)(1u << cls);
    }
    return DSI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* tokenizer_config.json                                                                    */

static int config_token(
    struct dsi_bpe *b, const json_t *cfg, const char *field, int32_t *id, struct dsi_err *err) {
    *id = -1;
    const json_t *v = json_object_get(cfg, field);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return DSI_OK;
    if (!json_is_string(v))
        return dsi_errf(err, DSI_ERR_FORMAT, "tokenizer_config.json: %s is not a string", field);
    *id = dsi_bpe_map_find(&b->by_name, json_string_value(v), json_string_length(v));
    if (*id < 0)
        return dsi_errf(err, DSI_ERR_FORMAT,
                        "tokenizer_config.json: %s '%.80s' is not a token of "
                        "tokenizer.json",
                        field, json_string_value(v));
    return DSI_OK;
}

static int load_config(struct dsi_bpe *b, const char *text, size_t len, struct dsi_err *err) {
    b->bos_id = b->eos_id = b->pad_id = -1;
    if (!text) return DSI_OK;
    json_error_t je;
    json_t *cfg = json_loadb(text, len, 0, &je);
    if (!cfg)
        return dsi_errf(err, DSI_ERR_FORMAT, "tokenizer_config.json: line %d: %s", je.line,
                        je.text);
    int rc = config_token(b, cfg, "bos_token", &b->bos_id, err);
    if (!rc) rc = config_token(b, cfg, "eos_token", &b->eos_id, err);
    if (!rc) rc = config_token(b, cfg, "pad_token", &b->pad_id, err);
    json_decref(cfg);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */

void dsi_bpe_free(struct dsi_bpe *b) {
    if (!b) return;
    free(b->tok_flags);
    free(b->tok_off);
    free(b->tok_bytes);
    free(b->pairs.keys);
    free(b->pairs.vals);
    free(b->whole.slots);
    free(b->vocab.slots);
    free(b->trie.node_tok);
    free(b->trie.node_cls);
    free(b->trie.edge_keys);
    free(b->trie.edge_vals);
    dsi_pretok_free(&b->pretok);
    free(b->name_off);
    free(b->name_blob);
    free(b->by_name.slots);
    free(b);
}

int dsi_bpe_load(struct dsi_bpe **out,
                 const char *tokenizer_json,
                 size_t tokenizer_len,
                 const char *config_json,
                 size_t config_len,
                 int64_t vocab_limit,
                 struct dsi_err *err) {
    *out = NULL;
    struct dsi_bpe *b = calloc(1, sizeof(*b));
    if (!b) return dsi_errf(err, DSI_ERR_NOMEM, "tokenizer: out of memory");
    json_error_t je;
    struct loader L = {.b = b, .err = err};
    for (int c = 0; c < 324; c++)
        L.c2b[c] = (int16_t)dsi_bytelevel_byte((uint32_t)c);
    for (int c = 0; c < 256; c++)
        L.b2c[c] = (uint16_t)dsi_bytelevel_char((uint8_t)c);
    L.root = json_loadb(tokenizer_json, tokenizer_len, 0, &je);
    int rc;
    if (!L.root) {
        rc = dsi_errf(err, DSI_ERR_FORMAT, "tokenizer.json: line %d column %d: %s", je.line,
                      je.column, je.text);
        goto fail;
    }
    if (!json_is_object(L.root)) {
        rc = dsi_errf(err, DSI_ERR_FORMAT, "tokenizer.json: not a JSON object");
        goto fail;
    }
    if ((rc = check_supported(&L)) || (rc = scan_ids(&L)) || (rc = build_ids(&L)) ||
        (rc = build_merges(&L)) || (rc = build_whole(&L)) || (rc = build_trie(&L)))
        goto fail;
    struct dsi_err perr = {0};
    if ((rc = dsi_pretok_init(&b->pretok, json_object_get(L.root, "pre_tokenizer"), &perr))) {
        dsi_errf(err, rc, "tokenizer.json: %.480s", perr.msg);
        goto fail;
    }
    if ((rc = load_config(b, config_json, config_len, err))) goto fail;
    b->vocab_limit = vocab_limit > 0 ? vocab_limit : b->n_ids;
    json_decref(L.root);
    *out = b;
    return DSI_OK;
fail:
    json_decref(L.root);
    dsi_bpe_free(b);
    return rc;
}

/* vocab_size from DIR/config.json, 0 if the file is absent. */
static int model_vocab_size(const char *dir, int64_t *vs, struct dsi_err *err) {
    char path[4096];
    *vs = 0;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return DSI_OK;
    fclose(f);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) return dsi_errf(err, DSI_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
    const json_t *v = json_object_get(cfg, "vocab_size");
    int rc = DSI_OK;
    if (v && (!json_is_integer(v) || json_integer_value(v) <= 0))
        rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: vocab_size is not a positive integer", path);
    else if (v)
        *vs = json_integer_value(v);
    json_decref(cfg);
    return rc;
}

int dsi_bpe_open_limit(struct dsi_bpe **out,
                       const char *model_dir,
                       int64_t vocab_limit,
                       struct dsi_err *err) {
    *out = NULL;
    char path[4096];
    char *tj = NULL, *cj = NULL;
    size_t tl = 0, cl = 0;
    int rc;
    if (vocab_limit <= 0 && (rc = model_vocab_size(model_dir, &vocab_limit, err))) return rc;
    snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir);
    if ((rc = dsi_read_file(path, &tj, &tl, err))) return rc;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", model_dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        if ((rc = dsi_read_file(path, &cj, &cl, err))) {
            free(tj);
            return rc;
        }
    }
    rc = dsi_bpe_load(out, tj, tl, cj, cl, vocab_limit, err);
    free(tj);
    free(cj);
    if (!rc) {
        const struct dsi_bpe *b = *out;
        dsi_log(DSI_LOG_INFO,
                "tokenizer %s: %lld BPE entries, %lld merges, %lld added tokens "
                "(%lld special), ids < %lld, %d split steps",
                model_dir, (long long)b->n_model, (long long)b->n_merges, (long long)b->n_added,
                (long long)b->n_special, (long long)b->vocab_limit, b->pretok.n_steps);
    }
    return rc;
}

int dsi_bpe_open(struct dsi_bpe **out, const char *model_dir, struct dsi_err *err) {
    return dsi_bpe_open_limit(out, model_dir, 0, err);
}
