/* dsml.c - render and parse DSML tool calls. See dsml.h.
 *
 * Rendering mirrors the reference exactly, including its fallbacks: arguments that are not a
 * JSON object in a string become one parameter "arguments" (a string that does not parse as
 * JSON: string="true" with the raw text; a non-string value: string="false" with its JSON).
 * (The reference crashes on a string that parses to a non-object; we take the first reading.)
 *
 * Parsing is lenient where the reference raises: whitespace between elements is free, a
 * missing string="..." attribute or a string="false" value that is not JSON is decided by
 * whether the value parses as JSON, a repeated parameter keeps its first value. A block is
 * rejected (returned as malformed) when an invoke or parameter cannot be delimited. */
#include "tok/dsml.h"
#include "core/json_out.h"

#define P_INVOKE     "<" DSI_DSML_TOKEN "invoke"
#define P_INVOKE_END "</" DSI_DSML_TOKEN "invoke"
#define P_PARAM      "<" DSI_DSML_TOKEN "parameter"
#define P_PARAM_END  "</" DSI_DSML_TOKEN "parameter"

static void put_json(struct dsi_tbuf *b, const json_t *v, struct dsi_err *err, int *rc) {
    if (*rc || b->oom) return;
    *rc = dsi_json_append(v, DSI_JSON_PY, &b->p, &b->len, &b->cap, err);
}

static void put_param(struct dsi_tbuf *b,
                      const char *key,
                      size_t klen,
                      const json_t *v,
                      struct dsi_err *err,
                      int *rc) {
    dsi_tbuf_puts(b, P_PARAM " name=\"");
    dsi_tbuf_put(b, key, klen);
    if (json_is_string(v)) {
        dsi_tbuf_puts(b, "\" string=\"true\">");
        dsi_tbuf_put(b, json_string_value(v), json_string_length(v));
    } else {
        dsi_tbuf_puts(b, "\" string=\"false\">");
        put_json(b, v, err, rc);
    }
    dsi_tbuf_puts(b, P_PARAM_END ">");
}

