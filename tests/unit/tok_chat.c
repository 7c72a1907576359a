/* tok_chat.c - chat rendering against DeepSeek's own test pairs and ref/tok_chat_ref.py's
 * goldens; parsing of generated text, whole and streamed, well-formed and malformed. */
#include "test.h"
#include "tok/chat.h"

#include <jansson.h>
#include <stdlib.h>

static json_t *load(struct test_ctx *t, const char *rel) {
    json_error_t je;
    json_t *j = json_load_file(test_path(t, rel), 0, &je);
    if (!j) fprintf(stderr, "  %s: %s\n", rel, je.text);
    return j;
}

static char *slurp(struct test_ctx *t, const char *rel, size_t *len) {
    char *s = NULL;
    if (dsi_read_file(test_path(t, rel), &s, len, NULL)) return NULL;
    return s;
}

static int same_text(const char *got, size_t gl, const char *want, size_t wl, const char *what) {
    if (gl == wl && !memcmp(got, want, gl)) return 0;
    size_t i = 0;
    while (i < gl && i < wl && got[i] == want[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: differs at byte %zu:\n    got  '%.*s'\n    want '%.*s'\n", what, i,
            (int)DSI_MIN(gl - from, 100), got + from, (int)DSI_MIN(wl - from, 100), want + from);
    return 1;
}

int test_chat_official(struct test_ctx *t) {
    static const int modes[4] = {DSI_CHAT_MODE_THINKING, DSI_CHAT_MODE_THINKING,
                                 DSI_CHAT_MODE_THINKING, DSI_CHAT_MODE_CHAT};
    for (int n = 1; n <= 4; n++) {
        char rel[128];
        snprintf(rel, sizeof(rel), "tests/golden/tok/chat/official_input_%d.json", n);
        json_t *in = load(t, rel);
        TEST_ASSERT(in);
        json_t *msgs = in;
        if (json_is_object(in)) { /* case 1: the tools go on the first (system) message */
            msgs = json_object_get(in, "messages");
            json_object_set(json_array_get(msgs, 0), "tools", json_object_get(in, "tools"));
        }
        snprintf(rel, sizeof(rel), "tests/golden/tok/chat/official_output_%d.txt", n);
        size_t wl;
        char *want = slurp(t, rel, &wl);
        TEST_ASSERT(want);
        struct dsi_chat_opts o = dsi_chat_opts_default();
        o.mode = modes[n - 1];
        char *got;
        size_t gl;
        struct dsi_err err = {0};
        TEST_ASSERTF(dsi_chat_render(msgs, &o, &got, &gl, &err) == 0, "case %d: %s", n, err.msg);
        TEST_ASSERT(same_text(got, gl, want, wl, rel) == 0);
        free(got);
        free(want);
        json_decref(in);
    }
    return 0;
}

static int opts_from_json(const json_t *j, struct dsi_chat_opts *o) {
    *o = dsi_chat_opts_default();
    const char *mode = json_string_value(json_object_get(j, "mode"));
    o->mode = mode && !strcmp(mode, "thinking") ? DSI_CHAT_MODE_THINKING : DSI_CHAT_MODE_CHAT;
    if (json_object_get(j, "drop_thinking"))
        o->drop_thinking = json_is_true(json_object_get(j, "drop_thinking"));
    if (json_object_get(j, "add_bos")) o->add_bos = json_is_true(json_object_get(j, "add_bos"));
    const char *eff = json_string_value(json_object_get(j, "effort"));
    o->effort = !eff                  ? DSI_CHAT_EFFORT_NONE
                : !strcmp(eff, "max") ? DSI_CHAT_EFFORT_MAX
                                      : DSI_CHAT_EFFORT_HIGH;
    o->context = json_object_get(j, "context");
    return 0;
}

int test_chat_cases(struct test_ctx *t) {
    json_t *g = load(t, "tests/golden/tok/chat/cases.json");
    TEST_ASSERT(g);
    size_t i;
    json_t *c;
    int bad = 0;
    json_array_foreach(g, i, c) {
        struct dsi_chat_opts o;
        opts_from_json(json_object_get(c, "opts"), &o);
        char *got;
        size_t gl;
        struct dsi_err err = {0};
        const char *name = json_string_value(json_object_get(c, "name"));
        if (dsi_chat_render(json_object_get(c, "messages"), &o, &got, &gl, &err)) {
            fprintf(stderr, "  %s: %s\n", name, err.msg);
            bad++;
            continue;
        }
        const json_t *want = json_object_get(c, "prompt");
        bad += same_text(got, gl, json_string_value(want), json_string_length(want), name);
        free(got);
    }
    TEST_ASSERT(i >= 30 && bad == 0);
    json_decref(g);
    return 0;
}

int test_chat_prompt_helper(struct test_ctx *t) {
    char *s;
    size_t n;
    TEST_ASSERT(dsi_chat_render_prompt("You are a helpful assistant.", "What is 2+2?",
                                       DSI_CHAT_MODE_THINKING, DSI_CHAT_EFFORT_NONE, &s, &n,
                                       NULL) == 0);
    TEST_ASSERT(!strcmp(s, "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is "
                           "2+2?<｜Assistant｜><think>"));
    free(s);
    TEST_ASSERT(dsi_chat_render_prompt(NULL, "Hi", DSI_CHAT_MODE_CHAT, DSI_CHAT_EFFORT_NONE, &s, &n,
                                       NULL) == 0);
    TEST_ASSERT(!strcmp(s, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"));
    free(s);
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_chat_render_prompt(NULL, "bad \xff", 0, 0, &s, &n, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(strstr(err.msg, "UTF-8"));
    (void)t;
    return 0;
}

/* Request-level tools attach to the system message, or to a new empty one. */
int test_chat_request_tools(struct test_ctx *t) {
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                               "\"parameters\": {}}}]",
                               0, NULL);
    json_t *m1 = json_loads("[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
                            "\"content\": \"U\"}]",
                            0, NULL);
    json_t *m2 = json_deep_copy(m1);
    json_object_set(json_array_get(m2, 0), "tools", tools);
    struct dsi_chat_opts o = dsi_chat_opts_default();
    char *a, *b;
    TEST_ASSERT(dsi_chat_render(m2, &o, &b, NULL, NULL) == 0);
    o.tools = tools;
    TEST_ASSERT(dsi_chat_render(m1, &o, &a, NULL, NULL) == 0);
    TEST_ASSERT(!strcmp(a, b));
    TEST_ASSERT(strstr(a, "## Tools") && strstr(a, "{\"name\": \"f\", \"parameters\": {}}"));
    free(a);
    free(b);
    json_array_remove(m1, 0);
    TEST_ASSERT(dsi_chat_render(m1, &o, &a, NULL, NULL) == 0);
    TEST_ASSERT(!strncmp(a, "<｜begin▁of▁sentence｜>\n\n## Tools",
                         strlen("<｜begin▁of▁sentence｜>\n\n## Tools")));
    /* the caller's messages are not modified */
    TEST_ASSERT(json_array_size(m1) == 1 && !json_object_get(json_array_get(m1, 0), "tools"));
    free(a);
    json_decref(tools);
    json_decref(m1);
    json_decref(m2);
    (void)t;
    return 0;
}

static int render_err(const char *msgs_json, int mode, const char *want) {
    json_t *m = json_loads(msgs_json, JSON_DECODE_ANY, NULL);
    struct dsi_chat_opts o = dsi_chat_opts_default();
    o.mode = mode;
    char *s = NULL;
    struct dsi_err err = {0};
    int rc = dsi_chat_render(m, &o, &s, NULL, &err);
    json_decref(m);
    if (rc != DSI_ERR_INVALID || s || !strstr(err.msg, want)) {
        fprintf(stderr, "  %s: rc %d '%s' (want '%s')\n", msgs_json, rc, err.msg, want);
        free(s);
        return 1;
    }
    return 0;
}

int test_chat_errors(struct test_ctx *t) {
    int bad = 0;
    bad += render_err("{}", 0, "not a list");
    bad += render_err("[1]", 0, "not an object");
    bad += render_err("[{\"role\": \"robot\", \"content\": \"x\"}]", 0, "unknown role 'robot'");
    bad += render_err("[{\"content\": \"x\"}]", 0, "no role");
    bad += render_err("[{\"role\": \"developer\", \"content\": \"\"}]", 0, "developer message");
    bad += render_err("[{\"role\": \"user\", \"content\": \"x\", \"task\": \"dance\"}]", 0,
                      "invalid task 'dance'");
    bad += render_err("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {}}]}]", 0,
                      "function.name");
    bad += render_err("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": "
                      "\"f\"}}]}]",
                      0, "without arguments");
    bad += render_err("[{\"role\": \"system\", \"content\": \"x\", \"tools\": {\"a\": 1}}]", 0,
                      "tools is not a list");
    bad += render_err("[{\"role\": \"system\", \"content\": \"x\", \"tools\": [{\"x\": 1}]}]", 0,
                      "has no function");
    bad += render_err("[{\"role\": \"system\", \"content\": [1]}]", 0, "must be a string");
    bad += render_err("[{\"role\": \"tool\", \"content\": {\"a\": 1}}]", 0, "must be a string");
    struct dsi_chat_opts o = dsi_chat_opts_default();
    o.mode = 7;
    char *s;
    json_t *m = json_array();
    TEST_ASSERT(dsi_chat_render(m, &o, &s, NULL, NULL) == DSI_ERR_INVALID);
    json_decref(m);
    TEST_ASSERT(bad == 0);
    (void)t;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Parsing                                                                                  */

struct events {
    char content[8192], reasoning[8192], calls[8192];
    size_t cl, rl, kl;
    int ends;
};

static int on_event(void *user, const struct dsi_chat_event *ev) {
    struct events *e = user;
    if (ev->kind == DSI_CHAT_EV_CONTENT) {
        memcpy(e->content + e->cl, ev->text, ev->len);
        e->cl += ev->len;
    } else if (ev->kind == DSI_CHAT_EV_REASONING) {
        memcpy(e->reasoning + e->rl, ev->text, ev->len);
        e->rl += ev->len;
    } else if (ev->kind == DSI_CHAT_EV_TOOL_CALL) {
        e->kl += (size_t)snprintf(e->calls + e->kl, sizeof(e->calls) - e->kl, "%d:%s(%s);",
                                  ev->index, ev->name, ev->arguments);
    } else if (ev->kind == DSI_CHAT_EV_END) {
        e->ends++;
    }
    return 0;
}

/* Parse text fed in pieces of `step` bytes (0: all at once). */
static int parse_pieces(const char *text, size_t n, int mode, size_t step, struct events *e) {
    memset(e, 0, sizeof(*e));
    struct dsi_chat_parser *p;
    if (dsi_chat_parser_new(&p, mode, NULL)) return -1;
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n; i += step)
        if (dsi_chat_parser_feed(p, text + i, DSI_MIN(step, n - i), on_event, e)) return -1;
    if (dsi_chat_parser_finish(p, on_event, e)) return -1;
    dsi_chat_parser_free(p);
    return 0;
}

static int same_events(const struct events *a, const struct events *b) {
    return a->cl == b->cl && a->rl == b->rl && a->kl == b->kl && a->ends == b->ends &&
           !memcmp(a->content, b->content, a->cl) && !memcmp(a->reasoning, b->reasoning, a->rl) &&
           !memcmp(a->calls, b->calls, a->kl);
}

/* Every split into 1-byte, 2-byte, ... pieces gives what one piece gives. */
static int streams_agree(const char *text, int mode) {
    size_t n = strlen(text);
    struct events whole, part;
    TEST_ASSERT(parse_pieces(text, n, mode, 0, &whole) == 0);
    for (size_t step = 1; step <= 9; step++) {
        TEST_ASSERT(parse_pieces(text, n, mode, step, &part) == 0);
        TEST_ASSERTF(same_events(&whole, &part), "step %zu of '%.60s'", step, text);
    }
    return 0;
}

int test_chat_parse_golden(struct test_ctx *t) {
    json_t *g = load(t, "tests/golden/tok/chat/parse.json");
    TEST_ASSERT(g);
    size_t i;
    json_t *c;
    json_array_foreach(g, i, c) {
        const char *mode_s = json_string_value(json_object_get(c, "mode"));
        int mode = !strcmp(mode_s, "thinking") ? DSI_CHAT_MODE_THINKING : DSI_CHAT_MODE_CHAT;
        const json_t *txt = json_object_get(c, "text");
        json_t *msg;
        struct dsi_err err = {0};
        TEST_ASSERT(
            dsi_chat_parse(json_string_value(txt), json_string_length(txt), mode, &msg, &err) == 0);
        if (!json_equal(msg, json_object_get(c, "message"))) {
            char *a = json_dumps(msg, 0), *b = json_dumps(json_object_get(c, "message"), 0);
            fprintf(stderr, "  %s:\n    got  %s\n    want %s\n",
                    json_string_value(json_object_get(c, "name")), a, b);
            free(a);
            free(b);
            return 1;
        }
        json_decref(msg);
        TEST_ASSERT(streams_agree(json_string_value(txt), mode) == 0);
    }
    json_decref(g);
    return 0;
}

#define EOS_S "<｜end▁of▁sentence｜>"
#define TC    "<｜DSML｜tool_calls>\n"
#define TCE   "</｜DSML｜tool_calls>"
#define INV   "<｜DSML｜invoke name=\"f\">\n"
#define INVE  "</｜DSML｜invoke>\n"
#define PAR   "<｜DSML｜parameter name="
#define PARE  "</｜DSML｜parameter>\n"

static int parse_is(const char *text,
                    int mode,
                    const char *reasoning,
                    const char *content,
                    const char *calls,
                    int ends) {
    struct events e;
    TEST_ASSERT(parse_pieces(text, strlen(text), mode, 0, &e) == 0);
    e.content[e.cl] = e.reasoning[e.rl] = e.calls[e.kl] = 0;
    if (strcmp(e.reasoning, reasoning) || strcmp(e.content, content) || strcmp(e.calls, calls) ||
        e.ends != ends) {
        fprintf(stderr, "  '%s':\n    reasoning '%s' content '%s' calls '%s' ends %d\n", text,
                e.reasoning, e.content, e.calls, e.ends);
        return 1;
    }
    return streams_agree(text, mode);
}

int test_chat_parse_lenient(struct test_ctx *t) {
    const int T = DSI_CHAT_MODE_THINKING, C = DSI_CHAT_MODE_CHAT;
    int bad = 0;
    bad += parse_is("no close tag at all", T, "no close tag at all", "", "", 0);
    bad += parse_is("<think>r</think>c" EOS_S "ignored", T, "r", "c", "", 1);
    bad += parse_is("c\n\n" TC INV PAR "\"a\" string=\"true\">x" PARE INVE TCE EOS_S, C, "", "c",
                    "0:f({\"a\": \"x\"});", 1);
    /* tool calls in the reasoning end it (never swallowed) */
    bad += parse_is("thinking\n\n" TC INV INVE TCE, T, "thinking", "", "0:f({});", 0);
    /* lenient values: bad JSON with string="false", missing string attr, duplicates */
    bad += parse_is(TC INV PAR "\"n\" string=\"false\">not json" PARE PAR "\"m\">[1, 2]" PARE PAR
                               "\"n\" string=\"true\">dup" PARE INVE TCE,
                    C, "", "", "0:f({\"n\": \"not json\", \"m\": [1, 2]});", 0);
    /* malformed blocks come back as content, byte for byte */
    bad += parse_is("x\n\n" TC "<｜DSML｜invoke nam=\"f\">\n" INVE TCE " y", C, "",
                    "x\n\n" TC "<｜DSML｜invoke nam=\"f\">\n" INVE TCE " y", "", 0);
    bad += parse_is("x\n\n" TC INV PAR "\"a\" string=\"true\">unterminated", C, "",
                    "x\n\n" TC INV PAR "\"a\" string=\"true\">unterminated", "", 0);
    bad += parse_is("x" TC INV INVE TCE "\n\n" TC "<｜DSML｜invoke name=\"g\">\n" INVE TCE, C, "",
                    "x", "0:f({});1:g({});", 0);
    /* markers split anywhere; look-alike text passes through */
    bad += parse_is("a <think> b </thin k> <｜end▁of▁sent c\n\nd\n", C, "",
                    "a <think> b </thin k> <｜end▁of▁sent c\n\nd\n", "", 0);
    bad += parse_is("\n\n\n", T, "\n\n\n", "", "", 0);
    bad += parse_is(EOS_S, C, "", "", "", 1);
    TEST_ASSERT(bad == 0);
    (void)t;
    return 0;
}
