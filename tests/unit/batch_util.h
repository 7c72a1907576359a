/* batch_util.h - helpers shared by the serving-API tests (test_batch.c, test_batch_grammar.c):
 * open a serving engine with the tests' options, run requests to completion, free results. */
#ifndef DSI_TEST_BATCH_UTIL_H
#define DSI_TEST_BATCH_UTIL_H

#include "dsinfer.h"

#include <stdio.h>

/* A serving engine: one thread, 128-row steps, 1024 positions, chunks aligned to 32. */
static inline int tb_open(struct dsi_engine **e,
                          const char *dir,
                          int max_seqs,
                          int64_t kv_pages,
                          bool sync,
                          const char *tok_dir) {
    struct dsi_engine_opts eo = {
        .model_dir = dir, .n_threads = 1, .max_rows = 128, .max_ctx = 1024, .max_seqs = max_seqs};
    struct dsi_batch_opts bo = {
        .sync = sync, .kv_pages = kv_pages, .chunk_align = 32, .tokenizer_dir = tok_dir};
    struct dsi_err err = {0};
    int rc = dsi_batch_open(e, &eo, &bo, &err);
    if (rc) fprintf(stderr, "  dsi_batch_open: %s\n", err.msg);
    return rc;
}

/* Submit n requests (tag = index) and collect their results in res[tag]. */
static inline int
tb_run(struct dsi_engine *e, const struct dsi_request *q, int n, struct dsi_result **res) {
    for (int i = 0; i < n; i++) {
        struct dsi_request r = q[i];
        r.tag = (uint64_t)i;
        struct dsi_err err = {0};
        res[i] = NULL;
        if (dsi_submit(e, &r, NULL, &err)) {
            fprintf(stderr, "  submit %d: %s\n", i, err.msg);
            return -1;
        }
    }
    struct dsi_event ev[16];
    for (int got = 0; got < n;) {
        int k = dsi_poll(e, ev, 16, 30000);
        if (k <= 0) {
            fprintf(stderr, "  poll: %d (%d of %d results)\n", k, got, n);
            return -1;
        }
        for (int i = 0; i < k; i++)
            if (ev[i].kind == DSI_EVENT_DONE) {
                res[ev[i].tag] = ev[i].result;
                got++;
            }
    }
    return 0;
}

static inline void tb_free(struct dsi_result **res, int n) {
    for (int i = 0; i < n; i++)
        dsi_result_free(res[i]);
}

#endif
