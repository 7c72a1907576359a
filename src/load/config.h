/* config.h - config.json (model_type deepseek_v4) -> struct dsi_config, validated, with the
 * derived dimensions (spec section 2.3) and the per-layer table (section 2.4). Nothing about
 * shapes is hard-coded anywhere else: every dimension comes from here. */
#ifndef DSI_CONFIG_H
#define DSI_CONFIG_H

#include "core/core.h"

#define DSI_MAX_LAYERS 256

enum dsi_attn_kind { DSI_ATTN_WINDOW = 0, DSI_ATTN_CSA, DSI_ATTN_HCA };

struct dsi_layer_info {
    int ratio;        /* 0 window only, 4 CSA (overlap + indexer), other >= 2 HCA */
    int kind;         /* enum dsi_attn_kind */
    bool hash_routed; /* routes by tid2eid */
    int rope;         /* 0: rope_theta plain; 1: compress_rope_theta + YaRN */
};

struct dsi_config {
    /* config.json fields (spec 2.1) */
    int vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
    int head_dim, qk_rope_head_dim, q_lora_rank, o_groups, o_lora_rank, sliding_window;
    int index_n_heads, index_head_dim, index_topk;
    int n_routed_experts, n_shared_experts, num_experts_per_tok, moe_intermediate_size;
    int num_hash_layers, hc_mult, hc_sinkhorn_iters, num_nextn_predict_layers;
    int bos_token_id, eos_token_id;
    int64_t max_position_embeddings;
    double rope_theta, compress_rope_theta, routed_scaling_factor, swiglu_limit, hc_eps;
    double rms_norm_eps;
    /* rope_scaling (YaRN); yarn_factor 0 = none */
    double yarn_factor, yarn_beta_fast, yarn_beta_slow;
    int64_t yarn_original_max_pos;
    char scoring_func[32], hidden_act[32], expert_dtype[16];
    bool norm_topk_prob;
    /* generation_config.json (defaults if absent) */
    double gen_temperature, gen_top_p;
    int gen_top_k;
    /* derived (spec 2.3) */
    int n_layers_total; /* num_hidden_layers + num_nextn_predict_layers */
    int nope_dim;       /* head_dim - qk_rope_head_dim */
    int hc_mix;         /* (2 + hc_mult) * hc_mult */
    int hc_dim;         /* hc_mult * hidden_size */
    int heads_per_group, group_in_dim, wo_b_in;
    struct dsi_layer_info layers[DSI_MAX_LAYERS];
};

/* Parse and validate DIR/config.json (and DIR/generation_config.json if present). On error
 * the message names the file and field and what was expected. */
int dsi_config_load(struct dsi_config *cfg, const char *dir, struct dsi_err *err);
/* Same from a JSON text (used by tests and the fuzzer); name is used in messages. */
int dsi_config_parse(
    struct dsi_config *cfg, const char *json, size_t len, const char *name, struct dsi_err *err);

#endif
