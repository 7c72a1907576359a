/* schema.c - JSON Schema -> grammar IR.
 *
 * Supported (drafts 4 to 2020-12 spellings):
 *   type (one or a list), enum, const, anyOf, oneOf (as anyOf: exclusivity is not enforced),
 *   allOf (merged into one schema when the parts do not conflict), $ref to "#", "#/$defs/...",
 *   "#/definitions/..." or any JSON pointer into the document (recursion allowed), nullable
 *   (OpenAPI), objects: properties, required, additionalProperties (false, true or a schema);
 *   arrays: items, prefixItems (and draft-4 tuple items + additionalItems), minItems, maxItems;
 *   strings: minLength, maxLength, pattern (anchored: a full match of the value), format (date,
 *   time, date-time, email, uuid); integers: minimum, maximum, exclusiveMinimum,
 *   exclusiveMaximum. Annotations (title, description, default, examples, $schema, $comment,
 *   ...) and keywords that no validator knows are ignored.
 * Rejected with DSI_ERR_UNSUPPORTED naming the keyword and the schema path: not, if/then/else,
 *   dependentRequired, dependentSchemas, dependencies, patternProperties, propertyNames,
 *   minProperties, maxProperties, unevaluatedProperties, unevaluatedItems, contains,
 *   minContains, maxContains, uniqueItems: true, multipleOf, $dynamicRef, $recursiveRef, bounds
 *   on "number", pattern together with minLength/maxLength, other formats, remote $refs.
 *
 * The language is XGrammar's (strict mode), so masks can be compared schema for schema:
 *   - properties appear in schema order; required ones always, optional ones may be skipped;
 *   - additionalProperties defaults to false when "properties" is given, and to any value for
 *     a bare {"type": "object"}; extra keys come after the declared ones and never repeat a
 *     declared name (they are spelled without escapes, so they cannot sneak one back in);
 *   - arrays with prefixItems and no "items" allow no further items;
 *   - enum and const values are written compactly (json.dumps(separators=(",", ":")));
 *   - whitespace: see enum dsi_grammar_ws (none around the top-level value).
 * Output is therefore always valid for the schema, with the exceptions noted: oneOf
 * exclusivity, and enum values that violate sibling keywords (enum is filtered by "type" only). */
#include "grammar/json_rules.h"

#include <math.h>

struct refent {
    char *ptr;
    uint32_t rule;
};

struct sc {
    struct dsi_grammar *g;
    struct jr j;
    json_t *doc;
    struct dsi_err *err;
    struct refent *refs;
    size_t n_refs, cap_refs;
    struct refent *strs; /* cached rules for constrained strings, keyed by a description */
    size_t n_strs, cap_strs;
    int depth;
    json_t *owned; /* merged schemas kept alive until the end */
};

static int sexpr(struct sc *c, json_t *s, const char *path, const char *hint, struct gx **out);

static int unsupported(struct sc *c, const char *kw, const char *path) {
    return dsi_errf(c->err, DSI_ERR_UNSUPPORTED, "json schema: unsupported keyword '%s' at %s", kw,
                    path);
}

static int invalid(struct sc *c, const char *path, const char *what) {
    return dsi_errf(c->err, DSI_ERR_INVALID, "json schema: %s at %s", what, path);
}

static void subpath(char *out, size_t cap, const char *path, const char *a, const char *b) {
    if (b)
        snprintf(out, cap, "%s/%s/%s", path, a, b);
    else
        snprintf(out, cap, "%s/%s", path, a);
}

/* Rule-name hint: letters, digits and underscores only. */
static void sanitize(char *out, size_t cap, const char *a, const char *b) {
    char tmp[96];
    snprintf(tmp, sizeof(tmp), "%s%s%s", a, b ? "_" : "", b ? b : "");
    size_t k = 0;
    for (size_t i = 0; tmp[i] && k + 1 < cap && k < 48; i++) {
        char ch = tmp[i];
        out[k++] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
                       ? ch
                       : '_';
    }
    out[k] = 0;
    if (!k) snprintf(out, cap, "s");
}

static const char *const k_unsupported[] = {"not",
                                            "if",
                                            "then",
                                            "else",
                                            "dependentRequired",
                                            "dependentSchemas",
                                            "dependencies",
                                            "patternProperties",
                                            "propertyNames",
                                            "minProperties",
                                            "maxProperties",
                                            "unevaluatedProperties",
                                            "unevaluatedItems",
                                            "contains",
                                            "minContains",
                                            "maxContains",
                                            "multipleOf",
                                            "$dynamicRef",
                                            "$recursiveRef",
                                            NULL};

