/* config.c - config.json parsing and validation (spec 2.1, 2.5). See config.h. */
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

struct field_ctx {
    json_t *root;
    const char *file;
    struct dsi_err *err;
    int rc;
};

/* Each getter records the first error and leaves the default in place. */
static void
get_int(struct field_ctx *c, const char *key, int *dst, bool required, int64_t lo, int64_t hi) {
    if (c->rc) return;
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) {
        if (required)
            c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: missing field %s", c->file, key);
        return;
    }
    if (!json_is_integer(v)) {
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: field %s: want an integer", c->file, key);
        return;
    }
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: field %s = %lld, want %lld..%lld", c->file,
                         key, (long long)x, (long long)lo, (long long)hi);
        return;
    }
    *dst = (int)x;
}

static void get_i64(struct field_ctx *c, json_t *obj, const char *key, int64_t *dst) {
    if (c->rc) return;
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: field %s: want a non-negative integer",
                         c->file, key);
    else
        *dst = json_integer_value(v);
}

static void get_num(struct field_ctx *c, json_t *obj, const char *key, double *dst, bool required) {
    if (c->rc) return;
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: missing field %s", c->file, key);
        return;
    }
    if (!json_is_number(v)) {
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: field %s: want a number", c->file, key);
        return;
    }
    *dst = json_number_value(v);
    if (!isfinite(*dst))
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: field %s: not finite", c->file, key);
}

static void get_str(struct field_ctx *c, const char *key, char *dst, size_t cap) {
    if (c->rc) return;
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) return;
    if (!json_is_string(v)) {
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: field %s: want a string", c->file, key);
        return;
    }
    snprintf(dst, cap, "%s", json_string_value(v));
}

static void get_bool(struct field_ctx *c, const char *key, bool *dst) {
    if (c->rc) return;
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) return;
    if (!json_is_boolean(v)) {
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG, "%s: field %s: want true or false", c->file, key);
        return;
    }
    *dst = json_is_true(v);
}

static int first_id(json_t *v) {
    if (json_is_integer(v)) return (int)json_integer_value(v);
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0)))
        return (int)json_integer_value(json_array_get(v, 0));
    return -1;
}

/* Layer schedule: compress_ratios (official) or layer_types + compress_rates (HF spelling). */
static void parse_schedule(struct field_ctx *c, struct dsi_config *cfg) {
    if (c->rc) return;
    int n = cfg->n_layers_total;
    json_t *cr = json_object_get(c->root, "compress_ratios");
    json_t *lt = json_object_get(c->root, "layer_types");
    if (json_is_array(cr)) {
        if ((int)json_array_size(cr) != n) {
            c->rc = dsi_errf(c->err, DSI_ERR_CONFIG,
                             "%s: compress_ratios has %zu entries, want num_hidden_layers + "
                             "num_nextn_predict_layers = %d",
                             c->file, json_array_size(cr), n);
            return;
        }
        for (int i = 0; i < n; i++) {
            json_t *v = json_array_get(cr, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) == 1 ||
                json_integer_value(v) > 65536) {
                c->rc = dsi_errf(c->err, DSI_ERR_CONFIG,
                                 "%s: compress_ratios[%d]: want 0, 4 or another integer >= 2",
                                 c->file, i);
                return;
            }
            cfg->layers[i].ratio = (int)json_integer_value(v);
        }
    } else if (json_is_array(lt)) {
        int n_main = cfg->num_hidden_layers;
        if ((int)json_array_size(lt) != n_main) {
            c->rc = dsi_errf(c->err, DSI_ERR_CONFIG,
                             "%s: layer_types has %zu entries, want num_hidden_layers = %d",
                             c->file, json_array_size(lt), n_main);
            return;
        }
        json_t *rates = json_object_get(c->root, "compress_rates");
        int csa = 4, hca = 128;
        if (json_is_object(rates)) {
            json_t *a = json_object_get(rates, "compressed_sparse_attention");
            json_t *b = json_object_get(rates, "heavily_compressed_attention");
            if (json_is_integer(a)) csa = (int)json_integer_value(a);
            if (json_is_integer(b)) hca = (int)json_integer_value(b);
        }
        for (int i = 0; i < n_main; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && !strcmp(s, "sliding_attention"))
                cfg->layers[i].ratio = 0;
            else if (s && !strcmp(s, "compressed_sparse_attention"))
                cfg->layers[i].ratio = csa;
            else if (s && !strcmp(s, "heavily_compressed_attention"))
                cfg->layers[i].ratio = hca;
            else {
                c->rc = dsi_errf(c->err, DSI_ERR_CONFIG,
                                 "%s: layer_types[%d]: want sliding_attention, "
                                 "compressed_sparse_attention or heavily_compressed_attention",
                                 c->file, i);
                return;
            }
        }
        for (int i = n_main; i < n; i++)
            cfg->layers[i].ratio = 0;
    } else {
        c->rc = dsi_errf(c->err, DSI_ERR_CONFIG,
                         "%s: missing field compress_ratios (or layer_types)", c->file);
        return;
    }
    json_t *mt = json_object_get(c->root, "mlp_layer_types");
    if (!json_object_get(c->root, "num_hash_layers") && json_is_array(mt)) {
        int nh = 0;
        while (nh < (int)json_array_size(mt) && json_string_value(json_array_get(mt, (size_t)nh)) &&
               !strcmp(json_string_value(json_array_get(mt, (size_t)nh)), "hash_moe"))
            nh++;
        cfg->num_hash_layers = nh;
    }
}

