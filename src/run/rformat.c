/* rformat.c - response_format -> cached compiled grammars; see rformat.h.
 *
 * The cache is a small array searched by a 64-bit hash of the key (kind, whitespace policy and
 * the grammar source; for JSON Schema the compact re-serialisation of the schema, so formatting
 * does not matter but property order does). Entries carry a reference count; idle ones
 * (count 0) are evicted least recently used first beyond max_idle. */
#include "run/rformat.h"

#include "grammar/grammar.h"
#include "tok/bpe.h"

#include <jansson.h>
#include <pthread.h>
#include <string.h>

struct dsi_rformat {
    char *key;
    size_t key_len;
    uint64_t hash;
    struct dsi_grammar_compiled *cg;
    int32_t n_vocab;
    int refs;
    uint64_t last_use;
};

struct dsi_rformat_cache {
    const struct dsi_bpe *bpe;
    int32_t eos;
    int max_idle;
    pthread_mutex_t mu;          /* entries, counters */
    pthread_mutex_t mu_vocab;    /* building the vocabulary */
    struct dsi_grammar_vocab *v; /* NULL until the first constrained request */
    struct dsi_rformat **e;
    int n, cap;
    uint64_t clock;
    struct dsi_rformat_stats st;
};

/* ---- the parsed request ---------------------------------------------------------------- */

struct spec {
    enum dsi_grammar_kind kind;
    struct dsi_grammar_opts opts;
    char *src; /* malloc'd grammar source (NULL for json_object) */
    size_t len;
};

static bool key_in(const char *k, const char *const *keys) {
    for (; *keys; keys++)
        if (!strcmp(k, *keys)) return true;
    return false;
}

/* Every member of o is one of keys; where names the object in the message. */
static int only_keys(json_t *o, const char *const *keys, const char *where, struct dsi_err *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (!key_in(k, keys))
            return dsi_errf(err, DSI_ERR_INVALID, "%s: unknown field \"%.80s\"", where, k);
    }
    return DSI_OK;
}

static int ws_opts(json_t *root, struct spec *sp, struct dsi_err *err) {
    json_t *w = json_object_get(root, "whitespace"), *m = json_object_get(root, "max_whitespace");
    if (w && !json_is_null(w)) {
        const char *s = json_is_string(w) ? json_string_value(w) : "";
        if (!strcmp(s, "flexible"))
            sp->opts.ws = DSI_GRAMMAR_WS_FLEXIBLE;
        else if (!strcmp(s, "compact"))
            sp->opts.ws = DSI_GRAMMAR_WS_COMPACT;
        else
            return dsi_errf(err, DSI_ERR_INVALID,
                            "response_format: field \"whitespace\": want \"flexible\" or "
                            "\"compact\"");
    }
    if (m && !json_is_null(m)) {
        json_int_t x = json_is_integer(m) ? json_integer_value(m) : -1;
        if (x < 0 || x > 1000)
            return dsi_errf(err, DSI_ERR_INVALID,
                            "response_format: field \"max_whitespace\": want an integer "
                            "0..1000");
        sp->opts.max_ws = (int)x;
    }
    return DSI_OK;
}

static int want_string(json_t *root, const char *k, struct spec *sp, struct dsi_err *err) {
    json_t *v = json_object_get(root, k);
    if (!v || json_is_null(v))
        return dsi_errf(err, DSI_ERR_INVALID, "response_format: this type needs \"%s\"", k);
    if (!json_is_string(v))
        return dsi_errf(err, DSI_ERR_INVALID, "response_format: field \"%s\": want a string", k);
    sp->len = json_string_length(v);
    sp->src = dsi_malloc(sp->len + 1);
    if (!sp->src) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    memcpy(sp->src, json_string_value(v), sp->len + 1);
    return DSI_OK;
}

