/* chat.h - DeepSeek-V4 chat encoding (prompt rendering) and parsing of generated text.
 *
 * Rendering reproduces DeepSeek's encoding/encoding_dsv4.py (encode_messages) byte for byte;
 * spec/deepseek-v4.md section 9 describes the rules. Messages are a jansson array of objects
 * in OpenAI shape: {"role": "system"|"user"|"developer"|"assistant"|"tool"|"latest_reminder",
 * "content", "reasoning_content", "tool_calls": [{"id", "type", "function": {"name",
 * "arguments"}}], "tool_call_id", "tools": [...], "response_format", "task", "wo_eos"}.
 * Unknown keys are ignored. JSON that lands in the prompt (tool schemas, response formats,
 * non-string arguments) is written as Python's json.dumps(ensure_ascii=False) would.
 *
 * Where the reference would crash (e.g. a list as user content) we either refuse with
 * DSI_ERR_INVALID or take the lenient reading documented at the function; where it renders
 * something odd but defined (latest_reminder without content -> "None") we do the same.
 *
 * Parsing (dsi_chat_parser) turns generated text into reasoning, content and DSML tool calls,
 * incrementally, and never fails: malformed tool-call markup comes out as content. */
#ifndef DSI_TOK_CHAT_H
#define DSI_TOK_CHAT_H

#include "core/core.h"

#include <jansson.h>

enum dsi_chat_mode {
    DSI_CHAT_MODE_CHAT = 0,     /* "chat": </think> right after <｜Assistant｜> */
    DSI_CHAT_MODE_THINKING = 1, /* "thinking": <think> opens the reasoning */
};

enum dsi_chat_effort {
    DSI_CHAT_EFFORT_NONE = 0,
    DSI_CHAT_EFFORT_HIGH = 1, /* renders nothing, as in the reference */
    DSI_CHAT_EFFORT_MAX = 2,  /* the "Reasoning Effort: Absolute maximum ..." preamble */
};

struct dsi_chat_opts {
    int mode;           /* enum dsi_chat_mode */
    bool drop_thinking; /* drop reasoning of turns before the last user turn (default true) */
    int effort;         /* enum dsi_chat_effort */
    bool add_bos; /* write <｜begin▁of▁sentence｜> when there is no context (default true) */
    /* Messages already rendered earlier (the reference's `context`): nothing of them is
     * written, no BOS either, but they take part in merging, ordering and thinking rules. */
    const json_t *context;
    /* OpenAI request-level "tools" / "response_format" (may be NULL): attached to the first
     * message if it is a system message, else to a new empty system message put first. */
    const json_t *tools;
    const json_t *response_format;
};

/* Defaults: chat mode, drop_thinking, no effort, BOS. */
struct dsi_chat_opts dsi_chat_opts_default(void);

/* Render messages (a JSON array) into a malloc'd NUL-terminated UTF-8 prompt (*out, caller
 * frees; *len may be NULL). Fails with DSI_ERR_INVALID and the message index on input the
 * reference rejects (unknown role, developer without content, bad task, tool call without a
 * function name, non-string content where text is needed). */
int dsi_chat_render(const json_t *messages,
                    const struct dsi_chat_opts *opts,
                    char **out,
                    size_t *len,
                    struct dsi_err *err);

/* Convenience for one turn: [system (if not NULL)], user -> the full generation prompt,
 * ending in <｜Assistant｜><think> (thinking) or <｜Assistant｜></think> (chat). */
int dsi_chat_render_prompt(const char *system,
                           const char *user,
                           int mode,
                           int effort,
                           char **out,
                           size_t *len,
                           struct dsi_err *err);

/* ---------------------------------------------------------------------------------------- */
/* Parsing generated text                                                                   */

enum dsi_chat_event_kind {
    DSI_CHAT_EV_REASONING = 1, /* text: a piece of reasoning */
    DSI_CHAT_EV_CONTENT = 2,   /* text: a piece of the answer */
    DSI_CHAT_EV_TOOL_CALL = 3, /* name + arguments (a JSON object as a string) */
    DSI_CHAT_EV_END = 4,       /* <｜end▁of▁sentence｜> was seen; later text is ignored */
};

struct dsi_chat_event {
    int kind;
    const char *text; /* REASONING/CONTENT: the piece (not NUL-terminated) */
    size_t len;
    const char *name;      /* TOOL_CALL: NUL-terminated */
    const char *arguments; /* TOOL_CALL: NUL-terminated JSON object text */
    int index;             /* TOOL_CALL: 0, 1, ... within the message */
};

/* Pointers inside ev are valid only during the call. Return non-zero to stop feeding (the
 * value is returned by dsi_chat_parser_feed/finish). */
typedef int (*dsi_chat_event_fn)(void *user, const struct dsi_chat_event *ev);

struct dsi_chat_parser;

/* mode: as the prompt was rendered. In thinking mode the text is reasoning until </think>
 * (a reasoning that never closes stays reasoning; a DSML tool-call block ends it too). */
int dsi_chat_parser_new(struct dsi_chat_parser **out, int mode, struct dsi_err *err);
void dsi_chat_parser_free(struct dsi_chat_parser *p);

/* Feed the next piece of generated text (any split, even inside a marker or a UTF-8
 * character). Text that might be the start of a marker is held back until it is decided. */
int dsi_chat_parser_feed(
    struct dsi_chat_parser *p, const char *text, size_t len, dsi_chat_event_fn fn, void *user);

/* End of generation: emits whatever is held back (an unfinished tool-call block as content). */
int dsi_chat_parser_finish(struct dsi_chat_parser *p, dsi_chat_event_fn fn, void *user);

/* Whole-message convenience: an OpenAI assistant message {"role": "assistant", "content",
 * "reasoning_content" (thinking mode), "tool_calls": [{"type": "function", "function":
 * {"name", "arguments"}}]} (new reference in *msg). */
int dsi_chat_parse(const char *text, size_t len, int mode, json_t **msg, struct dsi_err *err);

#endif
