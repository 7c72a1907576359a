#!/usr/bin/env python3
"""Export the trained tiny DeepSeek-V4 to models/dsv4-tiny/ in the released format and evaluate it.

    python3 ref/export_tiny.py --train-dir DIR        # DIR = ref/train_tiny.py --out (state-*.safetensors, log.json)
    python3 ref/export_tiny.py --eval-only             # re-evaluate the committed checkpoint

Export (spec 6, 7; the number formats and the safetensors writer are ref/dsv4_common.py's, the tensor
inventory / order, config validation and shard naming ref/make_checkpoint.py's -- the same code the
random-checkpoint tool uses; only the values differ): official names, FP8 e4m3 128x128-block weights with
UE8M0 scales, FP4 e2m1 routed experts (packed I8, low nibble first) with per-(row, 32) UE8M0 scales, BF16
embed/head/norms/gate/compressors/weights_proj, F32 hc_*/attn_sink/ape/gate.bias, I64 tid2eid. Shards follow the
released layout: embed, one shard per layer, the head (hc_head_*, norm, head), the MTP layer.
Writes config.json, generation_config.json, model.safetensors.index.json, the shards; tokenizer.json,
tokenizer_config.json and heldout.txt come from ref/tiny_data.py.

Evaluation (written to eval.json; profile `plain`, i.e. HF transformers maths): the checkpoint is read
back from disk with ref/dsv4_common.py, dequantised exactly to fp32, loaded into HF
DeepseekV4ForCausalLM (fp32, eager attention, no KV cache: every forward is one call over the whole
window) plus ref/mtp_ref.py's MTP layer. Indexer and router top-k ties are broken by the lower index
(ref/hf_golden.py's Probe, the dsinfer rule). See PROTOCOL below for the exact definitions.
"""

import argparse
import glob
import json
import math
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4_common as C  # noqa: E402
import make_checkpoint as MC  # noqa: E402
import tiny_model as T  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "models", "dsv4-tiny")

WINDOW = 256            # tokens per perplexity window, BOS included
PROMPTS = ["The jury said", "In the morning", "The president of the"]
GEN_TOKENS = 32

PROTOCOL = {
    "weights": "the exported checkpoint in this directory, read back and dequantised exactly to fp32 "
               "(FP8: e4m3 * 2^(scale-127) per 128x128 tile; FP4: e2m1 * 2^(scale-127) per (row, 32); "
               "BF16 widened); profile `plain` (HF transformers DeepseekV4ForCausalLM maths in fp32, "
               "no [QAT] activation / KV quantisation, eager attention, use_cache=False)",
    "tokenization": "tokenizer.json of this directory (HF tokenizers), the whole heldout.txt file as ONE "
                    "string (read as UTF-8, nothing stripped), encode with add_special_tokens=False: ids",
    "perplexity": f"non-overlapping windows: window k = [BOS=0] + ids[{WINDOW - 1}*k : {WINDOW - 1}*(k+1)] "
                  f"(the last window is shorter), i.e. at most {WINDOW} tokens each starting with BOS, each "
                  "evaluated independently from position 0 in one forward call; in each window the logits "
                  "row i (after token i) scores token i+1, for every i except the last row, so every id "
                  "of the file is scored exactly once (the BOS is never scored). ppl = exp(sum of "
                  "-log softmax(logits)[target] / number of scored tokens), natural log, fp32 logits "
                  "(log-softmax in float64 here)",
    "mtp_accuracy": "same windows; the MTP layer (spec 4.11, ref/mtp_ref.py) at row t takes the main "
                    "model's final 4 streams at t (before hc_head) and window token t+1 and predicts "
                    "window token t+2; top-1 = argmax of its logits (ties to the lower id), counted for "
                    "t = 0 .. len(window)-3 (row 0 uses the BOS streams); accuracy = hits / predictions",
    "generation": f"prompt ids = [BOS=0] + encode(prompt); {GEN_TOKENS} greedy steps, each a full forward "
                  "over the whole sequence so far (no cache), next id = argmax of the last logits row "
                  "(ties to the lower id); EOS does not stop it (none occurred unless shown); text = "
                  "decode(new ids)",
    "tie_rules": "indexer top-k and router top-k ties broken by the lower index (stable sort), as dsinfer "
                 "does; the eval counts whether any tie mattered",
}

