/* core.c - errors, assertions, logging, allocation, time. See core.h. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

int dsi_errf(struct dsi_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

const char *dsi_status_str(int code) {
    switch (code) {
    case DSI_OK:
        return "ok";
    case DSI_ERR_IO:
        return "i/o error";
    case DSI_ERR_FORMAT:
        return "format error";
    case DSI_ERR_CONFIG:
        return "config error";
    case DSI_ERR_NOMEM:
        return "out of memory";
    case DSI_ERR_INVALID:
        return "invalid argument";
    case DSI_ERR_UNSUPPORTED:
        return "unsupported";
    case DSI_ERR_CONTEXT_FULL:
        return "context full";
    case DSI_ERR_BUSY:
        return "busy";
    case DSI_ERR_CANCELLED:
        return "cancelled";
    case DSI_ERR_DEVICE:
        return "device error";
    default:
        return "unknown error";
    }
}

void dsi_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "dsinfer: assertion failed at %s:%d: %s\n", file, line, expr);
    abort();
}

static struct dsi_debug g_debug;
static pthread_once_t g_debug_once = PTHREAD_ONCE_INIT;

static void debug_init(void) {
    const char *s = getenv("DSI_LOG");
    g_debug.log_level = s ? atoi(s) : DSI_LOG_WARN;
    s = getenv("DSI_THREADS");
    g_debug.threads = s ? atoi(s) : 0;
}

const struct dsi_debug *dsi_debug_get(void) {
    pthread_once(&g_debug_once, debug_init);
    return &g_debug;
}

void dsi_log(int level, const char *fmt, ...) {
    if (level > dsi_debug_get()->log_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "dsinfer %s: ", names[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void *dsi_malloc(size_t n) { return malloc(n ? n : 1); }
void *dsi_calloc(size_t n, size_t size) { return calloc(n ? n : 1, size ? size : 1); }

void *dsi_aligned_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) return NULL;
    memset(p, 0, n);
    return p;
}

double dsi_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int dsi_read_file(const char *path, char **out, size_t *len, struct dsi_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dsi_errf(err, DSI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return dsi_errf(err, DSI_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return dsi_errf(err, DSI_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return dsi_errf(err, DSI_ERR_IO, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return DSI_OK;
}
