/* pool.h - persistent CPU thread pool. Work is split by index ranges (rows, heads, output
 * columns), never along a reduction axis, so results are bitwise identical for any thread
 * count. One pool per process is enough; it is owned by whoever calls dsi_pool_new. */
#ifndef DSI_POOL_H
#define DSI_POOL_H

#include <stdint.h>

struct dsi_pool;

/* fn(ctx, i0, i1, tid) processes items [i0, i1); tid in [0, n_threads). */
typedef void (*dsi_pool_fn)(void *ctx, int64_t i0, int64_t i1, int tid);

/* n_threads <= 0 means all online cores. Returns NULL on failure. */
struct dsi_pool *dsi_pool_new(int n_threads);
void dsi_pool_free(struct dsi_pool *p);
int dsi_pool_size(const struct dsi_pool *p);
/* Run fn over [0, n) split into contiguous ranges; returns when all are done. grain: minimum
 * items per task. Not reentrant: call only from the owning thread. */
void dsi_pool_run(struct dsi_pool *p, int64_t n, int64_t grain, dsi_pool_fn fn, void *ctx);

#endif
