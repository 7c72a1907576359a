/* attn.cuh - the attention op's parameters and key lookup, shared by attn.cu (the exact
 * kernels), attn_tc.cu (the tensor-core products of `fast` numerics) and attn_fa.cu (the fused
 * kernel of `fast` numerics). */
#ifndef DSI_CUDA_ATTN_CUH
#define DSI_CUDA_ATTN_CUH

#include "common.cuh"

struct attn_p {
    struct cu_step st;
    const float *q;
    float *out;
    int H, hd;
    const float *ring, *entries;
    int ratio;
    const int32_t *sel, *n_sel;
    int topk;
    struct cu_vec sinks;
    float scale;
    bool round_probs, round_bf16;
    float *S;
    int64_t maxk;
    int r0;
    bool fexp; /* attn_fa.cu: the single-precision exp (c->attn_fa_exp) */
    /* attn_fa.cu split along the keys (fa_o non-NULL; blockIdx.z = split, fa_tps tiles each):
       each block's unnormalised output rows [split][row][H][hd] in fa_o and its running maximum
       and sum [split][row][H][2] in fa_ml, merged by k_attn_fa_merge */
    float *fa_o, *fa_ml;
    int fa_tps;
};

__device__ __forceinline__ int attn_nkeys(const struct attn_p &p, int r, int64_t *w0) {
    int64_t t = p.st.pos[r];
    *w0 = t - p.st.window + 1 > 0 ? t - p.st.window + 1 : 0;
    int64_t nk = t - *w0 + 1;
    if (p.entries) nk += p.sel ? p.n_sel[r] : (t + 1) / p.ratio;
    return (int)(nk < p.maxk ? nk : p.maxk);
}

__device__ __forceinline__ const float *attn_key(const struct attn_p &p, int r, int64_t w0, int j) {
    int64_t t = p.st.pos[r];
    int64_t nwin = t - w0 + 1;
    int slot = p.st.slot[r];
    if (j < nwin) return p.ring + ((int64_t)slot * p.st.ring_cap + (w0 + j) % p.st.ring_cap) * p.hd;
    int64_t i = j - nwin;
    if (p.sel) i = p.sel[(int64_t)r * p.topk + i];
    return p.entries +
           paged(p.st.page_table, p.st.max_pages, p.st.page_tokens, slot, i, p.ratio, p.hd);
}

/* The tensor-core score and p.v kernels (attn_tc.cu) for one batch of rows [p.r0, p.r0 + rows);
 * false: not taken (shapes), the caller runs the exact ones. The softmax between them is
 * attn.cu's. */
bool attn_tc_ok(const struct attn_p *p);
bool launch_attn_scores_tc(struct cu_ctx *c, const struct attn_p *p, int rows);
bool launch_attn_pv_tc(struct cu_ctx *c, const struct attn_p *p, int rows);

/* `fast` numerics: scores, softmax and p.v in one kernel (attn_fa.cu; split along the keys below a
 * block per SM, then a merge) for all rows [0, rows) of the step (p->S unused), where attn_fa_ok
 * (shapes, alignment, the device's shared memory); the launch's false: an error (sticky). */
bool attn_fa_ok(const struct cu_ctx *c, const struct attn_p *p);
bool launch_attn_fa(struct cu_ctx *c, const struct attn_p *p, int rows);

#endif
