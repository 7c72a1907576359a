/* chat.c - DeepSeek-V4 prompt rendering (encode_messages of encoding_dsv4.py). See chat.h.
 *
 * Pipeline, as in the reference:
 *   1. merge:  tool messages become tool_result blocks of a user message; a user message
 *              following such blocks (or another user message without a task) joins it;
 *   2. order:  tool_result blocks follow the order of the last assistant tool_calls;
 *   3. drop:   thinking mode + drop_thinking (turned off by any "tools"): before the last
 *              user/developer message assistants lose reasoning, other roles but user/system/
 *              tool/latest_reminder disappear;
 *   4. render: each message, then the transition (<｜Assistant｜> + <think> or </think>, or a
 *              task token) when the next message is an assistant/latest_reminder or none.
 * Working lists are jansson arrays of (copied) message objects, freed at the end. */
#include "tok/chat.h"
#include "core/json_out.h"
#include "tok/dsml.h"
#include "tok/tbuf.h"

#include <string.h>

#define BOS                                                                                        \
    "<\xef\xbd\x9c"                                                                                \
    "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS                                                                                        \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define ASSIST                                                                                     \
    "<\xef\xbd\x9c"                                                                                \
    "Assistant\xef\xbd\x9c>"
#define REMINDER "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"
#define THINK    "<think>"
#define UNTHINK  "</think>"

static const char EFFORT_MAX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n";

/* The tools block, split around the schema lines. */
static const char TOOLS_HEAD[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke "
    "tools by writing a \"<" DSI_DSML_TOKEN "tool_calls>\" block like the following:\n\n"
    "<" DSI_DSML_TOKEN "tool_calls>\n"
    "<" DSI_DSML_TOKEN "invoke name=\"$TOOL_NAME\">\n"
    "<" DSI_DSML_TOKEN "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"
    "$PARAMETER_VALUE</" DSI_DSML_TOKEN "parameter>\n"
    "...\n"
    "</" DSI_DSML_TOKEN "invoke>\n"
    "<" DSI_DSML_TOKEN "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSI_DSML_TOKEN "invoke>\n"
    "</" DSI_DSML_TOKEN "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other "
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " THINK "), you MUST output your complete "
    "reasoning inside " THINK "..." UNTHINK " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " UNTHINK " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char TOOLS_TAIL[] = "\n\nYou MUST strictly follow the above defined tool name and "
                                 "parameter schemas to invoke tool calls.\n";

static const char RESPONSE_FORMAT[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

static const struct {
    const char *name, *token;
} TASKS[] = {
    {"action", "<\xef\xbd\x9c"
               "action\xef\xbd\x9c>"},
    {"query", "<\xef\xbd\x9cquery\xef\xbd\x9c>"},
    {"authority", "<\xef\xbd\x9c"
                  "authority\xef\xbd\x9c>"},
    {"domain", "<\xef\xbd\x9c"
               "domain\xef\xbd\x9c>"},
    {"title", "<\xef\xbd\x9ctitle\xef\xbd\x9c>"},
    {"read_url", "<\xef\xbd\x9cread_url\xef\xbd\x9c>"},
};

struct dsi_chat_opts dsi_chat_opts_default(void) {
    struct dsi_chat_opts o = {0};
    o.mode = DSI_CHAT_MODE_CHAT;
    o.drop_thinking = true;
    o.effort = DSI_CHAT_EFFORT_NONE;
    o.add_bos = true;
    return o;
}

/* ---------------------------------------------------------------------------------------- */
/* Small helpers: Python truthiness, str(), role tests                                      */

static bool truthy(const json_t *v) {
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_TRUE:
        return true;
    case JSON_INTEGER:
        return json_integer_value(v) != 0;
    case JSON_REAL:
        return json_real_value(v) != 0;
    case JSON_STRING:
        return json_string_length(v) > 0;
    case JSON_ARRAY:
        return json_array_size(v) > 0;
    case JSON_OBJECT:
        return json_object_size(v) > 0;
    default:
        return false;
    }
}