static int json_schema_src(json_t *root, struct spec *sp, struct dsi_err *err) {
    static const char *const keys[] = {"name", "description", "schema", "strict", NULL};
    json_t *js = json_object_get(root, "json_schema");
    if (!js || json_is_null(js))
        return dsi_errf(err, DSI_ERR_INVALID,
                        "response_format: type \"json_schema\" needs \"json_schema\"");
    if (!json_is_object(js))
        return dsi_errf(err, DSI_ERR_INVALID,
                        "response_format: field \"json_schema\": want an object");
    int rc = only_keys(js, keys, "response_format.json_schema", err);
    if (rc) return rc;
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    json_t *desc = json_object_get(js, "description");
    if (name && !json_is_string(name))
        return dsi_errf(err, DSI_ERR_INVALID,
                        "response_format.json_schema: field \"name\": want a string");
    if (desc && !json_is_string(desc))
        return dsi_errf(err, DSI_ERR_INVALID,
                        "response_format.json_schema: field \"description\": want a string");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return dsi_errf(err, DSI_ERR_INVALID,
                        "response_format.json_schema: field \"strict\": want true or false");
    json_t *s = json_object_get(js, "schema");
    if (!s || json_is_null(s))
        return dsi_errf(err, DSI_ERR_INVALID, "response_format.json_schema: no \"schema\"");
    if (!json_is_object(s) && !json_is_boolean(s))
        return dsi_errf(err, DSI_ERR_INVALID,
                        "response_format.json_schema: field \"schema\": want an object");
    /* jansson keeps member order, which the grammar follows (properties in schema order) */
    sp->src = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!sp->src) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    sp->len = strlen(sp->src);
    return DSI_OK;
}

/* *none = true for {"type": "text"}. */
static int
parse_spec(const char *json, size_t len, struct spec *sp, bool *none, struct dsi_err *err) {
    static const char *const k_text[] = {"type", NULL};
    static const char *const k_obj[] = {"type", "whitespace", "max_whitespace", NULL};
    static const char *const k_schema[] = {"type", "json_schema", "whitespace", "max_whitespace",
                                           NULL};
    static const char *const k_regex[] = {"type", "regex", NULL};
    static const char *const k_gram[] = {"type", "grammar", NULL};
    *none = false;
    dsi_grammar_opts_default(&sp->opts);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return dsi_errf(err, DSI_ERR_INVALID, "response_format: malformed JSON: %.120s", je.text);
    int rc = DSI_OK;
    json_t *t = json_object_get(root, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (!json_is_object(root)) {
        rc = dsi_errf(err, DSI_ERR_INVALID, "response_format: want an object with a \"type\"");
    } else if (!type) {
        rc = dsi_errf(err, DSI_ERR_INVALID,
                      "response_format: no \"type\" (want \"text\", \"json_object\", "
                      "\"json_schema\", \"regex\" or \"grammar\")");
    } else if (!strcmp(type, "text")) {
        rc = only_keys(root, k_text, "response_format", err);
        *none = true;
    } else if (!strcmp(type, "json_object")) {
        sp->kind = DSI_GRAMMAR_JSON_OBJECT;
        rc = only_keys(root, k_obj, "response_format", err);
        if (!rc) rc = ws_opts(root, sp, err);
    } else if (!strcmp(type, "json_schema")) {
        sp->kind = DSI_GRAMMAR_JSON_SCHEMA;
        rc = only_keys(root, k_schema, "response_format", err);
        if (!rc) rc = ws_opts(root, sp, err);
        if (!rc) rc = json_schema_src(root, sp, err);
    } else if (!strcmp(type, "regex")) {
        sp->kind = DSI_GRAMMAR_REGEX;
        rc = only_keys(root, k_regex, "response_format", err);
        if (!rc) rc = want_string(root, "regex", sp, err);
    } else if (!strcmp(type, "grammar")) {
        sp->kind = DSI_GRAMMAR_EBNF;
        rc = only_keys(root, k_gram, "response_format", err);
        if (!rc) rc = want_string(root, "grammar", sp, err);
    } else {
        rc = dsi_errf(err, DSI_ERR_INVALID,
                      "response_format: unknown type \"%.60s\" (want \"text\", \"json_object\", "
                      "\"json_schema\", \"regex\" or \"grammar\")",
                      type);
    }
    json_decref(root);
    return rc;
}

/* ---- the cache ------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void entry_free(struct dsi_rformat *f) {
    if (!f) return;
    dsi_grammar_compiled_free(f->cg);
    free(f->key);
    free(f);
}

int dsi_rformat_cache_new(struct dsi_rformat_cache **out,
                          const struct dsi_bpe *bpe,
                          int32_t eos,
                          int max_idle,
                          struct dsi_err *err) {
    *out = NULL;
    struct dsi_rformat_cache *c = dsi_calloc(1, sizeof(*c));
    if (!c) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    c->bpe = bpe;
    c->eos = eos;
    c->max_idle = max_idle > 0 ? max_idle : 64;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->mu_vocab, NULL);
    *out = c;
    return DSI_OK;
}

void dsi_rformat_cache_free(struct dsi_rformat_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        DSI_ASSERT(c->e[i]->refs == 0);
        entry_free(c->e[i]);
    }
    free(c->e);
    dsi_grammar_vocab_free(c->v);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->mu_vocab);
    free(c);
}

/* The grammar vocabulary of the tokenizer: every id's bytes; added tokens are control tokens;
 * EOS is the engine's (c->mu_vocab held). */
static int build_vocab(struct dsi_rformat_cache *c, struct dsi_err *err) {
    int64_t n = dsi_bpe_vocab_size(c->bpe);
    int32_t eos = c->eos >= 0 && c->eos < n ? c->eos : dsi_bpe_eos_id(c->bpe);
    if (eos < 0 || eos >= n)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "response_format: the model and the tokenizer have no EOS token");
    const char **tok = dsi_calloc((size_t)n + 1, sizeof(*tok));
    uint32_t *len = dsi_calloc((size_t)n + 1, sizeof(*len));
    uint8_t *flags = dsi_calloc((size_t)n + 1, 1);
    int rc = DSI_OK;
    if (!tok || !len || !flags) {
        rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *b;
        size_t l;
        int32_t id = (int32_t)i;
        if (dsi_bpe_token_bytes(c->bpe, id, &b, &l, NULL) == 0) {
            tok[i] = b;
            len[i] = (uint32_t)l;
        }
        if (dsi_bpe_is_special(c->bpe, id) || dsi_bpe_is_added(c->bpe, id))
            flags[i] = DSI_GRAMMAR_TOKEN_SPECIAL;
    }
    rc = dsi_grammar_vocab_new(&c->v, tok, len, flags, (int32_t)n, eos, err);
out_free:
    free(tok);
    free(len);
    free(flags);
    return rc;
}

