/* test_sample.c - the sampler (src/run/sample.c): Philox known answers, greedy ties, keyed
 * determinism, unbiasedness (chi-square against the softmax, with top-k / top-p / min-p
 * masks), noise keyed by token id, penalties and logprobs. */
#include "test.h"

#include "core/core.h"
#include "run/sample.h"

#include <stdlib.h>

int test_sample_philox(struct test_ctx *t) {
    /* Random123 known-answer vectors for philox4x32-10 */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                       {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    static const uint32_t key[3][2] = {
        {0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        dsi_philox4x32(ctr[i], key[i], out);
        for (int k = 0; k < 4; k++)
            TEST_ASSERTF(out[k] == want[i][k], "vector %d word %d: %08x want %08x", i, k, out[k],
                         want[i][k]);
    }
    return 0;
}

int test_sample_greedy(struct test_ctx *t) {
    struct dsi_sampler *s = dsi_sampler_new(6);
    TEST_ASSERT(s);
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f};
    struct dsi_sample_params p = {.repetition_penalty = 1.0f};
    TEST_ASSERT(dsi_sampler_sample(s, l, &p, NULL, 0, NULL) == 1); /* tie: lower id */
    /* penalties: frequency over generated tokens, presence once, repetition on prompt too */
    int32_t gen[3] = {1, 1, 3};
    struct dsi_sample_hist h = {NULL, 0, gen, 3};
    p.frequency_penalty = 0.3f; /* 1: 2 - 0.6 = 1.4, 3: 1.7 */
    TEST_ASSERT(dsi_sampler_sample(s, l, &p, &h, 0, NULL) == 3);
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 1.5f; /* 1 and 3 both -> 0.5; 4 wins */
    TEST_ASSERT(dsi_sampler_sample(s, l, &p, &h, 0, NULL) == 4);
    p.presence_penalty = 0.0f;
    int32_t prompt[1] = {4};
    h = (struct dsi_sample_hist){prompt, 1, gen, 1};
    p.repetition_penalty = 2.0f; /* 1: 2 / 2 = 1; 3 stays 2 */
    TEST_ASSERT(dsi_sampler_sample(s, l, &p, &h, 0, NULL) == 3);
    float neg[6] = {-1.0f, -0.6f, -3.0f, -3.0f, -3.0f, -3.0f};
    int32_t g1[1] = {1};
    h = (struct dsi_sample_hist){NULL, 0, g1, 1};
    TEST_ASSERT(dsi_sampler_sample(s, neg, &p, &h, 0, NULL) == 0); /* -0.6 * 2 = -1.2 < -1 */
    dsi_sampler_free(s);
    return 0;
}

static double chi2(const int *cnt, const double *p, int n, int total) {
    double x = 0.0;
    for (int i = 0; i < n; i++)
        if (p[i] > 0.0)
            x += ((double)cnt[i] - total * p[i]) * ((double)cnt[i] - total * p[i]) / (total * p[i]);
    return x;
}

/* Histogram over (seed, position) pairs against the softmax of the kept tokens. */
int test_sample_distribution(struct test_ctx *t) {
    enum { V = 8, N = 200000 };
    const float l[V] = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -14.0f, 0.2f};
    struct dsi_sampler *s = dsi_sampler_new(V);
    struct {
        float temp, top_p, min_p;
        int top_k;
    } cases[] = {{1.0f, 1.0f, 0.0f, 0}, {0.7f, 1.0f, 0.0f, 0}, {1.0f, 1.0f, 0.0f, 3},
                 {1.0f, 0.8f, 0.0f, 0}, {1.3f, 1.0f, 0.2f, 0}, {1.0f, 0.9f, 0.0f, 4}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        /* expected: softmax(l / T) restricted as the pipeline says */
        double pr[V], z = 0.0, mx = -1e30;
        int order[V];
        for (int i = 0; i < V; i++)
            order[i] = i;
        for (int i = 0; i < V; i++) /* sort ids by logit, descending (no ties here) */
            for (int j = i + 1; j < V; j++)
                if (l[order[j]] > l[order[i]]) {
                    int x = order[i];
                    order[i] = order[j];
                    order[j] = x;
                }
        int m = cases[c].top_k > 0 ? cases[c].top_k : V;
        for (int i = 0; i < V; i++)
            mx = fmax(mx, (double)(l[i] / cases[c].temp));
        for (int i = 0; i < m; i++)
            z += exp((double)(l[order[i]] / cases[c].temp) - mx);
        if (cases[c].top_p < 1.0f) {
            double cum = 0.0;
            for (int i = 0; i < m; i++) {
                cum += exp((double)(l[order[i]] / cases[c].temp) - mx) / z;
                if (cum >= (double)cases[c].top_p) {
                    m = i + 1;
                    break;
                }
            }
        }
        memset(pr, 0, sizeof(pr));
        double zz = 0.0;
        for (int i = 0; i < m; i++) {
            int v = order[i];
            double q = exp((double)(l[v] / cases[c].temp) - mx);
            if (cases[c].min_p > 0.0f && q < (double)cases[c].min_p) continue;
            pr[v] = q;
            zz += q;
        }
        for (int i = 0; i < V; i++)
            pr[i] /= zz;
        int cnt[V] = {0};
        struct dsi_sample_params p = {.temperature = cases[c].temp,
                                      .top_p = cases[c].top_p,
                                      .top_k = cases[c].top_k,
                                      .min_p = cases[c].min_p,
                                      .repetition_penalty = 1.0f};
        for (int i = 0; i < N; i++) {
            p.seed = 1000u + (uint64_t)(i / 100);
            int32_t tok = dsi_sampler_sample(s, l, &p, NULL, i % 100, NULL);
            TEST_ASSERT(tok >= 0 && tok < V);
            cnt[tok]++;
        }
        int df = -1;
        for (int i = 0; i < V; i++) {
            if (pr[i] == 0.0)
                TEST_ASSERTF(cnt[i] == 0, "case %zu: masked token %d drawn", c, i);
            else
                df++;
        }
        double x = chi2(cnt, pr, V, N);
        /* 99.99th percentile of chi-square with <= 7 degrees of freedom is < 30 */
        TEST_ASSERTF(x < 30.0, "case %zu: chi-square %.1f (df %d)", c, x, df);
    }
    dsi_sampler_free(s);
    return 0;
}

