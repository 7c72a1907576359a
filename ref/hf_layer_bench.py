#!/usr/bin/env python3
"""Time the same DeepSeek-V4 layers in HF transformers (eager, bf16) for `dsinfer bench layer --hf`.

Usage (repository root):

    python3 ref/hf_layer_bench.py --model /tmp/flash4 --out /tmp/hf_layer.json          # GPU
    python3 ref/hf_layer_bench.py --preset flash --layers 4 --out /tmp/hf_layer.json     # same shapes
    python3 ref/hf_layer_bench.py --tiny --device cpu --ctx 256 --batch 1,2 --prefill 64 --out x.json

What it builds: transformers' own DeepseekV4Model (embed + the layers + hc_head + final norm; no LM
head) from a config equal to the checkpoint's (the released config.json of --model, or
ref/make_checkpoint.py's preset, converted by make_checkpoint.hf_config: layer types, compress rates,
hash/learned MoE layers, experts, indexer, mHC, YaRN), in bf16 with transformers' own random
initialisation made directly on the device, and the modules HF keeps in fp32 when it loads a
checkpoint (`_keep_in_fp32_modules_strict`: mHC, sinks, position biases, router bias) upcast as
from_pretrained(dtype=bfloat16) would, except the RMSNorms, which stay bf16 (with fp32 weights HF's
bf16 forward fails, see keep_fp32). The shapes are what matter: the weights are not the
checkpoint's. Hash-routed layers get a random tid2eid table of distinct experts per token (HF
initialises it to zeros, which would send every token to expert 0). Attention is `eager` (the only
implementation HF ships for V4); the experts use HF's default implementation unless --experts says
otherwise (recorded in the JSON).

Decode at context C, batch B: one sequence of C random tokens is prefilled (in chunks of
--cache-chunk tokens, through HF's own cache), then its cache (sliding-window keys, compressor
buffers, overlap state, compressed entries, entry counts) is replicated to B sequences, so every
row sees the cache of a real C-token prefix; then --warmup + --steps decode steps of B random
tokens, each timed with a device synchronisation on both sides, median. A batch whose predicted
peak memory (the model + the replicated cache + eager attention's repeated K/V and scores) exceeds
--max-gb is skipped, as is one that runs out of memory; both are recorded.

Prefill: one prompt of --prefill tokens (default 8192) in one forward call (HF eager materialises
the whole [heads, S, S + entries] score matrix, in fp32 once the fp32 sinks join it), or in chunks
of --prefill-chunk tokens through HF's cache when that is given or when one call is predicted to
need more than --max-gb (then the largest halving of the prompt that fits: 4096 tokens for 8k at
V4-Flash shapes, ~120 GB predicted for one call), recorded in the JSON; one short warm-up then
--prefill-reps timed, median.

Output: JSON (--out), rewritten after every figure so that a run cut short by a time limit keeps
what it measured, and a table on stdout:
    {"decode": [{"ctx", "batch", "ms", "steps"}...], "prefill": [{"tokens", "ms", "chunk"}...],
     "skipped": [...], "device", "torch", "transformers", "experts_implementation", "cache", ...}
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_list(s, lo=1):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a list of integers like 1,8,32, got '{s}'")
    if not v or min(v) < lo:
        raise argparse.ArgumentTypeError(f"want a list of integers >= {lo}, got '{s}'")
    return v


def build_released_config(args):
    import make_checkpoint as MC
    if args.model:
        with open(os.path.join(args.model, "config.json")) as f:
            cfg = json.load(f)
        return cfg, args.model
    if args.tiny:
        return MC.preset_config("tiny-b"), "preset tiny-b"
    cfg = MC.preset_config(args.preset, args.layers)
    for kv in args.set or []:
        k, v = kv.split("=", 1)
        cfg[k] = MC.parse_value(v)
    sets = f", {' '.join(args.set)}" if args.set else ""
    return cfg, f"preset {args.preset}, {args.layers} layers{sets}"


# Norms whose fp32 output would feed bf16 linears (see keep_fp32).
NORMS_KEPT_BF16 = {"q_a_norm", "kv_norm", "input_layernorm", "post_attention_layernorm", "norm"}


def keep_fp32(model):
    """Upcast what from_pretrained(dtype=bf16) keeps in fp32 (_keep_in_fp32_modules_strict), except
    the RMSNorms: with their weights in fp32 they return fp32 into bf16 linears and the forward
    fails ("expected m1 and m2 to have the same dtype"; transformers 5.17, from_pretrained of a bf16
    V4 checkpoint does the same: the list is made for the FP8 checkpoint path, whose linears take
    any input dtype). So: mHC, sinks, compressor position biases and the router bias in fp32 (as
    HF keeps them), everything else bf16."""
    import torch
    keep = set(getattr(model, "_keep_in_fp32_modules_strict", None) or []) - NORMS_KEPT_BF16
    n = 0
    for name, mod in model.named_modules():
        for pname, p in list(mod.named_parameters(recurse=False)):
            if any(k in f"{name}.{pname}".split(".") for k in keep) and p.dtype != torch.float32:
                p.data = p.data.float()
                n += 1
        for bname, b in list(mod.named_buffers(recurse=False)):
            if (any(k in f"{name}.{bname}".split(".") for k in keep) and b.is_floating_point()
                    and b.dtype != torch.float32):
                setattr(mod, bname, b.float())
                n += 1
    return n


def build_model(args, hf_cfg, device):
    import torch
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Model
    config = DeepseekV4Config(**{k: v for k, v in hf_cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    kw = {"dtype": torch.bfloat16, "attn_implementation": "eager"}
    if args.experts != "default":
        kw["experts_implementation"] = args.experts
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = DeepseekV4Model._from_config(config, **kw)
    keep_fp32(model)
    model.eval()
    # hash layers: distinct random experts per token (HF initialises tid2eid to zeros)
    g = torch.Generator(device=device)
    g.manual_seed(args.seed)
    for layer in model.layers:
        gate = layer.mlp.gate
        if hasattr(gate, "tid2eid"):
            V, K = gate.tid2eid.shape
            E = config.n_routed_experts
            t = torch.rand(V, E, device=device, generator=g).argsort(dim=-1)[:, :K]
            gate.tid2eid.copy_(t.to(gate.tid2eid.dtype))
    return model, config


def sync(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tensors_bytes(obj):
    import torch
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()

    for layer in obj.layers:
        for v in vars(layer).values():
            if isinstance(v, dict):
                for x in v.values():
                    add(x)
            else:
                add(v)
    return total


def replicate_cache(cache, B):
    """The batch-1 cache of a prefilled sequence, as B sequences (batch is dim 0 of every tensor)."""
    import torch

    def rep(t):
        if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == 1:
            return t.repeat(B, *([1] * (t.dim() - 1)))
        return t

    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        nl = copy.copy(layer)
        for k, v in vars(layer).items():
            if isinstance(v, dict):
                setattr(nl, k, {kk: rep(vv) for kk, vv in v.items()})
            elif isinstance(v, torch.Tensor):
                setattr(nl, k, rep(v))
        if getattr(layer, "values", None) is getattr(layer, "keys", None) and hasattr(nl, "keys"):
            nl.values = nl.keys  # K = V shared storage (HCA/CSA cache layers)
        new.layers.append(nl)
    return new


def fresh_cache(config):
    from transformers import DynamicCache
    return DynamicCache(config=config)


def run_prompt(model, config, ids, chunk, cache=None):
    """Forward of ids [B, S] through `cache` (a new one if None), chunk tokens per call."""
    import torch
    cache = cache if cache is not None else fresh_cache(config)
    S = ids.shape[1]
    step = chunk if chunk and chunk < S else S
    out = None
    with torch.inference_mode():
        for at in range(0, S, step):
            out = model(input_ids=ids[:, at:at + step], past_key_values=cache, use_cache=True)
    return cache, out


def predict_decode_bytes(config, B, ctx, cache_bytes_1):
    """Peak extra bytes of one eager decode step at batch B: the replicated cache, and in the widest
    layer eager attention's K and V repeated over the heads plus a few score-sized tensors."""
    H, hd, W = config.num_attention_heads, config.head_dim, config.sliding_window
    widest = 0
    for t in config.layer_types:
        if t == "compressed_sparse_attention":
            keys = W + ctx // config.compress_rates[t]
        elif t == "heavily_compressed_attention":
            keys = W + ctx // config.compress_rates[t]
        else:
            keys = W
        widest = max(widest, keys)
    kv_rep = 2 * B * H * widest * hd * 2
    scores = 4 * B * H * widest * 4
    moe = 6 * B * config.num_experts_per_tok * config.moe_intermediate_size * 2 * 4
    return B * cache_bytes_1 + kv_rep + scores + moe


