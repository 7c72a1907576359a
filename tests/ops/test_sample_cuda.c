/* test_sample_cuda.c - the CUDA sample op against the CPU sample op (which test_sample_op.c
 * holds to the sampler): the token ids must be equal, row for row, on every batch of
 * sample_cases.h (n_vocab 1, 7, 1000, 1024, 1025, 129280; ld > n_vocab; ties, -inf masks,
 * overflowing x / T, rows the op does not take) and on serving mixes of 64 and 256 rows at
 * n_vocab 129280. Bad arguments must leave a sticky error. Without a CUDA device the test
 * prints "skipped" and passes. */
#include "test.h"

#include "backend/backend.h"
#include "core/core.h"
#include "unit/sample_cases.h"

#include <stdlib.h>
#include <string.h>

/* The GPU's and the CPU's tokens for case c; 0 when equal. */
static int run_case(struct dsi_backend *gpu, struct dsi_backend *cpu, const struct sample_case *c) {
    size_t lb = sizeof(float) * (size_t)(c->n * c->ld), rb = sizeof(*c->rows) * (size_t)c->n;
    size_t ob = sizeof(int32_t) * (size_t)c->n;
    float *dl = gpu->ops->alloc(gpu, lb);
    struct dsi_sample_row *dr = gpu->ops->alloc(gpu, rb);
    int32_t *dout = gpu->ops->alloc(gpu, ob);
    int32_t *got = malloc(ob), *want = malloc(ob);
    int bad = 1;
    if (!dl || !dr || !dout || !got || !want) {
        fprintf(stderr, "\n  %s: out of memory\n", c->name);
        goto out;
    }
    for (int64_t r = 0; r < c->n; r++)
        got[r] = want[r] = 0x5a5a5a5a; /* poison: not a token, not -1 */
    gpu->ops->upload(gpu, dl, c->logits, lb);
    gpu->ops->upload(gpu, dr, c->rows, rb);
    gpu->ops->upload(gpu, dout, got, ob);
    struct dsi_sample_args a = {
        .logits = dl, .n = c->n, .n_vocab = c->n_vocab, .ld = c->ld, .rows = dr, .out = dout};
    struct dsi_err err = {0};
    gpu->ops->sync(gpu, &err);
    double t0 = dsi_time_s();
    gpu->ops->sample(gpu, &a);
    int rc = gpu->ops->sync(gpu, &err);
    double ms = 1e3 * (dsi_time_s() - t0);
    if (rc) {
        fprintf(stderr, "\n  %s: %s\n", c->name, err.msg);
        goto out;
    }
    gpu->ops->download(gpu, got, dout, ob);
    struct dsi_sample_args ac = a;
    ac.logits = c->logits;
    ac.rows = c->rows;
    ac.out = want;
    cpu->ops->sample(cpu, &ac);
    int64_t nd = 0, first = -1;
    for (int64_t r = 0; r < c->n; r++)
        if (got[r] != want[r]) {
            nd++;
            if (first < 0) first = r;
        }
    if (nd) {
        const struct dsi_sample_row *row = &c->rows[first];
        fprintf(stderr,
                "\n  %s: %lld rows differ; row %lld (T %g top_k %d top_p %g min_p %g seed %llu "
                "stream %u pos %lld): cuda %d, cpu %d\n",
                c->name, (long long)nd, (long long)first, (double)row->temperature, row->top_k,
                (double)row->top_p, (double)row->min_p, (unsigned long long)row->seed, row->stream,
                (long long)row->pos, got[first], want[first]);
        goto out;
    }
    if (c->n_vocab >= 100000) fprintf(stderr, "[%s: %.3f ms] ", c->name, ms);
    bad = 0;
out:
    gpu->ops->mfree(gpu, dl);
    gpu->ops->mfree(gpu, dr);
    gpu->ops->mfree(gpu, dout);
    free(got);
    free(want);
    return bad;
}

/* Bad arguments: a sticky error at sync (on a backend of its own: sticky errors stay). */
static int check_bad_args(void) {
    struct dsi_backend *gpu = NULL;
    struct dsi_err err = {0};
    if (dsi_backend_cuda_new(&gpu, 0, &err)) return 1;
    float *dl = gpu->ops->alloc(gpu, 64);
    struct dsi_sample_row *dr = gpu->ops->alloc(gpu, sizeof(*dr));
    int32_t *dout = gpu->ops->alloc(gpu, 4);
    struct dsi_sample_args a = {
        .logits = dl, .n = 1, .n_vocab = 16, .ld = 8, .rows = dr, .out = dout}; /* ld < n_vocab */
    gpu->ops->sample(gpu, &a);
    int rc = gpu->ops->sync(gpu, &err);
    gpu->ops->mfree(gpu, dl);
    gpu->ops->mfree(gpu, dr);
    gpu->ops->mfree(gpu, dout);
    dsi_backend_free(gpu);
    return rc == DSI_ERR_INVALID ? 0 : 1;
}

int test_cuda_sample(struct test_ctx *t) {
    struct dsi_backend *gpu = NULL, *cpu = NULL;
    struct dsi_err err = {0};
    if (dsi_backend_cuda_new(&gpu, 0, &err)) {
        fprintf(stderr, "[%s] [skipped: no CUDA device] ", err.msg);
        return 0;
    }
    TEST_ASSERT(dsi_backend_cpu_new(&cpu, 0, &err) == 0);
    TEST_ASSERT(gpu->ops->sample && cpu->ops->sample);
    int bad = 0;
    bool tiny = getenv("DSI_TEST_TINY") != NULL; /* compute-sanitizer runs: small vocabularies */
    for (int i = 0; i < sample_cases_count() && !bad; i++) {
        struct sample_case c;
        TEST_ASSERT(sample_case_make(&c, i, t->seed) == 0);
        if (!tiny || c.n_vocab <= 2000) bad = run_case(gpu, cpu, &c);
        sample_case_free(&c);
    }
    static const int64_t serving[][2] = {{64, 129280}, {256, 129280}, {3, 1000}};
    for (size_t i = 0; i < sizeof(serving) / sizeof(serving[0]) && !bad; i++) {
        if (tiny && serving[i][1] > 2000) continue;
        for (uint64_t s = 0; s < 2 && !bad; s++) {
            struct sample_case c;
            TEST_ASSERT(sample_case_serving(&c, serving[i][0], serving[i][1], t->seed + s) == 0);
            bad = run_case(gpu, cpu, &c);
            sample_case_free(&c);
        }
    }
    dsi_backend_free(gpu);
    dsi_backend_free(cpu);
    TEST_ASSERT(!bad);
    TEST_ASSERT(check_bad_args() == 0);
    return 0;
}
