#!/usr/bin/env python3
"""Independent fp32 forward of DeepSeek-V4 written from /work/shared/spec/deepseek-v4.md (the `plain`
profile: no [QAT] steps, dequantised weights, fp32 everywhere), used to cross-check the HF goldens.

It does not use any transformers module: only torch tensor maths on the released-format checkpoint
decoded by ref/dsv4_common.py. Whole-prompt prefill from position 0, batch 1.

    python3 ref/spec_ref.py tests/golden/tiny-a        # compares with golden.json's logits files

Tie rules (spec 4.7, dsinfer): indexer and learned-router top-k break ties by lower index.
"""

import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4_common as C  # noqa: E402


def rope_table(cfg, compressed):
    """inv freqs in the reference fp32 order (see make_checkpoint.spec_rope_inv_freq)."""
    from make_checkpoint import spec_rope_inv_freq
    d = cfg["qk_rope_head_dim"]
    if compressed:
        return torch.from_numpy(spec_rope_inv_freq(cfg["compress_rope_theta"], d, cfg["rope_scaling"])[0])
    return torch.from_numpy(spec_rope_inv_freq(cfg["rope_theta"], d))


def rope(x, pos, inv_freq, inverse=False):
    """Interleaved pairs on the last 2*len(inv_freq) dims; x [..., S, (heads,) w], pos [S]."""
    rd = 2 * inv_freq.numel()
    ang = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # fp32 product
    c, s = torch.cos(ang), torch.sin(ang)
    if inverse:
        s = -s
    while c.dim() < x.dim():  # broadcast over head axes that sit after S
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    a, b = x[..., -rd::2], x[..., -rd + 1::2]
    ra = a * c - b * s
    rb = a * s + b * c
    out = x.clone()
    out[..., -rd::2] = ra
    out[..., -rd + 1::2] = rb
    return out


