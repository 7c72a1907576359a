/* json_out.c - JSON writer with Python json.dumps() compatible output. See json_out.h.
 *
 * The float formatter finds the shortest decimal that reads back to the same double by trying
 * 1..17 significant digits (printf's correctly rounded "%.*e", checked with strtod), plus the
 * two neighbours of the rounded mantissa, which matters only at powers of two where the
 * rounding interval is lopsided. That is what Python's repr (David Gay's dtoa, mode 0) yields. */
#include "core/json_out.h"

#include <math.h>
#include <string.h>

#define JSON_MAX_DEPTH 2048

struct jbuf {
    char **buf;
    size_t *len;
    size_t *cap;
    int oom;
};

static int jb_reserve(struct jbuf *b, size_t extra) {
    if (b->oom) return -1;
    size_t need = *b->len + extra + 1;
    if (need <= *b->cap) return 0;
    size_t nc = *b->cap ? *b->cap : 256;
    while (nc < need)
        nc *= 2;
    char *p = realloc(*b->buf, nc);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    *b->buf = p;
    *b->cap = nc;
    return 0;
}

static void jb_put(struct jbuf *b, const char *s, size_t n) {
    if (jb_reserve(b, n)) return;
    memcpy(*b->buf + *b->len, s, n);
    *b->len += n;
    (*b->buf)[*b->len] = 0;
}

static void jb_puts(struct jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

/* ---------------------------------------------------------------------------------------- */
/* Floats                                                                                   */

/* Parse "%.*e" output (d.ddde[+-]x) into an integer mantissa of p digits and an exponent. */
static void split_sci(const char *s, uint64_t *mant, int *exp10) {
    uint64_t m = 0;
    const char *p = s;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') m = m * 10 + (uint64_t)(*p - '0');
    *mant = m;
    *exp10 = *p == 'e' ? atoi(p + 1) : 0;
}

static uint64_t pow10u(int p) {
    uint64_t r = 1;
    while (p-- > 0)
        r *= 10;
    return r;
}

/* Does mantissa m (p digits) x 10^(e-p+1) read back as d? */
static int roundtrips(uint64_t m, int p, int e, double d) {
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "%llue%d", (unsigned long long)m, e - p + 1);
    return strtod(tmp, NULL) == d;
}

int dsi_json_format_double(double d, char *out, size_t cap) {
    if (!isfinite(d) || cap < 32) return -1;
    if (d == 0) return snprintf(out, cap, "%s", signbit(d) ? "-0.0" : "0.0");
    int neg = d < 0;
    double a = fabs(d);
    uint64_t mant = 0;
    int e = 0, p;
    for (p = 1; p <= 17; p++) {
        char tmp[64];
        snprintf(tmp, sizeof(tmp), "%.*e", p - 1, a);
        split_sci(tmp, &mant, &e);
        if (strtod(tmp, NULL) == a) break;
        /* neighbours of the rounded mantissa, normalised to p digits */
        uint64_t lo = pow10u(p - 1), hi = pow10u(p);
        uint64_t up = mant + 1, dn = mant - 1;
        int eu = e, ed = e;
        if (up == hi) up = lo, eu = e + 1;
        if (mant == lo) dn = hi - 1, ed = e - 1;
        if (p > 1 || dn > 0) {
            if (roundtrips(dn, p, ed, a)) {
                mant = dn, e = ed;
                break;
            }
        }
        if (roundtrips(up, p, eu, a)) {
            mant = up, e = eu;
            break;
        }
    }
    if (p > 17) p = 17; /* unreachable: 17 digits always round-trip */
    char digits[24];
    int nd = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)mant);
    while (nd > 1 && digits[nd - 1] == '0')
        digits[--nd] = 0;
    int decpt = e + 1;
    char *o = out;
    size_t left = cap;
#define EMIT(...)                                                                                  \
    do {                                                                                           \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                   \
        if (w_ < 0 || (size_t)w_ >= left) return -1;                                               \
        o += w_, left -= (size_t)w_;                                                               \
    } while (0)
    if (neg) EMIT("-");
    if (decpt <= -4 || decpt > 16) {
        EMIT("%c", digits[0]);
        if (nd > 1) EMIT(".%s", digits + 1);
        EMIT("e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    } else if (decpt <= 0) {
        EMIT("0.");
        for (int i = 0; i < -decpt; i++)
            EMIT("0");
        EMIT("%s", digits);
    } else if (decpt >= nd) {
        EMIT("%s", digits);
        for (int i = nd; i < decpt; i++)
            EMIT("0");
        EMIT(".0");
    } else {
        EMIT("%.*s.%s", decpt, digits, digits + decpt);
    }
#undef EMIT
    return (int)(o - out);
}

/* ---------------------------------------------------------------------------------------- */
/* Strings                                                                                  */

/* Decode one UTF-8 sequence at s (valid input assumed; invalid bytes come back as themselves). */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *adv) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if ((size_t)len > n) len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i < len; i++)
        cp = (cp << 6) | (s[i] & 0x3f);
    *adv = (size_t)len;
    return cp;
}

