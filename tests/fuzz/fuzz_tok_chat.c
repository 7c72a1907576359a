/* fuzz_tok_chat.c - libFuzzer target for the chat side of src/tok: the streaming parser of
 * generated text (DSML tool calls) fed whole and in pieces (the events must agree, text of one
 * kind joined), and the prompt renderer on the same bytes read as JSON messages.
 * Input: byte 0 = mode (bit 0), piece size (bits 1-4) and options, the rest = text. */
#include "tok/chat.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Events as records: kind byte, size_t length, payload; adjacent text of one kind merged. */
struct acc {
    char *buf;
    size_t len, cap, last; /* offset of the last record */
    char last_kind;
};

static void grow(struct acc *a, size_t n) {
    if (a->len + n > a->cap) {
        a->cap = 2 * (a->len + n) + 64;
        a->buf = realloc(a->buf, a->cap);
        if (!a->buf) abort();
    }
}

static void put(struct acc *a, char kind, const char *s, size_t n) {
    if ((kind == 'c' || kind == 'r') && kind == a->last_kind) {
        size_t cur;
        grow(a, n);
        memcpy(&cur, a->buf + a->last + 1, sizeof(cur));
        cur += n;
        memcpy(a->buf + a->last + 1, &cur, sizeof(cur));
        memcpy(a->buf + a->len, s, n);
        a->len += n;
        return;
    }
    grow(a, 1 + sizeof(size_t) + n);
    a->last = a->len;
    a->last_kind = kind;
    a->buf[a->len] = kind;
    memcpy(a->buf + a->len + 1, &n, sizeof(n));
    memcpy(a->buf + a->len + 1 + sizeof(n), s, n);
    a->len += 1 + sizeof(n) + n;
}

static int on_ev(void *user, const struct dsi_chat_event *ev) {
    struct acc *a = user;
    if (ev->kind == DSI_CHAT_EV_TOOL_CALL) {
        put(a, 't', ev->name, strlen(ev->name));
        put(a, 'a', ev->arguments, strlen(ev->arguments));
    } else if (ev->kind == DSI_CHAT_EV_END) {
        put(a, 'e', "", 0);
    } else {
        if (ev->len == 0) __builtin_trap(); /* no empty text events */
        put(a, ev->kind == DSI_CHAT_EV_CONTENT ? 'c' : 'r', ev->text, ev->len);
    }
    return 0;
}

static void parse(const char *s, size_t n, int mode, size_t step, struct acc *a) {
    struct dsi_chat_parser *p;
    if (dsi_chat_parser_new(&p, mode, NULL)) abort();
    for (size_t i = 0; i < n; i += step)
        if (dsi_chat_parser_feed(p, s + i, step < n - i ? step : n - i, on_ev, a)) abort();
    if (dsi_chat_parser_finish(p, on_ev, a)) abort();
    dsi_chat_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int mode = data[0] & 1;
    size_t step = 1 + ((data[0] >> 1) & 15);
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    struct acc whole = {0}, pieces = {0};
    parse(s, n, mode, n ? n : 1, &whole);
    parse(s, n, mode, step, &pieces);
    if (whole.len != pieces.len || (whole.len && memcmp(whole.buf, pieces.buf, whole.len)))
        __builtin_trap();
    free(whole.buf);
    free(pieces.buf);
    json_t *msg;
    if (dsi_chat_parse(s, n, mode, &msg, NULL) == 0) json_decref(msg);

    json_t *j = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    if (j) {
        struct dsi_chat_opts o = dsi_chat_opts_default();
        o.mode = mode;
        o.drop_thinking = data[0] & 32;
        o.effort = (data[0] >> 6) % 3;
        char *out;
        if (dsi_chat_render(j, &o, &out, NULL, NULL) == 0) free(out);
        json_decref(j);
    }
    return 0;
}