# --------------------------------------------------------------------------------------------
# Export


def load_train_state(train_dir):
    from safetensors.torch import load_file
    sd = {}
    files = sorted(glob.glob(os.path.join(train_dir, "state-*.safetensors")))
    assert files, f"no state-*.safetensors in {train_dir}"
    for f in files:
        sd.update(load_file(f))
    return sd


def shard_key(name, L):
    """Released layout: 0 = embed, 1 + N = layers.N, L + 1 = head group, L + 2 = mtp."""
    if name == "embed.weight":
        return 0
    if name.startswith("layers."):
        return 1 + int(name.split(".")[1])
    if name.startswith("mtp."):
        return L + 2
    return L + 1


def quantised_entries(cfg, off):
    """Official fp32 values -> safetensors entries, in make_checkpoint.inventory order."""
    entries = []
    for p in MC.inventory(cfg):
        n = p.name + ".weight" if p.kind in ("fp8", "fp4") else p.name
        w = off[n]
        if p.kind == "tid2eid":
            E = cfg["n_routed_experts"]
            assert w.dtype == np.int64 and w.min() >= 0 and w.max() < E
            assert all(len(set(r)) == len(r) for r in w.tolist()), "tid2eid rows must be distinct"
            entries.append((p.name, "I64", p.shape, w))
        elif p.kind == "f32":
            entries.append((p.name, "F32", p.shape, w.astype(np.float32)))
        elif p.kind == "bf16":
            entries.append((p.name, "BF16", p.shape, C.f32_to_bf16_bits(w)))
        elif p.kind == "fp8":
            q, s = C.quant_fp8_weight(w)
            entries += [(n, "F8_E4M3", q.shape, q), (p.name + ".scale", "F8_E8M0", s.shape, s)]
        elif p.kind == "fp4":
            q, s = C.quant_fp4_weight(w)
            entries += [(n, "I8", q.shape, q), (p.name + ".scale", "F8_E8M0", s.shape, s)]
        else:
            raise ValueError(p.kind)
    return entries


def export(cfg, train_dir, out_dir, log=print):
    MC.validate_config(cfg)
    sd = load_train_state(train_dir)
    off = T.to_official(sd, cfg)
    entries = quantised_entries(cfg, off)
    L = cfg["num_hidden_layers"]
    groups = {}
    for e in entries:
        groups.setdefault(shard_key(e[0], L), []).append(e)
    keys = sorted(groups)
    os.makedirs(out_dir, exist_ok=True)
    for fn in os.listdir(out_dir):
        if fn.startswith("model-") and fn.endswith(".safetensors"):
            os.remove(os.path.join(out_dir, fn))
    weight_map, total = {}, 0
    for k, key in enumerate(keys, 1):
        fn = MC.shard_name(k, len(keys))
        sh = groups[key]
        C.write_safetensors(os.path.join(out_dir, fn), sh, metadata={"format": "pt"})
        for e in sh:
            weight_map[e[0]] = fn
            total += C.tensor_nbytes(e[1], e[2])
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(MC.released_config(cfg, False), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 1.0,
                   "top_p": 1.0}, f, indent=2)
        f.write("\n")
    log(f"exported {len(entries)} tensors, {total} bytes, {len(keys)} shards to {out_dir}")
    # read back: every tensor decodes to exactly the quantisation of the trained value
    deq = C.dequantise_checkpoint(C.read_checkpoint(out_dir))
    worst = {}
    for p in MC.inventory(cfg):
        n = p.name + ".weight" if p.kind in ("fp8", "fp4") else p.name
        a, b = off[n], deq[n]
        assert a.shape == b.shape, n
        if p.kind == "tid2eid":
            assert np.array_equal(a, b), n
            continue
        if p.kind == "f32":
            assert np.array_equal(a, b), n
        if p.kind == "bf16":
            assert np.array_equal(C.bf16_round(a), b), n
        if p.kind == "fp8":
            assert np.array_equal(C.dequant_fp8_weight(*C.quant_fp8_weight(a)), b), n
        rel = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))
        worst[p.kind] = max(worst.get(p.kind, 0.0), rel)
    log("  read back OK; worst |w - deq(q(w))| / max|w| per kind: " + json.dumps(worst))
    return off