static int validate(struct dsi_config *cfg, const char *file, struct dsi_err *err) {
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) return dsi_errf(err, DSI_ERR_CONFIG, __VA_ARGS__);                            \
    } while (0)
    REQUIRE(cfg->num_key_value_heads == 1, "%s: num_key_value_heads = %d, want 1", file,
            cfg->num_key_value_heads);
    REQUIRE(cfg->n_shared_experts == 1, "%s: n_shared_experts = %d, want 1", file,
            cfg->n_shared_experts);
    REQUIRE(!strcmp(cfg->hidden_act, "silu"), "%s: hidden_act = %s, want silu", file,
            cfg->hidden_act);
    REQUIRE(!strcmp(cfg->scoring_func, "sqrtsoftplus"), "%s: scoring_func = %s, want sqrtsoftplus",
            file, cfg->scoring_func);
    REQUIRE(cfg->qk_rope_head_dim % 2 == 0 && cfg->qk_rope_head_dim <= cfg->head_dim &&
                cfg->qk_rope_head_dim <= cfg->index_head_dim,
            "%s: qk_rope_head_dim = %d, want even and <= head_dim (%d) and <= index_head_dim (%d)",
            file, cfg->qk_rope_head_dim, cfg->head_dim, cfg->index_head_dim);
    REQUIRE((cfg->head_dim - cfg->qk_rope_head_dim) % 64 == 0,
            "%s: head_dim - qk_rope_head_dim = %d, want a multiple of 64", file,
            cfg->head_dim - cfg->qk_rope_head_dim);
    REQUIRE(cfg->index_head_dim >= 32 && (cfg->index_head_dim & (cfg->index_head_dim - 1)) == 0,
            "%s: index_head_dim = %d, want a power of two >= 32", file, cfg->index_head_dim);
    REQUIRE(cfg->hidden_size % 128 == 0, "%s: hidden_size = %d, want a multiple of 128", file,
            cfg->hidden_size);
    REQUIRE(cfg->q_lora_rank % 128 == 0, "%s: q_lora_rank = %d, want a multiple of 128", file,
            cfg->q_lora_rank);
    REQUIRE(cfg->moe_intermediate_size % 128 == 0,
            "%s: moe_intermediate_size = %d, want a multiple of 128", file,
            cfg->moe_intermediate_size);
    REQUIRE(cfg->num_attention_heads % cfg->o_groups == 0,
            "%s: num_attention_heads = %d, want a multiple of o_groups = %d", file,
            cfg->num_attention_heads, cfg->o_groups);
    REQUIRE((cfg->o_groups * cfg->o_lora_rank) % 128 == 0,
            "%s: o_groups * o_lora_rank = %d, want a multiple of 128", file,
            cfg->o_groups * cfg->o_lora_rank);
    REQUIRE(cfg->num_hash_layers <= cfg->num_hidden_layers,
            "%s: num_hash_layers = %d, want <= num_hidden_layers = %d", file, cfg->num_hash_layers,
            cfg->num_hidden_layers);
    REQUIRE(cfg->num_experts_per_tok <= cfg->n_routed_experts,
            "%s: num_experts_per_tok = %d, want <= n_routed_experts = %d", file,
            cfg->num_experts_per_tok, cfg->n_routed_experts);
    REQUIRE(cfg->index_topk >= 1, "%s: index_topk = %d, want >= 1", file, cfg->index_topk);
    REQUIRE(cfg->eos_token_id >= 0 && cfg->eos_token_id < cfg->vocab_size,
            "%s: eos_token_id = %d, want 0..vocab_size-1", file, cfg->eos_token_id);
    for (int i = cfg->num_hidden_layers; i < cfg->n_layers_total; i++)
        REQUIRE(cfg->layers[i].ratio == 0, "%s: compress_ratios[%d] (MTP layer) = %d, want 0", file,
                i, cfg->layers[i].ratio);
    REQUIRE(strcmp(cfg->expert_dtype, "fp4") == 0 || strcmp(cfg->expert_dtype, "fp8") == 0 ||
                cfg->expert_dtype[0] == 0,
            "%s: expert_dtype = %s, want fp4 or fp8", file, cfg->expert_dtype);