static const char *role_of(const json_t *m) {
    return json_string_value(json_object_get(m, "role"));
}

static bool role_is(const json_t *m, const char *r) {
    const char *x = role_of(m);
    return x && !strcmp(x, r);
}

/* "task" present and not null (the reference's `.get("task") is not None`) */
static bool has_task(const json_t *m) {
    const json_t *t = json_object_get(m, "task");
    return t && !json_is_null(t);
}

/* Python str(v) of a scalar, as str.format writes it; arrays/objects are refused. */
static int
put_pystr(struct dsi_tbuf *b, const json_t *v, const char *what, size_t idx, struct dsi_err *err) {
    char num[64];
    if (!v || json_is_null(v)) {
        dsi_tbuf_puts(b, "None");
    } else if (json_is_string(v)) {
        dsi_tbuf_put(b, json_string_value(v), json_string_length(v));
    } else if (json_is_true(v)) {
        dsi_tbuf_puts(b, "True");
    } else if (json_is_false(v)) {
        dsi_tbuf_puts(b, "False");
    } else if (json_is_integer(v)) {
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        dsi_tbuf_puts(b, num);
    } else if (json_is_real(v) && dsi_json_format_double(json_real_value(v), num, 64) > 0) {
        dsi_tbuf_puts(b, num);
    } else {
        return dsi_errf(err, DSI_ERR_INVALID, "message %zu: %s must be a string", idx, what);
    }
    return DSI_OK;
}

/* The reference's `x or ""` followed by str.format. */
static int put_text_or_empty(
    struct dsi_tbuf *b, const json_t *v, const char *what, size_t idx, struct dsi_err *err) {
    return truthy(v) ? put_pystr(b, v, what, idx, err) : DSI_OK;
}