/* Keywords that constrain values (a $ref next to one of these is not supported). */
static const char *const k_validation[] = {"type",
                                           "enum",
                                           "const",
                                           "anyOf",
                                           "oneOf",
                                           "allOf",
                                           "properties",
                                           "required",
                                           "additionalProperties",
                                           "items",
                                           "prefixItems",
                                           "additionalItems",
                                           "minItems",
                                           "maxItems",
                                           "minLength",
                                           "maxLength",
                                           "pattern",
                                           "format",
                                           "minimum",
                                           "maximum",
                                           "exclusiveMinimum",
                                           "exclusiveMaximum",
                                           "nullable",
                                           NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

/* ---------------------------------------------------------------------------------------- */
/* $ref */

static json_t *resolve(struct sc *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    json_t *cur = c->doc;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char tok[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof(tok)) {
            if (p[0] == '~' && p[1] == '0')
                tok[k++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1')
                tok[k++] = '/', p += 2;
            else
                tok[k++] = *p++;
        }
        tok[k] = 0;
        if (json_is_object(cur))
            cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = *end || i < 0 ? NULL : json_array_get(cur, (size_t)i);
        } else
            cur = NULL;
        if (!cur) return NULL;
    }
    return cur;
}

static int ref_rule(struct sc *c, const char *ref, const char *path, uint32_t *out) {
    for (size_t i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ptr, ref)) {
            *out = c->refs[i].rule;
            return 0;
        }
    json_t *target = resolve(c, ref);
    if (!target) {
        if (ref[0] != '#')
            return dsi_errf(c->err, DSI_ERR_UNSUPPORTED,
                            "json schema: remote $ref '%s' unsupported at %s", ref, path);
        return dsi_errf(c->err, DSI_ERR_INVALID, "json schema: $ref '%s' does not resolve at %s",
                        ref, path);
    }
    const char *last = strrchr(ref, '/');
    char hint[64];
    sanitize(hint, sizeof(hint), "defs", last && last[1] ? last + 1 : "root");
    uint32_t r = gx_rule_new(c->g, hint);
    if (r == UINT32_MAX) return DSI_ERR_NOMEM;
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 16;
        struct refent *e = realloc(c->refs, cap * sizeof(*e));
        if (!e) return DSI_ERR_NOMEM;
        c->refs = e;
        c->cap_refs = cap;
    }
    c->refs[c->n_refs].ptr = strdup(ref);
    if (!c->refs[c->n_refs].ptr) return DSI_ERR_NOMEM;
    c->refs[c->n_refs++].rule = r;
    *out = r;
    /* the body after registering: recursion finds the rule */
    struct gx *body;
    int rc = sexpr(c, target, ref, hint, &body);
    if (rc) return rc;
    c->g->rules[r].body = body;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* allOf / siblings of anyOf: shallow merge of two schemas. */

