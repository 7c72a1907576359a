#!/usr/bin/env python3
"""Reference for the MTP layer (`mtp.0`, spec 4.11), used by ref/hf_golden.py for mtp_logits.f32.

HF transformers drops `mtp.*` at load, so the MTP golden is assembled here from the spec:

  for each main-model position t = 0..S-2, with X_t = the 4 residual streams of the main model at
  position t after the last decoder layer and BEFORE the main hc_head, and the next token tok_{t+1}:
    e      = RMSNorm(embed[tok_{t+1}], mtp.0.enorm)
    X_in_k = e_proj e + h_proj RMSNorm(X_t[k], mtp.0.hnorm)           (k = 0..hc_mult-1)
    Y      = MTP block (a full decoder layer: mHC sites, window-only attention with the
             theta = rope_theta plain RoPE, learned MoE with gate.bias) over rows t = 0..S-2
             at positions t, causal sliding-window attention (window incl. the current row)
    logits = head( RMSNorm( hc_head_mtp(Y), mtp.0.norm ) )          (shared `head`)

The block itself is HF's DeepseekV4DecoderLayer instantiated with a one-layer config
(layer_types ['sliding_attention'], mlp_layer_types ['moe']) and HF's DeepseekV4HyperHead for the
collapse, loaded with the `mtp.0.*` tensors of the released-format checkpoint decoded by
ref/dsv4_common.py (the same fp32 values HF uses for the main model). ref/spec_ref.py recomputes the
same thing without any HF module as a cross-check.

Generated data must never be edited by hand; rerun `python3 ref/make_goldens.py`.
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint as MC  # noqa: E402


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class MTPRef:
    def __init__(self, cfg, deq):
        """cfg: released config.json dict; deq: dequantised checkpoint {name: np array}."""
        from transformers import DeepseekV4Config
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
            DeepseekV4DecoderLayer, DeepseekV4HyperHead, DeepseekV4RotaryEmbedding)
        self.cfg = cfg
        L = cfg["num_hidden_layers"]
        assert cfg["compress_ratios"][L] == 0, "the MTP layer is window-only"
        hc = MC.hf_config(cfg)
        hc.update({"num_hidden_layers": 1, "layer_types": ["sliding_attention"], "mlp_layer_types": ["moe"]})
        hc.pop("architectures")
        hc.pop("model_type")
        hc.pop("torch_dtype")
        self.hfcfg = DeepseekV4Config(**hc)
        self.hfcfg._attn_implementation = "eager"
        self.hfcfg._experts_implementation = "grouped_mm"  # what from_pretrained picks for the main model
        self.layer = DeepseekV4DecoderLayer(self.hfcfg, 0).float().eval()
        self.head_c = DeepseekV4HyperHead(self.hfcfg).float().eval()
        self.rot = DeepseekV4RotaryEmbedding(self.hfcfg)
        t = lambda k: torch.from_numpy(np.ascontiguousarray(deq[k]))  # noqa: E731
        # map mtp.0.<block tensors> -> layers.0.* -> HF names via the main-model mapping
        blk = {}
        for k, v in deq.items():
            if not k.startswith("mtp.0."):
                continue
            rest = k[len("mtp.0."):]
            if rest.split(".")[0] in ("e_proj", "h_proj", "enorm", "hnorm", "norm") or rest.startswith("hc_head_"):
                continue
            blk["layers.0." + rest] = v
        hf = MC.official_to_hf(blk, dict(cfg, num_hidden_layers=1))
        sd = {k[len("model.layers.0."):]: v for k, v in hf.items()}
        missing, unexpected = self.layer.load_state_dict(sd, strict=True), None
        del missing, unexpected
        self.head_c.load_state_dict({"hc_fn": t("mtp.0.hc_head_fn"), "hc_base": t("mtp.0.hc_head_base"),
                                     "hc_scale": t("mtp.0.hc_head_scale")}, strict=True)
        self.embed = t("embed.weight")
        self.head = t("head.weight")
        self.e_proj = t("mtp.0.e_proj.weight")
        self.h_proj = t("mtp.0.h_proj.weight")
        self.enorm = t("mtp.0.enorm.weight")
        self.hnorm = t("mtp.0.hnorm.weight")
        self.norm = t("mtp.0.norm.weight")
        self.eps = cfg["rms_norm_eps"]

    @torch.no_grad()
    def logits(self, X, tokens):
        """X: [S, hc, D] fp32 main-model final streams; tokens: S ids. Returns [S-1, V]."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        S = tokens.numel()
        n = S - 1
        e = _rms(self.embed[tokens[1:]], self.enorm, self.eps)                    # [n, D]
        h = _rms(X[:n], self.hnorm, self.eps)                                      # [n, hc, D]
        Xin = (e @ self.e_proj.T)[:, None, :] + h @ self.h_proj.T                 # [n, hc, D]
        pos = torch.arange(n)[None, :]
        pe = {"main": self.rot(Xin, pos, layer_type="main"), "compress": self.rot(Xin, pos, layer_type="compress")}
        W = self.cfg["sliding_window"]
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        allow = (j <= i) & (j > i - W)
        mask = torch.zeros(n, n).masked_fill(~allow, float("-inf"))[None, None]
        Y = self.layer(Xin[None], position_embeddings=pe, position_ids=pos, attention_mask=mask,
                       input_ids=tokens[1:][None], past_key_values=None)
        hh = self.head_c(Y)[0]                                                     # [n, D]
        hh = _rms(hh, self.norm, self.eps)
        return hh @ self.head.T
