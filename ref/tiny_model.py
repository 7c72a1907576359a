"""The dsv4-tiny model definition shared by ref/train_tiny.py and ref/export_tiny.py (issue #4).

* TINY_CONFIG: the released-format config.json of models/dsv4-tiny (every field of spec 2.1; sizes obey
  spec 7 and make_checkpoint.validate_config).
* TinyV4: HF transformers' DeepseekV4ForCausalLM (the backbone, module `lm`) + TinyMTP (module `mtp`),
  the MTP layer of spec 4.11 built from HF's DeepseekV4DecoderLayer (1-layer window-only config,
  learned MoE with gate.bias) and DeepseekV4HyperHead, with e_proj, h_proj, enorm, hnorm, norm; it
  shares `embed` and `head` with the backbone. It computes exactly what ref/mtp_ref.py computes.
* official_names(cfg) / to_official(state_dict, cfg): trained parameters -> the official tensor names
  of the released checkpoint (spec 6.3), as fp32 / int64 numpy arrays (experts un-fused).
"""

import copy
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint as MC  # noqa: E402

TINY_OVERRIDES = {
    "vocab_size": 8192,            # tokenizer: 8000 BPE ids + 6 added tokens; rows 8006.. unused
    "hidden_size": 256,            # D, multiple of 128
    "num_hidden_layers": 4,
    "compress_ratios": [0, 4, 16, 4, 0],   # window-only, CSA, HCA (ratio 16), CSA; MTP window-only
    "num_attention_heads": 4,
    "head_dim": 512,               # as V4-Flash (kernels may specialise on 512 / rope 64)
    "qk_rope_head_dim": 64,
    "q_lora_rank": 128,
    "o_groups": 2,
    "o_lora_rank": 128,
    "sliding_window": 128,         # as V4-Flash
    "index_n_heads": 4,
    "index_head_dim": 128,
    "index_topk": 16,              # < visible CSA entries once t >= 67: the indexer really selects
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "num_hash_layers": 2,          # layers 0 (window) and 1 (CSA) route by tid2eid; 2, 3, MTP learned
}


def tiny_config():
    cfg = copy.deepcopy(MC.FLASH_CONFIG)
    cfg.update(copy.deepcopy(TINY_OVERRIDES))
    MC.validate_config(cfg)
    return cfg


def _hf_config(cfg, mtp=False, attn_impl="eager", experts_impl="eager"):
    from transformers import DeepseekV4Config
    hc = MC.hf_config(cfg)
    if mtp:
        hc.update({"num_hidden_layers": 1, "layer_types": ["sliding_attention"], "mlp_layer_types": ["moe"]})
    for k in ("architectures", "model_type", "torch_dtype"):
        hc.pop(k, None)
    c = DeepseekV4Config(**hc)
    c._attn_implementation = attn_impl
    c._experts_implementation = experts_impl
    return c


