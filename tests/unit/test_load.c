/* test_load.c - safetensors parsing (synthetic files, corrupt and truncated), config
 * validation, and weight binding errors on a real tiny checkpoint with edited headers. */
#include "test.h"

#include "load/config.h"
#include "load/safetensors.h"
#include "model/dsv4.h"

#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>

/* Write a safetensors file: header JSON text then `data_len` bytes of data. */
static int write_st(const char *path, const char *header, size_t data_len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t n = strlen(header);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(n >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++)
        fputc((int)(i & 0xff), f);
    return fclose(f);
}

static int
open_dir_with(struct test_ctx *t, const char *header, size_t data_len, struct dsi_err *err) {
    char dir[512], path[600];
    static int k;
    snprintf(dir, sizeof(dir), "%s/st%d", t->tmpdir, k++);
    mkdir(dir, 0700);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (write_st(path, header, data_len)) return -100;
    struct dsi_st *st = NULL;
    int rc = dsi_st_open(&st, dir, err);
    dsi_st_close(st);
    return rc;
}

int test_safetensors_valid(struct test_ctx *t) {
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/stv", t->tmpdir);
    mkdir(dir, 0700);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    TEST_ASSERT(write_st(path,
                         "{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
                         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                         20) == 0);
    struct dsi_st *st = NULL;
    struct dsi_err err = {0};
    TEST_ASSERTF(dsi_st_open(&st, dir, &err) == 0, "%s", err.msg);
    TEST_ASSERT(st->n_tensors == 2);
    const struct dsi_st_tensor *a = dsi_st_find(st, "a"), *b = dsi_st_find(st, "b");
    TEST_ASSERT(a && b && !dsi_st_find(st, "c"));
    TEST_ASSERT(a->dtype == DSI_DT_F32 && a->n_elem == 2 && a->n_bytes == 8);
    TEST_ASSERT(b->dtype == DSI_DT_BF16 && b->shape[0] == 2 && b->shape[1] == 3);
    TEST_ASSERT((const uint8_t *)b->data - (const uint8_t *)a->data == 8);
    TEST_ASSERT(((const uint8_t *)b->data)[0] == 8); /* data byte i holds i */
    TEST_ASSERT(dsi_st_total_bytes(st) == 20);
    dsi_st_close(st);
    return 0;
}

int test_safetensors_bad(struct test_ctx *t) {
    struct {
        const char *header;
        size_t data;
        const char *want; /* substring of the message */
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "truncated"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16, "need 12"},
        {"{\"a\":{\"dtype\":\"Q9\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8, "header JSON"},
        {"[1,2]", 0, "not a JSON object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "bad shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "data_offsets"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct dsi_err err = {0};
        int rc = open_dir_with(t, cases[i].header, cases[i].data, &err);
        TEST_ASSERTF(rc == DSI_ERR_FORMAT, "case %zu: rc %d (%s)", i, rc, err.msg);
        TEST_ASSERTF(strstr(err.msg, cases[i].want) && strstr(err.msg, "model.safetensors"),
                     "case %zu: message '%s' should mention '%s' and the file", i, err.msg,
                     cases[i].want);
    }
    /* Header length beyond the file. */
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/sthl", t->tmpdir);
    mkdir(dir, 0700);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint8_t hdr[12] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    fwrite(hdr, 1, sizeof(hdr), f);
    fclose(f);
    struct dsi_st *st = NULL;
    struct dsi_err err = {0};
    TEST_ASSERT(dsi_st_open(&st, dir, &err) == DSI_ERR_FORMAT && strstr(err.msg, "exceeds"));
    /* Missing directory. */
    TEST_ASSERT(dsi_st_open(&st, "/nonexistent/dir", &err) == DSI_ERR_IO);
    return 0;
}

static const char *g_good_config =
    "{\"model_type\":\"deepseek_v4\",\"vocab_size\":1024,\"hidden_size\":128,"
    "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":1,\"head_dim\":128,"
    "\"qk_rope_head_dim\":64,\"q_lora_rank\":128,\"o_groups\":2,\"o_lora_rank\":128,"
    "\"sliding_window\":16,\"compress_ratios\":[0,4,8,4,0],\"compress_rope_theta\":160000,"
    "\"rope_theta\":10000,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":16,"
    "\"original_max_position_embeddings\":65536,\"beta_fast\":32,\"beta_slow\":1},"
    "\"index_n_heads\":4,\"index_head_dim\":128,\"index_topk\":4,\"n_routed_experts\":8,"
    "\"n_shared_experts\":1,\"num_experts_per_tok\":2,\"moe_intermediate_size\":128,"
    "\"scoring_func\":\"sqrtsoftplus\",\"norm_topk_prob\":true,\"routed_scaling_factor\":1.5,"
    "\"num_hash_layers\":1,\"swiglu_limit\":10.0,\"hidden_act\":\"silu\",\"hc_mult\":4,"
    "\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-6,\"rms_norm_eps\":1e-6,"
    "\"num_nextn_predict_layers\":1,\"bos_token_id\":0,\"eos_token_id\":1}";

/* Replace the first occurrence of `from` in the good config with `to`. */
static int
parse_edited(const char *from, const char *to, struct dsi_config *c, struct dsi_err *err) {
    char buf[4096];
    const char *p = strstr(g_good_config, from);
    if (!p) return 99;
    snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(p - g_good_config), g_good_config, to,
             p + strlen(from));
    return dsi_config_parse(c, buf, strlen(buf), "config.json", err);
}