static void put_string(struct jbuf *b, const char *s, size_t n, int flags) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    jb_put(b, "\"", 1);
    size_t run = 0; /* start of the pending run of bytes copied verbatim */
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        const char *esc = NULL;
        char ubuf[16];
        size_t adv = 1;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20 || (c == 0x7f && (flags & DSI_JSON_ASCII))) {
                snprintf(ubuf, sizeof(ubuf), "\\u00%c%c", hex[c >> 4], hex[c & 15]);
                esc = ubuf;
            } else if (c >= 0x80 && (flags & DSI_JSON_ASCII)) {
                uint32_t cp = utf8_next(u + i, n - i, &adv);
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    unsigned hi = 0xd800 + (cp >> 10), lo = 0xdc00 + (cp & 0x3ff);
                    snprintf(ubuf, sizeof(ubuf), "\\u%04x\\u%04x", hi, lo);
                } else {
                    snprintf(ubuf, sizeof(ubuf), "\\u%04x", (unsigned)cp);
                }
                esc = ubuf;
            }
        }
        if (esc) {
            jb_put(b, s + run, i - run);
            jb_puts(b, esc);
            i += adv;
            run = i;
        } else {
            i++;
        }
    }
    jb_put(b, s + run, n - run);
    jb_put(b, "\"", 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Values                                                                                   */

static int put_value(struct jbuf *b, const json_t *v, int flags, int depth, struct dsi_err *err) {
    if (depth > JSON_MAX_DEPTH)
        return dsi_errf(err, DSI_ERR_INVALID, "json: nesting deeper than %d", JSON_MAX_DEPTH);
    const char *comma = (flags & DSI_JSON_COMPACT) ? "," : ", ";
    const char *colon = (flags & DSI_JSON_COMPACT) ? ":" : ": ";
    char num[64];
    switch (json_typeof(v)) {
    case JSON_NULL:
        jb_puts(b, "null");
        break;
    case JSON_TRUE:
        jb_puts(b, "true");
        break;
    case JSON_FALSE:
        jb_puts(b, "false");
        break;
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        jb_puts(b, num);
        break;
    case JSON_REAL:
        if (dsi_json_format_double(json_real_value(v), num, sizeof(num)) < 0)
            return dsi_errf(err, DSI_ERR_INVALID, "json: real value %g cannot be written",
                            json_real_value(v));
        jb_puts(b, num);
        break;
    case JSON_STRING:
        put_string(b, json_string_value(v), json_string_length(v), flags);
        break;
    case JSON_ARRAY: {
        jb_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) jb_puts(b, comma);
            int rc = put_value(b, json_array_get(v, i), flags, depth + 1, err);
            if (rc) return rc;
        }
        jb_put(b, "]", 1);
        break;
    }
    case JSON_OBJECT: {
        jb_put(b, "{", 1);
        int first = 1;
        /* jansson's iterators take a non-const object; iteration does not modify it. */
        json_t *obj = (json_t *)(uintptr_t)v;
        for (void *it = json_object_iter(obj); it; it = json_object_iter_next(obj, it)) {
            if (!first) jb_puts(b, comma);
            first = 0;
            put_string(b, json_object_iter_key(it), json_object_iter_key_len(it), flags);
            jb_puts(b, colon);
            int rc = put_value(b, json_object_iter_value(it), flags, depth + 1, err);
            if (rc) return rc;
        }
        jb_put(b, "}", 1);
        break;
    }
    default:
        return dsi_errf(err, DSI_ERR_INVALID, "json: unknown value type");
    }
    return DSI_OK;
}

int dsi_json_append(
    const json_t *v, int flags, char **buf, size_t *len, size_t *cap, struct dsi_err *err) {
    if (!v) return dsi_errf(err, DSI_ERR_INVALID, "json: NULL value");
    struct jbuf b = {buf, len, cap, 0};
    size_t start = *len;
    int rc = put_value(&b, v, flags, 0, err);
    if (!rc && b.oom) rc = dsi_errf(err, DSI_ERR_NOMEM, "json: out of memory");
    if (rc && *buf) {
        *len = start; /* leave the buffer as it was */
        (*buf)[start] = 0;
    }
    return rc;
}

int dsi_json_append_string(
    const char *s, size_t n, int flags, char **buf, size_t *len, size_t *cap, struct dsi_err *err) {
    struct jbuf b = {buf, len, cap, 0};
    put_string(&b, s, n, flags);
    if (b.oom) return dsi_errf(err, DSI_ERR_NOMEM, "json: out of memory");
    return DSI_OK;
}

int dsi_json_dumps(const json_t *v, int flags, char **out, size_t *len, struct dsi_err *err) {
    char *buf = NULL;
    size_t n = 0, cap = 0;
    *out = NULL;
    int rc = dsi_json_append(v, flags, &buf, &n, &cap, err);
    if (rc) {
        free(buf);
        return rc;
    }
    if (!buf) { /* cannot happen: every value writes something */
        buf = calloc(1, 1);
        if (!buf) return dsi_errf(err, DSI_ERR_NOMEM, "json: out of memory");
    }
    *out = buf;
    if (len) *len = n;
    return DSI_OK;
}
