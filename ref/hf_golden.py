#!/usr/bin/env python3
"""Generate the HF-transformers logits goldens tests/golden/<case>/ for the tiny checkpoints.

    python3 ref/make_goldens.py                  # everything (what produced the committed files)
    python3 ref/hf_golden.py --case tiny-a       # one case
    python3 ref/hf_golden.py --case tiny-b

THE FILES UNDER tests/golden/ ARE GENERATED. NEVER EDIT THEM BY HAND; change the scripts and rerun.

Per case, in tests/golden/<case>/:
  model/             released-format checkpoint from ref/make_checkpoint.py (tiny-a: 3 shards,
                     tiny-b: 1 shard; both with model.safetensors.index.json)
  logits_plain.f32   little-endian float32; for each prompt in order, S rows of vocab_size: row i =
                     logits after token i (predicting token i+1). HF DeepseekV4ForCausalLM in fp32
                     on the dequantised weights (the `--hf-out` directory), each prompt alone as
                     batch 1, one forward call over the whole prompt, use_cache=False.
  mtp_logits.f32     for each prompt, S-1 rows: row t = MTP logits for position t from the main
                     model's final streams at t (before hc_head) and token t+1 (ref/mtp_ref.py).
  golden.json        {"generator", "versions", "case", "seed", "vocab_size", "prompts", "logits",
                     "mtp_logits", "logits_rows", "mtp_rows", "min_top2_margin", ...}

Determinism / meaningfulness checks, which move to the next weight seed when they fail:
  * top1 - top2 logit margin >= 1e-3 on every row of both files;
  * learned-router selections: gap between the k-th and (k+1)-th (score + bias) >= 1e-4;
  * CSA indexer selections: wherever a query sees more entries than index_topk, the k-th and
    (k+1)-th index scores differ by >= 1e-4, or are both exactly 0 with every tied entry's per-head
    dots <= -1e-3 (robust ReLU zeros). Exact ties are resolved by lower entry index (dsinfer's rule):
    torch.topk's tie order is unspecified, so the indexer's topk is replaced by a stable sort while
    the goldens are computed (same selection as HF whenever there is no exact tie).
The HF weights directory is written to a temporary directory and deleted afterwards.
"""

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import zlib

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4_common as C  # noqa: E402
import make_checkpoint as MC  # noqa: E402
import mtp_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# "seed" is where the search for a seed passing the checks below starts. The values are the seeds
# the search found (tiny-a: 1 on the first try; tiny-b: searched from 101, 283 was the first to pass,
# ~10 minutes), so a regeneration with the same library versions passes on its first try.
CASES = {
    "tiny-a": {"preset": "tiny-a", "num_shards": 3, "prompt_lens": [70, 45], "seed": 1},
    "tiny-b": {"preset": "tiny-b", "num_shards": 1, "prompt_lens": [300, 140], "seed": 283},
}

MIN_TOP2 = 1e-3
MIN_ROUTER_GAP = 1e-4
MIN_INDEX_GAP = 1e-4
ROBUST_ZERO_DOT = 1e-3


def make_prompts(case, vocab, lens):
    rng = np.random.default_rng(zlib.crc32(("prompts:" + case).encode()))
    return [[int(x) for x in rng.integers(3, vocab, size=n)] for n in lens]