/* A list of content parts: text parts as is, others "[Unsupported TYPE]", joined by "\n\n". */
static int put_parts(struct dsi_tbuf *b, const json_t *parts, size_t idx, struct dsi_err *err) {
    for (size_t i = 0; i < json_array_size(parts); i++) {
        const json_t *p = json_array_get(parts, i);
        if (!json_is_object(p))
            return dsi_errf(err, DSI_ERR_INVALID, "message %zu: content part %zu is not an object",
                            idx, i);
        if (i) dsi_tbuf_put(b, "\n\n", 2);
        const char *type = json_string_value(json_object_get(p, "type"));
        if (type && !strcmp(type, "text")) {
            const json_t *t = json_object_get(p, "text");
            if (t && !json_is_string(t) && !json_is_null(t))
                return dsi_errf(err, DSI_ERR_INVALID, "message %zu: text part %zu is not a string",
                                idx, i);
            if (json_is_string(t)) dsi_tbuf_put(b, json_string_value(t), json_string_length(t));
        } else {
            dsi_tbuf_puts(b, "[Unsupported ");
            int rc = put_pystr(b, json_object_get(p, "type"), "part type", idx, err);
            if (rc) return rc;
            dsi_tbuf_puts(b, "]");
        }
    }
    return DSI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Preprocessing                                                                            */

/* Set key to a new reference (stolen); false on failure. */
static bool set_new(json_t *obj, const char *key, json_t *v) {
    return obj && v && json_object_set_new(obj, key, v) == 0;
}

/* merge_tool_messages: returns a new array of new/copied messages (NULL on out of memory).
 * msgs is the caller's deep copy, so its values are shared rather than copied again. */
static json_t *merge_tools(const json_t *msgs) {
    json_t *out = json_array(), *add = NULL, *blk = NULL, *v;
    for (size_t i = 0; out && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        size_t n = json_array_size(out);
        json_t *last = n ? json_array_get(out, n - 1) : NULL;
        json_t *blocks =
            last && role_is(last, "user") ? json_object_get(last, "content_blocks") : NULL;
        add = NULL;
        blk = json_object();
        if (!blk) goto oom;
        if (role_is(m, "tool")) {
            v = json_object_get(m, "tool_call_id");
            json_t *c = json_object_get(m, "content");
            if (!set_new(blk, "type", json_string("tool_result")) ||
                !set_new(blk, "tool_use_id", v ? json_incref(v) : json_string("")) ||
                !set_new(blk, "content", c ? json_incref(c) : json_string("")))
                goto oom_blk;
            if (blocks) {
                if (json_array_append_new(blocks, blk)) goto oom;
                continue;
            }
            add = json_object();
            if (!set_new(add, "role", json_string("user")) ||
                !set_new(add, "content_blocks", json_array()) ||
                json_array_append_new(json_object_get(add, "content_blocks"), blk))
                goto oom_add;
        } else if (role_is(m, "user")) {
            v = json_object_get(m, "content");
            if (!v)
                v = json_string("");
            else
                json_incref(v);
            if (!set_new(blk, "type", json_string("text")) || !set_new(blk, "text", v))
                goto oom_blk;
            if (blocks && !has_task(last)) {
                if (json_array_append_new(blocks, blk)) goto oom;
                continue;
            }
            add = json_object();
            if (!set_new(add, "role", json_string("user")) ||
                !set_new(add, "content", json_incref(json_object_get(blk, "text"))) ||
                !set_new(add, "content_blocks", json_array()) ||
                json_array_append_new(json_object_get(add, "content_blocks"), blk))
                goto oom_add;
            static const char *const keep[] = {"task", "wo_eos", "mask"};
            for (size_t k = 0; k < 3; k++)
                if ((v = json_object_get(m, keep[k])) && json_object_set(add, keep[k], v))
                    goto oom_add;
        } else {
            json_decref(blk);
            add = json_incref(m);
        }
        if (json_array_append_new(out, add)) goto oom;
    }
    return out;
oom_add:
    json_decref(add);
    goto oom;
oom_blk:
    json_decref(blk);
oom:
    json_decref(out);
    return NULL;
}

/* A tool call's id: tc["id"] or tc["function"]["id"] (first truthy), or NULL. */
static const char *call_id(const json_t *tc) {
    const json_t *id = json_object_get(tc, "id");
    if (!truthy(id)) id = json_object_get(json_object_get(tc, "function"), "id");
    return truthy(id) ? json_string_value(id) : NULL;
}

/* sort_tool_results_by_call_order, in place. */
static int sort_results(json_t *msgs) {
    const json_t *order = NULL; /* tool_calls of the last assistant that had some */
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (role_is(m, "assistant") && truthy(json_object_get(m, "tool_calls"))) {
            order = json_object_get(m, "tool_calls");
            continue;
        }
        json_t *blocks = json_object_get(m, "content_blocks");
        if (!role_is(m, "user") || !truthy(blocks) || !order) continue;
        /* the rank of a block: index of the last call with its id, else 0 */
        size_t nb = json_array_size(blocks), nt = 0, any_id = 0;
        for (size_t c = 0; c < json_array_size(order); c++)
            any_id |= call_id(json_array_get(order, c)) != NULL;
        if (!any_id) continue;
        json_t **tb = malloc(nb * sizeof(*tb));
        size_t *rank = malloc(nb * sizeof(*rank));
        if (!tb || !rank) {
            free(tb);
            free(rank);
            return -1;
        }
        for (size_t k = 0; k < nb; k++) {
            json_t *b = json_array_get(blocks, k);
            const char *type = json_string_value(json_object_get(b, "type"));
            if (!type || strcmp(type, "tool_result")) continue;
            const char *uid = json_string_value(json_object_get(b, "tool_use_id"));
            size_t r = 0;
            for (size_t c = 0; uid && c < json_array_size(order); c++) {
                const char *cid = call_id(json_array_get(order, c));
                if (cid && !strcmp(cid, uid)) r = c;
            }
            /* stable insertion sort by rank */
            size_t at = nt;
            while (at > 0 && rank[at - 1] > r) {
                tb[at] = tb[at - 1];
                rank[at] = rank[at - 1];
                at--;
            }
            tb[at] = json_incref(b);
            rank[at] = r;
            nt++;
        }
        if (nt > 1) {
            size_t t = 0;
            for (size_t k = 0; k < nb; k++) {
                const char *type =
                    json_string_value(json_object_get(json_array_get(blocks, k), "type"));
                if (type && !strcmp(type, "tool_result")) json_array_set(blocks, k, tb[t++]);
            }
        }
        for (size_t k = 0; k < nt; k++)
            json_decref(tb[k]);
        free(tb);
        free(rank);
    }
    return 0;
}

