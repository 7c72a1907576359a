/* json_out.h - JSON writer over jansson values, including the byte-exact form of Python's
 * json.dumps() that DeepSeek's chat encoder puts into prompts.
 *
 * DSI_JSON_PY (the default, flags = 0) reproduces json.dumps(v, ensure_ascii=False):
 *   - separators ", " and ": ", no indentation, object keys in insertion order (jansson keeps
 *     the order in which keys were inserted or parsed);
 *   - strings: '"' -> \", '\' -> \\, \n \r \t \b \f, other bytes < 0x20 -> \u00XX, everything
 *     else (DEL and non-ASCII included) written raw;
 *   - integers in decimal; reals in Python's repr(float): the shortest digit string that reads
 *     back to the same double, fixed notation for exponents -4..15 ("0.0001", "1e+16",
 *     "1.5e-05", "100.0", "-0.0").
 * DSI_JSON_COMPACT uses "," and ":" (json.dumps(..., separators=(",", ":"))).
 * DSI_JSON_ASCII escapes non-ASCII as \uXXXX with surrogate pairs (ensure_ascii=True); strings
 * must then be valid UTF-8 (jansson guarantees it for values it built or parsed).
 *
 * Knows nothing about models. Ownership: returned strings are malloc'd; the caller frees them. */
#ifndef DSI_JSON_OUT_H
#define DSI_JSON_OUT_H

#include "core/core.h"

#include <jansson.h>

enum dsi_json_flags {
    DSI_JSON_PY = 0,
    DSI_JSON_COMPACT = 1 << 0,
    DSI_JSON_ASCII = 1 << 1,
};

/* Serialise v to a malloc'd NUL-terminated string in *out (length without the NUL in *len,
 * which may be NULL). Fails on NaN/inf reals, nesting deeper than 2048 or out of memory. */
int dsi_json_dumps(const json_t *v, int flags, char **out, size_t *len, struct dsi_err *err);

/* Append the serialisation of v to the malloc'd buffer (*buf, *len, *cap), growing it with
 * realloc (it may move). *buf may start NULL with *len = *cap = 0. Keeps a NUL after the data. */
int dsi_json_append(
    const json_t *v, int flags, char **buf, size_t *len, size_t *cap, struct dsi_err *err);

/* Append a JSON string literal for the bytes s[0..n) (NUL allowed) as json.dumps would write
 * the Python str with those characters. Same buffer contract as dsi_json_append. */
int dsi_json_append_string(
    const char *s, size_t n, int flags, char **buf, size_t *len, size_t *cap, struct dsi_err *err);

/* Python repr() of a finite double into out (cap >= 32 is always enough). Returns the length,
 * or -1 if d is not finite or cap is too small. */
int dsi_json_format_double(double d, char *out, size_t cap);

#endif