# --------------------------------------------------------------------------------------------
# Evaluation


def build_eval_models(cfg, deq):
    import torch
    from transformers import DeepseekV4ForCausalLM
    import mtp_ref
    hfc = T._hf_config(cfg, attn_impl="eager", experts_impl="eager")
    model = DeepseekV4ForCausalLM(hfc).float().eval()
    sd = MC.official_to_hf({k: v for k, v in deq.items()}, cfg)
    missing, unexpected = model.load_state_dict(sd, strict=True)
    assert not missing and not unexpected
    mtp = mtp_ref.MTPRef(cfg, deq)
    del torch
    return model, mtp


def evaluate(cfg, model, mtp, tok, text, log=print, with_mtp=True):
    import torch
    import hf_golden
    ids = tok.encode(text, add_special_tokens=False).ids
    probe = hf_golden.Probe()
    W = WINDOW - 1
    nll, n_scored, hits, n_mtp = 0.0, 0, 0, 0
    windows = []
    t0 = time.time()
    with torch.no_grad(), probe.active(model, cfg["index_topk"]):
        for k in range(0, len(ids), W):
            w = [0] + ids[k:k + W]
            out = model(input_ids=torch.tensor([w]), use_cache=False)
            lg = out.logits[0].double()
            tgt = torch.tensor(w[1:])
            lp = torch.log_softmax(lg[:-1], dim=-1).gather(1, tgt[:, None])[:, 0]
            s = float(-lp.sum())
            nll += s
            n_scored += len(w) - 1
            rec = {"start": k, "n_scored": len(w) - 1, "nll_sum": s}
            if with_mtp and len(w) >= 3:
                X = probe.final_streams[0]
                ml = mtp.logits(X, w)                       # [len(w)-1, V], row t predicts w[t+2]
                pred = ml[:-1].argmax(-1)
                h = int((pred == torch.tensor(w[2:])).sum())
                hits += h
                n_mtp += len(w) - 2
                rec.update({"mtp_hits": h, "mtp_predictions": len(w) - 2})
            windows.append(rec)
    res = {"tokens": len(ids), "bytes": len(text.encode("utf-8")), "windows": len(windows),
           "nll_sum": nll, "scored_tokens": n_scored, "mean_nll": nll / n_scored,
           "ppl": math.exp(nll / n_scored), "bits_per_byte": nll / math.log(2) / len(text.encode("utf-8"))}
    if with_mtp:
        res.update({"mtp_top1_hits": hits, "mtp_predictions": n_mtp, "mtp_top1_accuracy": hits / n_mtp})
    res["tie_stats"] = {"router_min_gap": probe.min_router_gap, "router_tie_mismatch": probe.router_mismatch,
                        "indexer_rows_over_topk": probe.index_rows, "indexer_min_gap": probe.min_index_gap,
                        "indexer_exact_zero_ties": probe.index_zero_ties,
                        "indexer_topk_changed_by_stable_rule": probe.topk_changed}
    res["per_window"] = windows
    log(f"  ppl {res['ppl']:.3f} over {n_scored} tokens in {len(windows)} windows"
        + (f", MTP top-1 {res['mtp_top1_accuracy']:.4f}" if with_mtp else "") + f" ({time.time() - t0:.0f}s)")
    return res


def generate(cfg, model, tok, prompt):
    import torch
    import hf_golden
    probe = hf_golden.Probe()
    p_ids = [0] + tok.encode(prompt, add_special_tokens=False).ids
    seq = list(p_ids)
    with torch.no_grad(), probe.active(model, cfg["index_topk"]):
        for _ in range(GEN_TOKENS):
            lg = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            seq.append(int(torch.argmax(lg)))
    new = seq[len(p_ids):]
    return {"prompt": prompt, "prompt_ids": p_ids, "new_ids": new,
            "text": tok.decode(new, skip_special_tokens=False), "eos_in_output": 1 in new}

