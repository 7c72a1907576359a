/* args.c - see args.h. */
#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *args_default_model(void) {
    static char path[4200];
    struct stat sb;
    if (stat("models/dsv4-tiny/config.json", &sb) == 0) return "models/dsv4-tiny";
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(path, sizeof(path), "%.4000s/../models/dsv4-tiny", exe);
        char cfg[4300];
        snprintf(cfg, sizeof(cfg), "%s/config.json", path);
        if (stat(cfg, &sb) == 0) return path;
    }
    return "models/dsv4-tiny";
}

int args_parse_ids(const char *s, int32_t **out) {
    int cap = 64, n = 0;
    int32_t *v = malloc(sizeof(int32_t) * (size_t)cap);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            fprintf(stderr,
                    "dsinfer: --prompt-ids: '%s' is not a list of non-negative ids like "
                    "1,2,3\n",
                    s);
            free(v);
            return -1;
        }
        if (n == cap) {
            int32_t *nv = realloc(v, sizeof(int32_t) * (size_t)(cap *= 2));
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[n++] = (int32_t)x;
        p = end;
        while (*p == ',' || *p == ' ')
            p++;
    }
    if (!n) {
        fprintf(stderr, "dsinfer: --prompt-ids: empty list\n");
        free(v);
        return -1;
    }
    *out = v;
    return n;
}

int args_int(
    const char *cmd, const char *opt, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "dsinfer %s: %s: want an integer in %lld..%lld, got '%s'\n", cmd, opt, lo,
                hi, v ? v : "(nothing)");
        return -1;
    }
    *out = x;
    return 0;
}

int args_float(const char *cmd, const char *opt, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || *end || errno) {
        fprintf(stderr, "dsinfer %s: %s: want a number, got '%s'\n", cmd, opt, v ? v : "(nothing)");
        return -1;
    }
    *out = x;
    return 0;
}

/* v as the index of one of three names (an enum's values 0, 1, 2); a message and -1 otherwise */
static int
args_pick3(const char *cmd, const char *flag, const char *const names[3], const char *v, int *out) {
    for (int i = 0; i < 3; i++)
        if (v && !strcmp(v, names[i])) {
            *out = i;
            return 0;
        }
    fprintf(stderr, "dsinfer %s: %s: want %s, %s or %s, got '%s'\n", cmd, flag, names[0], names[1],
            names[2], v ? v : "(nothing)");
    return -1;
}

int args_kv_cache(const char *cmd, const char *v, int *out) {
    static const char *const names[3] = {"auto", "f32", "fp8"}; /* enum dsi_kv_cache_opt */
    return args_pick3(cmd, "--kv-cache", names, v, out);
}

int args_numerics(const char *cmd, const char *v, int *out) {
    static const char *const names[3] = {"plain", "reference", "fast"}; /* enum dsi_numerics_opt */
    return args_pick3(cmd, "--numerics", names, v, out);
}
