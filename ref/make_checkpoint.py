#!/usr/bin/env python3
"""Write a random-weight DeepSeek-V4 checkpoint in the exact released format (spec sections 6, 7).

Usage (from the repository root):

    python3 ref/make_checkpoint.py --preset tiny-a --seed 1 --out /tmp/tiny-a [--hf-out /tmp/tiny-a-hf]
    python3 ref/make_checkpoint.py --preset flash --layers 4 --out /data/flash4      # GPU benchmarks
    python3 ref/make_checkpoint.py --preset tiny-b --set index_topk=16 --set sliding_window=32 --out DIR
    python3 ref/make_checkpoint.py --preset tiny-a --config overrides.json --bf16-linears --out DIR

Output directory (released layout, names without a `model.` prefix):
    config.json                        model_type deepseek_v4, every field of spec 2.1
    generation_config.json             bos 0, eos 1, do_sample true, temperature 1.0, top_p 1.0
    model.safetensors.index.json       {"metadata": {"total_size": N}, "weight_map": {name: shard}}
    model-0000K-of-0000M.safetensors   shards, split greedily in file order by --max-shard-mb

Formats: FP8 linears = F8_E4M3 `.weight` + F8_E8M0 `.scale` [ceil(out/128), ceil(in/128)] with
s = 2^ceil(log2(amax/448)) per 128x128 tile and round-to-nearest-even codes; routed experts = FP4 e2m1
packed in I8 [out, in/2] (low nibble = even element) + F8_E8M0 `.scale` [out, in/32] with
s = 2^ceil(log2(amax/6)) per (row, 32); BF16 embed/head/norms/gate/compressor/weights_proj;
F32 hc_*, attn_sink, ape, gate.bias; I64 tid2eid. `--bf16-linears` writes every FP8/FP4 linear as a
plain BF16 `.weight` without `.scale` (and drops `quantization_config` / `expert_dtype` from
config.json, since they would be false).

Generation modes: `exact` (default for small models) draws fp32 master weights and quantises them
exactly as above; `fast` (default for the flash preset) draws random e4m3 / e2m1 / bf16 codes from a
Gaussian-shaped code table plus random per-block scales, without fp32 master tensors, so that
multi-GB checkpoints are written in minutes with bounded memory.

`--hf-out DIR` (exact mode only) writes the same weights, i.e. the dequantised values of exactly what
was written above as fp32, under the official names without `mtp.*` (HF renames them at load) plus
an HF-style config.json (layer_types, mlp_layer_types, compress_rates, rope_parameters yarn). The
script then loads that directory with transformers' DeepseekV4ForCausalLM in fp32, asserts that no
key is missing or unexpected, checks every loaded parameter against the released-format checkpoint
decoded with ref/dsv4_common.py, and checks HF's RoPE tables against the spec's YaRN formula.

Determinism: every tensor is drawn from its own RNG seeded by (seed, crc32(name)), so values do not
depend on sharding or order. Initialisation (chosen so activations are O(1) and non-trivial):
linears N(0, 1/sqrt(fan_in)), except routed and shared expert w1/w3 N(0, 3/sqrt(fan_in)) and w2
N(0, 1/(3 sqrt(fan_in))) so that the SwiGLU clamp at 10 is exercised; embed N(0, 1); norm weights
1 + N(0, 0.1); hc_*_fn N(0, 1/sqrt(hc_mult*D)); hc_*_base N(0, 0.5); hc_*_scale 1 + N(0, 0.1);
attn_sink N(0, 0.5); ape N(0, 0.5); gate.bias N(0, 0.1); tid2eid distinct random experts per row.
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4_common as C  # noqa: E402

# --------------------------------------------------------------------------------------------
# Configurations (released `config.json` field names)

FLASH_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4] + [0],
    "compress_rope_theta": 160000,
    "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 1048576,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2048,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "num_hash_layers": 3,
    "swiglu_limit": 10.0,
    "hidden_act": "silu",
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1,
    "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

TINY_A = {
    "vocab_size": 1024, "hidden_size": 128, "num_hidden_layers": 4,
    "compress_ratios": [0, 4, 8, 4, 0], "sliding_window": 16, "num_hash_layers": 1,
    "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
    "o_groups": 2, "o_lora_rank": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 128, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 4,
    "hc_mult": 4, "hc_sinkhorn_iters": 20,
}

TINY_B = dict(TINY_A, **{
    "sliding_window": 128, "num_hidden_layers": 5, "compress_ratios": [0, 0, 4, 128, 4, 0],
    "num_hash_layers": 2, "index_topk": 8, "n_routed_experts": 16, "num_experts_per_tok": 3,
})


def preset_config(name, layers=None):
    cfg = copy.deepcopy(FLASH_CONFIG)
    if name == "tiny-a":
        cfg.update(copy.deepcopy(TINY_A))
    elif name == "tiny-b":
        cfg.update(copy.deepcopy(TINY_B))
    elif name == "flash":
        pass
    else:
        raise SystemExit(f"unknown preset {name}")
    if layers is not None:
        n = int(layers)
        main = FLASH_CONFIG["compress_ratios"][:43] if name == "flash" else cfg["compress_ratios"][:-1]
        if n > len(main):
            raise SystemExit(f"--layers {n}: the {name} schedule has only {len(main)} layers")
        cfg["num_hidden_layers"] = n
        cfg["compress_ratios"] = list(main[:n]) + [0] * cfg["num_nextn_predict_layers"]
        cfg["num_hash_layers"] = min(cfg["num_hash_layers"], n)
    return cfg


def parse_value(s):
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        return s


def validate_config(c):
    """Spec 2.5 and 7 constraints (a faithful engine rejects anything else)."""
    L, M = c["num_hidden_layers"], c["num_nextn_predict_layers"]
    err = []
    if c["model_type"] != "deepseek_v4":
        err.append("model_type")
    if c["num_key_value_heads"] != 1 or c["n_shared_experts"] != 1 or c["hidden_act"] != "silu":
        err.append("kv heads / shared experts / act")
    if len(c["compress_ratios"]) != L + M or any(r != 0 for r in c["compress_ratios"][L:]):
        err.append("compress_ratios length / MTP entries")
    if any(r < 0 or r == 1 for r in c["compress_ratios"]):
        err.append("compress ratio values")
    hd, rd, ihd = c["head_dim"], c["qk_rope_head_dim"], c["index_head_dim"]
    if rd % 2 or rd > hd or rd > ihd or (hd - rd) % 64:
        err.append("rope dims")
    if ihd & (ihd - 1) or ihd % 32:
        err.append("index_head_dim")
    D, I = c["hidden_size"], c["moe_intermediate_size"]
    for w in (D, c["q_lora_rank"], I, c["o_groups"] * c["o_lora_rank"]):
        if w % 128:
            err.append(f"FP8/FP4 input width {w} not a multiple of 128")
    if c["num_attention_heads"] % c["o_groups"]:
        err.append("heads % o_groups")
    if c["num_hash_layers"] > L:
        err.append("num_hash_layers")
    if c["num_experts_per_tok"] > c["n_routed_experts"]:
        err.append("top-k > experts")
    if err:
        raise SystemExit("invalid config: " + "; ".join(err))

# --------------------------------------------------------------------------------------------
# Tensor inventory (spec 6.3), in file order


class P:
    """One logical parameter. kind: fp8 | fp4 | bf16 | f32 | tid2eid."""

    def __init__(self, name, kind, shape, init=None):
        self.name, self.kind, self.shape, self.init = name, kind, tuple(int(s) for s in shape), init


def inventory(c):
    D, H, hd = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    hc = c["hc_mult"]
    mix = (2 + hc) * hc
    I, E = c["moe_intermediate_size"], c["n_routed_experts"]
    qr, og, orank = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    ih, ihd = c["index_n_heads"], c["index_head_dim"]
    V, K = c["vocab_size"], c["num_experts_per_tok"]
    L = c["num_hidden_layers"]
    fn_std = 1.0 / math.sqrt(hc * D)
    lin = lambda fan_in, mult=1.0: ("normal", 0.0, mult / math.sqrt(fan_in))  # noqa: E731
    NORM = ("normal", 1.0, 0.1)
    ps = [P("embed.weight", "bf16", (V, D), ("normal", 0.0, 1.0))]

    def block(pre, layer_id, ratio, hash_layer):
        out = []
        for site in ("attn", "ffn"):
            out.append(P(f"{pre}hc_{site}_fn", "f32", (mix, hc * D), ("normal", 0.0, fn_std)))
            out.append(P(f"{pre}hc_{site}_base", "f32", (mix,), ("normal", 0.0, 0.5)))
            out.append(P(f"{pre}hc_{site}_scale", "f32", (3,), ("normal", 1.0, 0.1)))
        out += [
            P(f"{pre}attn_norm.weight", "bf16", (D,), NORM),
            P(f"{pre}ffn_norm.weight", "bf16", (D,), NORM),
            P(f"{pre}attn.attn_sink", "f32", (H,), ("normal", 0.0, 0.5)),
            P(f"{pre}attn.wq_a", "fp8", (qr, D), lin(D)),
            P(f"{pre}attn.q_norm.weight", "bf16", (qr,), NORM),
            P(f"{pre}attn.wq_b", "fp8", (H * hd, qr), lin(qr)),
            P(f"{pre}attn.wkv", "fp8", (hd, D), lin(D)),
            P(f"{pre}attn.kv_norm.weight", "bf16", (hd,), NORM),
            P(f"{pre}attn.wo_a", "fp8", (og * orank, H * hd // og), lin(H * hd // og)),
            P(f"{pre}attn.wo_b", "fp8", (D, og * orank), lin(og * orank)),
        ]
        if ratio == 4:  # CSA: overlapping compressor (2x width) + indexer
            out += [
                P(f"{pre}attn.compressor.ape", "f32", (4, 2 * hd), ("normal", 0.0, 0.5)),
                P(f"{pre}attn.compressor.wkv.weight", "bf16", (2 * hd, D), lin(D)),
                P(f"{pre}attn.compressor.wgate.weight", "bf16", (2 * hd, D), lin(D)),
                P(f"{pre}attn.compressor.norm.weight", "bf16", (hd,), NORM),
                P(f"{pre}attn.indexer.wq_b", "fp8", (ih * ihd, qr), lin(qr)),
                P(f"{pre}attn.indexer.weights_proj.weight", "bf16", (ih, D), lin(D)),
                P(f"{pre}attn.indexer.compressor.ape", "f32", (4, 2 * ihd), ("normal", 0.0, 0.5)),
                P(f"{pre}attn.indexer.compressor.wkv.weight", "bf16", (2 * ihd, D), lin(D)),
                P(f"{pre}attn.indexer.compressor.wgate.weight", "bf16", (2 * ihd, D), lin(D)),
                P(f"{pre}attn.indexer.compressor.norm.weight", "bf16", (ihd,), NORM),
            ]
        elif ratio > 0:  # HCA
            out += [
                P(f"{pre}attn.compressor.ape", "f32", (ratio, hd), ("normal", 0.0, 0.5)),
                P(f"{pre}attn.compressor.wkv.weight", "bf16", (hd, D), lin(D)),
                P(f"{pre}attn.compressor.wgate.weight", "bf16", (hd, D), lin(D)),
                P(f"{pre}attn.compressor.norm.weight", "bf16", (hd,), NORM),
            ]
        out.append(P(f"{pre}ffn.gate.weight", "bf16", (E, D), lin(D)))
        if hash_layer:
            out.append(P(f"{pre}ffn.gate.tid2eid", "tid2eid", (V, K)))
        else:
            out.append(P(f"{pre}ffn.gate.bias", "f32", (E,), ("normal", 0.0, 0.1)))
        for kind, pfx in (("fp8", f"{pre}ffn.shared_experts."),) + tuple(
                ("fp4", f"{pre}ffn.experts.{e}.") for e in range(E)):
            out += [
                P(pfx + "w1", kind, (I, D), lin(D, 3.0)),
                P(pfx + "w3", kind, (I, D), lin(D, 3.0)),
                P(pfx + "w2", kind, (D, I), lin(I, 1.0 / 3.0)),
            ]
        return out

    for n in range(L):
        ps += block(f"layers.{n}.", n, c["compress_ratios"][n], n < c["num_hash_layers"])
    ps += [
        P("hc_head_fn", "f32", (hc, hc * D), ("normal", 0.0, fn_std)),
        P("hc_head_base", "f32", (hc,), ("normal", 0.0, 0.5)),
        P("hc_head_scale", "f32", (1,), ("normal", 1.0, 0.1)),
        P("norm.weight", "bf16", (D,), NORM),
        P("head.weight", "bf16", (V, D), lin(D)),
    ]
    for m in range(c["num_nextn_predict_layers"]):
        pre = f"mtp.{m}."
        ps += [
            P(pre + "e_proj", "fp8", (D, D), lin(D)),
            P(pre + "h_proj", "fp8", (D, D), lin(D)),
            P(pre + "enorm.weight", "bf16", (D,), NORM),
            P(pre + "hnorm.weight", "bf16", (D,), NORM),
        ]
        ps += block(pre, L + m, c["compress_ratios"][L + m], False)
        ps += [
            P(pre + "norm.weight", "bf16", (D,), NORM),
            P(pre + "hc_head_fn", "f32", (hc, hc * D), ("normal", 0.0, fn_std)),
            P(pre + "hc_head_base", "f32", (hc,), ("normal", 0.0, 0.5)),
            P(pre + "hc_head_scale", "f32", (1,), ("normal", 1.0, 0.1)),
        ]
    return ps

# --------------------------------------------------------------------------------------------
# Value generation -> list of (name, dtype, shape, data) safetensors entries per parameter

ROW_CHUNK_BYTES = 1 << 26


def _row_chunks(shape, itemsize):
    rows = shape[0]
    per_row = int(np.prod(shape[1:])) * itemsize if len(shape) > 1 else itemsize
    step = max(1, ROW_CHUNK_BYTES // max(per_row, 1))
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def _normal(rng, shape, init):
    _, mean, std = init
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)).astype(np.float32)


def _tid2eid(rng, V, E, K):
    out = np.empty((V, K), np.int64)
    for r0 in range(0, V, 8192):
        r1 = min(V, r0 + 8192)
        out[r0:r1] = np.argsort(rng.random((r1 - r0, E)), axis=1)[:, :K]
    return out


def gen_exact(p, seed, bf16_linears):
    rng = C.name_seed(seed, p.name)
    if p.kind == "tid2eid":
        V, K = p.shape
        return [(p.name, "I64", p.shape, _tid2eid(rng, V, E_GLOBAL[0], K))]
    w = _normal(rng, p.shape, p.init)
    if p.kind == "f32":
        return [(p.name, "F32", p.shape, w)]
    if p.kind == "bf16":
        return [(p.name, "BF16", p.shape, C.f32_to_bf16_bits(w))]
    if bf16_linears:
        return [(p.name + ".weight", "BF16", p.shape, C.f32_to_bf16_bits(w))]
    if p.kind == "fp8":
        q, s = C.quant_fp8_weight(w)
        return [(p.name + ".weight", "F8_E4M3", q.shape, q), (p.name + ".scale", "F8_E8M0", s.shape, s)]
    if p.kind == "fp4":
        q, s = C.quant_fp4_weight(w)
        return [(p.name + ".weight", "I8", q.shape, q), (p.name + ".scale", "F8_E8M0", s.shape, s)]
    raise ValueError(p.kind)


# Fast mode: Gaussian-shaped code tables indexed by random uint16 (no fp32 master tensors).
_SIGMA_E4M3 = 448.0 / 4.0   # code-domain std: a 128x128 tile of N(0,1) has amax ~ 4-4.5 sigma
_SIGMA_E2M1 = 6.0 / 2.5     # code-domain std for the (row, 32) FP4 blocks


def _code_tables(rng):
    z = rng.standard_normal(65536).astype(np.float32)
    t8 = C.e4m3_encode(np.clip(z * _SIGMA_E4M3, -448, 448))
    z2 = rng.standard_normal((65536, 2)).astype(np.float32)
    c4 = C.e2m1_encode(np.clip(z2 * _SIGMA_E2M1, -6, 6))
    t4 = (c4[:, 0] | (c4[:, 1] << 4)).astype(np.uint8).view(np.int8)
    return t8, t4


def gen_fast(p, seed, bf16_linears):
    """Lazy producers; values are random but deterministic per (seed, name)."""
    if p.kind in ("f32", "tid2eid") or int(np.prod(p.shape)) <= (1 << 16):
        return gen_exact(p, seed, bf16_linears)
    shape = p.shape
    std = p.init[2]
    mean = p.init[1]

    if p.kind == "bf16" or bf16_linears:
        name = p.name if p.kind == "bf16" else p.name + ".weight"

        def prod_bf16():
            rng = C.name_seed(seed, p.name)
            table = C.f32_to_bf16_bits(rng.standard_normal(65536).astype(np.float32) * np.float32(std)
                                       + np.float32(mean))
            for r0, r1 in _row_chunks(shape, 2):
                yield table[rng.integers(0, 65536, size=(r1 - r0,) + shape[1:], dtype=np.uint16)]
        return [(name, "BF16", shape, prod_bf16)]

    o, i = shape
    if p.kind == "fp8":
        srng = C.name_seed(seed, p.name + "#scale")
        base = 127 + int(round(math.log2(std / _SIGMA_E4M3)))
        sc = (base + srng.integers(-1, 2, size=(-(-o // 128), -(-i // 128)))).astype(np.uint8)

        def prod_fp8():
            rng = C.name_seed(seed, p.name)
            t8, _ = _code_tables(rng)
            for r0, r1 in _row_chunks(shape, 1):
                yield t8[rng.integers(0, 65536, size=(r1 - r0, i), dtype=np.uint16)]
        return [(p.name + ".weight", "F8_E4M3", shape, prod_fp8), (p.name + ".scale", "F8_E8M0", sc.shape, sc)]
    if p.kind == "fp4":
        srng = C.name_seed(seed, p.name + "#scale")
        base = 127 + int(round(math.log2(std / _SIGMA_E2M1)))
        sc = (base + srng.integers(-1, 2, size=(o, i // 32))).astype(np.uint8)

        def prod_fp4():
            rng = C.name_seed(seed, p.name)
            _, t4 = _code_tables(rng)
            for r0, r1 in _row_chunks((o, i // 2), 1):
                yield t4[rng.integers(0, 65536, size=(r1 - r0, i // 2), dtype=np.uint16)]
        return [(p.name + ".weight", "I8", (o, i // 2), prod_fp4), (p.name + ".scale", "F8_E8M0", sc.shape, sc)]
    raise ValueError(p.kind)


E_GLOBAL = [0]  # n_routed_experts, for tid2eid

# --------------------------------------------------------------------------------------------
# Writing


def shard_name(k, n):
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def plan_entries(cfg, seed, mode, bf16_linears):
    E_GLOBAL[0] = cfg["n_routed_experts"]
    gen = gen_exact if mode == "exact" else gen_fast
    entries = []
    for p in inventory(cfg):
        entries += gen(p, seed, bf16_linears)
    return entries


def split_shards(entries, max_bytes):
    shards, cur, cur_bytes = [], [], 0
    for e in entries:
        n = C.tensor_nbytes(e[1], e[2])
        if cur and cur_bytes + n > max_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(e)
        cur_bytes += n
    if cur:
        shards.append(cur)
    return shards


def released_config(cfg, bf16_linears):
    out = copy.deepcopy(cfg)
    if bf16_linears:
        out.pop("quantization_config", None)
        out.pop("expert_dtype", None)
    return out


def write_released(cfg, out_dir, seed, mode="exact", bf16_linears=False, max_shard_bytes=4 << 30,
                   num_shards=None, log=print):
    """Writes the released-format checkpoint; returns (weight_map, total_size, n_shards)."""
    validate_config(cfg)
    os.makedirs(out_dir, exist_ok=True)
    for fn in os.listdir(out_dir):
        if fn.startswith("model-") and fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, fn))
    entries = plan_entries(cfg, seed, mode, bf16_linears)
    total = sum(C.tensor_nbytes(e[1], e[2]) for e in entries)
    if num_shards is not None:  # smallest max size that gives exactly num_shards shards
        lo, hi = 1, total
        while lo < hi:
            mid = (lo + hi) // 2
            if len(split_shards(entries, mid)) <= num_shards:
                hi = mid
            else:
                lo = mid + 1
        max_shard_bytes = lo
        assert len(split_shards(entries, lo)) == num_shards, "cannot split into that many shards"
    shards = split_shards(entries, max_shard_bytes)
    weight_map = {}
    for k, sh in enumerate(shards, 1):
        fn = shard_name(k, len(shards))
        C.write_safetensors(os.path.join(out_dir, fn), sh, metadata={"format": "pt"})
        for e in sh:
            weight_map[e[0]] = fn
        log(f"  wrote {fn}: {len(sh)} tensors, {sum(C.tensor_nbytes(e[1], e[2]) for e in sh)} bytes")
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(released_config(cfg, bf16_linears), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 1.0,
                   "top_p": 1.0}, f, indent=2)
        f.write("\n")
    log(f"  {len(entries)} tensors, {total} bytes in {len(shards)} shard(s)")
    return weight_map, total, len(shards)

def verify_released(cfg, out_dir, full=True, log=print):
    """Re-reads the checkpoint with the `safetensors` package (independent parser) and our reader:
    same names / dtypes / shapes / bytes, index consistent, inventory as expected; with full=True also
    checks our e4m3 / UE8M0 decoders against torch's float8_e4m3fn / float8_e8m0fnu casts."""
    import torch
    from safetensors import safe_open
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    tdt = {"BF16": torch.bfloat16, "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn,
           "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8, "I64": torch.int64}
    names = set()
    total = 0
    for fn in sorted(set(index["weight_map"].values())):
        path = os.path.join(out_dir, fn)
        header, base = C.read_safetensors_header(path)
        ours = C.read_safetensors(path) if full else None
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                info = header[k]
                assert index["weight_map"][k] == fn
                sl = f.get_slice(k)
                assert sl.get_dtype() == info["dtype"] and list(sl.get_shape()) == info["shape"], k
                total += C.tensor_nbytes(info["dtype"], info["shape"])
                names.add(k)
                if not full:
                    continue
                t = f.get_tensor(k)
                assert t.dtype == tdt[info["dtype"]], (k, t.dtype)
                raw = ours[k][1]
                assert t.view(torch.uint8).numpy().tobytes() == raw.tobytes(), k
                if info["dtype"] == "F8_E4M3":
                    a = t.float().numpy()
                    b = C.e4m3_decode(raw)
                    assert np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)]), k
                elif info["dtype"] == "F8_E8M0":
                    assert np.array_equal(t.float().numpy(), C.ue8m0_decode(raw)), k
    assert names == set(index["weight_map"]), "index and shards disagree"
    assert total == index["metadata"]["total_size"]
    E_GLOBAL[0] = cfg["n_routed_experts"]
    bf16 = not any(v.endswith(".scale") for v in names)
    want = set()
    for p in inventory(cfg):
        if p.kind in ("fp8", "fp4"):
            want.add(p.name + ".weight")
            if not bf16:
                want.add(p.name + ".scale")
        else:
            want.add(p.name)
    assert names == want, sorted(names ^ want)[:10]
    log(f"  released checkpoint OK: {len(names)} tensors, {total} bytes, parsed by `safetensors` and by "
        f"ref/dsv4_common.py" + (", FP8/E8M0 decoders == torch casts" if full else " (headers only)"))


