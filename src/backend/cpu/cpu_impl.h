/* cpu_impl.h - internals shared by the CPU backend's files. */
#ifndef DSI_CPU_IMPL_H
#define DSI_CPU_IMPL_H

#include "backend/backend.h"
#include "backend/cpu/quant.h"
#include "core/pool.h"

struct cpu_ctx {
    struct dsi_pool *pool;
    int n_threads;
    char **scratch; /* [n_threads] per-thread scratch, scratch_bytes each */
    int64_t scratch_bytes;
};

static inline struct cpu_ctx *cpu_ctx(struct dsi_backend *be) { return be->ctx; }
/* Per-thread scratch of at least `bytes` (DSI_ASSERT if reserve was too small). */
void *cpu_scratch(struct dsi_backend *be, int tid, int64_t bytes);

/* Transcendentals evaluated in double and rounded to float: the correctly rounded value, the
 * same on every libm and the same as the CUDA backend's (so the backends agree bit for bit). */
#include <math.h>
static inline float cpu_expf(float x) { return (float)exp((double)x); }
static inline float cpu_cosf(float x) { return (float)cos((double)x); }
static inline float cpu_sinf(float x) { return (float)sin((double)x); }
static inline float cpu_log1pf(float x) { return (float)log1p((double)x); }

void cpu_tables_init(void); /* once, before any op */
/* Decode row `row` of a weight (any type) into out[0 .. w->ne[0]). */
void cpu_decode_row(const struct dsi_tensor *w, int64_t row, float *out);
/* Read element i of a float vector tensor (F32/BF16/F16). */
float cpu_vec_get(const struct dsi_tensor *t, int64_t i);
/* Dot product in fixed order: 32-wide partial sums with 8 lanes each, added in sequence. */
float cpu_dot(const float *a, const float *b, int64_t n);

void cpu_gemm(struct dsi_backend *, const struct dsi_gemm_args *);
void cpu_act_quant(struct dsi_backend *, const struct dsi_act_quant_args *);
void cpu_moe(struct dsi_backend *, const struct dsi_moe_args *);
void cpu_rms_norm(struct dsi_backend *, const struct dsi_rms_norm_args *);
void cpu_rope(struct dsi_backend *, const struct dsi_rope_args *);
void cpu_hc_pre(struct dsi_backend *, const struct dsi_hc_pre_args *);
void cpu_hc_post(struct dsi_backend *, const struct dsi_hc_post_args *);
void cpu_hc_head(struct dsi_backend *, const struct dsi_hc_head_args *);
void cpu_attn(struct dsi_backend *, const struct dsi_attn_args *);
void cpu_indexer(struct dsi_backend *, const struct dsi_indexer_args *);
void cpu_kv_store(struct dsi_backend *, const struct dsi_kv_store_args *);
void cpu_comp_ape(struct dsi_backend *, const struct dsi_comp_ape_args *);
void cpu_compress(struct dsi_backend *, const struct dsi_compress_args *);
void cpu_comp_store(struct dsi_backend *, const struct dsi_comp_store_args *);
void cpu_entry_store(struct dsi_backend *, const struct dsi_entry_store_args *);
void cpu_gather(struct dsi_backend *, const struct dsi_gather_args *);
/* Address of entry i of the sequence in `slot` in a paged pool of rows of `width` floats. */
static inline int64_t
cpu_paged(const struct dsi_step *st, int slot, int64_t i, int ratio, int64_t width) {
    int64_t per_page = st->page_tokens / ratio;
    int32_t page = st->page_table[(int64_t)slot * st->max_pages + i / per_page];
    return ((int64_t)page * per_page + i % per_page) * width;
}
/* Row i of a cache's key rows: store v (FP8: quantised by the row format's rule, exact for the
 * [QAT] values it is meant for); read it as floats (F32: the row itself; FP8: decoded into
 * buf[0 .. dim), which is returned). */
void cpu_kv_row_put(const struct dsi_kv_rows *k, int64_t i, const float *v);
const float *cpu_kv_row_get(const struct dsi_kv_rows *k, int64_t i, float *buf);
/* Decoding tables (gemm.c, filled by cpu_tables_init): an e4m3 code's value; a byte's two e2m1
 * values, low nibble first. */
extern float g_e4m3[256];
extern float g_fp4_pair[256][2];
static inline float cpu_e4m3(uint8_t b) { return g_e4m3[b]; }
static inline const float *cpu_fp4_pair(uint8_t b) { return g_fp4_pair[b]; }
void cpu_hadamard_q4(struct dsi_backend *, const struct dsi_hadamard_q4_args *);
void cpu_embed(struct dsi_backend *, const struct dsi_embed_args *);
void cpu_add(struct dsi_backend *, const struct dsi_add_args *);
void cpu_copy(struct dsi_backend *, const struct dsi_copy_args *);
void cpu_moe_route(struct dsi_backend *, const struct dsi_moe_route_args *);
void cpu_sample(struct dsi_backend *, const struct dsi_sample_args *);

#endif