class SpecModel:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        deq = C.dequantise_checkpoint(C.read_checkpoint(model_dir))
        self.w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in deq.items()}
        self.eps = self.cfg["rms_norm_eps"]
        self.f_main = rope_table(self.cfg, False)
        self.f_comp = rope_table(self.cfg, True)
        self.stats = {"clamp_u": 0, "clamp_g": 0}

    # ---- primitives
    def rms(self, x, w=None):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * w if w is not None else y

    def hc_pre(self, X, pre):
        c = self.cfg
        hc, eps = c["hc_mult"], c["hc_eps"]
        fn, base, scale = self.w[pre + "_fn"], self.w[pre + "_base"], self.w[pre + "_scale"]
        S = X.shape[0]
        x = X.reshape(S, -1)
        rho = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        m = (x @ fn.T) * rho
        prew = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + eps
        post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
        Cm = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(S, hc, hc)  # [j][k]
        Cm = torch.softmax(Cm, dim=-1) + eps
        Cm = Cm / (Cm.sum(-2, keepdim=True) + eps)
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            Cm = Cm / (Cm.sum(-1, keepdim=True) + eps)
            Cm = Cm / (Cm.sum(-2, keepdim=True) + eps)
        y = (prew[:, :, None] * X).sum(1)
        return y, post, Cm

    @staticmethod
    def hc_post(f, X, post, Cm):
        return post[:, :, None] * f[:, None, :] + torch.einsum("sjk,sjd->skd", Cm, X)

    def hc_head(self, X, pre):
        c = self.cfg
        S = X.shape[0]
        x = X.reshape(S, -1)
        rho = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        m = (x @ self.w[pre + "hc_head_fn"].T) * rho
        prew = torch.sigmoid(m * self.w[pre + "hc_head_scale"] + self.w[pre + "hc_head_base"]) + c["hc_eps"]
        return (prew[:, :, None] * X).sum(1)

    def lin(self, x, name):
        return x @ self.w[name + ".weight"].T

    # ---- compressor (spec 4.6): returns entries [n, w] after norm + rope, n = S // r
    def compress(self, x, pre, r, w, overlap):
        S = x.shape[0]
        n = S // r
        if n == 0:
            return x.new_zeros((0, w))
        a = self.lin(x[: n * r], pre + ".wkv")
        b = self.lin(x[: n * r], pre + ".wgate") + self.w[pre + ".ape"].repeat(n, 1)
        a = a.view(n, r, -1)
        b = b.view(n, r, -1)
        if not overlap:
            c = (torch.softmax(b, dim=1) * a).sum(1)
        else:
            sa = torch.zeros(n, 2 * r, w)
            sb = torch.full((n, 2 * r, w), float("-inf"))
            sa[1:, :r] = a[:-1, :, :w]
            sb[1:, :r] = b[:-1, :, :w]
            sa[:, r:] = a[:, :, w:]
            sb[:, r:] = b[:, :, w:]
            c = (torch.softmax(sb, dim=1) * sa).sum(1)
        c = self.rms(c, self.w[pre + ".norm.weight"])
        return rope(c, torch.arange(n) * r, self.f_comp)

    # ---- attention (spec 4.5, 4.7)
    def attention(self, x, pre, ratio, pos):
        c = self.cfg
        S = x.shape[0]
        H, hd, W = c["num_attention_heads"], c["head_dim"], c["sliding_window"]
        f = self.f_main if ratio == 0 else self.f_comp
        qr = self.rms(self.lin(x, pre + "wq_a"), self.w[pre + "q_norm.weight"])
        q = self.lin(qr, pre + "wq_b").view(S, H, hd)
        q = self.rms(q)
        q = rope(q, pos, f)
        kv = self.rms(self.lin(x, pre + "wkv"), self.w[pre + "kv_norm.weight"])
        kv = rope(kv, pos, f)
        t = pos[:, None]
        j = pos[None, :]
        allow = (j <= t) & (j > t - W)  # window incl. the current token
        keys = kv
        if ratio > 0:
            comp = self.compress(x, pre + "compressor", ratio, hd, ratio == 4)
            n = comp.shape[0]
            vis = torch.arange(n)[None, :] < ((pos + 1) // ratio)[:, None]  # [S, n]
            if ratio == 4 and n > 0:
                sel = self.indexer(x, qr, pre, pos, vis)
                vis = vis & sel
            keys = torch.cat([kv, comp], 0)
            allow = torch.cat([allow, vis], 1)
        s = torch.einsum("shd,kd->shk", q, keys) / math.sqrt(hd)
        s = s.masked_fill(~allow[:, None, :], float("-inf"))
        sink = self.w[pre + "attn_sink"][None, :, None]
        mx = torch.maximum(s.max(-1, keepdim=True).values, sink)
        e = torch.exp(s - mx)
        Z = e.sum(-1, keepdim=True) + torch.exp(sink - mx)
        o = torch.einsum("shk,kd->shd", e / Z, keys)
        o = rope(o, pos, f, inverse=True)
        og, orank = c["o_groups"], c["o_lora_rank"]
        wo_a = self.w[pre + "wo_a.weight"].view(og, orank, -1)
        z = torch.einsum("sgi,gri->sgr", o.reshape(S, og, -1), wo_a).reshape(S, og * orank)
        return self.lin(z, pre + "wo_b")

    def indexer(self, x, qr, pre, pos, vis):
        c = self.cfg
        S = x.shape[0]
        ih, ihd, k = c["index_n_heads"], c["index_head_dim"], c["index_topk"]
        K = self.compress(x, pre + "indexer.compressor", 4, ihd, True)  # [n, ihd]
        qI = self.lin(qr, pre + "indexer.wq_b").view(S, ih, ihd)
        qI = rope(qI, pos, self.f_comp)
        wts = self.lin(x, pre + "indexer.weights_proj") * (ihd ** -0.5 * ih ** -0.5)
        score = (wts[:, :, None] * torch.relu(torch.einsum("shd,nd->shn", qI, K))).sum(1)  # [S, n]
        score = score.masked_fill(~vis, float("-inf"))
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        sel = torch.zeros_like(vis)
        nvis = vis.sum(-1)
        for t in range(S):
            m = min(k, int(nvis[t]))
            sel[t, order[t, :m]] = True
        return sel

    # ---- MoE (spec 4.8)
    def swiglu(self, x, pfx):
        lim = self.cfg["swiglu_limit"]
        g = self.lin(x, pfx + "w1")
        u = self.lin(x, pfx + "w3")
        self.stats["clamp_u"] += int((u.abs() > lim).sum())
        self.stats["clamp_g"] += int((g > lim).sum())
        u = u.clamp(-lim, lim)
        g = g.clamp(max=lim)
        return torch.nn.functional.silu(g) * u

    def moe(self, x, pre, tokens, hash_layer):
        c = self.cfg
        k = c["num_experts_per_tok"]
        logits = x @ self.w[pre + "gate.weight"].T
        s = torch.sqrt(torch.nn.functional.softplus(logits))
        if hash_layer:
            idx = self.w[pre + "gate.tid2eid"][tokens]
        else:
            sel = s + self.w[pre + "gate.bias"]
            idx = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :k]
        wsel = s.gather(1, idx)
        wsel = wsel / wsel.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for slot in range(k):
                e = int(idx[t, slot])
                a = self.swiglu(x[t:t + 1], f"{pre}experts.{e}.") * wsel[t, slot]
                y[t] += self.lin(a, f"{pre}experts.{e}.w2")[0]
        y = y + self.lin(self.swiglu(x, pre + "shared_experts."), pre + "shared_experts.w2")
        return y

    def block(self, X, pre, ratio, hash_layer, tokens, pos):
        y, post, Cm = self.hc_pre(X, pre + "hc_attn")
        f = self.attention(self.rms(y, self.w[pre + "attn_norm.weight"]), pre + "attn.", ratio, pos)
        X = self.hc_post(f, X, post, Cm)
        y, post, Cm = self.hc_pre(X, pre + "hc_ffn")
        f = self.moe(self.rms(y, self.w[pre + "ffn_norm.weight"]), pre + "ffn.", tokens, hash_layer)
        return self.hc_post(f, X, post, Cm)

    @torch.no_grad()
    def forward(self, tokens):
        """Returns (logits [S, V], final streams X [S, hc, D] before hc_head)."""
        c = self.cfg
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        S = tokens.numel()
        pos = torch.arange(S)
        X = self.w["embed.weight"][tokens][:, None, :].repeat(1, c["hc_mult"], 1)
        for n in range(c["num_hidden_layers"]):
            X = self.block(X, f"layers.{n}.", c["compress_ratios"][n], n < c["num_hash_layers"], tokens, pos)
        h = self.rms(self.hc_head(X, ""), self.w["norm.weight"])
        return h @ self.w["head.weight"].T, X

    @torch.no_grad()
    def mtp(self, X, tokens):
        """Spec 4.11: rows t = 0..S-2 from the main streams X[t] and token t+1."""
        c = self.cfg
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        S = tokens.numel()
        pre = "mtp.0."
        e = self.rms(self.w["embed.weight"][tokens[1:]], self.w[pre + "enorm.weight"])
        h = self.rms(X[: S - 1], self.w[pre + "hnorm.weight"])
        Xin = self.lin(e, pre + "e_proj")[:, None, :] + self.lin(h, pre + "h_proj")
        L = c["num_hidden_layers"]
        Y = self.block(Xin, pre, c["compress_ratios"][L], False, tokens[1:], torch.arange(S - 1))
        hh = self.rms(self.hc_head(Y, pre), self.w[pre + "norm.weight"])
        return hh @ self.w["head.weight"].T