static int merge_into(struct sc *c, json_t *dst, json_t *src, const char *path) {
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v) {
        json_t *d = json_object_get(dst, k);
        if (!d) {
            json_object_set(dst, k, v);
            continue;
        }
        if (json_equal(d, v)) continue;
        if (!strcmp(k, "properties") && json_is_object(d) && json_is_object(v)) {
            json_t *m = json_deep_copy(d);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *old = json_object_get(m, pk);
                if (old && !json_equal(old, pv)) {
                    json_decref(m);
                    return dsi_errf(
                        c->err, DSI_ERR_UNSUPPORTED,
                        "json schema: allOf/anyOf parts disagree on property '%s' at %s", pk, path);
                }
                json_object_set(m, pk, pv);
            }
            json_object_set_new(dst, k, m);
        } else if (!strcmp(k, "required") && json_is_array(d) && json_is_array(v)) {
            json_t *m = json_deep_copy(d);
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                bool have = false;
                for (size_t q = 0; q < json_array_size(m) && !have; q++)
                    have = json_equal(json_array_get(m, q), x);
                if (!have) json_array_append(m, x);
            }
            json_object_set_new(dst, k, m);
        } else if (in_list(k_validation, k)) {
            return dsi_errf(c->err, DSI_ERR_UNSUPPORTED,
                            "json schema: allOf/anyOf parts disagree on '%s' at %s", k, path);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Strings */

static int
cached_rule(struct sc *c, const char *key, uint32_t *out, bool *fresh, const char *hint) {
    for (size_t i = 0; i < c->n_strs; i++)
        if (!strcmp(c->strs[i].ptr, key)) {
            *out = c->strs[i].rule;
            *fresh = false;
            return 0;
        }
    if (c->n_strs == c->cap_strs) {
        size_t cap = c->cap_strs ? c->cap_strs * 2 : 16;
        struct refent *e = realloc(c->strs, cap * sizeof(*e));
        if (!e) return DSI_ERR_NOMEM;
        c->strs = e;
        c->cap_strs = cap;
    }
    uint32_t r = gx_rule_new(c->g, hint);
    char *k = strdup(key);
    if (r == UINT32_MAX || !k) {
        free(k);
        return DSI_ERR_NOMEM;
    }
    c->strs[c->n_strs].ptr = k;
    c->strs[c->n_strs++].rule = r;
    *out = r;
    *fresh = true;
    return 0;
}

static int
get_count(struct sc *c, json_t *s, const char *kw, const char *path, int64_t *v, bool *has) {
    json_t *x = json_object_get(s, kw);
    *has = x != NULL;
    if (!x) return 0;
    double d = json_is_integer(x) ? (double)json_integer_value(x)
               : json_is_real(x)  ? json_real_value(x)
                                  : -1;
    if (d < 0 || d != floor(d))
        return invalid(c, path, "count keyword is not a non-negative integer");
    if (d > (double)c->g->opts.max_repeat)
        return dsi_errf(c->err, DSI_ERR_UNSUPPORTED,
                        "json schema: '%s' %.0f above the limit %d at %s", kw, d,
                        c->g->opts.max_repeat, path);
    *v = (int64_t)d;
    return 0;
}

static int string_expr(struct sc *c, json_t *s, const char *path, struct gx **out) {
    struct dsi_grammar *g = c->g;
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    int64_t minl = 0, maxl = -1;
    bool hmin, hmax;
    int rc;
    if ((rc = get_count(c, s, "minLength", path, &minl, &hmin))) return rc;
    if ((rc = get_count(c, s, "maxLength", path, &maxl, &hmax))) return rc;
    if (!hmax) maxl = -1;
    if (hmax && maxl < minl) return invalid(c, path, "maxLength below minLength");
    if ((fmt || pat) && (hmin || hmax))
        return unsupported(c, hmin ? "minLength" : "maxLength", path); /* with pattern/format */
    if (fmt && pat) return unsupported(c, "pattern", path);
    char key[600];
    const char *hint = "json_string";
    if (fmt) {
        if (!json_is_string(fmt)) return invalid(c, path, "'format' is not a string");
        snprintf(key, sizeof(key), "format:%s", json_string_value(fmt));
        hint = "json_format";
    } else if (pat) {
        if (!json_is_string(pat)) return invalid(c, path, "'pattern' is not a string");
        snprintf(key, sizeof(key), "pattern:%.580s", json_string_value(pat));
        if (strlen(json_string_value(pat)) > 580)
            snprintf(key, sizeof(key), "pattern@%p", (void *)pat);
        hint = "json_pattern";
    } else if (hmin || hmax) {
        snprintf(key, sizeof(key), "len:%lld:%lld", (long long)minl, (long long)maxl);
        hint = "json_string_len";
    } else {
        uint32_t r = jr_string(&c->j);
        if (r == UINT32_MAX) return DSI_ERR_NOMEM;
        *out = gx_ref(g, r);
        return 0;
    }
    uint32_t r;
    bool fresh;
    if ((rc = cached_rule(c, key, &r, &fresh, hint))) return rc;
    if (fresh) {
        struct gx *body;
        if (fmt) {
            if ((rc = jr_format(&c->j, json_string_value(fmt), &body, c->err))) {
                char msg[sizeof(c->err->msg)];
                snprintf(msg, sizeof(msg), "%s", c->err ? c->err->msg : "");
                return dsi_errf(c->err, rc, "%s at %s", msg, path);
            }
        } else if (pat) {
            const char *re = json_string_value(pat);
            if ((rc = gx_parse_regex(g, re, strlen(re), true, &body, c->err))) {
                char msg[sizeof(c->err->msg)];
                snprintf(msg, sizeof(msg), "%s", c->err ? c->err->msg : "");
                return dsi_errf(c->err, rc, "json schema: pattern at %s: %s", path, msg);
            }
        } else {
            body = gx_rep(g, jr_char(&c->j, false), (uint32_t)minl,
                          maxl < 0 ? GX_INF : (uint32_t)maxl);
        }
        g->rules[r].body = gx_seq3(g, gx_str(g, "\""), body, gx_str(g, "\""));
    }
    *out = gx_ref(g, r);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Numbers */

static int bound(struct sc *c, json_t *s, const char *kw, const char *path, double *v, bool *has) {
    json_t *x = json_object_get(s, kw);
    *has = false;
    if (!x || json_is_boolean(x)) return 0;
    if (!json_is_number(x)) return invalid(c, path, "bound is not a number");
    *v = json_number_value(x);
    if (!isfinite(*v) || fabs(*v) > 9.0e15)
        return dsi_errf(c->err, DSI_ERR_UNSUPPORTED, "json schema: '%s' out of range at %s", kw,
                        path);
    *has = true;
    return 0;
}

static int integer_expr(struct sc *c, json_t *s, const char *path, struct gx **out) {
    double mn, mx, emn, emx;
    bool hmn, hmx, hemn, hemx;
    int rc;
    if ((rc = bound(c, s, "minimum", path, &mn, &hmn)) ||
        (rc = bound(c, s, "maximum", path, &mx, &hmx)) ||
        (rc = bound(c, s, "exclusiveMinimum", path, &emn, &hemn)) ||
        (rc = bound(c, s, "exclusiveMaximum", path, &emx, &hemx)))
        return rc;
    /* draft 4: exclusiveMinimum: true makes minimum exclusive */
    if (json_is_true(json_object_get(s, "exclusiveMinimum")) && hmn)
        hemn = true, emn = mn, hmn = false;
    if (json_is_true(json_object_get(s, "exclusiveMaximum")) && hmx)
        hemx = true, emx = mx, hmx = false;
    if (!hmn && !hmx && !hemn && !hemx) {
        uint32_t r = jr_integer(&c->j);
        if (r == UINT32_MAX) return DSI_ERR_NOMEM;
        *out = gx_ref(c->g, r);
        return 0;
    }
    int64_t lo = JR_NEG_INF, hi = JR_POS_INF;
    if (hmn) lo = (int64_t)ceil(mn);
    if (hemn) {
        int64_t v = (int64_t)floor(emn) + 1;
        if (v > lo || lo == JR_NEG_INF) lo = v;
    }
    if (hmx) hi = (int64_t)floor(mx);
    if (hemx) {
        int64_t v = (int64_t)ceil(emx) - 1;
        if (v < hi || hi == JR_POS_INF) hi = v;
    }
    if (lo > hi) return invalid(c, path, "no integer satisfies the bounds");
    *out = jr_int_range(&c->j, lo, hi);
    return 0;
}

static int number_expr(struct sc *c, json_t *s, const char *path, struct gx **out) {
    static const char *const kws[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++)
        if (json_object_get(s, kws[i])) return unsupported(c, kws[i], path); /* on type number */
    uint32_t r = jr_number(&c->j);
    if (r == UINT32_MAX) return DSI_ERR_NOMEM;
    *out = gx_ref(c->g, r);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Arrays */

static int
array_expr(struct sc *c, json_t *s, const char *path, const char *hint, struct gx **out) {
    struct dsi_grammar *g = c->g;
    char sp[512];
    int rc;
    json_t *u = json_object_get(s, "uniqueItems");
    if (u && !json_is_false(u)) return unsupported(c, "uniqueItems", path);
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *additional = NULL;
    if (json_is_array(items)) { /* draft 4-2019 tuple form */
        if (prefix) return invalid(c, path, "both prefixItems and array-valued items");
        prefix = items;
        items = json_object_get(s, "additionalItems");
        additional = items;
    }
    if (prefix && !json_is_array(prefix)) return invalid(c, path, "'prefixItems' is not an array");
    size_t k = prefix ? json_array_size(prefix) : 0;
    int64_t mi = 0, ma = -1;
    bool hmi, hma;
    if ((rc = get_count(c, s, "minItems", path, &mi, &hmi)) ||
        (rc = get_count(c, s, "maxItems", path, &ma, &hma)))
        return rc;
    if (!hma) ma = -1;
    /* element schema after the prefix: none when items is false, or absent with a prefix */
    struct gx *rest = NULL;
    bool rest_ok = items ? !json_is_false(items) : (k == 0 && !additional);
    if (rest_ok) {
        if (items && !json_is_true(items)) {
            subpath(sp, sizeof(sp), path, additional ? "additionalItems" : "items", NULL);
            if ((rc = sexpr(c, items, sp, hint, &rest))) return rc;
        } else {
            uint32_t r = jr_value(&c->j);
            if (r == UINT32_MAX) return DSI_ERR_NOMEM;
            rest = gx_ref(g, r);
        }
    }
    int64_t max_n = rest ? ma : (ma < 0 || (size_t)ma > k ? (int64_t)k : ma);
    if (max_n >= 0 && mi > max_n) return invalid(c, path, "minItems above the most items allowed");
    struct gx **pe = calloc(k + 1, sizeof(*pe));
    if (!pe) return DSI_ERR_NOMEM;
    for (size_t i = 0; i < k; i++) {
        char idx[24];
        snprintf(idx, sizeof(idx), "%zu", i);
        subpath(sp, sizeof(sp), path, "prefixItems", idx);
        if ((rc = sexpr(c, json_array_get(prefix, i), sp, hint, &pe[i]))) {
            free(pe);
            return rc;
        }
    }
    struct gx *sep = jr_punct(&c->j, ",");
    struct gx *empty = gx_seq3(g, gx_str(g, "["), jr_ws(&c->j), gx_str(g, "]"));
    if (max_n == 0) {
        free(pe);
        *out = empty;
        return 0;
    }
    /* body for n >= 1 elements, n in [max(mi,1), max_n] */
    int64_t need = mi > 1 ? mi : 1;
    int64_t kk = (int64_t)k;
    struct gx *tail = gx_empty(g);
    if (rest) {
        int64_t from = need > kk ? need : kk; /* elements already placed when the tail starts */
        uint32_t mx = max_n < 0 ? GX_INF : (uint32_t)(max_n - from);
        tail = gx_rep(g, gx_seq2(g, sep, rest), 0, mx);
    }
    for (int64_t j = kk; j > need; j--) /* optional prefix elements need+1 .. k (1-based) */
        tail = gx_rep(g, gx_seq3(g, sep, pe[j - 1], tail), 0, 1);
    struct gx_list body = {0};
    for (int64_t j = 1; j <= need && j <= kk; j++) {
        if (j > 1) gx_list_push(g, &body, sep);
        gx_list_push(g, &body, pe[j - 1]);
    }
    if (need > kk) { /* fixed elements beyond the prefix */
        int64_t extra = need - kk;
        if (kk == 0) {
            gx_list_push(g, &body, rest);
            extra--;
        }
        if (extra > 0)
            gx_list_push(g, &body,
                         gx_rep(g, gx_seq2(g, sep, rest), (uint32_t)extra, (uint32_t)extra));
    }
    gx_list_push(g, &body, tail);
    free(pe);
    struct gx *full = gx_seq(g,
                             (struct gx *[]){gx_str(g, "["), jr_ws(&c->j), gx_list_seq(g, &body),
                                             jr_ws(&c->j), gx_str(g, "]")},
                             5);
    *out = mi == 0 ? gx_alt2(g, empty, full) : full;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Objects */

static char *json_key(const char *name) {
    json_t *s = json_string(name);
    if (!s) return NULL;
    char *k = json_dumps(s, JSON_ENCODE_ANY);
    json_decref(s);
    return k;
}

static int
object_expr(struct sc *c, json_t *s, const char *path, const char *hint, struct gx **out) {
    struct dsi_grammar *g = c->g;
    char sp[512], h[64];
    int rc = 0;
    static const char *const obj_unsup[] = {"patternProperties", "propertyNames", "minProperties",
                                            "maxProperties", NULL};
    for (int i = 0; obj_unsup[i]; i++)
        if (json_object_get(s, obj_unsup[i])) return unsupported(c, obj_unsup[i], path);
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return invalid(c, path, "'properties' is not an object");
    if (req && !json_is_array(req)) return invalid(c, path, "'required' is not an array");
    if (!props && !addl && !req) { /* any object */
        uint32_t r = jr_object(&c->j);
        if (r == UINT32_MAX) return DSI_ERR_NOMEM;
        *out = gx_ref(g, r);
        return 0;
    }
    /* declared properties: those of "properties" then required names not among them */
    size_t np = props ? json_object_size(props) : 0, nr = req ? json_array_size(req) : 0;
    const char **names = calloc(np + nr + 1, sizeof(*names));
    json_t **schemas = calloc(np + nr + 1, sizeof(*schemas));
    bool *required = calloc(np + nr + 1, sizeof(*required));
    struct gx **pairs = calloc(np + nr + 1, sizeof(*pairs));
    if (!names || !schemas || !required || !pairs) {
        rc = DSI_ERR_NOMEM;
        goto out;
    }
    size_t n = 0;
    const char *key;
    json_t *val;
    if (props) json_object_foreach(props, key, val) {
            names[n] = key;
            schemas[n++] = val;
        }
    bool addl_ok = addl ? !json_is_false(addl) : !props;
    for (size_t i = 0; i < nr; i++) {
        json_t *x = json_array_get(req, i);
        if (!json_is_string(x)) {
            rc = invalid(c, path, "'required' holds a non-string");
            goto out;
        }
        size_t q = 0;
        while (q < n && strcmp(names[q], json_string_value(x)))
            q++;
        if (q == n) {
            if (!addl_ok) {
                char msg[300];
                snprintf(msg, sizeof(msg),
                         "required property '%.200s' is not in properties and additionalProperties "
                         "is false",
                         json_string_value(x));
                rc = invalid(c, path, msg);
                goto out;
            }
            names[n] = json_string_value(x);
            schemas[n++] = addl && !json_is_true(addl) ? addl : json_true();
        }
        required[q] = true;
    }
    for (size_t i = 0; i < n; i++) {
        struct gx *v;
        subpath(sp, sizeof(sp), path, "properties", names[i]);
        sanitize(h, sizeof(h), hint, names[i]);
        if ((rc = sexpr(c, schemas[i], sp, h, &v))) goto out;
        char *k = json_key(names[i]);
        if (!k) {
            rc = DSI_ERR_NOMEM;
            goto out;
        }
        pairs[i] = gx_seq3(g, gx_str(g, k), jr_punct(&c->j, ":"), v);
        free(k);
    }
    struct gx *extra = NULL; /* one additional pair */
    if (addl_ok) {
        struct gx *v;
        if (addl && !json_is_true(addl)) {
            subpath(sp, sizeof(sp), path, "additionalProperties", NULL);
            sanitize(h, sizeof(h), hint, "addl");
            if ((rc = sexpr(c, addl, sp, h, &v))) goto out;
        } else {
            uint32_t r = jr_value(&c->j);
            if (r == UINT32_MAX) {
                rc = DSI_ERR_NOMEM;
                goto out;
            }
            v = gx_ref(g, r);
        }
        uint32_t kr = n ? jr_other_key(&c->j, names, n) : jr_string(&c->j);
        if (kr == UINT32_MAX) {
            rc = DSI_ERR_NOMEM;
            goto out;
        }
        extra = gx_seq3(g, gx_ref(g, kr), jr_punct(&c->j, ":"), v);
    }
    /* S_i: what may follow once something was written, from property i on (rules);
     * F_i: the first written pair is property i or later (inlined into F_{i-1}). */
    struct gx *sep = jr_punct(&c->j, ",");
    struct gx *s_next = extra ? gx_rep(g, gx_seq2(g, sep, extra), 0, GX_INF) : gx_empty(g);
    for (size_t i = n; i-- > 0;) {
        /* s_next is S_{i+1}; make it a rule when it is used twice */
        struct gx *s_ref = s_next;
        if (s_next->kind != GX_EMPTY) {
            sanitize(h, sizeof(h), hint, "part");
            uint32_t r = gx_rule_new(g, h);
            if (r == UINT32_MAX) {
                rc = DSI_ERR_NOMEM;
                goto out;
            }
            g->rules[r].body = s_next;
            s_ref = gx_ref(g, r);
        }
        struct gx *with = gx_seq3(g, sep, pairs[i], s_ref);
        s_next = required[i] ? with : gx_alt2(g, with, s_ref);
        pairs[i] = gx_seq2(g, pairs[i], s_ref); /* P_i S_{i+1}: the first pair is i */
    }
    /* F_0 = P_0 S_1 | (if 0 optional) P_1 S_2 | ... up to the first required; then extra S_n */
    struct gx_list first = {0};
    bool any_required = false;
    for (size_t i = 0; i < n; i++) {
        gx_list_push(g, &first, pairs[i]);
        if (required[i]) {
            any_required = true;
            break;
        }
    }
    if (!any_required && extra)
        gx_list_push(g, &first, gx_seq2(g, extra, gx_rep(g, gx_seq2(g, sep, extra), 0, GX_INF)));
    struct gx *open = gx_seq2(g, gx_str(g, "{"), jr_ws(&c->j));
    struct gx *close = gx_seq2(g, jr_ws(&c->j), gx_str(g, "}"));
    if (first.n == 0) {
        free(first.v);
        *out = gx_seq3(g, gx_str(g, "{"), jr_ws(&c->j), gx_str(g, "}"));
    } else {
        struct gx *nonempty = gx_seq3(g, open, gx_list_alt(g, &first), close);
        *out = any_required
                   ? nonempty
                   : gx_alt2(g, gx_seq3(g, gx_str(g, "{"), jr_ws(&c->j), gx_str(g, "}")), nonempty);
    }
out:
    free(names);
    free(schemas);
    free(required);
    free(pairs);
    if (rc == DSI_ERR_NOMEM) dsi_errf(c->err, rc, "json schema: out of memory");
    return rc;
}

/* ---------------------------------------------------------------------------------------- */

static bool type_ok(json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

static bool types_ok(json_t *v, json_t *type) {
    if (!type) return true;
    if (json_is_string(type)) return type_ok(v, json_string_value(type));
    size_t i;
    json_t *t;
    json_array_foreach(type, i,
                       t) if (json_is_string(t) && type_ok(v, json_string_value(t))) return true;
    return false;
}

static int
typed(struct sc *c, json_t *s, const char *t, const char *path, const char *hint, struct gx **out) {
    struct dsi_grammar *g = c->g;
    if (!strcmp(t, "string")) return string_expr(c, s, path, out);
    if (!strcmp(t, "integer")) return integer_expr(c, s, path, out);
    if (!strcmp(t, "number")) return number_expr(c, s, path, out);
    if (!strcmp(t, "boolean")) {
        *out = gx_alt2(g, gx_str(g, "true"), gx_str(g, "false"));
        return 0;
    }
    if (!strcmp(t, "null")) {
        *out = gx_str(g, "null");
        return 0;
    }
    if (!strcmp(t, "object") || !strcmp(t, "array")) {
        char h[64];
        sanitize(h, sizeof(h), hint, NULL);
        uint32_t r = gx_rule_new(g, h);
        if (r == UINT32_MAX) return DSI_ERR_NOMEM;
        struct gx *body = NULL;
        int rc = t[0] == 'o' ? object_expr(c, s, path, h, &body) : array_expr(c, s, path, h, &body);
        if (rc) return rc;
        g->rules[r].body = body;
        *out = gx_ref(g, r);
        return 0;
    }
    char msg[160];
    snprintf(msg, sizeof(msg), "unknown type '%.100s'", t);
    return invalid(c, path, msg);
}

static const char *infer_type(json_t *s) {
    static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const arr[] = {"items", "prefixItems", "minItems", "maxItems", NULL};
    static const char *const str[] = {"minLength", "maxLength", "pattern", "format", NULL};
    static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                      NULL};
    for (int i = 0; obj[i]; i++)
        if (json_object_get(s, obj[i])) return "object";
    for (int i = 0; arr[i]; i++)
        if (json_object_get(s, arr[i])) return "array";
    for (int i = 0; str[i]; i++)
        if (json_object_get(s, str[i])) return "string";
    for (int i = 0; num[i]; i++)
        if (json_object_get(s, num[i])) return "number";
    return NULL;
}

static int
sexpr_body(struct sc *c, json_t *s, const char *path, const char *hint, struct gx **out) {
    struct dsi_grammar *g = c->g;
    char sp[512];
    int rc;
    if (json_is_true(s)) {
        uint32_t r = jr_value(&c->j);
        if (r == UINT32_MAX) return DSI_ERR_NOMEM;
        *out = gx_ref(g, r);
        return 0;
    }
    if (json_is_false(s)) return invalid(c, path, "schema false matches nothing");
    if (!json_is_object(s)) return invalid(c, path, "schema is not an object or a boolean");
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (in_list(k_unsupported, k)) return unsupported(c, k, path);
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return invalid(c, path, "'$ref' is not a string");
        json_object_foreach(s, k, v) {
            if (in_list(k_validation, k))
                return dsi_errf(c->err, DSI_ERR_UNSUPPORTED,
                                "json schema: '$ref' alongside '%s' unsupported at %s", k, path);
        }
        uint32_t r = 0;
        if ((rc = ref_rule(c, json_string_value(ref), path, &r))) return rc;
        *out = gx_ref(g, r);
        return 0;
    }
    json_t *all = json_object_get(s, "allOf");
    if (all) { /* merge everything into one schema */
        if (!json_is_array(all)) return invalid(c, path, "'allOf' is not an array");
        json_t *m = json_deep_copy(s);
        if (!m) return DSI_ERR_NOMEM;
        json_object_del(m, "allOf");
        json_array_append_new(c->owned, m);
        size_t i;
        json_t *part;
        json_array_foreach(all, i, part) {
            if (json_is_object(part) && json_object_get(part, "$ref")) {
                json_t *t = resolve(c, json_string_value(json_object_get(part, "$ref"))
                                           ? json_string_value(json_object_get(part, "$ref"))
                                           : "");
                if (!t) return invalid(c, path, "allOf part with a $ref that does not resolve");
                part = t;
            }
            if (!json_is_object(part)) return invalid(c, path, "allOf part is not an object");
            subpath(sp, sizeof(sp), path, "allOf", NULL);
            if ((rc = merge_into(c, m, part, sp))) return rc;
        }
        return sexpr(c, m, path, hint, out);
    }
    json_t *any = json_object_get(s, "anyOf");
    const char *any_kw = "anyOf";
    if (!any) any = json_object_get(s, "oneOf"), any_kw = "oneOf";
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0)
            return invalid(c, path, "anyOf/oneOf is not a non-empty array");
        /* siblings (other than the other combinator) are merged into each branch */
        json_t *sib = json_deep_copy(s);
        if (!sib) return DSI_ERR_NOMEM;
        json_object_del(sib, any_kw);
        json_array_append_new(c->owned, sib);
        bool has_sib = false;
        json_object_foreach(sib, k, v) if (in_list(k_validation, k)) has_sib = true;
        struct gx_list l = {0};
        size_t i;
        json_t *br;
        json_array_foreach(any, i, br) {
            char idx[24];
            snprintf(idx, sizeof(idx), "%zu", i);
            subpath(sp, sizeof(sp), path, any_kw, idx);
            json_t *use = br;
            if (has_sib) {
                json_t *m = json_deep_copy(sib);
                if (!m) {
                    free(l.v);
                    return DSI_ERR_NOMEM;
                }
                json_array_append_new(c->owned, m);
                json_t *b = br;
                if (json_is_object(b) && json_object_get(b, "$ref"))
                    b = resolve(c, json_string_value(json_object_get(b, "$ref"))
                                       ? json_string_value(json_object_get(b, "$ref"))
                                       : "");
                if (!json_is_object(b)) {
                    free(l.v);
                    return invalid(c, sp, "branch is not an object");
                }
                if ((rc = merge_into(c, m, b, sp))) {
                    free(l.v);
                    return rc;
                }
                use = m;
            }
            struct gx *x;
            if ((rc = sexpr(c, use, sp, hint, &x))) {
                free(l.v);
                return rc;
            }
            gx_list_push(g, &l, x);
        }
        *out = gx_list_alt(g, &l);
        return 0;
    }
    json_t *type = json_object_get(s, "type");
    if (type && !json_is_string(type) && !json_is_array(type))
        return invalid(c, path, "'type' is not a string or an array");
    struct gx_list l = {0};
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && !json_is_array(en)) return invalid(c, path, "'enum' is not an array");
        if (cn) {
            if (types_ok(cn, type)) gx_list_push(g, &l, jr_literal(&c->j, cn));
        } else {
            size_t i;
            json_t *x;
            json_array_foreach(en, i, x) if (types_ok(x, type))
                gx_list_push(g, &l, jr_literal(&c->j, x));
        }
        if (l.n == 0) return invalid(c, path, "no enum/const value matches 'type'");
    } else if (!type) {
        const char *t = infer_type(s);
        if (!t) {
            uint32_t r = jr_value(&c->j);
            if (r == UINT32_MAX) return DSI_ERR_NOMEM;
            gx_list_push(g, &l, gx_ref(g, r));
        } else {
            struct gx *x;
            if ((rc = typed(c, s, t, path, hint, &x))) return rc;
            gx_list_push(g, &l, x);
        }
    } else {
        size_t nt = json_is_string(type) ? 1 : json_array_size(type);
        if (nt == 0) return invalid(c, path, "'type' is an empty array");
        for (size_t i = 0; i < nt; i++) {
            json_t *t = json_is_string(type) ? type : json_array_get(type, i);
            if (!json_is_string(t)) {
                free(l.v);
                return invalid(c, path, "'type' holds a non-string");
            }
            struct gx *x;
            if ((rc = typed(c, s, json_string_value(t), path, hint, &x))) {
                free(l.v);
                return rc;
            }
            gx_list_push(g, &l, x);
        }
    }
    if (json_is_true(json_object_get(s, "nullable"))) gx_list_push(g, &l, gx_str(g, "null"));
    *out = gx_list_alt(g, &l);
    return 0;
}

