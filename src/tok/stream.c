/* stream.c - incremental detokenizer that only ever emits valid UTF-8. See bpe.h.
 *
 * Invariant: pending[0..npend) is a valid but unfinished prefix of one UTF-8 sequence (at most
 * 3 bytes). Each feed appends the token's bytes, emits every complete sequence (ill-formed
 * maximal subparts as U+FFFD) and keeps an unfinished tail as the new pending bytes. Because
 * a maximal subpart is decided by the bytes up to where it ends, this emits exactly what a
 * lossy decode of the whole sequence would. */
#include "tok/bpe_internal.h"
#include "tok/utf8.h"

#include <string.h>

struct dsi_bpe_stream {
    const struct dsi_bpe *bpe;
    unsigned flags;
    unsigned char pending[4];
    size_t npend;
    char *out; /* owned; returned text points here */
    size_t cap;
};

int dsi_bpe_stream_new(struct dsi_bpe_stream **out,
                       const struct dsi_bpe *bpe,
                       unsigned flags,
                       struct dsi_err *err) {
    struct dsi_bpe_stream *s = calloc(1, sizeof(*s));
    if (!s) return dsi_errf(err, DSI_ERR_NOMEM, "tokenizer: out of memory");
    s->bpe = bpe;
    s->flags = flags;
    *out = s;
    return DSI_OK;
}

void dsi_bpe_stream_free(struct dsi_bpe_stream *s) {
    if (!s) return;
    free(s->out);
    free(s);
}

int dsi_bpe_stream_feed(
    struct dsi_bpe_stream *s, int32_t id, const char **text, size_t *len, struct dsi_err *err) {
    const char *tb;
    size_t tl;
    *text = "";
    *len = 0;
    int rc = dsi_bpe_token_bytes(s->bpe, id, &tb, &tl, err);
    if (rc) return rc;
    if ((s->flags & DSI_DECODE_SKIP_SPECIAL) && (s->bpe->tok_flags[id] & TOKF_SPECIAL))
        return DSI_OK;
    size_t n = s->npend + tl;
    /* worst case: every byte becomes U+FFFD (3 bytes); the input is staged at the end */
    size_t need = 4 * n + 8;
    if (need > s->cap) {
        char *p = realloc(s->out, need);
        if (!p) return dsi_errf(err, DSI_ERR_NOMEM, "tokenizer: out of memory");
        s->out = p;
        s->cap = need;
    }
    unsigned char *in = (unsigned char *)s->out + 3 * n + 8;
    memcpy(in, s->pending, s->npend);
    memcpy(in + s->npend, tb, tl);
    size_t i = 0, k = 0;
    s->npend = 0;
    while (i < n) {
        size_t l;
        int st = dsi_utf8_scan(in + i, n - i, &l);
        if (st == DSI_UTF8_INCOMPLETE) {
            memcpy(s->pending, in + i, l);
            s->npend = l;
            break;
        }
        if (st == DSI_UTF8_OK)
            memmove(s->out + k, in + i, l), k += l;
        else
            memcpy(s->out + k, "\xef\xbf\xbd", 3), k += 3;
        i += l;
    }
    s->out[k] = 0;
    *text = s->out;
    *len = k;
    return DSI_OK;
}

void dsi_bpe_stream_flush(struct dsi_bpe_stream *s, const char **text, size_t *len) {
    if (s->npend) {
        *text = "\xef\xbf\xbd";
        *len = 3;
    } else {
        *text = "";
        *len = 0;
    }
    s->npend = 0;
}

void dsi_bpe_stream_reset(struct dsi_bpe_stream *s) { s->npend = 0; }
