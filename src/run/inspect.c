/* inspect.c - dsi_inspect: config summary, layer table, tensor counts and bytes by dtype, and
 * the validation result of binding every tensor. */
#include "dsinfer.h"

#include "cache/kv.h"
#include "model/dsv4.h"

/* The cache's bytes in format dtype: per position of context (compressed entries and indexer
 * keys, from a page's bytes) and per sequence (the window rings of every layer, window rows). */
static void cache_line(FILE *f, const struct dsi_config *c, int dtype, const char *name) {
    int rope = dtype == DSI_KV_FP8 ? c->qk_rope_head_dim : 0;
    double per_pos = (double)dsi_kv_page_bytes(c, dtype) / dsi_kv_page_tokens(c);
    double ring = (double)c->n_layers_total * c->sliding_window *
                  (double)dsi_kv_row_total(dtype, c->head_dim, rope);
    fprintf(f, "  %-4s %8.1f bytes a position of context, %.2f MiB a sequence (window rings)\n",
            name, per_pos, ring / (1 << 20));
}

int dsi_inspect(const char *dir, void *file, struct dsi_err *err) {
    FILE *f = file;
    struct dsi_config cfg;
    int rc = dsi_config_load(&cfg, dir, err);
    if (rc) return rc;
    fprintf(f, "model: %s\n", dir);
    fprintf(f,
            "config: vocab %d, hidden %d, layers %d (+%d MTP), heads %d x %d (rope %d), "
            "q_lora %d, o_groups %d x %d, window %d\n",
            cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_nextn_predict_layers,
            cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.q_lora_rank,
            cfg.o_groups, cfg.o_lora_rank, cfg.sliding_window);
    fprintf(f,
            "        experts %d (top-%d, inter %d, %d hash layers, scale %.3g), indexer %d x %d "
            "top-%d, mHC %d streams %d iters\n",
            cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.num_hash_layers, cfg.routed_scaling_factor, cfg.index_n_heads, cfg.index_head_dim,
            cfg.index_topk, cfg.hc_mult, cfg.hc_sinkhorn_iters);
    fprintf(f, "layers:");
    for (int i = 0; i < cfg.n_layers_total; i++) {
        const struct dsi_layer_info *l = &cfg.layers[i];
        fprintf(f, " %d:%s%s%s", i,
                l->kind == DSI_ATTN_WINDOW ? "win"
                : l->kind == DSI_ATTN_CSA  ? "csa"
                                           : "hca",
                l->hash_routed ? "/hash" : "", i >= cfg.num_hidden_layers ? "(mtp)" : "");
    }
    fprintf(f, "\n");
    fprintf(f, "cache (--kv-cache; fp8: the reference and fast profiles' default):\n");
    cache_line(f, &cfg, DSI_KV_F32, "f32");
    if (dsi_kv_fp8_ok(cfg.head_dim, cfg.qk_rope_head_dim)) cache_line(f, &cfg, DSI_KV_FP8, "fp8");
    struct dsi_st *st = NULL;
    rc = dsi_st_open(&st, dir, err);
    if (rc) return rc;
    int64_t count[DSI_DT_COUNT] = {0}, bytes[DSI_DT_COUNT] = {0};
    for (int i = 0; i < st->n_tensors; i++) {
        count[st->tensors[i].dtype]++;
        bytes[st->tensors[i].dtype] += (int64_t)st->tensors[i].n_bytes;
    }
    fprintf(f, "tensors: %d in %d shard%s, %zu bytes\n", st->n_tensors, st->n_shards,
            st->n_shards == 1 ? "" : "s", dsi_st_total_bytes(st));
    for (int d = 0; d < DSI_DT_COUNT; d++)
        if (count[d])
            fprintf(f, "  %-8s %8lld tensors %14lld bytes\n", dsi_dtype_name((enum dsi_dtype)d),
                    (long long)count[d], (long long)bytes[d]);
    dsi_st_close(st);
    struct dsi_model *m = NULL;
    rc = dsi_model_load(&m, dir, err);
    if (rc) return rc;
    fprintf(f, "validation: ok (%lld parameters)\n", (long long)m->n_params);
    dsi_model_free(m);
    return DSI_OK;
}
