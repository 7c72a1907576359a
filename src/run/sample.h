/* sample.h - token sampling from a row of logits: greedy, temperature, top-k, top-p, drawn
 * with a counter-based generator keyed by (seed, step) so a seed gives the same tokens. */
#ifndef DSI_SAMPLE_H
#define DSI_SAMPLE_H

#include <stdint.h>

/* work: at least 2 * n floats of scratch. */
int32_t dsi_sample(const float *logits, int n, float temperature, float top_p, int top_k,
                   uint64_t seed, uint64_t step, float *work);

#endif