def compare(golden_dir, log=print):
    """Spec forward vs the goldens; returns the worst max|diff| / max|golden| over both files."""
    with open(os.path.join(golden_dir, "golden.json")) as f:
        g = json.load(f)
    m = SpecModel(os.path.join(golden_dir, "model"))
    V = g["vocab_size"]
    ref = np.fromfile(os.path.join(golden_dir, g["logits"]), dtype="<f4").reshape(-1, V)
    mref = np.fromfile(os.path.join(golden_dir, g["mtp_logits"]), dtype="<f4").reshape(-1, V)
    r0 = m0 = 0
    worst = 0.0
    for p in g["prompts"]:
        lg, X = m.forward(p)
        ml = m.mtp(X, p)
        S = len(p)
        a, b = lg.numpy(), ref[r0:r0 + S]
        ma, mb = ml.numpy(), mref[m0:m0 + S - 1]
        d1, d2 = float(np.abs(a - b).max()), float(np.abs(ma - mb).max())
        worst = max(worst, d1 / float(np.abs(b).max()), d2 / float(np.abs(mb).max()))
        ag1, ag2 = float(np.mean(a.argmax(1) == b.argmax(1))), float(np.mean(ma.argmax(1) == mb.argmax(1)))
        log(f"  spec_ref vs golden, S={S}: logits max|diff| {d1:.2e} (max|golden| {np.abs(b).max():.2f}), "
            f"argmax agree {ag1:.3f}; mtp max|diff| {d2:.2e}, argmax agree {ag2:.3f}")
        assert ag1 == 1.0 and ag2 == 1.0
        r0 += S
        m0 += S - 1
    log(f"  spec_ref: SwiGLU clamps hit {m.stats}; worst relative diff {worst:.2e}")
    return worst


if __name__ == "__main__":
    compare(sys.argv[1])
