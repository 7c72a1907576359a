/* pool.c - persistent thread pool with a generation counter; see pool.h.
 * Invariant: workers only read job fields after observing a new generation under the lock. */
#define _POSIX_C_SOURCE 200809L
#include "pool.h"

#include "core.h"

#include <pthread.h>
#include <unistd.h>

struct dsi_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t gen;
    int pending, quit;
    /* current job */
    dsi_pool_fn fn;
    void *ctx;
    int64_t n_items, chunk;
};

struct worker_arg {
    struct dsi_pool *p;
    int tid;
};

static void run_part(struct dsi_pool *p, int tid) {
    int64_t i0 = (int64_t)tid * p->chunk;
    int64_t i1 = DSI_MIN(p->n_items, i0 + p->chunk);
    if (i0 < i1) p->fn(p->ctx, i0, i1, tid);
}

static void *worker(void *arg) {
    struct worker_arg *wa = arg;
    struct dsi_pool *p = wa->p;
    int tid = wa->tid;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->quit)
            pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_part(p, tid);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct dsi_pool *dsi_pool_new(int n_threads) {
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads <= 0) n_threads = 1;
    struct dsi_pool *p = dsi_calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = dsi_calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = dsi_malloc(sizeof(*wa));
        DSI_ASSERT(wa);
        wa->p = p;
        wa->tid = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa) != 0) {
            free(wa);
            p->n = i; /* run with what we have */
            break;
        }
    }
    return p;
}

void dsi_pool_free(struct dsi_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

int dsi_pool_size(const struct dsi_pool *p) { return p ? p->n : 1; }

void dsi_pool_run(struct dsi_pool *p, int64_t n, int64_t grain, dsi_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = p ? p->n : 1;
    int64_t max_parts = (n + grain - 1) / grain;
    if (max_parts < nt) nt = (int)max_parts;
    if (!p || nt <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->chunk = (n + nt - 1) / nt;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    run_part(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