/* Same seed and position: same token; different seeds differ; a mask that keeps the drawn
 * token does not change the draw (noise keyed by token id); stream separates completions. */
int test_sample_keyed(struct test_ctx *t) {
    enum { V = 1000 };
    float *l = malloc(sizeof(float) * V);
    unsigned rs = t->seed;
    for (int i = 0; i < V; i++)
        l[i] = (float)(rand_r(&rs) % 1000) / 250.0f;
    struct dsi_sampler *s = dsi_sampler_new(V), *s2 = dsi_sampler_new(V);
    struct dsi_sample_params p = {.temperature = 1.0f, .repetition_penalty = 1.0f, .seed = 42};
    int same_seed_diff = 0, diff_seed_same = 0, mask_moved = 0, stream_same = 0;
    for (int pos = 0; pos < 300; pos++) {
        int32_t a = dsi_sampler_sample(s, l, &p, NULL, pos, NULL);
        int32_t b = dsi_sampler_sample(s2, l, &p, NULL, pos, NULL);
        same_seed_diff += a != b;
        struct dsi_sample_params q = p;
        q.seed = 43;
        diff_seed_same += dsi_sampler_sample(s, l, &q, NULL, pos, NULL) == a;
        q = p;
        q.stream = 1;
        stream_same += dsi_sampler_sample(s, l, &q, NULL, pos, NULL) == a;
        /* top-k that keeps a: the draw must still be a */
        int rank = 0;
        for (int i = 0; i < V; i++)
            rank += l[i] > l[a] || (l[i] == l[a] && i < a);
        q = p;
        q.top_k = rank + 1 + pos % 5;
        mask_moved += dsi_sampler_sample(s, l, &q, NULL, pos, NULL) != a;
    }
    TEST_ASSERT(same_seed_diff == 0);
    TEST_ASSERTF(diff_seed_same < 60, "%d", diff_seed_same);
    TEST_ASSERTF(stream_same < 60, "%d", stream_same);
    TEST_ASSERTF(mask_moved == 0, "%d draws moved by a mask that kept them", mask_moved);
    /* the compatibility wrapper draws the same tokens */
    float *work = malloc(sizeof(float) * 2 * V);
    p.top_k = 50;
    p.top_p = 0.9f;
    for (int pos = 0; pos < 50; pos++)
        TEST_ASSERT(dsi_sample(l, V, 1.0f, 0.9f, 50, 42, (uint64_t)pos, work) ==
                    dsi_sampler_sample(s, l, &p, NULL, pos, NULL));
    free(work);
    free(l);
    dsi_sampler_free(s);
    dsi_sampler_free(s2);
    return 0;
}

int test_sample_logprobs(struct test_ctx *t) {
    enum { V = 50 };
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = (float)((i * 37) % 23) / 3.0f - 2.0f;
    l[7] = l[3]; /* a tie */
    double mx = -1e30, z = 0.0;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, (double)l[i]);
    for (int i = 0; i < V; i++)
        z += exp((double)l[i] - mx);
    struct dsi_sampler *s = dsi_sampler_new(V);
    int32_t ids[5];
    float lps[5];
    struct dsi_sample_lp lp = {.n_top = 5, .top_id = ids, .top_lp = lps};
    struct dsi_sample_params p = {.temperature = 0.9f,
                                  .top_k = 10,
                                  .repetition_penalty = 1.0f,
                                  .seed = 5,
                                  .presence_penalty = 1.0f};
    int32_t gen[2] = {3, 4};
    struct dsi_sample_hist h = {NULL, 0, gen, 2};
    int32_t tok = dsi_sampler_sample(s, l, &p, &h, 9, &lp);
    /* the log-softmax of the logits given to the sampler (before penalties / temperature) */
    TEST_ASSERT(fabs((double)lp.chosen - ((double)l[tok] - mx - log(z))) < 1e-5);
    for (int k = 0; k < 5; k++) {
        TEST_ASSERT(fabs((double)lps[k] - ((double)l[ids[k]] - mx - log(z))) < 1e-5);
        if (k) TEST_ASSERT(lps[k] < lps[k - 1] || (lps[k] == lps[k - 1] && ids[k] > ids[k - 1]));
    }
    for (int i = 0; i < V; i++) /* nothing outside the top 5 is larger than the 5th */
        if (l[i] > l[ids[4]]) {
            bool in = false;
            for (int k = 0; k < 5; k++)
                in |= ids[k] == i;
            TEST_ASSERT(in);
        }
    dsi_sampler_free(s);
    return 0;
}