int test_config_good(struct test_ctx *t) {
    struct dsi_config c;
    struct dsi_err err = {0};
    TEST_ASSERTF(dsi_config_parse(&c, g_good_config, strlen(g_good_config), "config.json", &err) ==
                     0,
                 "%s", err.msg);
    TEST_ASSERT(c.n_layers_total == 5 && c.nope_dim == 64 && c.hc_mix == 24 && c.hc_dim == 512);
    TEST_ASSERT(c.layers[0].kind == DSI_ATTN_WINDOW && c.layers[0].hash_routed);
    TEST_ASSERT(c.layers[1].kind == DSI_ATTN_CSA && !c.layers[1].hash_routed && c.layers[1].rope);
    TEST_ASSERT(c.layers[2].kind == DSI_ATTN_HCA && c.layers[2].ratio == 8);
    TEST_ASSERT(c.layers[4].kind == DSI_ATTN_WINDOW && c.layers[4].rope == 0);
    TEST_ASSERT(c.yarn_factor == 16 && c.yarn_original_max_pos == 65536);
    /* YaRN frequencies (spec 3): pairs below `low` keep f, pairs above `high` get f / 16. */
    float fr[32], base[32];
    dsi_rope_freqs(&c, 1, fr);
    c.yarn_factor = 0;
    dsi_rope_freqs(&c, 1, base);
    TEST_ASSERT(fr[0] == base[0] && fr[15] == base[15]);
    TEST_ASSERT(fabsf(fr[31] - base[31] / 16) <= 1e-6f * base[31]);
    TEST_ASSERT(fr[20] < base[20] && fr[20] > base[20] / 16);
    /* HF spelling of the schedule. */
    TEST_ASSERT(parse_edited("\"compress_ratios\":[0,4,8,4,0]",
                             "\"layer_types\":[\"sliding_attention\",\"compressed_sparse_"
                             "attention\",\"heavily_compressed_attention\",\"compressed_sparse_"
                             "attention\"],\"compress_rates\":{\"heavily_compressed_attention\":8}",
                             &c, &err) == 0);
    TEST_ASSERT(c.layers[2].ratio == 8 && c.layers[3].kind == DSI_ATTN_CSA);
    return 0;
}

