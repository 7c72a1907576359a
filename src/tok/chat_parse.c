/* chat_parse.c - incremental parser of generated DeepSeek-V4 text. See chat.h.
 *
 * States: REASONING (thinking mode, until </think>) -> CONTENT -> TOOLS (inside a DSML
 * tool-call block, buffered until its closing tag) -> CONTENT ... ; EOS ends everything.
 * Undecided text (a suffix that may be the start of a marker) waits in `pend`. A tool-call
 * block that does not parse is given back as content, byte for byte, including its opener.
 * In REASONING a tool-call opener also ends the reasoning, so a model that skips </think>
 * cannot hide its tool calls inside the reasoning. */
#include "tok/chat.h"
#include "tok/dsml.h"
#include "tok/tbuf.h"
#include "tok/utf8.h"

#define EOS_TEXT                                                                                   \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define THINK_OPEN  "<think>"
#define THINK_CLOSE "</think>"
#define CALLS_OPEN  DSI_DSML_CALLS_OPEN
#define CALLS_CLOSE DSI_DSML_CALLS_CLOSE

enum { ST_REASONING, ST_CONTENT, ST_TOOLS, ST_DONE };

struct dsi_chat_parser {
    int state;
    bool at_start;        /* nothing consumed yet (a leading <think> is dropped) */
    struct dsi_tbuf pend; /* undecided text */
    struct dsi_tbuf open; /* the exact opener text of the current tool-call block */
    int n_calls;
    struct dsi_dsml_calls calls;
};

int dsi_chat_parser_new(struct dsi_chat_parser **out, int mode, struct dsi_err *err) {
    *out = NULL;
    struct dsi_chat_parser *p = calloc(1, sizeof(*p));
    if (!p) return dsi_errf(err, DSI_ERR_NOMEM, "chat parser: out of memory");
    p->state = mode == DSI_CHAT_MODE_THINKING ? ST_REASONING : ST_CONTENT;
    p->at_start = true;
    *out = p;
    return DSI_OK;
}

void dsi_chat_parser_free(struct dsi_chat_parser *p) {
    if (!p) return;
    free(p->pend.p);
    free(p->open.p);
    dsi_dsml_calls_clear(&p->calls);
    free(p);
}

static int emit_text(int kind, const char *s, size_t n, dsi_chat_event_fn fn, void *user) {
    if (n == 0) return 0;
    struct dsi_chat_event ev = {.kind = kind, .text = s, .len = n};
    return fn(user, &ev);
}

/* Earliest occurrence of pat in s[0..n), or n. */
static size_t find_at(const char *s, size_t n, const char *pat) {
    size_t pl = strlen(pat);
    for (size_t i = 0; i + pl <= n; i++) {
        const char *q = memchr(s + i, pat[0], n - i);
        if (!q) return n;
        i = (size_t)(q - s);
        if (i + pl <= n && !memcmp(q, pat, pl)) return i;
    }
    return n;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of pat. */
static size_t partial(const char *s, size_t n, const char *pat) {
    size_t pl = strlen(pat);
    for (size_t k = DSI_MIN(n, pl - 1); k > 0; k--)
        if (!memcmp(s + n - k, pat, k)) return k;
    return 0;
}

/* Length of an unfinished UTF-8 character at the end of s[0..n) (held back so that events
 * carry whole characters even when the caller splits one). */
static size_t utf8_tail(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xc0) == 0x80) continue;
        size_t l;
        return c >= 0xc0 &&
                       dsi_utf8_scan((const unsigned char *)s + n - k, k, &l) == DSI_UTF8_INCOMPLETE
                   ? k
                   : 0;
    }
    return 0;
}

/* Start of the tool-call opener at position i: include up to two newlines before it. */
static size_t opener_start(const char *s, size_t i) {
    size_t j = i;
    while (j > 0 && i - j < 2 && s[j - 1] == '\n')
        j--;
    return j;
}

/* Emit a parsed block's calls, or the raw block as content. */
static int finish_block(struct dsi_chat_parser *p,
                        const char *body,
                        size_t n,
                        bool closed,
                        dsi_chat_event_fn fn,
                        void *user) {
    int ok = closed ? dsi_dsml_parse_block(body, n, &p->calls) : 0;
    int rc = 0;
    if (ok > 0) {
        for (size_t i = 0; i < p->calls.n && !rc; i++) {
            struct dsi_chat_event ev = {.kind = DSI_CHAT_EV_TOOL_CALL,
                                        .name = p->calls.v[i].name,
                                        .arguments = p->calls.v[i].arguments,
                                        .index = p->n_calls++};
            rc = fn(user, &ev);
        }
    } else {
        rc = emit_text(DSI_CHAT_EV_CONTENT, p->open.p, p->open.len, fn, user);
        if (!rc) rc = emit_text(DSI_CHAT_EV_CONTENT, body, n, fn, user);
        if (!rc && closed)
            rc = emit_text(DSI_CHAT_EV_CONTENT, CALLS_CLOSE, strlen(CALLS_CLOSE), fn, user);
    }
    dsi_dsml_calls_clear(&p->calls);
    p->open.len = 0;
    return rc;
}

