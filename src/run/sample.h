/* sample.h - the sampler: one row of logits -> one token, as a fixed pipeline (design 8):
 *
 *     penalties -> temperature -> top-k -> top-p -> min-p -> keyed Gumbel-max draw
 *
 * Draws are a pure function of (seed, position, token id, completion index): Philox4x32-10
 * keyed by the request's 64-bit seed with counter (v / 4, position, purpose << 16, stream), so
 * a seeded request gives the same tokens whatever the batch, the step boundaries, preemption
 * and recompute (spec/techniques.md section 3.3). Noise is keyed by token id, so masks never
 * move other tokens' noise; the Gumbel value is computed in double from a 32-bit uniform that
 * is never 0 or 1. Temperature <= 0 is greedy: argmax, ties to the lower id.
 *
 * Penalties (only from tokens committed to the sequence):
 *   presence / frequency (OpenAI): logit[v] -= presence * (count_v > 0) + frequency * count_v,
 *       counts over the generated tokens;
 *   repetition (HF / vLLM): for every v in the prompt or the generated tokens,
 *       logit[v] = logit[v] > 0 ? logit[v] / r : logit[v] * r.
 * top-k keeps the k largest (ties: lower id first); top-p keeps the smallest prefix of the
 * sorted kept tokens whose probability mass (softmax after temperature, renormalised over the
 * top-k set) reaches top_p; min-p keeps tokens with p >= min_p * p_max.
 *
 * Logprobs are the log-softmax of the row of logits the sampler was given (before penalties
 * and temperature: vLLM's "raw logprobs"), for the chosen token and the top-N alternatives
 * (largest first, ties to the lower id).
 *
 * The draw itself (temperature onwards) is core/draw.c, shared with the backends' sample op.
 *
 * Ownership: struct dsi_sampler owns its scratch (sized for one vocabulary); one per thread. */
#ifndef DSI_SAMPLE_H
#define DSI_SAMPLE_H

#include "core/philox.h" /* dsi_philox4x32, enum dsi_sample_purpose */

#include <stdbool.h>
#include <stdint.h>

/* Most top-N alternatives reported per token. */
#define DSI_SAMPLE_MAX_TOP 20

struct dsi_sample_params {
    float temperature;        /* <= 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1 (or <= 0): off */
    float min_p;              /* <= 0: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    float repetition_penalty; /* 1 (or <= 0): off */
    uint64_t seed;            /* Philox key */
    uint32_t stream;          /* completion index (n > 1): the counter's fourth word */
};

/* The tokens the penalties look at (borrowed for the call). */
struct dsi_sample_hist {
    const int32_t *prompt;
    int n_prompt;
    const int32_t *gen;
    int n_gen;
};

/* Logprob output for one sampled token (optional). */
struct dsi_sample_lp {
    int n_top;       /* alternatives wanted, 0..DSI_SAMPLE_MAX_TOP */
    float chosen;    /* out: logprob of the chosen token */
    int32_t *top_id; /* out: [n_top] */
    float *top_lp;   /* out: [n_top] */
};

struct dsi_sampler;

/* Scratch for vocabularies of n_vocab tokens. NULL on out of memory. */
struct dsi_sampler *dsi_sampler_new(int n_vocab);
void dsi_sampler_free(struct dsi_sampler *s);

/* Sample the token at absolute position pos from logits[n_vocab] (not modified). hist may be
 * NULL when no penalty is set; lp may be NULL. */
int32_t dsi_sampler_sample(struct dsi_sampler *s,
                           const float *logits,
                           const struct dsi_sample_params *p,
                           const struct dsi_sample_hist *hist,
                           int64_t pos,
                           struct dsi_sample_lp *lp);

/* Log-softmax entries of logits[n]: the chosen token's and the top n_top alternatives. */
void dsi_sample_logprobs(const float *logits, int n, int32_t chosen, struct dsi_sample_lp *lp);

/* Philox4x32-10 (Salmon et al., SC'11): dsi_philox4x32(ctr, key, out), declared in
 * core/philox.h, shared with the backends' sample op, which must produce the same words. */

/* The Gumbel(0, 1) noise the draw adds to logit[v] / T for token v at position pos. */
double dsi_sample_gumbel(uint64_t seed, uint32_t stream, int purpose, int64_t pos, int32_t v);

/* Compatibility wrapper used by dsi_engine_generate: temperature / top-p / top-k only, stream 0,
 * position `step`. work: at least 2 * n floats of scratch. */
int32_t dsi_sample(const float *logits,
                   int n,
                   float temperature,
                   float top_p,
                   int top_k,
                   uint64_t seed,
                   uint64_t step,
                   float *work);

#endif
