/* utf8.h - UTF-8 validation, lossy repair and the GPT-2 byte-level alphabet.
 *
 * "Valid" means well-formed UTF-8 as Unicode and Python define it: no overlong forms, no
 * surrogates, nothing above U+10FFFF. The lossy form replaces every maximal ill-formed
 * subpart with U+FFFD, exactly as Python's bytes.decode("utf-8", "replace") and Rust's
 * String::from_utf8_lossy (which HF tokenizers uses for decoding) do. */
#ifndef DSI_TOK_UTF8_H
#define DSI_TOK_UTF8_H

#include "core/core.h"

enum dsi_utf8_scan {
    DSI_UTF8_OK = 0,         /* a complete valid sequence of *len bytes */
    DSI_UTF8_BAD = 1,        /* an ill-formed maximal subpart of *len bytes (-> one U+FFFD) */
    DSI_UTF8_INCOMPLETE = 2, /* all n bytes are a valid but unfinished prefix of a sequence */
};

/* Classify the sequence starting at s[0] (n >= 1). */
int dsi_utf8_scan(const unsigned char *s, size_t n, size_t *len);

/* Length of the longest valid prefix of s[0..n) (== n when s is valid UTF-8). */
size_t dsi_utf8_valid_len(const char *s, size_t n);

/* Lossy repair into a malloc'd NUL-terminated copy (caller frees *out). A trailing unfinished
 * sequence is replaced too (as at the end of a complete decode). */
int dsi_utf8_lossy(const char *s, size_t n, char **out, size_t *out_len, struct dsi_err *err);

/* GPT-2 byte-level alphabet: byte -> code point (all < 0x144), and code point -> byte or -1. */
uint32_t dsi_bytelevel_char(uint8_t b);
int dsi_bytelevel_byte(uint32_t cp);

/* Encode cp as UTF-8 into out (4 bytes room); returns the length. */
int dsi_utf8_put(uint32_t cp, char *out);

#endif