class Probe:
    """Hooks on HF modules: stable indexer top-k, tie / gap statistics, SwiGLU clamp counts."""

    def __init__(self):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
        self.M = M
        self.reset()

    def reset(self):
        self.min_router_gap = float("inf")
        self.router_mismatch = 0
        self.min_index_gap = float("inf")
        self.index_zero_ties = 0
        self.index_bad = []
        self.index_rows = 0
        self.topk_changed = 0
        self.clamp = {"routed_up": 0, "routed_gate": 0, "shared_up": 0, "shared_gate": 0}
        self.final_streams = None

    @contextlib.contextmanager
    def active(self, model, topk_k):
        M = self.M
        handles = []
        orig_topk = torch.Tensor.topk
        probe = self

        def stable_topk(self_t, k, dim=-1, largest=True, sorted=True):
            assert largest
            v, i = torch.sort(self_t, dim=dim, descending=True, stable=True)
            hv, hi = orig_topk(self_t, k, dim=dim)
            # compare the selections of valid (finite-score) entries only; -inf picks become -1
            big = self_t.shape[dim]
            a = torch.sort(torch.where(torch.isfinite(hv), hi, big), dim=dim).values
            b = torch.sort(torch.where(torch.isfinite(v.narrow(dim, 0, k)), i.narrow(dim, 0, k), big), dim=dim).values
            probe.topk_changed += int((a != b).any(dim=dim).sum())
            return torch.return_types.topk((v.narrow(dim, 0, k), i.narrow(dim, 0, k)))

        orig_idx_fwd = M.DeepseekV4Indexer.forward

        def idx_fwd(self_m, *a, **kw):
            torch.Tensor.topk = stable_topk
            try:
                return orig_idx_fwd(self_m, *a, **kw)
            finally:
                torch.Tensor.topk = orig_topk

        orig_gate = M.DeepseekV4Experts._apply_gate

        def apply_gate(self_m, gate_up):
            g, u = gate_up.chunk(2, dim=-1)
            probe.clamp["routed_up"] += int((u.abs() > self_m.limit).sum())
            probe.clamp["routed_gate"] += int((g > self_m.limit).sum())
            return orig_gate(self_m, gate_up)

        def scorer_hook(mod, args, out):
            q, ckv, hs = args
            dots = torch.einsum("bshd,btd->bsht", q.float(), ckv.float())[0]  # [S, H, T]
            scores = out[0]  # [S, T]
            S, T = scores.shape
            for t in range(S):
                nvis = min((t + 1) // 4, T)
                if nvis <= topk_k:
                    continue
                probe.index_rows += 1
                sv = scores[t, :nvis]
                srt = torch.sort(sv, descending=True, stable=True)
                a, b = float(srt.values[topk_k - 1]), float(srt.values[topk_k])
                gap = a - b
                if gap == 0.0:
                    tied = (sv == a).nonzero().flatten()
                    worst = float(dots[t, :, tied].max())
                    if a != 0.0 or worst > -ROBUST_ZERO_DOT:
                        probe.index_bad.append((t, a, worst))
                    probe.index_zero_ties += 1
                else:
                    probe.min_index_gap = min(probe.min_index_gap, gap)

        def router_hook(mod, args, out):
            x = args[0].reshape(-1, mod.hidden_dim)
            logits = torch.nn.functional.linear(x, mod.weight)
            sel = mod.score_fn(logits) + mod.e_score_correction_bias
            srt = torch.sort(sel, dim=-1, descending=True, stable=True)
            k = mod.top_k
            gap = (srt.values[:, k - 1] - srt.values[:, k]).min()
            probe.min_router_gap = min(probe.min_router_gap, float(gap))
            mine = torch.sort(srt.indices[:, :k], dim=-1).values
            theirs = torch.sort(out[2], dim=-1).values
            probe.router_mismatch += int((mine != theirs).any(-1).sum())

        def shared_hook(mod, args, out):
            x = args[0]
            g, u = mod.gate_proj(x), mod.up_proj(x)
            probe.clamp["shared_up"] += int((u.abs() > mod.limit).sum())
            probe.clamp["shared_gate"] += int((g > mod.limit).sum())

        def head_pre(mod, args):
            probe.final_streams = args[0].detach().clone()

        M.DeepseekV4Indexer.forward = idx_fwd
        M.DeepseekV4Experts._apply_gate = apply_gate
        try:
            for m in model.modules():
                if isinstance(m, M.DeepseekV4IndexerScorer):
                    handles.append(m.register_forward_hook(scorer_hook))
                elif isinstance(m, M.DeepseekV4TopKRouter):
                    handles.append(m.register_forward_hook(router_hook))
                elif isinstance(m, M.DeepseekV4MLP):
                    handles.append(m.register_forward_hook(shared_hook))
                elif isinstance(m, M.DeepseekV4HyperHead) and m is getattr(getattr(model, "model", None), "hc_head", None):
                    handles.append(m.register_forward_pre_hook(head_pre))
            yield self
        finally:
            M.DeepseekV4Indexer.forward = orig_idx_fwd
            M.DeepseekV4Experts._apply_gate = orig_gate
            for h in handles:
                h.remove()


def top2_margin(lg):
    t2 = torch.topk(torch.as_tensor(lg), 2, dim=-1).values
    return float((t2[:, 0] - t2[:, 1]).min())


def run_case(case, out_root, keep_hf=None, max_tries=400, log=print):
    spec = CASES[case]
    cfg = MC.preset_config(spec["preset"])
    V = cfg["vocab_size"]
    prompts = make_prompts(case, V, spec["prompt_lens"])
    out_dir = os.path.join(out_root, case)
    model_dir = os.path.join(out_dir, "model")
    hf_dir = keep_hf or tempfile.mkdtemp(prefix=f"dsinfer-{case}-hf-")
    probe = Probe()
    try:
        for seed in range(spec["seed"], spec["seed"] + max_tries):
            log(f"[{case}] seed {seed}")
            if os.path.isdir(model_dir):
                shutil.rmtree(model_dir)
            MC.write_released(cfg, model_dir, seed, "exact", False, num_shards=spec["num_shards"],
                              log=lambda s: log("  " + s))
            MC.verify_released(cfg, model_dir, log=lambda s: log("  " + s))
            if os.path.isdir(hf_dir):
                shutil.rmtree(hf_dir)
            deq = MC.write_hf(cfg, model_dir, hf_dir, log=lambda s: log("  " + s))
            model = MC.verify_hf(cfg, model_dir, hf_dir, log=lambda s: log("  " + s))
            mtp = mtp_ref.MTPRef(cfg, deq)
            probe.reset()
            logits, mlogits = [], []
            with torch.no_grad(), probe.active(model, cfg["index_topk"]):
                for p in prompts:
                    out = model(input_ids=torch.tensor([p]), use_cache=False)
                    logits.append(out.logits[0].float().numpy())
                    X = probe.final_streams[0]
                    mlogits.append(mtp.logits(X, p).float().numpy())
            m_plain = min(top2_margin(x) for x in logits)
            m_mtp = min(top2_margin(x) for x in mlogits)
            stats = {
                "min_top2_margin_plain": m_plain,
                "min_top2_margin_mtp": m_mtp,
                "min_router_gap": probe.min_router_gap,
                "router_selection_mismatch": probe.router_mismatch,
                "indexer_rows_over_topk": probe.index_rows,
                "min_indexer_gap": probe.min_index_gap,
                "indexer_exact_zero_ties": probe.index_zero_ties,
                "indexer_fragile": len(probe.index_bad),
                "indexer_topk_tie_resolved_differently_than_torch_topk": probe.topk_changed,
                "swiglu_clamps_hit": dict(probe.clamp),
            }
            log("  " + json.dumps(stats))
            ok = (m_plain >= MIN_TOP2 and m_mtp >= MIN_TOP2 and probe.min_router_gap >= MIN_ROUTER_GAP
                  and probe.min_index_gap >= MIN_INDEX_GAP and not probe.index_bad
                  and probe.router_mismatch == 0)
            if ok:
                break
            log("  -> margins too small, next seed")
        else:
            raise SystemExit(f"{case}: no seed passed the margin checks")
        np.concatenate(logits).astype("<f4").tofile(os.path.join(out_dir, "logits_plain.f32"))
        np.concatenate(mlogits).astype("<f4").tofile(os.path.join(out_dir, "mtp_logits.f32"))
        import safetensors
        import transformers
        g = {
            "generator": f"python3 ref/make_goldens.py (case {case}: python3 ref/hf_golden.py --case {case}; "
                         f"checkpoint = python3 ref/make_checkpoint.py --preset {spec['preset']} --seed {seed} "
                         f"--num-shards {spec['num_shards']} --out tests/golden/{case}/model)",
            "note": "generated; never edit by hand",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "numpy": np.__version__, "safetensors": safetensors.__version__,
                         "python": platform.python_version()},
            "case": case,
            "seed": seed,
            "model": "model",
            "profile": "plain (HF transformers, fp32, dequantised weights, no [QAT] steps)",
            "vocab_size": V,
            "prompts": prompts,
            "logits": "logits_plain.f32",
            "logits_rows": [len(p) for p in prompts],
            "mtp_logits": "mtp_logits.f32",
            "mtp_rows": [len(p) - 1 for p in prompts],
            "min_top2_margin": min(m_plain, m_mtp),
            "stats": stats,
            "tie_rule": "indexer and router top-k ties broken by lower index (stable sort)",
        }
        text = json.dumps(dict(g, prompts=[f"@PROMPT{i}@" for i in range(len(prompts))]), indent=1)
        for i, p in enumerate(prompts):  # one line per prompt
            text = text.replace(f'"@PROMPT{i}@"', json.dumps(p))
        assert json.loads(text) == g
        with open(os.path.join(out_dir, "golden.json"), "w") as f:
            f.write(text + "\n")
        log(f"[{case}] done: seed {seed}, min top2 margin {g['min_top2_margin']:.4g}")
        return g
    finally:
        if keep_hf is None:
            shutil.rmtree(hf_dir, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden"))
    ap.add_argument("--keep-hf", help="write the HF fp32 directory here and keep it")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    for case in args.case or sorted(CASES):
        run_case(case, args.out, args.keep_hf)


if __name__ == "__main__":
    main()