int test_config_bad(struct test_ctx *t) {
    struct {
        const char *from, *to, *want;
    } cases[] = {
        {"\"model_type\":\"deepseek_v4\"", "\"model_type\":\"llama\"", "model_type"},
        {"\"hidden_size\":128", "\"hidden_size\":100", "hidden_size"},
        {"\"vocab_size\":1024,", "", "missing field vocab_size"},
        {"[0,4,8,4,0]", "[0,4,8,4]", "compress_ratios has 4 entries"},
        {"[0,4,8,4,0]", "[0,4,8,4,4]", "MTP layer"},
        {"[0,4,8,4,0]", "[0,1,8,4,0]", "compress_ratios[1]"},
        {"\"num_key_value_heads\":1", "\"num_key_value_heads\":2", "num_key_value_heads"},
        {"\"head_dim\":128", "\"head_dim\":96", "multiple of 64"},
        {"\"scoring_func\":\"sqrtsoftplus\"", "\"scoring_func\":\"softmax\"", "scoring_func"},
        {"\"o_groups\":2", "\"o_groups\":3", "o_groups"},
        {"\"index_head_dim\":128", "\"index_head_dim\":96", "index_head_dim"},
        {"\"vocab_size\":1024", "\"vocab_size\":\"1024\"", "want an integer"},
        {"\"num_hash_layers\":1", "\"num_hash_layers\":9", "num_hash_layers"},
        {"{\"model_type\"", "{{\"model_type\"", "malformed JSON"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct dsi_config c;
        struct dsi_err err = {0};
        int rc = parse_edited(cases[i].from, cases[i].to, &c, &err);
        TEST_ASSERTF(rc < 0 && rc != 99, "case %zu accepted", i);
        TEST_ASSERTF(strstr(err.msg, cases[i].want) && strstr(err.msg, "config.json"),
                     "case %zu: message '%s' should mention '%s'", i, err.msg, cases[i].want);
    }
    return 0;
}

/* Copy the golden tiny-a checkpoint to a temp dir with its header transformed by `edit`. */
static int edited_copy(struct test_ctx *t,
                       const char *name,
                       void (*edit)(json_t *),
                       long truncate,
                       char *dir_out,
                       size_t cap) {
    char src[1024];
    snprintf(src, sizeof(src), "%s", test_path(t, "tests/golden/tiny-b/model"));
    snprintf(dir_out, cap, "%s/%s", t->tmpdir, name);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", dir_out, src, dir_out);
    if (system(cmd) != 0) return -1;
    /* Single-shard checkpoint: rewrite its header. */
    char path[1200];
    snprintf(path, sizeof(path), "%s/model-00001-of-00001.safetensors", dir_out);
    char *data = NULL;
    size_t len = 0;
    struct dsi_err err;
    if (dsi_read_file(path, &data, &len, &err)) return -1;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (uint8_t)data[i];
    json_t *h = json_loadb(data + 8, hl, 0, NULL);
    if (!h) return -1;
    if (edit) edit(h);
    char *nh = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(nh);
    for (int i = 0; i < 8; i++)
        fputc((int)((n >> (8 * i)) & 0xff), f);
    fwrite(nh, 1, n, f);
    size_t body = len - 8 - hl;
    if (truncate > 0) body -= (size_t)truncate;
    fwrite(data + 8 + hl, 1, body, f);
    fclose(f);
    free(nh);
    free(data);
    /* Without the index, the single shard is found as model.safetensors (names may change). */
    char idx[1200];
    snprintf(idx, sizeof(idx), "%s/model.safetensors.index.json", dir_out);
    remove(idx);
    char single[1200];
    snprintf(single, sizeof(single), "%s/model.safetensors", dir_out);
    rename(path, single);
    return 0;
}

static void rename_wq_a(json_t *h) {
    json_t *v = json_object_get(h, "layers.0.attn.wq_a.weight");
    json_incref(v);
    json_object_del(h, "layers.0.attn.wq_a.weight");
    json_object_set_new(h, "layers.0.attn.wq_a.weightx", v);
}
static void transpose_wq_a(json_t *h) {
    json_t *s = json_object_get(json_object_get(h, "layers.0.attn.wq_a.weight"), "shape");
    json_t *a = json_array_get(s, 0), *b = json_array_get(s, 1);
    json_int_t x = json_integer_value(a), y = json_integer_value(b);
    json_integer_set(a, y);
    json_integer_set(b, x);
    if (x == y) json_integer_set(a, y * 2), json_integer_set(b, x / 2);
}
static void retype_norm(json_t *h) {
    json_t *t = json_object_get(h, "layers.0.attn_norm.weight");
    json_object_set_new(t, "dtype", json_string("I16x"));
}
static void retype_norm_i8(json_t *h) {
    json_t *t = json_object_get(h, "layers.0.attn_norm.weight");
    json_t *s = json_object_get(t, "shape");
    json_integer_set(json_array_get(s, 0), json_integer_value(json_array_get(s, 0)) * 2);
    json_object_set_new(t, "dtype", json_string("I8"));
}
static void rename_key(json_t *h, const char *from, const char *to) {
    json_t *v = json_object_get(h, from);
    json_incref(v);
    json_object_del(h, from);
    json_object_set_new(h, to, v);
}
static void alias_names(json_t *h) {
    rename_key(h, "layers.0.attn.wq_a.weight", "model.layers.0.self_attn.wq_a.weight");
    rename_key(h, "layers.0.attn.wq_a.scale", "model.layers.0.self_attn.wq_a.weight_scale_inv");
    rename_key(h, "layers.1.ffn.gate.bias", "layers.1.mlp.gate.e_score_correction_bias");
}
static void drop_scale(json_t *h) { json_object_del(h, "layers.1.attn.wkv.scale"); }

int test_weights_bad(struct test_ctx *t) {
    struct {
        const char *name;
        void (*edit)(json_t *);
        long truncate;
        const char *want[2];
    } cases[] = {
        {"w_rename",
         rename_wq_a,
         0,
         {"missing: layers.0.attn.wq_a.weight", "unexpected tensors for this config.json"}},
        {"w_shape", transpose_wq_a, 0, {"layers.0.attn.wq_a.weight: shape", "want"}},
        {"w_dtype_unknown", retype_norm, 0, {"unknown dtype", "layers.0.attn_norm.weight"}},
        {"w_dtype", retype_norm_i8, 0, {"layers.0.attn_norm.weight: dtype I8", NULL}},
        {"w_scale", drop_scale, 0, {"needs its scale tensor layers.1.attn.wkv.scale", NULL}},
        {"w_trunc", NULL, 1000, {"truncated", NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char dir[1024];
        TEST_ASSERT(
            edited_copy(t, cases[i].name, cases[i].edit, cases[i].truncate, dir, sizeof(dir)) == 0);
        struct dsi_model *m = NULL;
        struct dsi_err err = {0};
        int rc = dsi_model_load(&m, dir, &err);
        dsi_model_free(m);
        TEST_ASSERTF(rc == DSI_ERR_FORMAT, "case %s: rc %d (%s)", cases[i].name, rc, err.msg);
        for (int k = 0; k < 2; k++)
            TEST_ASSERTF(!cases[i].want[k] || strstr(err.msg, cases[i].want[k]),
                         "case %s: '%s' should contain '%s'", cases[i].name, err.msg,
                         cases[i].want[k]);
    }
    /* HF-style aliases load: model. prefix, self_attn -> attn, mlp -> ffn. */
    {
        char dir[1024];
        TEST_ASSERT(edited_copy(t, "w_alias", alias_names, 0, dir, sizeof(dir)) == 0);
        struct dsi_model *m = NULL;
        struct dsi_err err = {0};
        TEST_ASSERTF(dsi_model_load(&m, dir, &err) == 0, "aliases: %s", err.msg);
        dsi_model_free(m);
    }
    /* Unchanged copy loads. */
    char dir[1024];
    TEST_ASSERT(edited_copy(t, "w_ok", NULL, 0, dir, sizeof(dir)) == 0);
    struct dsi_model *m = NULL;
    struct dsi_err err = {0};
    TEST_ASSERTF(dsi_model_load(&m, dir, &err) == 0, "%s", err.msg);
    dsi_model_free(m);
    return 0;
}