static int sexpr(struct sc *c, json_t *s, const char *path, const char *hint, struct gx **out) {
    if (++c->depth > 64)
        return dsi_errf(c->err, DSI_ERR_UNSUPPORTED, "json schema: nested deeper than 64 at %s",
                        path);
    int rc = sexpr_body(c, s, path, hint, out);
    c->depth--;
    if (rc == DSI_ERR_NOMEM) dsi_errf(c->err, rc, "json schema: out of memory");
    return rc;
}

int gx_parse_schema(struct dsi_grammar *g, const char *src, size_t len, struct dsi_err *err) {
    json_error_t je;
    json_t *doc = json_loadb(src, len, JSON_DECODE_ANY, &je);
    if (!doc)
        return dsi_errf(err, DSI_ERR_INVALID, "json schema: not JSON: %s (line %d, column %d)",
                        je.text, je.line, je.column);
    struct sc c = {.g = g, .doc = doc, .err = err};
    jr_init(&c.j, g);
    c.owned = json_array();
    uint32_t root = gx_rule_new(g, "root");
    int rc = root == UINT32_MAX || !c.owned ? DSI_ERR_NOMEM : 0;
    if (!rc) {
        /* "#" refers to the root: register it so recursion through "#" lands on root */
        c.refs = malloc(sizeof(*c.refs));
        if (c.refs) c.refs[0].ptr = strdup("#");
        if (!c.refs || !c.refs[0].ptr)
            rc = DSI_ERR_NOMEM;
        else {
            c.refs[0].rule = root;
            c.n_refs = c.cap_refs = 1;
        }
    }
    struct gx *body = NULL;
    if (!rc) rc = sexpr(&c, doc, "#", "root", &body);
    if (!rc) {
        g->rules[root].body = body;
        g->root = root;
    }
    for (size_t i = 0; i < c.n_refs; i++)
        free(c.refs[i].ptr);
    free(c.refs);
    for (size_t i = 0; i < c.n_strs; i++)
        free(c.strs[i].ptr);
    free(c.strs);
    json_decref(c.owned);
    json_decref(doc);
    if (!rc && g->oom) rc = DSI_ERR_NOMEM;
    if (rc == DSI_ERR_NOMEM) dsi_errf(err, rc, "json schema: out of memory");
    return rc;
}

uint32_t gx_json_value_rule(struct dsi_grammar *g) {
    struct jr j;
    jr_init(&j, g);
    return jr_value(&j);
}

uint32_t gx_json_object_rule(struct dsi_grammar *g) {
    struct jr j;
    jr_init(&j, g);
    return jr_object(&j);
}