static int render_call(struct dsi_tbuf *b, const json_t *tc, size_t idx, struct dsi_err *err) {
    const json_t *fn = json_object_get(tc, "function");
    const json_t *name = json_object_get(fn, "name");
    if (!json_is_object(fn) || !json_is_string(name))
        return dsi_errf(err, DSI_ERR_INVALID, "message %zu: tool call without function.name", idx);
    if (!json_object_get(fn, "arguments"))
        return dsi_errf(err, DSI_ERR_INVALID, "message %zu: tool call '%s' without arguments", idx,
                        json_string_value(name));
    const json_t *args = json_object_get(fn, "arguments");
    dsi_tbuf_puts(b, P_INVOKE " name=\"");
    dsi_tbuf_put(b, json_string_value(name), json_string_length(name));
    dsi_tbuf_puts(b, "\">\n");
    int rc = 0;
    json_t *parsed = NULL;
    if (json_is_string(args))
        parsed = json_loadb(json_string_value(args), json_string_length(args),
                            JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (json_is_object(parsed)) {
        const char *k;
        size_t kl;
        json_t *v;
        int first = 1;
        json_object_keylen_foreach(parsed, k, kl, v) {
            if (!first) dsi_tbuf_put(b, "\n", 1);
            first = 0;
            put_param(b, k, kl, v, err, &rc);
        }
    } else {
        put_param(b, "arguments", 9, args, err, &rc);
    }
    json_decref(parsed);
    dsi_tbuf_puts(b, "\n" P_INVOKE_END ">");
    return rc;
}

int dsi_dsml_render_calls(struct dsi_tbuf *b,
                          const json_t *tool_calls,
                          size_t msg_index,
                          struct dsi_err *err) {
    if (!json_is_array(tool_calls))
        return dsi_errf(err, DSI_ERR_INVALID, "message %zu: tool_calls is not a list", msg_index);
    dsi_tbuf_puts(b, "\n\n" DSI_DSML_CALLS_OPEN ">\n");
    for (size_t i = 0; i < json_array_size(tool_calls); i++) {
        if (i) dsi_tbuf_put(b, "\n", 1);
        int rc = render_call(b, json_array_get(tool_calls, i), msg_index, err);
        if (rc) return rc;
    }
    dsi_tbuf_puts(b, "\n" DSI_DSML_CALLS_CLOSE);
    return DSI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Parsing                                                                                  */

void dsi_dsml_calls_clear(struct dsi_dsml_calls *c) {
    for (size_t i = 0; i < c->n; i++) {
        free(c->v[i].name);
        free(c->v[i].arguments);
    }
    free(c->v);
    memset(c, 0, sizeof(*c));
}

static const char *find(const char *s, const char *end, const char *pat) {
    size_t pl = strlen(pat);
    for (const char *p = s; p + pl <= end; p++) {
        p = memchr(p, pat[0], (size_t)(end - p));
        if (!p || p + pl > end) return NULL;
        if (!memcmp(p, pat, pl)) return p;
    }
    return NULL;
}

static const char *skip_ws(const char *s, const char *end) {
    while (s < end && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t'))
        s++;
    return s;
}

static int starts(const char *s, const char *end, const char *pat) {
    size_t pl = strlen(pat);
    return (size_t)(end - s) >= pl && !memcmp(s, pat, pl);
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

struct param {
    const char *key, *val;
    size_t klen, vlen;
    int str; /* 1 true, 0 false, -1 not given */
};

/* Build the OpenAI arguments string from the parameters. */
static char *build_args(const struct param *ps, size_t np) {
    struct dsi_tbuf b = {0};
    dsi_tbuf_put(&b, "{", 1);
    size_t kept = 0;
    for (size_t i = 0; i < np; i++) {
        int dup = 0;
        for (size_t j = 0; j < i && !dup; j++)
            dup = ps[j].klen == ps[i].klen && !memcmp(ps[j].key, ps[i].key, ps[i].klen);
        if (dup) continue;
        if (kept++) dsi_tbuf_put(&b, ", ", 2);
        dsi_json_append_string(ps[i].key, ps[i].klen, DSI_JSON_PY, &b.p, &b.len, &b.cap, NULL);
        dsi_tbuf_put(&b, ": ", 2);
        int raw = 0;
        if (ps[i].str != 1) {
            json_t *v = json_loadb(ps[i].val, ps[i].vlen, JSON_DECODE_ANY, NULL);
            raw = v != NULL;
            json_decref(v);
        }
        if (raw)
            dsi_tbuf_put(&b, ps[i].val, ps[i].vlen);
        else
            dsi_json_append_string(ps[i].val, ps[i].vlen, DSI_JSON_PY, &b.p, &b.len, &b.cap, NULL);
    }
    dsi_tbuf_put(&b, "}", 1);
    if (b.oom || !b.p) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* Parse one invoke starting at s (at "<｜DSML｜invoke"); *next gets the position after it.
 * Returns 1 ok, 0 malformed, -1 out of memory. */
static int
parse_invoke(const char *s, const char *end, const char **next, struct dsi_dsml_call *out) {
    s += strlen(P_INVOKE);
    const char *pe = find(s, end, P_PARAM), *ie = find(s, end, P_INVOKE_END);
    if (!ie) return 0;
    const char *hdr_end = pe && pe < ie ? pe : ie;
    /* header: ws name="NAME"> ws */
    const char *h = skip_ws(s, hdr_end), *he = hdr_end;
    while (he > h && (he[-1] == ' ' || he[-1] == '\n' || he[-1] == '\r' || he[-1] == '\t'))
        he--;
    if (!starts(h, he, "name=\"") || he - h < 8 || memcmp(he - 2, "\">", 2)) return 0;
    const char *name = h + 6;
    size_t name_len = (size_t)(he - 2 - name);
    if (name_len == 0) return 0;
    struct param ps[64];
    size_t np = 0;
    const char *p = hdr_end;
    while (p < ie) {
        p = skip_ws(p, ie);
        if (p == ie) break;
        if (!starts(p, ie, P_PARAM) || np == 64) return 0;
        p += strlen(P_PARAM);
        const char *ve = find(p, end, P_PARAM_END);
        if (!ve || ve > ie) return 0;
        p = skip_ws(p, ve);
        if (!starts(p, ve, "name=\"")) return 0;
        const char *k = p + 6;
        const char *q = find(k, ve, "\" string=\"");
        struct param *pp = &ps[np];
        pp->key = k;
        if (q && (starts(q + 10, ve, "true\">") || starts(q + 10, ve, "false\">"))) {
            pp->klen = (size_t)(q - k);
            pp->str = q[10] == 't';
            pp->val = q + 10 + (pp->str ? 6 : 7);
        } else {
            q = find(k, ve, "\">");
            if (!q) return 0;
            pp->klen = (size_t)(q - k);
            pp->str = -1;
            pp->val = q + 2;
        }
        pp->vlen = (size_t)(ve - pp->val);
        np++;
        p = ve + strlen(P_PARAM_END);
        if (p < end && *p == '>') p++;
    }
    p = ie + strlen(P_INVOKE_END);
    if (p < end && *p == '>') p++;
    *next = p;
    out->name = dup_n(name, name_len);
    out->arguments = build_args(ps, np);
    if (!out->name || !out->arguments) {
        free(out->name);
        free(out->arguments);
        out->name = out->arguments = NULL;
        return -1;
    }
    return 1;
}

int dsi_dsml_parse_block(const char *s, size_t n, struct dsi_dsml_calls *calls) {
    const char *end = s + n, *p = skip_ws(s, end);
    dsi_dsml_calls_clear(calls);
    if (p == end || *p != '>') return 0;
    p++;
    for (;;) {
        p = skip_ws(p, end);
        if (p == end) return 1;
        if (!starts(p, end, P_INVOKE)) break;
        struct dsi_dsml_call c = {0};
        int rc = parse_invoke(p, end, &p, &c);
        if (rc <= 0) {
            dsi_dsml_calls_clear(calls);
            return rc;
        }
        if (calls->n == calls->cap) {
            size_t nc = calls->cap ? 2 * calls->cap : 4;
            struct dsi_dsml_call *v = realloc(calls->v, nc * sizeof(*v));
            if (!v) {
                free(c.name);
                free(c.arguments);
                dsi_dsml_calls_clear(calls);
                return -1;
            }
            calls->v = v;
            calls->cap = nc;
        }
        calls->v[calls->n++] = c;
    }
    dsi_dsml_calls_clear(calls);
    return 0;
}
