/* sample_cases.h - batches for the sample op tests (test_sample_op.c: the CPU op against the
 * sampler; tests/ops/test_sample_cuda.c: the CUDA op against the CPU op). Each batch mixes
 * parameter sets (greedy, temperature, min-p, top-k 1/2/50/1023/1024, top-p with top-k, rows
 * the op does not take, tiny temperatures that overflow x / T) and kinds of logits (normal,
 * -inf masks, forced ties, all but one -inf, all -inf, signed zeros, huge and subnormal
 * values), with random seeds, streams and positions (some past 2^32). The padding of rows
 * (ld > n_vocab) holds +1e30, which would win every draw if an op read it. */
#ifndef DSI_TEST_SAMPLE_CASES_H
#define DSI_TEST_SAMPLE_CASES_H

#include "backend/backend.h"

#include <stdint.h>

struct sample_case {
    char name[96];
    int64_t n, n_vocab, ld;
    float *logits;               /* [n, ld] */
    struct dsi_sample_row *rows; /* [n] */
};

/* Number of cases in the standard list. */
int sample_cases_count(void);
/* Case i (0 <= i < sample_cases_count()); 0, or -1 out of memory. */
int sample_case_make(struct sample_case *c, int i, uint64_t seed);
/* A batch of n rows at vocabulary n_vocab (ld = n_vocab) with parameters as a server sees them
 * (greedy, temperature only, top-k + top-p, min-p). 0, or -1 out of memory. */
int sample_case_serving(struct sample_case *c, int64_t n, int64_t n_vocab, uint64_t seed);
void sample_case_free(struct sample_case *c);

#endif
