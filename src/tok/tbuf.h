/* tbuf.h - growable text buffer for the chat renderer and parser. Out-of-memory is sticky:
 * appends after a failure do nothing and the owner checks `oom` once at the end. The data is
 * always NUL-terminated once anything was appended. Owner frees p with free(). */
#ifndef DSI_TOK_TBUF_H
#define DSI_TOK_TBUF_H

#include "core/core.h"

#include <string.h>

struct dsi_tbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static inline bool dsi_tbuf_reserve(struct dsi_tbuf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + extra + 1)
        nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) {
        b->oom = true;
        return false;
    }
    b->p = np;
    b->cap = nc;
    return true;
}

static inline void dsi_tbuf_put(struct dsi_tbuf *b, const char *s, size_t n) {
    if (!dsi_tbuf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static inline void dsi_tbuf_puts(struct dsi_tbuf *b, const char *s) {
    dsi_tbuf_put(b, s, strlen(s));
}

/* Drop the first n bytes. */
static inline void dsi_tbuf_consume(struct dsi_tbuf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
    if (b->p) b->p[b->len] = 0;
}

#endif