def inventory_totals(cfg, bf16_linears=False):
    """(tensor count, bytes, dtype histogram, parameters) of the checkpoint `cfg` describes."""
    E_GLOBAL[0] = cfg["n_routed_experts"]
    n, nbytes, hist, params = 0, 0, {}, 0
    for p in inventory(cfg):
        o = p.shape
        if p.kind == "fp8" and not bf16_linears:
            ents = [("F8_E4M3", o), ("F8_E8M0", (-(-o[0] // 128), -(-o[1] // 128)))]
        elif p.kind == "fp4" and not bf16_linears:
            ents = [("I8", (o[0], o[1] // 2)), ("F8_E8M0", (o[0], o[1] // 32))]
        elif p.kind in ("fp8", "fp4", "bf16"):
            ents = [("BF16", o)]
        elif p.kind == "f32":
            ents = [("F32", o)]
        else:
            ents = [("I64", o)]
        for dt, sh in ents:
            n += 1
            nbytes += C.tensor_nbytes(dt, sh)
            hist[dt] = hist.get(dt, 0) + 1
        params += int(np.prod(o))
    return n, nbytes, hist, params


def check_flash_inventory(log=print):
    """The full V4-Flash inventory must reproduce the release exactly (spec 6.1)."""
    n, nbytes, hist, params = inventory_totals(preset_config("flash"))
    assert (n, nbytes) == (69187, 159609485896), (n, nbytes)
    assert hist == {"BF16": 433, "F32": 417, "F8_E4M3": 375, "F8_E8M0": 34167, "I8": 33792, "I64": 3}, hist
    log(f"  V4-Flash inventory OK: {n} tensors, {nbytes} bytes, {params} parameters (= the release)")


# --------------------------------------------------------------------------------------------
# HF transformers side


def hf_config(cfg):
    """HF-style config.json for DeepseekV4ForCausalLM (transformers >= 5)."""
    L = cfg["num_hidden_layers"]
    ratios = cfg["compress_ratios"][:L]
    hca = sorted({r for r in ratios if r not in (0, 4)})
    if len(hca) > 1:
        raise SystemExit(f"HF supports one HCA ratio per model, got {hca}")
    types = {0: "sliding_attention", 4: "compressed_sparse_attention"}
    layer_types = [types.get(r, "heavily_compressed_attention") for r in ratios]
    rs = cfg["rope_scaling"]
    keep = ["vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "q_lora_rank",
            "num_experts_per_tok", "n_routed_experts", "n_shared_experts", "scoring_func",
            "norm_topk_prob", "routed_scaling_factor", "max_position_embeddings", "rope_theta",
            "compress_rope_theta", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "swiglu_limit",
            "sliding_window", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim",
            "index_topk", "num_nextn_predict_layers", "hidden_act", "rms_norm_eps", "bos_token_id",
            "eos_token_id", "tie_word_embeddings", "attention_bias", "attention_dropout",
            "initializer_range"]
    out = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
    out.update({k: cfg[k] for k in keep})
    out.update({
        "layer_types": layer_types,
        "mlp_layer_types": ["hash_moe" if n < cfg["num_hash_layers"] else "moe" for n in range(L)],
        "compress_rates": {"compressed_sparse_attention": 4,
                           "heavily_compressed_attention": hca[0] if hca else 128},
        "partial_rotary_factor": cfg["qk_rope_head_dim"] / cfg["head_dim"],
        "rope_parameters": {"rope_type": "yarn", "factor": rs["factor"],
                            "original_max_position_embeddings": rs["original_max_position_embeddings"],
                            "beta_fast": rs["beta_fast"], "beta_slow": rs["beta_slow"]},
        "torch_dtype": "float32",
        "use_cache": True,
    })
    return out


def write_hf(cfg, released_dir, hf_dir, log=print):
    """Dequantise the released checkpoint and write it as fp32 under the official names (no mtp)."""
    import torch
    from safetensors.torch import save_file
    raw = C.read_checkpoint(released_dir)
    deq = C.dequantise_checkpoint(raw)
    os.makedirs(hf_dir, exist_ok=True)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in deq.items() if not k.startswith("mtp.")}
    save_file(sd, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
        f.write("\n")
    log(f"  wrote HF fp32 dir {hf_dir}: {len(sd)} tensors")
    return deq


def official_to_hf(deq, cfg):
    """Map official tensor names to HF parameter names (spec 6.6), fusing experts."""
    import torch
    out = {}
    E = cfg["n_routed_experts"]
    ren = [(".attn.", ".self_attn."), (".ffn.", ".mlp.")]
    leaf = {
        "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
        "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
        "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
        "self_attn.attn_sink": "self_attn.sinks",
        "self_attn.wq_a.weight": "self_attn.q_a_proj.weight",
        "self_attn.q_norm.weight": "self_attn.q_a_norm.weight",
        "self_attn.wq_b.weight": "self_attn.q_b_proj.weight",
        "self_attn.wkv.weight": "self_attn.kv_proj.weight",
        "self_attn.kv_norm.weight": "self_attn.kv_norm.weight",
        "self_attn.wo_a.weight": "self_attn.o_a_proj.weight",
        "self_attn.wo_b.weight": "self_attn.o_b_proj.weight",
        "self_attn.compressor.ape": "self_attn.compressor.position_bias",
        "self_attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
        "self_attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
        "self_attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
        "self_attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
        "self_attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
        "self_attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
        "self_attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
        "self_attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
        "self_attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
        "mlp.gate.weight": "mlp.gate.weight", "mlp.gate.bias": "mlp.gate.e_score_correction_bias",
        "mlp.gate.tid2eid": "mlp.gate.tid2eid",
        "mlp.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
        "mlp.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
        "mlp.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    }
    top = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
           "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
           "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
    experts = {}
    for k, v in deq.items():
        if k.startswith("mtp."):
            continue
        if k in top:
            out[top[k]] = v
            continue
        assert k.startswith("layers.")
        _, n, rest = k.split(".", 2)
        rest = "." + rest
        for a, b in ren:
            rest = rest.replace(a, b)
        rest = rest[1:]
        if rest.startswith("mlp.experts."):
            _, _, e, w, _ = rest.split(".")
            experts[(int(n), int(e), w)] = v
            continue
        out[f"model.layers.{n}.{leaf[rest]}"] = v
    for n in sorted({k[0] for k in experts}):
        gu = np.stack([np.concatenate([experts[(n, e, "w1")], experts[(n, e, "w3")]], 0) for e in range(E)])
        dn = np.stack([experts[(n, e, "w2")] for e in range(E)])
        out[f"model.layers.{n}.mlp.experts.gate_up_proj"] = gu
        out[f"model.layers.{n}.mlp.experts.down_proj"] = dn
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def spec_rope_inv_freq(theta, d, yarn=None):
    """Spec section 3, evaluated in fp32 the way the reference code (and HF) does it:
    f_i = 1 / fl32(theta^(2i/d)) with a correctly rounded pow; for YaRN,
    smooth_i = 1 - ramp_i and f'_i = (f_i / s) * (1 - smooth_i) + f_i * smooth_i, all in fp32.
    (The spec's algebraically equal form (f/s)*ramp + f*(1-ramp) can differ by 1 ulp on the ramp
    pairs, and 1 ulp of frequency moves the angle at position ~1e6 by up to ~0.06 rad; for the
    released theta/yarn values the two forms happen to agree bit for bit. numpy's float32 pow is NOT
    correctly rounded (4-6 of 32 entries off by 1 ulp), torch's is: use a double pow + round.)"""
    i = np.arange(d // 2, dtype=np.float32)
    pw = (float(theta) ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)  # correctly rounded
    f = (np.float32(1.0) / pw).astype(np.float32)
    if yarn is None:
        return f
    s, L0, bf, bs = yarn["factor"], yarn["original_max_position_embeddings"], yarn["beta_fast"], yarn["beta_slow"]
    corr = lambda n: d * math.log(L0 / (2 * math.pi * n)) / (2 * math.log(theta))  # noqa: E731
    low = max(math.floor(corr(bf)), 0)
    high = min(math.ceil(corr(bs)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((i - np.float32(low)) / np.float32(high - low), 0, 1).astype(np.float32)
    smooth = (np.float32(1) - ramp).astype(np.float32)
    interp = (np.float32(1.0) / (np.float32(s) * pw)).astype(np.float32)
    return (interp * (np.float32(1) - smooth) + f * smooth).astype(np.float32), (low, high)


def spec_rope_inv_freq_naive(theta, d, yarn):
    """The spec text's literal form (f/s)*ramp + f*(1-ramp), for reporting the difference."""
    f = spec_rope_inv_freq(theta, d)
    _, (low, high) = spec_rope_inv_freq(theta, d, yarn)
    i = np.arange(d // 2, dtype=np.float32)
    ramp = np.clip((i - np.float32(low)) / np.float32(high - low), 0, 1).astype(np.float32)
    return ((f / np.float32(yarn["factor"])) * ramp + f * (np.float32(1) - ramp)).astype(np.float32)


def load_hf(hf_dir):
    import torch
    from transformers import DeepseekV4ForCausalLM
    model, info = DeepseekV4ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, output_loading_info=True)
    model.eval()
    return model, info


def verify_hf(cfg, released_dir, hf_dir, log=print):
    import torch
    model, info = load_hf(hf_dir)
    bad = {k: v for k, v in info.items() if v and k != "mismatched_keys" or (k == "mismatched_keys" and v)}
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith("mtp.")]
    assert not info.get("missing_keys"), f"missing keys: {info['missing_keys']}"
    assert not unexpected, f"unexpected keys: {unexpected}"
    assert not info.get("mismatched_keys"), f"mismatched: {info['mismatched_keys']}"
    assert not info.get("error_msgs"), f"errors: {info['error_msgs']}"
    del bad
    # every HF parameter / persistent buffer equals the released checkpoint decoded by our decoder
    deq = C.dequantise_checkpoint(C.read_checkpoint(released_dir))
    want = official_to_hf(deq, cfg)
    have = dict(model.state_dict())
    assert set(want) == set(have), (sorted(set(want) ^ set(have)))[:20]
    for k, v in want.items():
        h = have[k]
        assert h.shape == v.shape, (k, h.shape, v.shape)
        if v.dtype == torch.int64:
            assert torch.equal(h.long(), v), k
        else:
            assert h.dtype == torch.float32, (k, h.dtype)
            assert torch.equal(h, v), k
    log(f"  HF load OK: {len(have)} tensors, no missing/unexpected keys, all equal to the decoded checkpoint")
    # RoPE tables vs the spec
    rot = model.model.rotary_emb
    d = cfg["qk_rope_head_dim"]
    main_spec = spec_rope_inv_freq(cfg["rope_theta"], d)
    comp_spec, (low, high) = spec_rope_inv_freq(cfg["compress_rope_theta"], d, cfg["rope_scaling"])
    main_hf = rot.main_inv_freq.numpy()
    comp_hf = rot.compress_inv_freq.numpy()
    assert np.array_equal(main_hf, main_spec), (main_hf, main_spec)
    assert np.array_equal(comp_hf, comp_spec), (comp_hf, comp_spec)
    naive = spec_rope_inv_freq_naive(cfg["compress_rope_theta"], d, cfg["rope_scaling"])
    n_naive = int(np.sum(naive != comp_hf))
    assert rot.main_attention_scaling == 1.0 and rot.compress_attention_scaling == 1.0
    pos = torch.tensor([[0, 1, 5, 127, 128, 1000, 4095, 65535, 1048575]])
    x = torch.zeros(1, 1, dtype=torch.float32)
    worst = 0.0
    for kind, spec_f in (("main", main_spec), ("compress", comp_spec)):
        cos, sin = rot(x, pos, layer_type=kind)
        ang = (pos[0].numpy().astype(np.float32)[:, None] * spec_f[None, :]).astype(np.float32)
        ang = ang.astype(np.float64)  # cos/sin of the fp32 angle, evaluated exactly
        worst = max(worst, float(np.max(np.abs(cos[0].numpy() - np.cos(ang)))),
                    float(np.max(np.abs(sin[0].numpy() - np.sin(ang)))))
    assert worst < 1e-6, worst
    log(f"  RoPE OK: HF main/compress inv_freq bit-equal to the spec formula in reference fp32 order "
        f"(yarn low={low} high={high}, attention_scaling 1.0; the literal (f/s)*ramp+f*(1-ramp) form "
        f"differs in {n_naive} of {d // 2} entries by 1 ulp); cos/sin = cos/sin(fp32(pos*f)) within {worst:.1e}")
    return model

# --------------------------------------------------------------------------------------------


def build_config(args):
    cfg = preset_config(args.preset, args.layers)
    if args.config:
        with open(args.config) as f:
            cfg.update(json.load(f))
    for kv in args.set or []:
        k, v = kv.split("=", 1)
        cfg[k] = parse_value(v)
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny-a", choices=["tiny-a", "tiny-b", "flash"])
    ap.add_argument("--layers", type=int, help="number of backbone layers (real schedule prefix)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (JSON value)")
    ap.add_argument("--config", help="JSON file of config overrides")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--hf-out")
    ap.add_argument("--bf16-linears", action="store_true")
    ap.add_argument("--max-shard-mb", type=float, default=4096.0)
    ap.add_argument("--num-shards", type=int, help="instead of --max-shard-mb: exactly this many shards")
    ap.add_argument("--gen", choices=["exact", "fast"], help="default: exact below 1e9 parameters")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip re-reading the checkpoint with safetensors + torch (tests that only "
                         "need a random model, on machines without torch)")
    ap.add_argument("--check-inventory", action="store_true",
                    help="only check that the full V4-Flash inventory matches the release, then exit")
    args = ap.parse_args(argv)
    if args.check_inventory:
        check_flash_inventory()
        return
    if not args.out:
        ap.error("--out is required")
    cfg = build_config(args)
    validate_config(cfg)
    E_GLOBAL[0] = cfg["n_routed_experts"]
    nparams = sum(int(np.prod(p.shape)) for p in inventory(cfg))
    mode = args.gen or ("exact" if nparams < 1e9 else "fast")
    print(f"preset {args.preset}: {cfg['num_hidden_layers']} layers, {nparams} parameters, mode {mode}")
    write_released(cfg, args.out, args.seed, mode, args.bf16_linears,
                   int(args.max_shard_mb * (1 << 20)), args.num_shards)
    if not args.no_verify:
        verify_released(cfg, args.out, full=nparams < 1e9)
    if args.hf_out:
        if mode != "exact" and nparams > 2e9:
            raise SystemExit("--hf-out is meant for small models")
        if os.path.isdir(args.hf_out):
            shutil.rmtree(args.hf_out)
        write_hf(cfg, args.out, args.hf_out)
        verify_hf(cfg, args.out, args.hf_out)


if __name__ == "__main__":
    main()
