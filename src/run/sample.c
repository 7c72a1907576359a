/* sample.c - see sample.h. */
#include "sample.h"

#include "core/core.h"

#include <math.h>
#include <stdlib.h>

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

int32_t dsi_sample(const float *logits, int n, float temperature, float top_p, int top_k,
                   uint64_t seed, uint64_t step, float *work) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0f) return best;
    /* threshold logit from top-k */
    float *sorted = work;
    for (int i = 0; i < n; i++) sorted[i] = logits[i];
    qsort(sorted, (size_t)n, sizeof(float), cmp_desc);
    float kth = (top_k > 0 && top_k < n) ? sorted[top_k - 1] : -INFINITY;
    float mx = logits[best];
    double z = 0.0;
    for (int i = 0; i < n; i++)
        if (sorted[i] >= kth) z += exp((double)(sorted[i] - mx) / (double)temperature);
    /* top-p: smallest prefix of the sorted distribution with mass >= top_p */
    float pth = -INFINITY;
    if (top_p < 1.0f) {
        double c = 0.0;
        for (int i = 0; i < n && sorted[i] >= kth; i++) {
            c += exp((double)(sorted[i] - mx) / (double)temperature) / z;
            if (c >= (double)top_p) {
                pth = sorted[i];
                break;
            }
        }
    }
    float th = fmaxf(kth, pth);
    double total = 0.0;
    float *p = work + n;
    for (int i = 0; i < n; i++) {
        p[i] = logits[i] >= th ? (float)exp((double)(logits[i] - mx) / (double)temperature) : 0.0f;
        total += (double)p[i];
    }
    uint64_t r = mix64(seed ^ mix64(step));
    double u = (double)(r >> 11) * (1.0 / 9007199254740992.0) * total, c = 0.0;
    for (int i = 0; i < n; i++) {
        c += (double)p[i];
        if (p[i] > 0.0f && u < c) return i;
    }
    return best;
}