def predict_prefill_bytes(config, S, chunk):
    """Peak extra bytes of an eager prefill of S tokens in chunks of c: eager attention's
    [H, c, c + window + entries] scores (bf16, then fp32 once the fp32 sinks are concatenated),
    the indexer's fp32 [c, index heads, entries] scores (three of them) and the MoE's
    intermediates."""
    c = chunk if chunk and chunk < S else S
    H, Hi = config.num_attention_heads, config.index_n_heads
    keys = c + config.sliding_window + S // 4
    # at the peak (eager_attention_forward's last cast): the masked bf16 scores (2 bytes), the
    # fp32 logits with the fp32 sinks concatenated (4), the softmax (4) and its bf16 cast (2);
    # K and V repeated over the heads (bf16)
    att = H * c * keys * (2 + 4 + 4 + 2) + 2 * H * keys * config.head_dim * 2
    idx = 3 * c * Hi * (S // 4) * 4
    moe = 6 * c * config.num_experts_per_tok * config.moe_intermediate_size * 2 * 4
    return max(att, idx) + moe  # the indexer's scores are freed before the attention runs


class Recorder:
    def __init__(self, path, meta):
        self.path = path
        self.doc = dict(meta)
        self.doc.update({"decode": [], "prefill": [], "skipped": [], "notes": []})

    def write(self):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="checkpoint directory: use its config.json (released names)")
    src.add_argument("--tiny", action="store_true", help="tiny shapes (preset tiny-b) for a CPU check")
    ap.add_argument("--preset", default="flash", choices=["flash", "tiny-a", "tiny-b"],
                    help="make_checkpoint.py preset when no --model (default flash)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the preset (default 4)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a preset config field, as make_checkpoint.py --set (not with --model)")
    ap.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    ap.add_argument("--ctx", type=parse_list, default=[4096], help="decode contexts (default 4096)")
    ap.add_argument("--batch", type=parse_list, default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                    help="decode batch sizes (default 1,2,4,...,256)")
    ap.add_argument("--steps", type=int, default=5, help="timed decode steps, median (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed decode steps first (default 2)")
    ap.add_argument("--cache-chunk", type=int, default=2048,
                    help="tokens per call when prefilling the decode cache (default 2048)")
    ap.add_argument("--prefill", type=int, default=8192, help="prefill prompt length (default 8192; 0 = none)")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="tokens per call in the prefill (default 0: the whole prompt if it fits in "
                         "--max-gb, else the largest halving that does)")
    ap.add_argument("--prefill-reps", type=int, default=2, help="timed prefills, median (default 2)")
    ap.add_argument("--experts", default="default", choices=["default", "eager", "grouped_mm", "batched_mm"],
                    help="HF experts implementation (default: HF's own default)")
    ap.add_argument("--max-gb", type=float, default=120.0,
                    help="skip sizes predicted to need more device memory than this (default 120)")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds: start no new figure after this much time (default 0: no limit)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="JSON output file")
    args = ap.parse_args(argv)
    for name in ("steps", "prefill_reps", "cache_chunk"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.set and (args.model or args.tiny):
        ap.error("--set applies to --preset only (with --model the checkpoint's config.json is used)")
    for kv in args.set or []:
        if "=" not in kv:
            ap.error(f"--set: want KEY=VALUE, got '{kv}'")
    if args.warmup < 0 or args.prefill < 0 or args.prefill_chunk < 0:
        ap.error("--warmup, --prefill and --prefill-chunk must be >= 0")

    t_start = time.time()
    import torch
    import transformers
    import make_checkpoint as MC

    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("hf_layer_bench: no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    cfg, cfg_src = build_released_config(args)
    hf_cfg = MC.hf_config(cfg)
    model, config = build_model(args, hf_cfg, device)
    sync(device)
    n_params = sum(p.numel() for p in model.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) + \
        sum(b.numel() * b.element_size() for b in model.buffers())
    dev_name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    experts_impl = getattr(config, "_experts_implementation", None) or "?"
    rec = Recorder(args.out, {
        "schema": "dsinfer.hf_layer_bench.v1",
        "config_source": cfg_src,
        "device": dev_name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": "bfloat16",
        "attn_implementation": config._attn_implementation,
        "experts_implementation": experts_impl,
        "layers": config.num_hidden_layers,
        "layer_types": list(config.layer_types),
        "mlp_layer_types": list(config.mlp_layer_types),
        "n_routed_experts": config.n_routed_experts,
        "params": n_params,
        "model_gb": model_bytes / 1e9,
        "scope": "DeepseekV4Model forward: embed + layers + hc_head + final norm (no LM head)",
        "cache": f"one sequence prefilled to ctx in chunks of {args.cache_chunk} tokens, its cache "
                 f"replicated to the batch",
        "max_gb": args.max_gb,
    })
    print(f"# hf_layer_bench: {cfg_src}; {config.num_hidden_layers} layers {list(config.layer_types)}; "
          f"{n_params / 1e9:.2f}B params, {model_bytes / 1e9:.1f} GB; {dev_name}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; attention {config._attn_implementation}, "
          f"experts {experts_impl}; built in {time.time() - t_start:.1f} s", flush=True)
    rec.write()
    g = torch.Generator(device="cpu")
    g.manual_seed(args.seed)
    V = config.vocab_size

    def tokens(B, S):
        return torch.randint(3, V, (B, S), generator=g).to(device)

    def over_budget():
        return args.budget > 0 and time.time() - t_start > args.budget

    def skip(what, why):
        print(f"# skipped {what}: {why}", flush=True)
        rec.doc["skipped"].append({"what": what, "why": why})
        rec.write()

    # warm-up of the kernels (a short prompt and a few decode steps)
    cache, out = run_prompt(model, config, tokens(1, min(256, max(args.ctx))), 0)
    sync(device)
    if not torch.isfinite(out.last_hidden_state.float()).all():
        rec.doc["notes"].append("the random model's output has non-finite values (timing only)")
    del cache, out

    # ---- decode ----
    print(f"{'ctx':>7} {'batch':>6} {'ms':>10} {'tok/s':>10}", flush=True)
    for ctx in args.ctx:
        if over_budget():
            skip(f"decode ctx {ctx}", "time budget")
            continue
        t0 = time.time()
        try:
            base, _ = run_prompt(model, config, tokens(1, ctx), args.cache_chunk)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            skip(f"decode ctx {ctx}", "out of memory while prefilling the cache")
            continue
        sync(device)
        t_fill = time.time() - t0
        c1 = tensors_bytes(base)
        rec.doc["notes"].append(f"ctx {ctx}: cache of one sequence {c1 / 1e6:.1f} MB, prefilled in {t_fill:.2f} s")
        for B in args.batch:
            if over_budget():
                skip(f"decode ctx {ctx} batch {B}", "time budget")
                continue
            need = model_bytes + predict_decode_bytes(config, B, ctx, c1)
            if device.startswith("cuda") and need > args.max_gb * 1e9:
                skip(f"decode ctx {ctx} batch {B}", f"predicted peak {need / 1e9:.0f} GB > --max-gb {args.max_gb:.0f}")
                continue
            cache = None
            try:
                cache = replicate_cache(base, B)
                ts = []
                with torch.inference_mode():
                    for s in range(args.warmup + args.steps):
                        ids = tokens(B, 1)
                        sync(device)
                        t0 = time.perf_counter()
                        model(input_ids=ids, past_key_values=cache, use_cache=True)
                        sync(device)
                        if s >= args.warmup:
                            ts.append(time.perf_counter() - t0)
                ms = statistics.median(ts) * 1e3
                rec.doc["decode"].append({"ctx": ctx, "batch": B, "ms": ms, "steps": args.steps})
                rec.write()
                print(f"{ctx:7d} {B:6d} {ms:10.3f} {B / ms * 1e3:10.1f}", flush=True)
            except torch.cuda.OutOfMemoryError:
                skip(f"decode ctx {ctx} batch {B}", "out of memory")
            finally:
                del cache
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
        del base

    # ---- prefill ----
    if args.prefill > 0 and not over_budget():
        P = args.prefill
        chunk = args.prefill_chunk
        if chunk == 0:
            whole = model_bytes + predict_prefill_bytes(config, P, 0)
            chunk = P
            while (device.startswith("cuda") and chunk > 256
                   and model_bytes + predict_prefill_bytes(config, P, chunk) > args.max_gb * 1e9):
                chunk = (chunk + 1) // 2
            if chunk < P:
                rec.doc["notes"].append(f"prefill {P}: one call predicted at {whole / 1e9:.0f} GB > --max-gb "
                                        f"{args.max_gb:.0f}; chunks of {chunk} tokens through HF's cache")
        ids = tokens(1, P)
        ts = []
        try:
            run_prompt(model, config, ids[:, :min(P, 512)], 0)  # warm-up
            for _ in range(args.prefill_reps):
                if over_budget() and ts:
                    break
                sync(device)
                t0 = time.perf_counter()
                run_prompt(model, config, ids, chunk)
                sync(device)
                ts.append(time.perf_counter() - t0)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            if chunk > 1024:
                rec.doc["notes"].append(f"prefill {P}: out of memory in chunks of {chunk}; chunks of "
                                        f"{chunk // 4}")
                chunk, ts = chunk // 4, []
                try:
                    for _ in range(args.prefill_reps):
                        sync(device)
                        t0 = time.perf_counter()
                        run_prompt(model, config, ids, chunk)
                        sync(device)
                        ts.append(time.perf_counter() - t0)
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    ts = []
            if not ts:
                skip(f"prefill {P}", "out of memory")
        if ts:
            ms = statistics.median(ts) * 1e3
            rec.doc["prefill"].append({"tokens": P, "ms": ms, "chunk": chunk, "reps": len(ts)})
            rec.write()
            print(f"# prefill {P} tokens (chunks of {chunk}): {ms:.1f} ms, {P / ms * 1e3:.1f} tok/s", flush=True)
    elif args.prefill > 0:
        skip(f"prefill {args.prefill}", "time budget")
    if device.startswith("cuda"):
        rec.doc["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    rec.doc["seconds"] = time.time() - t_start
    rec.write()
    print(f"# done in {time.time() - t_start:.1f} s" + (f"; JSON in {args.out}" if args.out else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
