/* json_out_test.c - src/core/json_out.c against Python's json.dumps / repr(float)
 * (tests/golden/tok/json.json, made by ref/tok_gen_goldens.py). */
#include "test.h"
#include "core/json_out.h"

#include <jansson.h>
#include <stdlib.h>

static int check_dump(const json_t *v, int flags, const json_t *want, const char *src) {
    char *s;
    size_t n;
    struct dsi_err err = {0};
    TEST_ASSERTF(dsi_json_dumps(v, flags, &s, &n, &err) == 0, "%s: %s", src, err.msg);
    int same = n == json_string_length(want) && !memcmp(s, json_string_value(want), n);
    if (!same)
        fprintf(stderr, "  %s (flags %d): got '%s' want '%s'\n", src, flags, s,
                json_string_value(want));
    free(s);
    return same ? 0 : 1;
}

int test_json_out_python(struct test_ctx *t) {
    json_error_t je;
    json_t *g = json_load_file(test_path(t, "tests/golden/tok/json.json"), 0, &je);
    TEST_ASSERTF(g, "%s", je.text);
    size_t i;
    json_t *c;
    int bad = 0, n = 0;
    json_array_foreach(json_object_get(g, "values"), i, c) {
        const json_t *src = json_object_get(c, "json");
        json_t *v = json_loadb(json_string_value(src), json_string_length(src),
                               JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        TEST_ASSERTF(v, "%s: %s", json_string_value(src), je.text);
        bad += check_dump(v, DSI_JSON_PY, json_object_get(c, "py"), json_string_value(src));
        bad +=
            check_dump(v, DSI_JSON_ASCII, json_object_get(c, "py_ascii"), json_string_value(src));
        bad += check_dump(v, DSI_JSON_COMPACT, json_object_get(c, "py_compact"),
                          json_string_value(src));
        json_decref(v);
        n++;
    }
    TEST_ASSERT(n >= 25 && bad == 0);
    json_decref(g);
    return 0;
}

int test_json_out_floats(struct test_ctx *t) {
    json_error_t je;
    json_t *g = json_load_file(test_path(t, "tests/golden/tok/json.json"), 0, &je);
    TEST_ASSERTF(g, "%s", je.text);
    size_t i;
    json_t *c;
    int bad = 0, n = 0;
    json_array_foreach(json_object_get(g, "doubles"), i, c) {
        uint64_t bits = strtoull(json_string_value(json_array_get(c, 0)), NULL, 16);
        double d;
        memcpy(&d, &bits, 8);
        char buf[64];
        int len = dsi_json_format_double(d, buf, sizeof(buf));
        const char *want = json_string_value(json_array_get(c, 1));
        if (len < 0 || strcmp(buf, want)) {
            if (bad < 10) fprintf(stderr, "  %.17g: got '%s' want '%s'\n", d, buf, want);
            bad++;
        }
        n++;
    }
    TEST_ASSERT(n >= 3000 && bad == 0);
    json_decref(g);
    char buf[64];
    TEST_ASSERT(dsi_json_format_double(1.0 / 0.0, buf, sizeof(buf)) == -1);
    return 0;
}

int test_json_out_misc(struct test_ctx *t) {
    /* insertion order, nesting limit, NaN refusal, append keeps prior content */
    json_t *o = json_object();
    json_object_set_new(o, "z", json_integer(1));
    json_object_set_new(o, "a", json_string("x\"y"));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    TEST_ASSERT(dsi_json_append_string("k", 1, 0, &buf, &len, &cap, NULL) == 0);
    TEST_ASSERT(dsi_json_append(o, 0, &buf, &len, &cap, NULL) == 0);
    TEST_ASSERT(!strcmp(buf, "\"k\"{\"z\": 1, \"a\": \"x\\\"y\"}"));
    free(buf);
    json_decref(o);
    json_t *deep = json_array(), *cur = deep;
    for (int i = 0; i < 3000; i++) {
        json_t *n = json_array();
        json_array_append_new(cur, n);
        cur = n;
    }
    char *s;
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_json_dumps(deep, 0, &s, &len, &err) == DSI_ERR_INVALID);
    TEST_ASSERT(strstr(err.msg, "nesting"));
    json_decref(deep);
    (void)t;
    return 0;
}
