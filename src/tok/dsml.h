/* dsml.h - DSML tool-call markup of DeepSeek-V4 (internal to src/tok).
 *
 *   <｜DSML｜tool_calls>
 *   <｜DSML｜invoke name="NAME">
 *   <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
 *   <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 *   </｜DSML｜tool_calls>
 *
 * Rendering follows encode_arguments_to_dsml of encoding_dsv4.py; parsing is a lenient
 * version of its parse_tool_calls. */
#ifndef DSI_TOK_DSML_H
#define DSI_TOK_DSML_H

#include "core/core.h"
#include "tok/tbuf.h"

#include <jansson.h>

#define DSI_DSML_TOKEN                                                                             \
    "\xef\xbd\x9c"                                                                                 \
    "DSML"                                                                                         \
    "\xef\xbd\x9c"                                           /* ｜DSML｜ */
#define DSI_DSML_CALLS_OPEN  "<" DSI_DSML_TOKEN "tool_calls" /* then ">\n" */
#define DSI_DSML_CALLS_CLOSE "</" DSI_DSML_TOKEN "tool_calls>"

/* Append "\n\n<｜DSML｜tool_calls>\n" + invokes + "\n</｜DSML｜tool_calls>" for an OpenAI
 * tool_calls array. msg_index is only for error messages. */
int dsi_dsml_render_calls(struct dsi_tbuf *b,
                          const json_t *tool_calls,
                          size_t msg_index,
                          struct dsi_err *err);

/* One parsed call: name and the OpenAI "arguments" string (both malloc'd, owned by the list). */
struct dsi_dsml_call {
    char *name;
    char *arguments;
};

struct dsi_dsml_calls {
    struct dsi_dsml_call *v;
    size_t n, cap;
};

/* Parse the inside of a tool-call block: the text after "<｜DSML｜tool_calls" up to (not
 * including) "</｜DSML｜tool_calls>". Returns 1 and fills calls when every invoke is
 * well-formed, 0 when the block is malformed (calls then empty), <0 when out of memory. */
int dsi_dsml_parse_block(const char *s, size_t n, struct dsi_dsml_calls *calls);

void dsi_dsml_calls_clear(struct dsi_dsml_calls *calls);

#endif
