/* test.h - the tiny test runner's interface. Each test is
 *     int test_name(struct test_ctx *t)
 * returning 0 on success; register it in a .def file included by tests/tests.def. */
#ifndef DSI_TEST_H
#define DSI_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

struct test_ctx {
    const char *root;   /* repository root (tests find tests/golden, models/ under it) */
    const char *tmpdir; /* scratch directory for this run */
    unsigned seed;
    int slow;
};

#define TEST_ASSERT(c)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "  FAIL %s (%s:%d): %s\n", __func__, __FILE__, __LINE__, #c);          \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define TEST_ASSERTF(c, ...)                                                                       \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "  FAIL %s (%s:%d): %s: ", __func__, __FILE__, __LINE__, #c);          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Path helper: returns a static buffer with root/rel (valid until the next call). */
const char *test_path(const struct test_ctx *t, const char *rel);

#define T(name) int name(struct test_ctx *t);
#include "tests.def"
#undef T

#endif