static long last_user_index(const json_t *msgs) {
    for (size_t i = json_array_size(msgs); i-- > 0;)
        if (role_is(json_array_get(msgs, i), "user") ||
            role_is(json_array_get(msgs, i), "developer"))
            return (long)i;
    return -1;
}

/* _drop_thinking_messages: a new array (shares unchanged messages). */
static json_t *drop_thinking(const json_t *msgs) {
    static const char *const keep[] = {"user", "system", "tool", "latest_reminder",
                                       "direct_search_results"};
    long last = last_user_index(msgs);
    json_t *out = json_array();
    for (size_t i = 0; out && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        bool k = (long)i >= last;
        for (size_t r = 0; r < 5 && !k; r++)
            k = role_is(m, keep[r]);
        if (k) {
            if (json_array_append(out, m)) goto oom;
        } else if (role_is(m, "assistant")) {
            json_t *c = json_copy(m);
            if (!c) goto oom;
            json_object_del(c, "reasoning_content");
            if (json_array_append_new(out, c)) goto oom;
        }
    }
    return out;
oom:
    json_decref(out);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Rendering                                                                                */

struct render {
    struct dsi_tbuf *b;
    const json_t *msgs;
    int mode;
    bool drop;
    int effort;
    long last_user;
    struct dsi_err *err;
};

static int render_tools(struct render *r, const json_t *tools, size_t idx) {
    if (!json_is_array(tools))
        return dsi_errf(r->err, DSI_ERR_INVALID, "message %zu: tools is not a list", idx);
    dsi_tbuf_puts(r->b, "\n\n");
    dsi_tbuf_puts(r->b, TOOLS_HEAD);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        if (!fn)
            return dsi_errf(r->err, DSI_ERR_INVALID, "message %zu: tool %zu has no function", idx,
                            i);
        if (i) dsi_tbuf_put(r->b, "\n", 1);
        int rc = dsi_json_append(fn, DSI_JSON_PY, &r->b->p, &r->b->len, &r->b->cap, r->err);
        if (rc) return rc;
    }
    dsi_tbuf_puts(r->b, TOOLS_TAIL);
    return DSI_OK;
}

/* "\n\n" + tools block and "\n\n" + response format, for system and developer messages. */
static int render_extras(struct render *r, const json_t *m, size_t idx) {
    const json_t *tools = json_object_get(m, "tools");
    int rc;
    if (truthy(tools) && (rc = render_tools(r, tools, idx))) return rc;
    const json_t *rf = json_object_get(m, "response_format");
    if (truthy(rf)) {
        dsi_tbuf_puts(r->b, "\n\n");
        dsi_tbuf_puts(r->b, RESPONSE_FORMAT);
        return dsi_json_append(rf, DSI_JSON_PY, &r->b->p, &r->b->len, &r->b->cap, r->err);
    }
    return DSI_OK;
}