#undef REQUIRE
    return DSI_OK;
}

int dsi_config_parse(
    struct dsi_config *cfg, const char *json, size_t len, const char *name, struct dsi_err *err) {
    memset(cfg, 0, sizeof(*cfg));
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return dsi_errf(err, DSI_ERR_CONFIG, "%s: malformed JSON: %s (line %d column %d)", name,
                        je.text, je.line, je.column);
    struct field_ctx c = {.root = root, .file = name, .err = err};
    if (!json_is_object(root)) {
        c.rc = dsi_errf(err, DSI_ERR_CONFIG, "%s: want a JSON object", name);
        goto out;
    }
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt) || strcmp(json_string_value(mt), "deepseek_v4") != 0) {
        c.rc = dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "%s: model_type %s%s%s is not supported, want "
                        "deepseek_v4",
                        name, json_is_string(mt) ? "\"" : "",
                        json_is_string(mt) ? json_string_value(mt) : "(missing)",
                        json_is_string(mt) ? "\"" : "");
        goto out;
    }
    /* Defaults = V4-Flash values for optional fields. */
    cfg->num_key_value_heads = 1;
    cfg->n_shared_experts = 1;
    cfg->num_hash_layers = 0;
    cfg->num_nextn_predict_layers = 0;
    cfg->hc_sinkhorn_iters = 20;
    cfg->hc_eps = 1e-6;
    cfg->rms_norm_eps = 1e-6;
    cfg->rope_theta = 10000;
    cfg->compress_rope_theta = 160000;
    cfg->routed_scaling_factor = 1.5;
    cfg->swiglu_limit = 10.0;
    cfg->bos_token_id = 0;
    cfg->eos_token_id = 1;
    cfg->max_position_embeddings = 1048576;
    cfg->norm_topk_prob = true;
    snprintf(cfg->scoring_func, sizeof(cfg->scoring_func), "sqrtsoftplus");
    snprintf(cfg->hidden_act, sizeof(cfg->hidden_act), "silu");
    snprintf(cfg->expert_dtype, sizeof(cfg->expert_dtype), "fp4");
    cfg->gen_temperature = 1.0;
    cfg->gen_top_p = 1.0;

    const int64_t BIG = 1 << 24;
    get_int(&c, "vocab_size", &cfg->vocab_size, true, 1, BIG);
    get_int(&c, "hidden_size", &cfg->hidden_size, true, 1, BIG);
    get_int(&c, "num_hidden_layers", &cfg->num_hidden_layers, true, 1, DSI_MAX_LAYERS - 8);
    get_int(&c, "num_attention_heads", &cfg->num_attention_heads, true, 1, 4096);
    get_int(&c, "num_key_value_heads", &cfg->num_key_value_heads, false, 1, 4096);
    get_int(&c, "head_dim", &cfg->head_dim, true, 1, 8192);
    get_int(&c, "qk_rope_head_dim", &cfg->qk_rope_head_dim, false, 0, 8192);
    get_int(&c, "q_lora_rank", &cfg->q_lora_rank, true, 1, BIG);
    get_int(&c, "o_groups", &cfg->o_groups, true, 1, 4096);
    get_int(&c, "o_lora_rank", &cfg->o_lora_rank, true, 1, BIG);
    get_int(&c, "sliding_window", &cfg->sliding_window, true, 1, 1 << 20);
    get_int(&c, "index_n_heads", &cfg->index_n_heads, true, 1, 4096);
    get_int(&c, "index_head_dim", &cfg->index_head_dim, true, 1, 8192);
    get_int(&c, "index_topk", &cfg->index_topk, true, 1, BIG);
    get_int(&c, "n_routed_experts", &cfg->n_routed_experts, true, 1, 65536);
    get_int(&c, "n_shared_experts", &cfg->n_shared_experts, false, 0, 64);
    get_int(&c, "num_experts_per_tok", &cfg->num_experts_per_tok, true, 1, 64);
    get_int(&c, "moe_intermediate_size", &cfg->moe_intermediate_size, true, 1, BIG);
    get_int(&c, "num_hash_layers", &cfg->num_hash_layers, false, 0, DSI_MAX_LAYERS);
    get_int(&c, "hc_mult", &cfg->hc_mult, true, 1, 64);
    get_int(&c, "hc_sinkhorn_iters", &cfg->hc_sinkhorn_iters, false, 1, 1000);
    get_int(&c, "num_nextn_predict_layers", &cfg->num_nextn_predict_layers, false, 0, 1);
    get_i64(&c, root, "max_position_embeddings", &cfg->max_position_embeddings);
    get_num(&c, root, "rope_theta", &cfg->rope_theta, false);
    get_num(&c, root, "compress_rope_theta", &cfg->compress_rope_theta, false);
    get_num(&c, root, "routed_scaling_factor", &cfg->routed_scaling_factor, false);
    get_num(&c, root, "swiglu_limit", &cfg->swiglu_limit, false);
    get_num(&c, root, "hc_eps", &cfg->hc_eps, false);
    get_num(&c, root, "rms_norm_eps", &cfg->rms_norm_eps, false);
    get_str(&c, "scoring_func", cfg->scoring_func, sizeof(cfg->scoring_func));
    get_str(&c, "hidden_act", cfg->hidden_act, sizeof(cfg->hidden_act));
    get_str(&c, "expert_dtype", cfg->expert_dtype, sizeof(cfg->expert_dtype));
    get_bool(&c, "norm_topk_prob", &cfg->norm_topk_prob);
    if (c.rc) goto out;
    int id = first_id(json_object_get(root, "bos_token_id"));
    if (id >= 0) cfg->bos_token_id = id;
    id = first_id(json_object_get(root, "eos_token_id"));
    if (id >= 0) cfg->eos_token_id = id;
    if (!json_object_get(root, "qk_rope_head_dim")) {
        json_t *prf = json_object_get(root, "partial_rotary_factor");
        cfg->qk_rope_head_dim =
            json_is_number(prf) ? (int)(cfg->head_dim * json_number_value(prf) + 0.5) : 64;
    }
    /* rope_scaling (official) or rope_parameters.compress (HF). */
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!json_is_object(rs)) {
        json_t *rp = json_object_get(root, "rope_parameters");
        rs = json_is_object(rp) ? json_object_get(rp, "compress") : NULL;
    }
    if (json_is_object(rs)) {
        json_t *ty = json_object_get(rs, "type");
        if (!ty) ty = json_object_get(rs, "rope_type");
        if (json_is_string(ty) && !strcmp(json_string_value(ty), "yarn")) {
            cfg->yarn_beta_fast = 32;
            cfg->yarn_beta_slow = 1;
            get_num(&c, rs, "factor", &cfg->yarn_factor, true);
            get_num(&c, rs, "beta_fast", &cfg->yarn_beta_fast, false);
            get_num(&c, rs, "beta_slow", &cfg->yarn_beta_slow, false);
            get_i64(&c, rs, "original_max_position_embeddings", &cfg->yarn_original_max_pos);
            if (!c.rc && (cfg->yarn_factor <= 0 || cfg->yarn_original_max_pos <= 0))
                c.rc = dsi_errf(err, DSI_ERR_CONFIG,
                                "%s: rope_scaling: want factor > 0 and "
                                "original_max_position_embeddings > 0",
                                name);
        } else if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "default"))) {
            c.rc = dsi_errf(err, DSI_ERR_UNSUPPORTED, "%s: rope_scaling type: want yarn", name);
        }
    }
    if (c.rc) goto out;
    cfg->n_layers_total = cfg->num_hidden_layers + cfg->num_nextn_predict_layers;
    parse_schedule(&c, cfg);
    if (c.rc) goto out;
    for (int i = 0; i < cfg->n_layers_total; i++) {
        struct dsi_layer_info *l = &cfg->layers[i];
        l->kind = l->ratio == 0 ? DSI_ATTN_WINDOW : l->ratio == 4 ? DSI_ATTN_CSA : DSI_ATTN_HCA;
        l->hash_routed = i < cfg->num_hash_layers;
        l->rope = l->ratio > 0 ? 1 : 0;
    }
    cfg->nope_dim = cfg->head_dim - cfg->qk_rope_head_dim;
    cfg->hc_mix = (2 + cfg->hc_mult) * cfg->hc_mult;
    cfg->hc_dim = cfg->hc_mult * cfg->hidden_size;
    cfg->heads_per_group = cfg->num_attention_heads / DSI_MAX(cfg->o_groups, 1);
    cfg->group_in_dim = cfg->heads_per_group * cfg->head_dim;
    cfg->wo_b_in = cfg->o_groups * cfg->o_lora_rank;
    c.rc = validate(cfg, name, err);
out:
    json_decref(root);
    return c.rc;
}

static int load_generation_config(struct dsi_config *cfg, const char *dir, struct dsi_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return DSI_OK; /* optional */
    fclose(f);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return dsi_errf(err, DSI_ERR_CONFIG, "%s: malformed JSON: %s (line %d column %d)", path,
                        je.text, je.line, je.column);
    struct field_ctx c = {.root = root, .file = path, .err = err};
    if (json_is_object(root)) {
        get_num(&c, root, "temperature", &cfg->gen_temperature, false);
        get_num(&c, root, "top_p", &cfg->gen_top_p, false);
        get_int(&c, "top_k", &cfg->gen_top_k, false, 0, 1 << 30);
        json_t *ds = json_object_get(root, "do_sample");
        if (!c.rc && json_is_false(ds)) cfg->gen_temperature = 0;
    }
    json_decref(root);
    return c.rc;
}

int dsi_config_load(struct dsi_config *cfg, const char *dir, struct dsi_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
    int rc = dsi_read_file(path, &text, &len, err);
    if (rc) return rc;
    rc = dsi_config_parse(cfg, text, len, path, err);
    free(text);
    if (rc) return rc;
    return load_generation_config(cfg, dir, err);
}
