/* bench_leave.c - the op table of `bench layer --leave-out` (bench_leave.h). */
#include "bench_leave.h"

#include <string.h>

/* A no-op with op's argument type, and a setter that puts it in an op table. */
#define LEAVE(op, T)                                                                               \
    static void leave_##op(struct dsi_backend *be, const struct T *a) {                            \
        (void)be;                                                                                  \
        (void)a;                                                                                   \
    }                                                                                              \
    static void set_##op(struct dsi_backend_ops *o) { o->op = leave_##op; }

LEAVE(gemm, dsi_gemm_args)
LEAVE(act_quant, dsi_act_quant_args)
LEAVE(hadamard_q4, dsi_hadamard_q4_args)
LEAVE(add, dsi_add_args)
LEAVE(copy, dsi_copy_args)
LEAVE(rms_norm, dsi_rms_norm_args)
LEAVE(rope, dsi_rope_args)
LEAVE(hc_pre, dsi_hc_pre_args)
LEAVE(hc_post, dsi_hc_post_args)
LEAVE(attn, dsi_attn_args)
LEAVE(indexer, dsi_indexer_args)
LEAVE(kv_store, dsi_kv_store_args)
LEAVE(comp_ape, dsi_comp_ape_args)
LEAVE(compress, dsi_compress_args)
LEAVE(comp_store, dsi_comp_store_args)
LEAVE(entry_store, dsi_entry_store_args)
LEAVE(gather, dsi_gather_args)
LEAVE(moe_route, dsi_moe_route_args)
LEAVE(moe, dsi_moe_args)

static const struct {
    const char *name;
    void (*set)(struct dsi_backend_ops *);
} leave_ops[] = {
    {"gemm", set_gemm},
    {"act_quant", set_act_quant},
    {"hadamard_q4", set_hadamard_q4},
    {"add", set_add},
    {"copy", set_copy},
    {"rms_norm", set_rms_norm},
    {"rope", set_rope},
    {"hc_pre", set_hc_pre},
    {"hc_post", set_hc_post},
    {"attn", set_attn},
    {"indexer", set_indexer},
    {"kv_store", set_kv_store},
    {"comp_ape", set_comp_ape},
    {"compress", set_compress},
    {"comp_store", set_comp_store},
    {"entry_store", set_entry_store},
    {"gather", set_gather},
    {"moe_route", set_moe_route},
    {"moe", set_moe},
};

int bench_leave_set(struct dsi_backend_ops *ops, const char *name) {
    for (size_t i = 0; i < sizeof(leave_ops) / sizeof(leave_ops[0]); i++)
        if (!strcmp(leave_ops[i].name, name)) {
            leave_ops[i].set(ops);
            return 0;
        }
    return -1;
}

const char *bench_leave_names(void) {
    static char buf[512];
    if (!buf[0])
        for (size_t i = 0; i < sizeof(leave_ops) / sizeof(leave_ops[0]); i++) {
            if (i) strncat(buf, ",", sizeof(buf) - strlen(buf) - 1);
            strncat(buf, leave_ops[i].name, sizeof(buf) - strlen(buf) - 1);
        }
    return buf;
}
