/* dsv4.h - model-side structures: the weights of every layer (views into the checkpoint's
 * mmap, never copies), the model object and the per-sequence decode state.
 *
 * Ownership: struct dsi_model owns the safetensors mapping (weights), the backend handle it
 * was given is borrowed. struct dsi_seq owns its state buffers (see cache/kv.h). */
#ifndef DSI_DSV4_H
#define DSI_DSV4_H

#include "backend/backend.h"
#include "load/config.h"
#include "load/safetensors.h"

/* See enum dsi_numerics_opt (dsinfer.h). */
enum dsi_numerics { DSI_NUMERICS_PLAIN = 0, DSI_NUMERICS_REFERENCE = 1, DSI_NUMERICS_FAST = 2 };

/* One mHC site. */
struct dsi_hc_w {
    struct dsi_tensor fn, base, scale;
};

struct dsi_compressor_w {
    struct dsi_tensor wkv, wgate, ape, norm;
};

struct dsi_layer_w {
    struct dsi_hc_w hc_attn, hc_ffn;
    struct dsi_tensor attn_norm, ffn_norm, attn_sink;
    struct dsi_tensor wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b;
    struct dsi_compressor_w comp; /* ratio > 0 */
    struct dsi_tensor idx_wq_b, idx_weights_proj;
    struct dsi_compressor_w idx_comp; /* CSA only */
    struct dsi_tensor gate_w, gate_bias, tid2eid;
    bool has_bias, has_tid2eid;
    struct dsi_tensor sh_w1, sh_w2, sh_w3;
    struct dsi_tensor *ew1, *ew2, *ew3;          /* [n_routed_experts] */
    const struct dsi_tensor **pw1, **pw2, **pw3; /* pointer arrays for the moe op */
    /* MTP only */
    struct dsi_tensor e_proj, h_proj, enorm, hnorm, norm;
    struct dsi_hc_w hc_head;
    /* scale tensors live here so that weight tensors can point at them */
    struct dsi_tensor scales[16];
    int n_scales;
    struct dsi_tensor *escales; /* [3 * n_routed_experts] */
};

struct dsi_model {
    struct dsi_config cfg;
    struct dsi_st *st;
    struct dsi_tensor embed, head, norm;
    struct dsi_hc_w hc_head;
    struct dsi_tensor top_scales[4];
    int n_top_scales;
    struct dsi_layer_w *layers; /* [n_layers_total]; index num_hidden_layers is mtp.0 */
    float *freq[2];             /* rope frequencies [qk_rope_head_dim/2]: plain, YaRN (host) */
    const float *freq_dev[2];   /* the same in backend memory (dsi_model_import) */
    int64_t n_params;
};

/* Bind every tensor of the checkpoint in dir to the model (strict dtype and shape checks;
 * missing and unexpected tensors reported together). */
int dsi_model_load(struct dsi_model **out, const char *dir, struct dsi_err *err);
void dsi_model_free(struct dsi_model *m);
/* Make every weight usable by the backend's ops (CPU: no copy; a device backend uploads each
 * tensor once, in its stored format). */
int dsi_model_import(struct dsi_model *m, struct dsi_backend *be, struct dsi_err *err);

/* RoPE frequencies for a table (spec section 3), fp32. */
void dsi_rope_freqs(const struct dsi_config *cfg, int table, float *freq);

#endif