/* The grammar vocabulary, built on first use. */
static int
get_vocab(struct dsi_rformat_cache *c, const struct dsi_grammar_vocab **out, struct dsi_err *err) {
    pthread_mutex_lock(&c->mu_vocab);
    int rc = DSI_OK;
    if (!c->v) {
        double t0 = dsi_time_s();
        rc = build_vocab(c, err);
        pthread_mutex_lock(&c->mu);
        c->st.compile_s += dsi_time_s() - t0;
        pthread_mutex_unlock(&c->mu);
    }
    *out = c->v;
    pthread_mutex_unlock(&c->mu_vocab);
    return rc;
}

/* The entry with this key (c->mu held), or NULL. */
static struct dsi_rformat *
find(struct dsi_rformat_cache *c, const char *key, size_t n, uint64_t h) {
    for (int i = 0; i < c->n; i++) {
        struct dsi_rformat *f = c->e[i];
        if (f->hash == h && f->key_len == n && !memcmp(f->key, key, n)) return f;
    }
    return NULL;
}

/* Drop idle entries beyond max_idle, least recently used first (c->mu held). */
static void evict(struct dsi_rformat_cache *c) {
    for (;;) {
        int idle = 0, lru = -1;
        for (int i = 0; i < c->n; i++) {
            if (c->e[i]->refs) continue;
            idle++;
            if (lru < 0 || c->e[i]->last_use < c->e[lru]->last_use) lru = i;
        }
        if (idle <= c->max_idle) return;
        entry_free(c->e[lru]);
        c->e[lru] = c->e[--c->n];
    }
}