# --------------------------------------------------------------------------------------------
# Plot and README


def plot(train_log, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    st = train_log["steps"]
    x = np.array([s["step"] for s in st])
    tokens = x * train_log["args"]["batch"] * train_log["args"]["seq"] / 1e6

    def smooth(y, k=20):
        y = np.array(y, dtype=np.float64)
        c = np.convolve(y, np.ones(k) / k, mode="valid")
        return np.concatenate([y[:k - 1], c]) if len(y) >= k else y

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    ax.plot(tokens, smooth([s["main"] for s in st]), lw=1.2, label="train main CE (next token, 20-step mean)")
    ax.plot(tokens, smooth([s["mtp"] for s in st]), lw=1.2, label="train MTP CE (next-next token)")
    v = train_log["val"]
    vt = np.array([e["step"] for e in v]) * train_log["args"]["batch"] * train_log["args"]["seq"] / 1e6
    ax.plot(vt, [e["val_main"] for e in v], "o-", ms=3, label="validation main CE")
    ax.plot(vt, [e["val_mtp"] for e in v], "s-", ms=3, label="validation MTP CE")
    b = train_log["best_step"] * train_log["args"]["batch"] * train_log["args"]["seq"] / 1e6
    ax.axvline(b, color="grey", ls=":", lw=1, label=f"exported snapshot (step {train_log['best_step']})")
    if train_log.get("decay_at"):
        ax.axvline(train_log["decay_at"] * train_log["args"]["batch"] * train_log["args"]["seq"] / 1e6,
                   color="k", ls="--", lw=0.8, label=f"LR decay start (step {train_log['decay_at']})")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_ylim(min(e["val_main"] for e in v) - 1.5, 9.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("dsv4-tiny on Brown (train split); validation = held-out files not in heldout.txt", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def compact_log(train_log):
    keep = ("step", "lr", "loss", "main", "mtp", "mtp_acc", "idx_kl", "grad_norm", "max_load_over_mean", "t")
    out = {k: v for k, v in train_log.items() if k != "steps"}
    out["steps"] = [{k: (round(s[k], 5) if isinstance(s[k], float) else s[k]) for k in keep} for s in train_log["steps"]]
    return out


def param_counts(cfg):
    inv = MC.inventory(cfg)
    total = sum(int(np.prod(p.shape)) for p in inv)
    mtp = sum(int(np.prod(p.shape)) for p in inv if p.name.startswith("mtp."))
    experts = sum(int(np.prod(p.shape)) for p in inv if p.kind == "fp4")
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    active = total - experts + experts * K // E
    return {"total": total, "backbone": total - mtp, "mtp": mtp, "routed_experts": experts,
            "active_per_token": active, "embed_and_head": 2 * cfg["vocab_size"] * cfg["hidden_size"]}

# --------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train-dir", help="output directory of ref/train_tiny.py")
    ap.add_argument("--out", default=MODEL_DIR)
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--no-fp32-compare", action="store_true")
    ap.add_argument("--train-meta", help="JSON with how training was run (command, device, wall time)")
    args = ap.parse_args(argv)
    import torch
    from tokenizers import Tokenizer
    torch.manual_seed(0)
    cfg = T.tiny_config()
    if not args.eval_only:
        off = export(cfg, args.train_dir, args.out)
        with open(os.path.join(args.train_dir, "log.json")) as f:
            tlog = json.load(f)
        with open(os.path.join(args.out, "train_log.json"), "w") as f:
            json.dump(compact_log(tlog), f, separators=(",", ":"))
            f.write("\n")
        plot(tlog, os.path.join(args.out, "loss_curve.png"))
    else:
        off = None
    with open(os.path.join(args.out, "config.json")) as f:
        assert json.load(f) == MC.released_config(cfg, False), "config.json differs from ref/tiny_model.py"
    deq = C.dequantise_checkpoint(C.read_checkpoint(args.out))
    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "heldout.txt"), encoding="utf-8", newline="") as f:
        text = f.read()
    model, mtp = build_eval_models(cfg, deq)
    print("evaluating the quantised checkpoint (dequantised fp32) on heldout.txt")
    res = evaluate(cfg, model, mtp, tok, text)
    gens = [generate(cfg, model, tok, p) for p in PROMPTS]
    for g in gens:
        print(f"  {g['prompt']!r} -> {g['text']!r}")
    fp32 = None
    if off is not None and not args.no_fp32_compare:
        print("evaluating the unquantised fp32 trained weights (for the quantisation cost only)")
        m32, _ = build_eval_models(cfg, off)
        r32 = evaluate(cfg, m32, None, tok, text, with_mtp=False)
        fp32 = {"ppl": r32["ppl"], "mean_nll": r32["mean_nll"]}
    import safetensors
    import tokenizers
    import transformers
    ev = {
        "model": "models/dsv4-tiny",
        "generator": "python3 ref/export_tiny.py (generated; never edit by hand)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "numpy": np.__version__,
                     "safetensors": safetensors.__version__, "python": platform.python_version()},
        "protocol": PROTOCOL,
        "window_tokens_including_bos": WINDOW,
        "bos_prepended": True,
        "heldout": {"file": "heldout.txt", **{k: v for k, v in res.items() if k != "per_window"}},
        "generations": gens,
        "per_window": res["per_window"],
    }
    prev = None
    if os.path.exists(os.path.join(args.out, "eval.json")):
        with open(os.path.join(args.out, "eval.json")) as f:
            prev = json.load(f)
    if fp32 is not None:
        ev["unquantised_fp32_heldout"] = fp32
    elif prev and "unquantised_fp32_heldout" in prev:
        ev["unquantised_fp32_heldout"] = prev["unquantised_fp32_heldout"]
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(ev, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {os.path.join(args.out, 'eval.json')}")
    write_readme(cfg, args.out, ev, args.train_meta)


def write_readme(cfg, out, ev, train_meta_path):
    with open(os.path.join(out, "train_log.json")) as f:
        tl = json.load(f)
    meta = {}
    mp = train_meta_path or os.path.join(out, "train_meta.json")
    if os.path.exists(mp):
        with open(mp) as f:
            meta = json.load(f)
        if train_meta_path:
            with open(os.path.join(out, "train_meta.json"), "w") as f:
                json.dump(meta, f, indent=1)
                f.write("\n")
    pc = param_counts(cfg)
    files = sorted(os.listdir(out))
    sizes = {fn: os.path.getsize(os.path.join(out, fn)) for fn in files}
    ckpt = sum(v for k, v in sizes.items() if k.endswith(".safetensors"))
    h = ev["heldout"]
    tail = tl["steps"][-20:]
    last = {k: sum(x[k] for x in tail) / len(tail) for k in ("main", "mtp")}
    best_val = min(tl["val"], key=lambda v: v["val_main"] + tl["args"]["mtp_weight"] * v["val_mtp"])
    fp = ev.get("unquantised_fp32_heldout")
    gens = "\n".join(f"| `{g['prompt']}` | {g['text']!r} |".replace("\n", "\\n") for g in ev["generations"])
    ratios = cfg["compress_ratios"]
    kinds = {0: "window-only", 4: "CSA (ratio 4, overlapping compressor, lightning indexer)"}
    layer_rows = "\n".join(
        f"| {n} | {kinds.get(r, f'HCA (ratio {r})')} | {'hash (tid2eid)' if n < cfg['num_hash_layers'] else 'learned (sqrtsoftplus + gate.bias)'} |"
        for n, r in enumerate(ratios[:cfg["num_hidden_layers"]]))
    cmd = meta.get("command", "python3 ref/train_tiny.py --out build/tiny-train")
    text = f"""# dsv4-tiny: a small trained DeepSeek-V4

A {pc['total'] / 1e6:.2f}M-parameter model with the exact DeepSeek-V4 architecture (spec
`/work/shared/spec/deepseek-v4.md`), trained on the Brown corpus, in the released checkpoint format
(official tensor names, FP8 e4m3 128x128 blocks and FP4 e2m1 routed experts with UE8M0 scales, BF16 / F32 /
I64 as in V4-Flash). It is dsinfer's default model. Everything here is generated by `ref/tiny_data.py`,
`ref/train_tiny.py` and `ref/export_tiny.py`; do not edit by hand.

## Architecture

`config.json` is V4-Flash's with smaller sizes (`ref/tiny_model.py`, checked by
`ref/make_checkpoint.py`'s `validate_config`): hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers + 1 MTP layer, mHC with
{cfg['hc_mult']} streams ({cfg['hc_sinkhorn_iters']} Sinkhorn iterations), {cfg['num_attention_heads']} heads of head_dim {cfg['head_dim']} (RoPE on the last
{cfg['qk_rope_head_dim']}), q_lora_rank {cfg['q_lora_rank']}, grouped output {cfg['o_groups']} x {cfg['o_lora_rank']}, sliding window {cfg['sliding_window']},
indexer {cfg['index_n_heads']} heads x {cfg['index_head_dim']} with top-{cfg['index_topk']}, {cfg['n_routed_experts']} routed experts (top-{cfg['num_experts_per_tok']}, intermediate {cfg['moe_intermediate_size']},
FP4) + 1 shared expert (FP8), routed_scaling_factor {cfg['routed_scaling_factor']}, SwiGLU limit {cfg['swiglu_limit']}, vocab {cfg['vocab_size']}, YaRN and
RoPE thetas as V4-Flash.

| layer | attention | MoE routing |
|---|---|---|
{layer_rows}
| MTP (`mtp.0`) | window-only | learned |

HCA uses ratio {[r for r in ratios if r not in (0, 4)][0]} (not 128) so that heavily compressed entries exist on short texts:
a 256-token window already has 16 of them, and training windows (512 tokens) 32; with 128 a sequence
would need 128 tokens before the first entry and far longer training contexts to make it matter.
index_topk {cfg['index_topk']} is below the number of visible CSA entries from position 67 on, so the indexer really selects.

Parameters: {pc['total']:,} in total ({pc['backbone']:,} backbone + {pc['mtp']:,} MTP; embed + head
{pc['embed_and_head']:,}; routed experts {pc['routed_experts']:,}); {pc['active_per_token']:,} used per token (everything but the
routed experts, plus {cfg['num_experts_per_tok']} of {cfg['n_routed_experts']} experts per layer; MTP and embeddings included).
Checkpoint: {ckpt:,} bytes in {sum(1 for k in files if k.startswith('model-'))} shards (released layout: embed, one shard per
layer, head, MTP).

## Data and tokenizer

Brown corpus 1.9.80 (500 files, tags stripped, sentences rebuilt with English spacing, paragraphs separated
by a blank line: `ref/tiny_data.py`). Split by file: sorted file index i % 16 == 7 is held out (32 files,
6.4%); the first 7 held-out files (`ca08 ca24 ca40 cb12 cc01 cc17 cd16`) form `heldout.txt`
({h['bytes']:,} bytes, {h['tokens']:,} tokens; the test text, never used in training or model selection), the other
25 are the validation text used to pick the snapshot. Training: 468 files, {tl['train_tokens']:,} tokens.
Tokenizer: byte-level BPE trained on the training split with HF `tokenizers` (8000 BPE ids; ids 0, 1, 2 =
`<｜begin▁of▁sentence｜>`, `<｜end▁of▁sentence｜>`, `<｜▁pad▁｜>`), DeepSeek's own pre-tokenizer (copied from
DeepSeek-V3's `tokenizer.json`, spec 8.2), ByteLevel decoder, added tokens `<｜User｜>` 8000,
`<｜Assistant｜>` 8001, `<think>` 8002, `</think>` 8003, `｜DSML｜` 8004, `<｜latest_reminder｜>` 8005. The
model has {cfg['vocab_size']} embedding rows (8006..8191 unused). `tokenizer_config.json` as DeepSeek's
(`add_bos_token` false: prepend BOS yourself).

## Training

Command: `{cmd}`{(' on ' + meta['device']) if meta.get('device') else ''}.
{tl['steps_run']} steps of {tl['args']['batch']} x {tl['args']['seq']} tokens ({tl['tokens_seen'] / 1e6:.1f}M tokens, {tl['tokens_seen'] / tl['train_tokens']:.1f} epochs),
{tl['train_seconds']:.0f} s of training ({tl.get('ms_per_step', float('nan')):.0f} ms/step){(', ' + str(meta['wall_seconds']) + ' s for the whole device command') if meta.get('wall_seconds') else ''}.
AdamW (0.9, 0.95), peak LR {tl['args']['lr']}, weight decay {tl['args']['wd']}, residual dropout {tl['args']['dropout']}, fp32 weights (TF32 matmuls),
warmup {tl['args']['warmup']} steps, constant LR, linear decay to {tl['args']['min_lr_frac']} x from step {tl['decay_at']} (trigger: {tl.get('decay_reason', '')}).
Loss = next-token CE + {tl['args']['mtp_weight']} x MTP next-next-token CE + indexer KL (DSA-style: the indexer learns the
main attention's distribution over the compressed entries; its inputs are detached) + {tl['args'].get('balance_weight', 0)} x a
batch-wise expert-balance loss; learned routers are also balanced DeepSeek-V3 style (gate.bias +=
{tl['args']['bias_gamma']} x sign(mean load - load) after every step; tid2eid is a fixed random table).
Final train loss (mean of the last 20 steps, dropout on): main {last['main']:.3f}, MTP {last['mtp']:.3f}. Exported snapshot: step
{tl['best_step']} (best validation score), validation main CE {best_val['val_main']:.3f} (ppl {best_val['val_ppl']:.1f}), MTP CE
{best_val['val_mtp']:.3f}, MTP top-1 {best_val['val_mtp_acc'] * 100:.1f}%.

![loss curve](loss_curve.png)

The full per-step log is `train_log.json`.

## Evaluation (`eval.json`)

On `heldout.txt`, with the quantised checkpoint (dequantised to fp32, HF transformers maths, profile `plain`):

* perplexity **{h['ppl']:.2f}** ({h['mean_nll']:.4f} nats/token, {h['bits_per_byte']:.4f} bits/byte) over {h['scored_tokens']:,} tokens in {h['windows']} windows{(f"; the unquantised fp32 weights give {fp['ppl']:.2f}" if fp else '')};
* MTP next-next-token top-1 accuracy **{h['mtp_top1_accuracy'] * 100:.2f}%** ({h['mtp_top1_hits']:,} / {h['mtp_predictions']:,}).

Protocol: windows of at most {WINDOW} tokens, each `[BOS] + the next {WINDOW - 1} ids of the file`, no overlap,
each run from position 0 without cache; every id of the file is scored once. `eval.json` spells out every
step (`protocol`), per-window NLL sums and MTP hits, and the greedy generations with their token ids:

| prompt (BOS prepended) | greedy continuation, 32 tokens |
|---|---|
{gens}

Top-k margins seen during the evaluation (for engine tests): smallest router gap between the k-th and
(k+1)-th `score + bias` {h['tie_stats']['router_min_gap']:.2g}, smallest indexer gap {h['tie_stats']['indexer_min_gap']:.2g}
({h['tie_stats']['indexer_rows_over_topk']:,} rows where the indexer had more than {cfg['index_topk']} candidates); no exact ties. An
engine in the `plain` profile should match the perplexity to a few 1e-4 relative; the `reference`
profile ([QAT] activation / KV quantisation, bf16 activations) will differ more and may flip a few
near-tied selections.

Reproduce: `python3 ref/tiny_data.py && python3 ref/train_tiny.py --out build/tiny-train --decay-at {tl['decay_at']}`
(on an H200; the data files go to `build/tiny-data/`), then
`python3 ref/export_tiny.py --train-dir build/tiny-train`. `python3 ref/export_tiny.py --eval-only` recomputes
`eval.json` from the committed checkpoint.
"""
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)
    print(f"wrote {os.path.join(out, 'README.md')}")


if __name__ == "__main__":
    main()
