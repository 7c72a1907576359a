/* test_main.c - runs the registered tests. Flags: --list, --only GLOB, --slow, --seed N,
 * --root DIR. One line a test: its name, ok or FAILED, its wall time (what a short device run
 * needs to plan its time limits by). Ends with one "N passed, N failed" line; exit status 1 if
 * any failed. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct entry {
    const char *name;
    int (*fn)(struct test_ctx *);
};

static const struct entry g_tests[] = {
#define T(name) {#name, name},
#include "tests.def"
#undef T
};

static const struct test_ctx *g_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *test_path(const struct test_ctx *t, const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof(buf), "%s/%s", t->root, rel);
    return buf;
}

int main(int argc, char **argv) {
    struct test_ctx ctx = {.root = ".", .seed = 1234};
    const char *only = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list"))
            list = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--slow"))
            ctx.slow = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            ctx.seed = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--root") && i + 1 < argc)
            ctx.root = argv[++i];
        else {
            fprintf(stderr, "usage: dsinfer-test [--list] [--only GLOB] [--slow] [--seed N] "
                            "[--root DIR]\n");
            return 2;
        }
    }
    char tmpl[] = "/tmp/dsinfer-test-XXXXXX";
    if (!list && !mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 2;
    }
    ctx.tmpdir = tmpl;
    g_ctx = &ctx;
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof(g_tests) / sizeof(g_tests[0]); i++) {
        if (only && fnmatch(only, g_tests[i].name, 0) != 0) continue;
        if (list) {
            printf("%s\n", g_tests[i].name);
            continue;
        }
        fprintf(stderr, "%-48s ", g_tests[i].name);
        fflush(stderr);
        double t0 = now_s();
        int rc = g_tests[i].fn(&ctx);
        fprintf(stderr, "%s (%.1f s)\n", rc == 0 ? "ok" : "FAILED", now_s() - t0);
        if (rc == 0)
            passed++;
        else
            failed++;
    }
    if (!list) {
        char cmd[4200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpl);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpl);
        printf("%d passed, %d failed\n", passed, failed);
    }
    return failed ? 1 : 0;
}