static int compile(struct dsi_rformat_cache *c,
                   const struct spec *sp,
                   struct dsi_grammar_compiled **cg,
                   struct dsi_err *err) {
    const struct dsi_grammar_vocab *v;
    int rc = get_vocab(c, &v, err);
    if (rc) return rc;
    struct dsi_grammar *g = NULL;
    struct dsi_err ge = {0};
    double t0 = dsi_time_s();
    rc = dsi_grammar_parse(&g, sp->kind, sp->src ? sp->src : "", sp->len, &sp->opts, &ge);
    if (!rc) rc = dsi_grammar_compile(cg, g, v, &sp->opts, &ge);
    dsi_grammar_free(g);
    pthread_mutex_lock(&c->mu);
    c->st.compile_s += dsi_time_s() - t0;
    pthread_mutex_unlock(&c->mu);
    if (rc) return dsi_errf(err, rc, "response_format: %s", ge.msg);
    return DSI_OK;
}

int dsi_rformat_get(struct dsi_rformat_cache *c,
                    const char *json,
                    size_t len,
                    struct dsi_rformat **out,
                    struct dsi_err *err) {
    *out = NULL;
    struct spec sp = {0};
    bool none = false;
    int rc = parse_spec(json, len, &sp, &none, err);
    if (!rc && !none && !c)
        rc = dsi_errf(err, DSI_ERR_UNSUPPORTED,
                      "response_format needs a tokenizer (the model has no tokenizer.json)");
    if (rc || none) {
        free(sp.src);
        return rc;
    }
    /* key: "kind ws max_ws\n" + source */
    char head[64];
    int hl =
        snprintf(head, sizeof(head), "%d %d %d\n", (int)sp.kind, (int)sp.opts.ws, sp.opts.max_ws);
    size_t kn = (size_t)hl + sp.len;
    char *key = dsi_malloc(kn + 1);
    if (!key) {
        free(sp.src);
        return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    memcpy(key, head, (size_t)hl);
    if (sp.len) memcpy(key + hl, sp.src, sp.len);
    key[kn] = 0;
    uint64_t h = fnv1a(key, kn);
    pthread_mutex_lock(&c->mu);
    struct dsi_rformat *f = find(c, key, kn, h);
    if (f) {
        f->refs++;
        f->last_use = ++c->clock;
        c->st.hits++;
    }
    pthread_mutex_unlock(&c->mu);
    if (f) {
        free(key);
        free(sp.src);
        *out = f;
        return DSI_OK;
    }
    struct dsi_grammar_compiled *cg = NULL;
    rc = compile(c, &sp, &cg, err); /* outside the lock: others keep going */
    free(sp.src);
    if (rc) {
        free(key);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    c->st.compiles++;
    f = find(c, key, kn, h); /* compiled meanwhile by another thread: use that one */
    if (f) {
        dsi_grammar_compiled_free(cg);
        free(key);
    } else {
        f = dsi_calloc(1, sizeof(*f));
        if (f && c->n == c->cap) {
            int nc = c->cap ? 2 * c->cap : 16;
            struct dsi_rformat **e = realloc(c->e, (size_t)nc * sizeof(*e));
            if (e) {
                c->e = e;
                c->cap = nc;
            }
        }
        if (!f || c->n == c->cap) {
            free(f);
            pthread_mutex_unlock(&c->mu);
            dsi_grammar_compiled_free(cg);
            free(key);
            return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        }
        *f = (struct dsi_rformat){.key = key,
                                  .key_len = kn,
                                  .hash = h,
                                  .cg = cg,
                                  .n_vocab = dsi_grammar_vocab_size(c->v)};
        c->e[c->n++] = f;
    }
    f->refs++;
    f->last_use = ++c->clock;
    evict(c);
    pthread_mutex_unlock(&c->mu);
    *out = f;
    return DSI_OK;
}

void dsi_rformat_put(struct dsi_rformat_cache *c, struct dsi_rformat *f) {
    if (!f) return;
    pthread_mutex_lock(&c->mu);
    DSI_ASSERT(f->refs > 0);
    f->refs--;
    evict(c);
    pthread_mutex_unlock(&c->mu);
}

const struct dsi_grammar_compiled *dsi_rformat_grammar(const struct dsi_rformat *f) {
    return f->cg;
}

int32_t dsi_rformat_vocab_size(const struct dsi_rformat *f) { return f->n_vocab; }

void dsi_rformat_cache_stats(struct dsi_rformat_cache *c, struct dsi_rformat_stats *st) {
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    st->n_entries = c->n;
    pthread_mutex_unlock(&c->mu);
}
