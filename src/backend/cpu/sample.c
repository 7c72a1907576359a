/* sample.c - the CPU sample op: per row, core/draw.c's pipeline (the sampler of run/sample.c
 * without penalties), rows split over the thread pool. A row the op does not take
 * (dsi_sample_op_takes) gets token -1. */
#include "cpu_impl.h"

#include "core/draw.h"
#include "core/philox.h"

struct sample_job {
    const struct dsi_sample_args *a;
};

static void sample_part(void *ctx, int64_t r0, int64_t r1, int tid) {
    const struct dsi_sample_args *a = ((const struct sample_job *)ctx)->a;
    /* the draw needs top_k candidates at most for the rows the op takes (8 KiB): on the stack,
     * so the op allocates nothing and needs no reserve */
    struct dsi_draw_cand c[DSI_SAMPLE_OP_MAX_TOPK];
    for (int64_t r = r0; r < r1; r++) {
        const struct dsi_sample_row *row = &a->rows[r];
        if (!dsi_sample_op_takes(row, a->n_vocab)) {
            a->out[r] = -1;
            continue;
        }
        struct dsi_draw_params p = {.temperature = row->temperature,
                                    .top_k = row->top_k,
                                    .top_p = row->top_p,
                                    .min_p = row->min_p,
                                    .seed = row->seed,
                                    .stream = row->stream,
                                    .purpose = DSI_PURPOSE_SAMPLE};
        DSI_ASSERT(dsi_draw_scratch((int)a->n_vocab, &p) <= DSI_SAMPLE_OP_MAX_TOPK);
        a->out[r] = dsi_draw(a->logits + r * a->ld, (int)a->n_vocab, &p, row->pos, c);
    }
}

void cpu_sample(struct dsi_backend *be, const struct dsi_sample_args *a) {
    if (a->n <= 0) return;
    DSI_ASSERT(a->n_vocab >= 1 && a->n_vocab <= INT32_MAX && a->ld >= a->n_vocab);
    struct sample_job j = {a};
    dsi_pool_run(cpu_ctx(be)->pool, a->n, 1, sample_part, &j);
}