static int render_user(struct render *r, const json_t *m, size_t idx) {
    dsi_tbuf_puts(r->b, USER);
    const json_t *blocks = json_object_get(m, "content_blocks");
    if (!truthy(blocks))
        return put_text_or_empty(r->b, json_object_get(m, "content"), "content", idx, r->err);
    for (size_t i = 0; i < json_array_size(blocks); i++) {
        const json_t *blk = json_array_get(blocks, i);
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (i) dsi_tbuf_put(r->b, "\n\n", 2);
        int rc = DSI_OK;
        const json_t *c = json_object_get(blk, type && !strcmp(type, "text") ? "text" : "content");
        if (type && !strcmp(type, "text")) {
            /* lenient: null -> "", a list of parts -> their text (the reference raises) */
            if (json_is_array(c))
                rc = put_parts(r->b, c, idx, r->err);
            else if (c && !json_is_null(c))
                rc = put_pystr(r->b, c, "content", idx, r->err);
        } else if (type && !strcmp(type, "tool_result")) {
            dsi_tbuf_puts(r->b, "<tool_result>");
            rc = json_is_array(c) ? put_parts(r->b, c, idx, r->err)
                                  : put_pystr(r->b, c, "tool content", idx, r->err);
            dsi_tbuf_puts(r->b, "</tool_result>");
        } else {
            dsi_tbuf_puts(r->b, "[Unsupported ");
            rc = put_pystr(r->b, json_object_get(blk, "type"), "block type", idx, r->err);
            dsi_tbuf_puts(r->b, "]");
        }
        if (rc) return rc;
    }
    return DSI_OK;
}

static int render_assistant(struct render *r, const json_t *m, size_t idx) {
    bool prev_task = idx > 0 && has_task(json_array_get(r->msgs, idx - 1));
    if (r->mode == DSI_CHAT_MODE_THINKING && !prev_task && (!r->drop || (long)idx > r->last_user)) {
        int rc = put_text_or_empty(r->b, json_object_get(m, "reasoning_content"),
                                   "reasoning_content", idx, r->err);
        if (rc) return rc;
        dsi_tbuf_puts(r->b, UNTHINK);
    }
    int rc = put_text_or_empty(r->b, json_object_get(m, "content"), "content", idx, r->err);
    if (rc) return rc;
    const json_t *tc = json_object_get(m, "tool_calls");
    if (truthy(tc) && (rc = dsi_dsml_render_calls(r->b, tc, idx, r->err))) return rc;
    if (!truthy(json_object_get(m, "wo_eos"))) dsi_tbuf_puts(r->b, EOS);
    return DSI_OK;
}

static int render_message(struct render *r, size_t idx) {
    const json_t *m = json_array_get(r->msgs, idx);
    const char *role = role_of(m);
    int rc = DSI_OK;
    if (idx == 0 && r->mode == DSI_CHAT_MODE_THINKING && r->effort == DSI_CHAT_EFFORT_MAX)
        dsi_tbuf_puts(r->b, EFFORT_MAX);
    if (!role) {
        return dsi_errf(r->err, DSI_ERR_INVALID, "message %zu: no role", idx);
    } else if (!strcmp(role, "system")) {
        rc = put_text_or_empty(r->b, json_object_get(m, "content"), "content", idx, r->err);
        if (!rc) rc = render_extras(r, m, idx);
    } else if (!strcmp(role, "developer")) {
        const json_t *c = json_object_get(m, "content");
        if (!truthy(c))
            return dsi_errf(r->err, DSI_ERR_INVALID,
                            "message %zu: developer message without "
                            "content",
                            idx);
        if (!json_is_string(c))
            return dsi_errf(r->err, DSI_ERR_INVALID, "message %zu: content must be a string", idx);
        dsi_tbuf_puts(r->b, USER);
        dsi_tbuf_put(r->b, json_string_value(c), json_string_length(c));
        rc = render_extras(r, m, idx);
    } else if (!strcmp(role, "user")) {
        rc = render_user(r, m, idx);
    } else if (!strcmp(role, "latest_reminder")) {
        dsi_tbuf_puts(r->b, REMINDER);
        rc = put_pystr(r->b, json_object_get(m, "content"), "content", idx, r->err);
    } else if (!strcmp(role, "assistant")) {
        rc = render_assistant(r, m, idx);
    } else {
        return dsi_errf(r->err, DSI_ERR_INVALID, "message %zu: unknown role '%.40s'", idx, role);
    }
    if (rc) return rc;

    /* transition */
    const json_t *next = json_array_get(r->msgs, idx + 1);
    if (next && !role_is(next, "assistant") && !role_is(next, "latest_reminder")) return DSI_OK;
    bool thinking = r->mode == DSI_CHAT_MODE_THINKING;
    if (has_task(m)) {
        const char *task = json_string_value(json_object_get(m, "task"));
        size_t t = 0;
        while (t < sizeof(TASKS) / sizeof(TASKS[0]) && (!task || strcmp(task, TASKS[t].name)))
            t++;
        if (t == sizeof(TASKS) / sizeof(TASKS[0]))
            return dsi_errf(r->err, DSI_ERR_INVALID,
                            "message %zu: invalid task '%.40s' (valid: "
                            "action, query, authority, domain, title, read_url)",
                            idx, task ? task : "?");
        if (strcmp(task, "action")) {
            dsi_tbuf_puts(r->b, TASKS[t].token);
        } else {
            dsi_tbuf_puts(r->b, ASSIST);
            dsi_tbuf_puts(r->b, thinking ? THINK : UNTHINK);
            dsi_tbuf_puts(r->b, TASKS[t].token);
        }
    } else if (!strcmp(role, "user") || !strcmp(role, "developer")) {
        dsi_tbuf_puts(r->b, ASSIST);
        bool open = thinking && (!r->drop || (long)idx >= r->last_user);
        dsi_tbuf_puts(r->b, open ? THINK : UNTHINK);
    }
    return DSI_OK;
}

