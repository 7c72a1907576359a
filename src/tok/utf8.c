/* utf8.c - UTF-8 scanning, lossy repair, byte-level alphabet. See utf8.h. */
#include "tok/utf8.h"

#include <string.h>

int dsi_utf8_scan(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    if (c < 0x80) {
        *len = 1;
        return DSI_UTF8_OK;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        need = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        *len = 1;
        return DSI_UTF8_BAD;
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n) {
            *len = i;
            return DSI_UTF8_INCOMPLETE;
        }
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xbf;
        if (b < l || b > h) {
            *len = i;
            return DSI_UTF8_BAD;
        }
    }
    *len = need;
    return DSI_UTF8_OK;
}

size_t dsi_utf8_valid_len(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* fast path: 8 ASCII bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        size_t len;
        if (dsi_utf8_scan(u + i, n - i, &len) != DSI_UTF8_OK) return i;
        i += len;
    }
    return n;
}

int dsi_utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int dsi_utf8_lossy(const char *s, size_t n, char **out, size_t *out_len, struct dsi_err *err) {
    /* each bad byte becomes at most 3 bytes */
    char *o = malloc(n * 3 + 1);
    if (!o) return dsi_errf(err, DSI_ERR_NOMEM, "utf8: out of memory");
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, k = 0;
    while (i < n) {
        size_t len;
        int st = dsi_utf8_scan(u + i, n - i, &len);
        if (st == DSI_UTF8_OK) {
            memcpy(o + k, s + i, len);
            k += len;
        } else {
            memcpy(o + k, "\xef\xbf\xbd", 3);
            k += 3;
        }
        i += len;
    }
    o[k] = 0;
    *out = o;
    if (out_len) *out_len = k;
    return DSI_OK;
}

/* bytes_to_unicode() of GPT-2: printable bytes map to themselves, the 68 others to 256+k. */
static int printable(unsigned b) {
    return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t dsi_bytelevel_char(uint8_t b) {
    if (printable(b)) return b;
    uint32_t k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!printable(x)) k++;
    return 256 + k;
}

int dsi_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (unsigned x = 0; x < 256; x++)
        if (!printable(x) && k-- == 0) return (int)x;
    return -1;
}
