/* core.h - status codes, error messages, assertions, logging, allocation and time.
 *
 * Knows nothing about models. Every library function that can fail returns an int status
 * (0 = DSI_OK, negative = enum dsi_status) and fills an optional struct dsi_err. The library
 * never calls exit(); only tools/dsinfer.c turns a status into an exit code. */
#ifndef DSI_CORE_H
#define DSI_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum dsi_status {
    DSI_OK = 0,
    DSI_ERR_IO = -1,
    DSI_ERR_FORMAT = -2,
    DSI_ERR_CONFIG = -3,
    DSI_ERR_NOMEM = -4,
    DSI_ERR_INVALID = -5,
    DSI_ERR_UNSUPPORTED = -6,
    DSI_ERR_CONTEXT_FULL = -7,
    DSI_ERR_BUSY = -8,
    DSI_ERR_CANCELLED = -9,
    DSI_ERR_DEVICE = -10,
};

struct dsi_err {
    int code;
    char msg[512];
};

/* Fill err (if not NULL) with code and a formatted message; returns code. */
int dsi_errf(struct dsi_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *dsi_status_str(int code);

/* Broken invariants: print file:line and abort. Always on. */
#define DSI_ASSERT(c)                                                                              \
    do {                                                                                           \
        if (!(c)) dsi_assert_fail(__FILE__, __LINE__, #c);                                         \
    } while (0)
#ifdef __cplusplus /* nvcc compiles the CUDA backend as C++ */
#define DSI_NORETURN [[noreturn]]
#else
#define DSI_NORETURN _Noreturn
#endif
DSI_NORETURN void dsi_assert_fail(const char *file, int line, const char *expr);

/* Logging to stderr; level from struct dsi_debug (DSI_LOG). */
enum dsi_log_level { DSI_LOG_ERROR = 0, DSI_LOG_WARN, DSI_LOG_INFO, DSI_LOG_DEBUG };
void dsi_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Debug settings read once from the environment at start-up (never in a step).
 * DSI_LOG: log level 0-3; DSI_THREADS: CPU worker threads (0 = all cores). */
struct dsi_debug {
    int log_level;
    int threads;
};
const struct dsi_debug *dsi_debug_get(void);

/* Allocation: NULL on failure (callers report DSI_ERR_NOMEM). Freed with free(). */
void *dsi_malloc(size_t n);
void *dsi_calloc(size_t n, size_t size);
void *dsi_aligned_alloc(size_t n); /* 64-byte aligned, zeroed; free with free() */

double dsi_time_s(void); /* monotonic seconds */

/* Read a whole file into a NUL-terminated malloc'd buffer (caller frees). */
int dsi_read_file(const char *path, char **out, size_t *len, struct dsi_err *err);

#define DSI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DSI_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