/* Process pend as far as it can be decided. final: no more text will come. */
static int advance(struct dsi_chat_parser *p, bool final, dsi_chat_event_fn fn, void *user) {
    int rc = 0;
    while (!rc && p->state != ST_DONE) {
        const char *s = p->pend.p ? p->pend.p : "";
        size_t n = p->pend.len;
        if (p->state == ST_REASONING && p->at_start) {
            if (n >= strlen(THINK_OPEN) && !memcmp(s, THINK_OPEN, strlen(THINK_OPEN))) {
                dsi_tbuf_consume(&p->pend, strlen(THINK_OPEN));
                p->at_start = false;
                continue;
            }
            if (!final && n < strlen(THINK_OPEN) && !memcmp(s, THINK_OPEN, n)) return 0;
        }
        if (n) p->at_start = false;
        if (p->state == ST_TOOLS) {
            size_t c = find_at(s, n, CALLS_CLOSE), e = find_at(s, n, EOS_TEXT);
            if (c < n && c < e) {
                rc = finish_block(p, s, c, true, fn, user);
                dsi_tbuf_consume(&p->pend, c + strlen(CALLS_CLOSE));
                p->state = ST_CONTENT;
                continue;
            }
            if (e < n || final) { /* unterminated block: give it back as content */
                rc = finish_block(p, s, e, false, fn, user);
                dsi_tbuf_consume(&p->pend, e);
                p->state = ST_CONTENT;
                continue;
            }
            return 0;
        }
        int kind = p->state == ST_REASONING ? DSI_CHAT_EV_REASONING : DSI_CHAT_EV_CONTENT;
        size_t t = p->state == ST_REASONING ? find_at(s, n, THINK_CLOSE) : n;
        size_t o = find_at(s, n, CALLS_OPEN), e = find_at(s, n, EOS_TEXT);
        size_t first = DSI_MIN(t, DSI_MIN(o, e));
        if (first < n && first == e) {
            rc = emit_text(kind, s, e, fn, user);
            struct dsi_chat_event ev = {.kind = DSI_CHAT_EV_END};
            if (!rc) rc = fn(user, &ev);
            p->pend.len = 0;
            p->state = ST_DONE;
            return rc;
        }
        if (first < n && first == t) {
            rc = emit_text(kind, s, t, fn, user);
            dsi_tbuf_consume(&p->pend, t + strlen(THINK_CLOSE));
            p->state = ST_CONTENT;
            continue;
        }
        if (first < n) { /* tool-call opener */
            size_t j = opener_start(s, o);
            rc = emit_text(kind, s, j, fn, user);
            p->open.len = 0;
            dsi_tbuf_put(&p->open, s + j, o + strlen(CALLS_OPEN) - j);
            dsi_tbuf_consume(&p->pend, o + strlen(CALLS_OPEN));
            p->state = ST_TOOLS;
            continue;
        }
        /* nothing found: keep back what may start a marker, emit the rest */
        size_t hold = 0;
        if (!final) {
            hold = DSI_MAX(partial(s, n, EOS_TEXT), partial(s, n, CALLS_OPEN));
            if (p->state == ST_REASONING) hold = DSI_MAX(hold, partial(s, n, THINK_CLOSE));
            size_t nl = 0; /* newlines that may precede a tool-call opener */
            while (nl < 2 && nl < n - hold && s[n - hold - nl - 1] == '\n')
                nl++;
            hold += nl;
            hold = DSI_MAX(hold, utf8_tail(s, n));
        }
        rc = emit_text(kind, s, n - hold, fn, user);
        dsi_tbuf_consume(&p->pend, n - hold);
        return rc;
    }
    if (p->state == ST_DONE) p->pend.len = 0;
    return rc;
}

int dsi_chat_parser_feed(
    struct dsi_chat_parser *p, const char *text, size_t len, dsi_chat_event_fn fn, void *user) {
    if (p->state == ST_DONE) return 0;
    dsi_tbuf_put(&p->pend, text, len);
    if (p->pend.oom) return DSI_ERR_NOMEM;
    return advance(p, false, fn, user);
}

int dsi_chat_parser_finish(struct dsi_chat_parser *p, dsi_chat_event_fn fn, void *user) {
    int rc = advance(p, true, fn, user);
    p->pend.len = 0;
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Whole-message convenience                                                                */

struct collect {
    struct dsi_tbuf content, reasoning;
    json_t *calls;
    int oom;
};

static int collect_ev(void *user, const struct dsi_chat_event *ev) {
    struct collect *c = user;
    if (ev->kind == DSI_CHAT_EV_CONTENT)
        dsi_tbuf_put(&c->content, ev->text, ev->len);
    else if (ev->kind == DSI_CHAT_EV_REASONING)
        dsi_tbuf_put(&c->reasoning, ev->text, ev->len);
    else if (ev->kind == DSI_CHAT_EV_TOOL_CALL) {
        json_t *tc = json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name",
                               ev->name, "arguments", ev->arguments);
        if (!tc || json_array_append_new(c->calls, tc)) c->oom = 1;
    }
    return 0;
}

int dsi_chat_parse(const char *text, size_t len, int mode, json_t **msg, struct dsi_err *err) {
    *msg = NULL;
    struct dsi_chat_parser *p = NULL;
    int rc = dsi_chat_parser_new(&p, mode, err);
    if (rc) return rc;
    struct collect c = {.calls = json_array()};
    rc = dsi_chat_parser_feed(p, text, len, collect_ev, &c);
    if (!rc) rc = dsi_chat_parser_finish(p, collect_ev, &c);
    dsi_chat_parser_free(p);
    json_t *m = NULL;
    if (!rc && c.calls && !c.oom && !c.content.oom && !c.reasoning.oom)
        m = json_pack("{s:s, s:s%, s:s%, s:O}", "role", "assistant", "content",
                      c.content.p ? c.content.p : "", c.content.len, "reasoning_content",
                      c.reasoning.p ? c.reasoning.p : "", c.reasoning.len, "tool_calls", c.calls);
    free(c.content.p);
    free(c.reasoning.p);
    json_decref(c.calls);
    if (!m) {
        return dsi_errf(err, rc ? rc : DSI_ERR_INVALID, "chat parse: %s",
                        rc ? "out of memory" : "text is not valid UTF-8 or out of memory");
    }
    *msg = m;
    return DSI_OK;
}