/* Apply opts->tools / response_format: returns a new reference to the (possibly new) list
 * that holds the first message of the conversation, with *other pointing to the other one. */
static int attach_request_tools(const struct dsi_chat_opts *o,
                                json_t **ctx,
                                json_t **msgs,
                                struct dsi_err *err) {
    if (!truthy(o->tools) && !truthy(o->response_format)) return DSI_OK;
    json_t **list = json_array_size(*ctx) ? ctx : msgs;
    json_t *first = json_array_get(*list, 0);
    json_t *sys;
    if (first && role_is(first, "system")) {
        sys = json_copy(first);
        if (!sys || json_array_set_new(*list, 0, sys)) goto oom;
    } else {
        sys = json_pack("{s:s, s:s}", "role", "system", "content", "");
        if (!sys || json_array_insert_new(*list, 0, sys)) goto oom;
    }
    if (truthy(o->tools) && json_object_set(sys, "tools", (json_t *)(uintptr_t)o->tools)) goto oom;
    if (truthy(o->response_format) &&
        json_object_set(sys, "response_format", (json_t *)(uintptr_t)o->response_format))
        goto oom;
    return DSI_OK;
oom:
    return dsi_errf(err, DSI_ERR_NOMEM, "chat: out of memory");
}

int dsi_chat_render(const json_t *messages,
                    const struct dsi_chat_opts *opts,
                    char **out,
                    size_t *len,
                    struct dsi_err *err) {
    struct dsi_chat_opts o = opts ? *opts : dsi_chat_opts_default();
    *out = NULL;
    if (!json_is_array(messages))
        return dsi_errf(err, DSI_ERR_INVALID, "chat: messages is not a list");
    if (o.context && !json_is_array(o.context))
        return dsi_errf(err, DSI_ERR_INVALID, "chat: context is not a list");
    if (o.mode != DSI_CHAT_MODE_CHAT && o.mode != DSI_CHAT_MODE_THINKING)
        return dsi_errf(err, DSI_ERR_INVALID, "chat: invalid thinking mode %d", o.mode);
    if (o.effort < DSI_CHAT_EFFORT_NONE || o.effort > DSI_CHAT_EFFORT_MAX)
        return dsi_errf(err, DSI_ERR_INVALID, "chat: invalid reasoning effort %d", o.effort);
    for (size_t i = 0; i < json_array_size(messages); i++)
        if (!json_is_object(json_array_get(messages, i)))
            return dsi_errf(err, DSI_ERR_INVALID, "message %zu is not an object", i);
    for (size_t i = 0; i < json_array_size(o.context); i++)
        if (!json_is_object(json_array_get(o.context, i)))
            return dsi_errf(err, DSI_ERR_INVALID, "context message %zu is not an object", i);

    int rc = DSI_OK;
    json_t *raw_ctx = o.context ? json_deep_copy(o.context) : json_array();
    json_t *raw_msgs = json_deep_copy(messages);
    json_t *msgs = NULL, *ctx = NULL, *full = NULL, *tmp = NULL, *dctx = NULL;
    struct dsi_tbuf b = {0};
    if (!raw_ctx || !raw_msgs) goto oom;
    if ((rc = attach_request_tools(&o, &raw_ctx, &raw_msgs, err))) goto out;
    size_t n_raw_ctx = json_array_size(raw_ctx);

    /* messages = sort(context + merge(messages))[len(context):] */
    if (!(msgs = merge_tools(raw_msgs)) || !(tmp = json_copy(raw_ctx)) ||
        json_array_extend(tmp, msgs))
        goto oom;
    if (sort_results(tmp)) goto oom;
    if (!(ctx = n_raw_ctx ? merge_tools(raw_ctx) : json_array())) goto oom;
    if (sort_results(ctx)) goto oom;
    if (!(full = json_copy(ctx)) || json_array_extend(full, msgs)) goto oom;

    bool drop = o.drop_thinking;
    for (size_t i = 0; i < json_array_size(full) && drop; i++)
        if (truthy(json_object_get(json_array_get(full, i), "tools"))) drop = false;
    size_t n_render = json_array_size(msgs), ctx_len = json_array_size(ctx);
    if (o.mode == DSI_CHAT_MODE_THINKING && drop) {
        json_t *d = drop_thinking(full);
        if (!d || !(dctx = drop_thinking(ctx))) {
            json_decref(d);
            goto oom;
        }
        json_decref(full);
        full = d;
        n_render = json_array_size(full) - json_array_size(dctx);
        ctx_len = json_array_size(full) - n_render;
    }

    if (o.add_bos && n_raw_ctx == 0) dsi_tbuf_puts(&b, BOS);
    struct render r = {&b, full, o.mode, drop, o.effort, last_user_index(full), err};
    for (size_t i = 0; i < n_render && !rc; i++)
        rc = render_message(&r, ctx_len + i);
    if (!rc && b.oom) goto oom;
    if (!rc && !b.p) dsi_tbuf_put(&b, "", 0);
    if (!rc && b.oom) goto oom;
    goto out;
oom:
    rc = dsi_errf(err, DSI_ERR_NOMEM, "chat: out of memory");
out:
    json_decref(raw_ctx);
    json_decref(raw_msgs);
    json_decref(msgs);
    json_decref(ctx);
    json_decref(full);
    json_decref(tmp);
    json_decref(dctx);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    if (len) *len = b.len;
    return DSI_OK;
}

int dsi_chat_render_prompt(const char *system,
                           const char *user,
                           int mode,
                           int effort,
                           char **out,
                           size_t *len,
                           struct dsi_err *err) {
    json_t *msgs = json_array();
    int rc = DSI_OK;
    if (!msgs) return dsi_errf(err, DSI_ERR_NOMEM, "chat: out of memory");
    if (system &&
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system)))
        rc = dsi_errf(err, DSI_ERR_INVALID, "chat: system prompt is not valid UTF-8");
    if (!rc && json_array_append_new(
                   msgs, json_pack("{s:s, s:s}", "role", "user", "content", user ? user : "")))
        rc = dsi_errf(err, DSI_ERR_INVALID, "chat: user prompt is not valid UTF-8");
    if (!rc) {
        struct dsi_chat_opts o = dsi_chat_opts_default();
        o.mode = mode;
        o.effort = effort;
        rc = dsi_chat_render(msgs, &o, out, len, err);
    }
    json_decref(msgs);
    return rc;
}