def tid2eid_table(V, E, K, seed):
    """Fixed random token -> expert table, K distinct experts per row (numpy, seeded)."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((V, E)), axis=1)[:, :K].astype(np.int64)


def window_mask(n, W, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    allow = (j <= i) & (j > i - W)
    return torch.zeros(n, n, device=device).masked_fill(~allow, float("-inf"))[None, None]


class TinyMTP(nn.Module):
    """mtp.0 (spec 4.11). Input: main-model final streams X [B, S, hc, D] (before the main hc_head) and
    the token ids [B, S]; output: logits [B, S-1, V], row t predicting token t+2."""

    def __init__(self, cfg, attn_impl="eager", experts_impl="eager"):
        super().__init__()
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
            DeepseekV4DecoderLayer, DeepseekV4HyperHead, DeepseekV4RMSNorm, DeepseekV4RotaryEmbedding)
        assert cfg["compress_ratios"][cfg["num_hidden_layers"]] == 0
        self.hfcfg = _hf_config(cfg, mtp=True, attn_impl=attn_impl, experts_impl=experts_impl)
        D, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.window = cfg["sliding_window"]
        self.e_proj = nn.Linear(D, D, bias=False)
        self.h_proj = nn.Linear(D, D, bias=False)
        self.enorm = DeepseekV4RMSNorm(D, eps=eps)
        self.hnorm = DeepseekV4RMSNorm(D, eps=eps)
        self.norm = DeepseekV4RMSNorm(D, eps=eps)
        self.layer = DeepseekV4DecoderLayer(self.hfcfg, 0)
        self.hc_head = DeepseekV4HyperHead(self.hfcfg)
        self.rot = DeepseekV4RotaryEmbedding(self.hfcfg)

    def forward(self, X, input_ids, embed, head):
        B, S = input_ids.shape
        n = S - 1
        nxt = input_ids[:, 1:]
        e = self.enorm(embed(nxt))                                        # [B, n, D]
        h = self.hnorm(X[:, :n])                                          # [B, n, hc, D]
        Xin = self.e_proj(e).unsqueeze(2) + self.h_proj(h)                # [B, n, hc, D]
        pos = torch.arange(n, device=input_ids.device)[None].expand(B, -1)
        pe = {"main": self.rot(Xin, pos, layer_type="main"), "compress": self.rot(Xin, pos, layer_type="compress")}
        mask = window_mask(n, self.window, device=input_ids.device)
        Y = self.layer(Xin, position_embeddings=pe, position_ids=pos, attention_mask=mask,
                       input_ids=nxt, past_key_values=None)
        return head(self.norm(self.hc_head(Y)))


class TinyV4(nn.Module):
    def __init__(self, cfg, seed=0, attn_impl="eager", experts_impl="eager"):
        super().__init__()
        from transformers import DeepseekV4ForCausalLM
        self.cfg = cfg
        torch.manual_seed(seed)
        self.lm = DeepseekV4ForCausalLM(_hf_config(cfg, attn_impl=attn_impl, experts_impl=experts_impl))
        self.mtp = TinyMTP(cfg, attn_impl=attn_impl, experts_impl=experts_impl)
        # HF-style init for the MTP block too (same _init_weights as the backbone)
        self.mtp.apply(self.lm._init_weights)
        std = self.lm.config.initializer_range
        for lin in (self.mtp.e_proj, self.mtp.h_proj):
            nn.init.normal_(lin.weight, 0.0, std)
        t = tid2eid_table(cfg["vocab_size"], cfg["n_routed_experts"], cfg["num_experts_per_tok"], seed + 1000)
        for n in range(cfg["num_hash_layers"]):
            self.lm.model.layers[n].mlp.gate.tid2eid.copy_(torch.from_numpy(t))
        self._streams = None
        self.lm.model.layers[-1].register_forward_hook(self._keep_streams)

    def _keep_streams(self, mod, args, out):
        self._streams = out

    def forward(self, input_ids, with_mtp=True):
        out = self.lm(input_ids=input_ids, use_cache=False)
        X = self._streams
        self._streams = None
        mtp_logits = None
        if with_mtp:
            mtp_logits = self.mtp(X, input_ids, self.lm.model.embed_tokens, self.lm.lm_head)
        return out.logits, mtp_logits, X

# --------------------------------------------------------------------------------------------
# Name mapping to the released checkpoint


def _weight_name(p):
    return p.name + ".weight" if p.kind in ("fp8", "fp4") else p.name


def official_to_module_names(cfg):
    """{official tensor name: (TinyV4 state-dict key, expert slice or None)}.
    Derived from make_checkpoint.official_to_hf (the mapping HF itself uses at load), applied to
    identity-tagged values, so it cannot drift from the loader the goldens use."""
    E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    L = cfg["num_hidden_layers"]
    names = [_weight_name(p) for p in MC.inventory(cfg)]
    out = {}
    main = [n for n in names if not n.startswith("mtp.")]
    mtp_extra = {"e_proj.weight": "mtp.e_proj.weight", "h_proj.weight": "mtp.h_proj.weight",
                 "enorm.weight": "mtp.enorm.weight", "hnorm.weight": "mtp.hnorm.weight",
                 "norm.weight": "mtp.norm.weight", "hc_head_fn": "mtp.hc_head.hc_fn",
                 "hc_head_base": "mtp.hc_head.hc_base", "hc_head_scale": "mtp.hc_head.hc_scale"}

    def derive(official, prefix_out, strip):
        tagged = {}
        for i, n in enumerate(official):
            if ".ffn.experts." in n:
                continue
            tagged[n] = np.array([i], dtype=np.int64)
        hf = MC.official_to_hf(tagged, dict(cfg))
        inv = {int(v.reshape(-1)[0]): k for k, v in hf.items()}
        res = {}
        for i, n in enumerate(official):
            if ".ffn.experts." in n:
                _, lay, _, _, e, w, _ = n.split(".")
                fused = f"model.layers.{lay}.mlp.experts." + ("down_proj" if w == "w2" else "gate_up_proj")
                sl = (int(e), slice(None)) if w == "w2" else (int(e), slice(0, I) if w == "w1" else slice(I, 2 * I))
                res[n] = (prefix_out + fused[len(strip):], sl)
            else:
                res[n] = (prefix_out + inv[i][len(strip):], None)
        return res

    out.update(derive(main, "lm.", ""))
    blk = [n for n in names if n.startswith("mtp.0.") and n[len("mtp.0."):] not in mtp_extra]
    as_l0 = ["layers.0." + n[len("mtp.0."):] for n in blk]
    d = derive(as_l0, "mtp.layer.", "model.layers.0.")
    for n, n0 in zip(blk, as_l0):
        out[n] = d[n0]
    for k, v in mtp_extra.items():
        out["mtp.0." + k] = (v, None)
    assert set(out) == set(names) and len(names) == len(set(names))
    del L, E
    return out


def to_official(sd, cfg):
    """TinyV4 state dict -> {official name: numpy array (float32, tid2eid int64)}, in inventory order."""
    m = official_to_module_names(cfg)
    out = {}
    used = set()
    for p in MC.inventory(cfg):
        n = _weight_name(p)
        key, sl = m[n]
        t = sd[key]
        used.add(key)
        if sl is not None:
            t = t[sl[0]][sl[1]]
        a = t.detach().cpu()
        a = a.numpy().astype(np.int64) if p.kind == "tid2eid" else a.float().numpy().astype(np.float32)
        assert tuple(a.shape) == p.shape, (n, a.shape, p.shape)
        out[n] = np.ascontiguousarray(a)
    unused = [k for k in sd if k not in used]
    assert not unused, unused[:10]
    return out
