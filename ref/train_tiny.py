#!/usr/bin/env python3
"""Train models/dsv4-tiny: a small DeepSeek-V4 (every V4 mechanism) on the Brown corpus (issue #4).

    python3 ref/tiny_data.py                                   # once: text, tokenizer, build/tiny-data/*.npy
    python3 ref/train_tiny.py --out build/tiny-train           # GPU if present, else CPU (slow)
    python3 ref/train_tiny.py --out build/tiny-train --decay-at 680   # the shipped run's schedule
    python3 ref/train_tiny.py --out /tmp/t --steps 3 --batch 2 --seq 128 --eval-every 2 --val-windows 2  # smoke

Model: ref/tiny_model.py (HF transformers' DeepseekV4ForCausalLM + the MTP layer of spec 4.11), fp32
master weights; on CUDA the matmuls run in TF32. Objective per step (batch of `--batch` windows of
`--seq` tokens, each window = BOS + `seq-1` consecutive tokens of the training stream; documents are
separated by EOS in that stream):

  loss = CE(main logits[t] -> tok[t+1])                     over t = 0..seq-2
       + mtp_weight * CE(MTP logits[t] -> tok[t+2])          over t = 0..seq-3   (next-next token)
       + idx_weight * sum over CSA layers of KL(p_attn || p_indexer)
       + balance_weight * mean over learned routers of sum_i f_i P_i     (batch-wise balance loss)

The lightning indexer's top-k is not differentiable, so, as in DeepSeek-V3.2's DSA, the indexer is
trained by its own KL loss: the target p_attn(t, .) is the main attention's softmax over the
compressed entries visible at t (q . k / sqrt(head_dim) per head, mean over heads, detached), and
p_indexer = softmax of the indexer scores over the same entries; the indexer's inputs are detached,
so this loss trains only the indexer's own weights. Learned-routing layers (and the MTP layer) are
balanced the auxiliary-loss-free way (DeepSeek-V3): after every step gate.bias += gamma *
sign(mean load - expert load), plus a small batch-wise balance loss (f_i = load of expert i relative
to uniform, P_i = mean normalised sqrtsoftplus score; DeepSeek-V3 uses a sequence-wise one) because
this run is far too short for the bias alone to stop an early routing collapse. Hash layers use a
fixed random tid2eid table (ref/tiny_model.py). Residual dropout (on the attention and MoE sub-block outputs) regularises training only.

Schedule (one run, no tuning passes): AdamW (0.9, 0.95, wd 0.1 on matrices), linear warmup, then a
constant learning rate until the validation score (main CE + mtp_weight * MTP CE on the held-out
files not in heldout.txt, evaluated every `--eval-every` steps) has not improved for `--plateau`
evaluations, or `--epochs` passes over the training data are done, or 75% of `--time-budget` is
used; then a linear decay to min_lr_frac * lr over max(--min-decay, decay_frac * steps so far) steps
(warmup-stable-decay). Training windows: per epoch, non-overlapping chunks at a random shift,
shuffled. The snapshot with the best validation score is the one saved. The log records where the
decay started; `--decay-at N` reproduces that schedule exactly (up to GPU non-determinism).

Outputs in --out: state-0000K.safetensors (the chosen fp32 state dict, TinyV4 names, split into files
of at most 15 MiB), log.json (config, args, per-step losses, validation curve, timing), train.log.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_model as T  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Log:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)

    def __call__(self, *a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        self.f.write(s + "\n")


class Hooks:
    """Training-only instrumentation of the HF modules (forward maths unchanged)."""

    def __init__(self, model, dropout):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
        self.M = M
        self.collect = False
        self.idx_scores = {}     # id(attention module) -> [B, S, T] indexer scores (with grad)
        self.attn_target = {}    # id(attention module) -> [B, S, T] detached target distribution
        self.loads = {}          # router module -> expert counts this step
        self.routers = []
        self.dropout = dropout
        hooks = self

        # 1) indexer: detach its inputs (its output, a top-k selection, carries no gradient anyway)
        orig_idx = M.DeepseekV4Indexer.forward

        def idx_forward(self_m, hidden_states, q_residual, position_ids, past_key_values, layer_idx):
            return orig_idx(self_m, hidden_states.detach(), q_residual.detach(), position_ids,
                            past_key_values, layer_idx)
        M.DeepseekV4Indexer.forward = idx_forward

        # 2) indexer scores and the attention target, per CSA attention module
        for mod in model.modules():
            if isinstance(mod, M.DeepseekV4Attention) and mod.layer_type == "compressed_sparse_attention":
                scorer = mod.compressor.indexer.scorer
                key = id(mod)

                def scorer_hook(m, args, out, key=key):
                    if hooks.collect:
                        hooks.idx_scores[key] = out
                scorer.register_forward_hook(scorer_hook)

        orig_eager = M.eager_attention_forward

        def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
            out = orig_eager(module, query, key, value, attention_mask, scaling, dropout, **kw)
            if hooks.collect and getattr(module, "layer_type", None) == "compressed_sparse_attention":
                with torch.no_grad():
                    S = query.shape[2]
                    kc = key[:, :, S:, :]                                   # compressed entries
                    Tn = kc.shape[2]
                    if Tn > 0:
                        lg = torch.matmul(query, kc.transpose(2, 3)).float() * scaling  # [B, H, S, T]
                        vis = visible(S, Tn, 4, query.device)
                        lg = lg.masked_fill(~vis, float("-inf"))
                        p = torch.softmax(lg, dim=-1).nan_to_num(0.0).mean(dim=1)      # [B, S, T]
                        hooks.attn_target[id(module)] = p
            return out
        M.eager_attention_forward = eager

        # 3) residual dropout on the sub-block outputs
        def attn_drop(m, args, out):
            return (F.dropout(out[0], hooks.dropout, m.training),) + tuple(out[1:])

        def moe_drop(m, args, out):
            return F.dropout(out, hooks.dropout, m.training)

        # 4) expert loads of the learned routers, and a batch-wise balance loss on them
        self.bal_terms = []

        def router_hook(m, args, out):
            if hooks.collect:
                c = torch.bincount(out[2].reshape(-1), minlength=m.num_experts)
                hooks.loads[m] = hooks.loads.get(m, 0) + c
                s = m.score_fn(out[0].float())                                   # [N, E]
                P = (s / s.sum(-1, keepdim=True)).mean(0)                        # mean routing prob
                f = c.float() * (m.num_experts / (out[2].numel()))               # load (1 = balanced)
                hooks.bal_terms.append((f.detach() * P).sum())

        for mod in model.modules():
            if isinstance(mod, M.DeepseekV4Attention) and dropout > 0:
                mod.register_forward_hook(attn_drop)
            elif isinstance(mod, M.DeepseekV4SparseMoeBlock) and dropout > 0:
                mod.register_forward_hook(moe_drop)
            if isinstance(mod, M.DeepseekV4TopKRouter):
                mod.register_forward_hook(router_hook)
                self.routers.append(mod)

    def indexer_loss(self):
        losses = []
        for key, s in self.idx_scores.items():
            p = self.attn_target[key]
            B, S, Tn = s.shape
            vis = visible(S, Tn, 4, s.device)[0, 0]                       # [S, T]
            logq = torch.log_softmax(s.float().masked_fill(~vis, float("-inf")), dim=-1)
            kl = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p)).sum(-1)
            rows = vis.any(-1)                                           # rows with >= 1 visible entry
            losses.append(kl[:, rows].mean())
        self.idx_scores.clear()
        self.attn_target.clear()
        return torch.stack(losses).sum() if losses else None

    def balance_loss(self):
        t = torch.stack(self.bal_terms).mean() if self.bal_terms else None
        self.bal_terms = []
        return t

    @torch.no_grad()
    def balance(self, gamma):
        stats = []
        for r in self.routers:
            c = self.loads.get(r)
            if c is None:
                continue
            c = c.float()
            r.e_score_correction_bias.add_(gamma * torch.sign(c.mean() - c))
            stats.append(float(c.max() / c.mean()))
        self.loads.clear()
        return max(stats) if stats else None


def visible(S, Tn, ratio, device):
    """[1, 1, S, T] bool: compressed entry i is visible at query t iff i < (t + 1) // ratio."""
    t = torch.arange(S, device=device)[:, None]
    i = torch.arange(Tn, device=device)[None, :]
    return (i < (t + 1) // ratio)[None, None]


def chunk_plan(n_tokens, L, epochs, seed):
    """List of start offsets (one per window), epoch by epoch: non-overlapping chunks of L tokens at a
    random shift, shuffled."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        shift = int(rng.integers(0, L))
        starts = np.arange(shift, n_tokens - L, L)
        rng.shuffle(starts)
        out.append(starts)
    return np.concatenate(out)


def batches_for(stream, starts, L, device):
    idx = torch.as_tensor(starts, device=device)[:, None] + torch.arange(L, device=device)[None]
    x = stream[idx]
    bos = torch.zeros(x.shape[0], 1, dtype=x.dtype, device=device)
    return torch.cat([bos, x], dim=1)


def losses_for(model, ids):
    logits, mtp_logits, _ = model(ids)
    V = logits.shape[-1]
    main = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), ids[:, 1:].reshape(-1))
    mlg = mtp_logits[:, :-1]
    mtp = F.cross_entropy(mlg.reshape(-1, V).float(), ids[:, 2:].reshape(-1))
    acc = (mlg.argmax(-1) == ids[:, 2:]).float().mean()
    return main, mtp, acc


@torch.no_grad()
def evaluate(model, stream, L, bs, device, max_windows=None):
    model.eval()
    n = (stream.numel() - 1) // L
    if max_windows:
        n = min(n, max_windows)
    starts = np.arange(n) * L
    tm = tmtp = tacc = 0.0
    cnt = 0
    for i in range(0, n, bs):
        ids = batches_for(stream, starts[i:i + bs], L, device)
        m, mt, a = losses_for(model, ids)
        k = ids.shape[0]
        tm += float(m) * k
        tmtp += float(mt) * k
        tacc += float(a) * k
        cnt += k
    model.train()
    return tm / cnt, tmtp / cnt, tacc / cnt


def save_state(sd, out_dir, max_bytes=15 << 20):
    from safetensors.torch import save_file
    parts, cur, cur_b = [], {}, 0
    for k, v in sd.items():
        b = v.numel() * v.element_size()
        if cur and cur_b + b > max_bytes:
            parts.append(cur)
            cur, cur_b = {}, 0
        cur[k] = v.contiguous()
        cur_b += b
    if cur:
        parts.append(cur)
    names = []
    for i, p in enumerate(parts, 1):
        fn = f"state-{i:05d}-of-{len(parts):05d}.safetensors"
        save_file(p, os.path.join(out_dir, fn), metadata={"format": "pt"})
        names.append(fn)
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "tiny-data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=20, help="at most this many epochs before the decay")
    ap.add_argument("--steps", type=int, help="exact number of steps (decay over the last decay_frac/(1+decay_frac))")
    ap.add_argument("--decay-at", type=int, help="start the decay at this step (reproduces a logged run)")
    ap.add_argument("--decay-frac", type=float, default=0.2)
    ap.add_argument("--min-decay", type=int, default=100)
    ap.add_argument("--plateau", type=int, default=2, help="evaluations without improvement before decaying")
    ap.add_argument("--time-budget", type=float, default=420.0,
                    help="seconds for the training loop (ignored with --decay-at / --steps)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--idx-weight", type=float, default=1.0)
    ap.add_argument("--bias-gamma", type=float, default=5e-3)
    ap.add_argument("--balance-weight", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--val-windows", type=int, default=0, help="0 = the whole validation stream")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    t_start = time.time()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    cfg = T.tiny_config()
    model = T.TinyV4(cfg, seed=args.seed).to(dev)
    model.train()
    hooks = Hooks(model, args.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"device {dev} ({torch.cuda.get_device_name(0) if dev.type == 'cuda' else 'cpu'}), torch {torch.__version__}, "
        f"params {n_params} (+ buffers tid2eid / gate.bias)")

    train = torch.from_numpy(np.load(os.path.join(args.data, "train.npy")).astype(np.int64)).to(dev)
    val = torch.from_numpy(np.load(os.path.join(args.data, "val.npy")).astype(np.int64)).to(dev)
    L = args.seq - 1
    per_epoch = train.numel() // L
    n_ep = int(math.ceil(max(args.epochs, (args.steps or 0) * args.batch / per_epoch) * (1 + args.decay_frac))) + 1
    plan = chunk_plan(train.numel(), L, n_ep, args.seed + 1)
    log(f"train tokens {train.numel()}, val tokens {val.numel()}, windows/epoch {per_epoch}, "
        f"at most {args.epochs} epochs before the decay (batch {args.batch} x {args.seq})")

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 and "position_bias" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    # Warmup-stable-decay schedule: linear warmup to --lr, constant until the validation score has not
    # improved for --plateau evaluations (or --epochs are done, or 75% of --time-budget is used),
    # then a linear decay to min_lr_frac * lr over max(--min-decay, decay_frac * steps so far) steps.
    # --decay-at N fixes the start of the decay (to reproduce a run); --steps N = --decay-at
    # round(N / (1 + decay_frac)) with the decay ending at N.
    decay_at = args.decay_at
    decay_len = None
    if args.steps:
        decay_at = int(round(args.steps / (1 + args.decay_frac)))
        decay_len = args.steps - decay_at
    if decay_at is not None and decay_len is None:
        decay_len = max(args.min_decay, int(args.decay_frac * decay_at))

    def lr_at(step):
        if decay_at is not None and step >= decay_at:
            f = min(1.0, (step - decay_at) / max(1, decay_len))
            return args.lr * (1 - (1 - args.min_lr_frac) * f)
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        return args.lr

    rec = {"args": vars(args), "config": cfg, "params": n_params, "steps": [], "val": [],
           "train_tokens": int(train.numel()), "val_tokens": int(val.numel()),
           "versions": {"torch": torch.__version__}}
    import transformers
    rec["versions"]["transformers"] = transformers.__version__
    best = (float("inf"), None, -1)
    bad = 0
    t_loop = time.time()
    step = 0
    stop_reason = "schedule done"
    per_step = None
    t_mark = None
    while True:
        if decay_at is not None and step >= decay_at + decay_len:
            break
        if args.decay_at is None and not args.steps and time.time() - t_loop > 1.1 * args.time_budget:
            stop_reason = "time budget exceeded by 10%"
            break
        if step >= len(plan) // args.batch:
            stop_reason = "out of planned data"
            break
        if step == 10 or step == 40:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if step == 10:
                t_mark = time.time()
            else:
                per_step = (time.time() - t_mark) / 30
                rec["ms_per_step"] = per_step * 1000
                log(f"  {per_step * 1000:.1f} ms/step")
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        ids = batches_for(train, plan[step * args.batch:(step + 1) * args.batch], L, dev)
        hooks.collect = True
        main_l, mtp_l, mtp_acc = losses_for(model, ids)
        idx_l = hooks.indexer_loss()
        bal_l = hooks.balance_loss()
        hooks.collect = False
        loss = main_l + args.mtp_weight * mtp_l + (args.idx_weight * idx_l if idx_l is not None else 0.0)
        if bal_l is not None and args.balance_weight > 0:
            loss = loss + args.balance_weight * bal_l
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        imbalance = hooks.balance(args.bias_gamma)
        step += 1
        r = {"step": step, "lr": lr, "loss": loss.item(), "main": main_l.item(), "mtp": mtp_l.item(),
             "mtp_acc": mtp_acc.item(), "idx_kl": idx_l.item() if idx_l is not None else None,
             "balance": bal_l.item() if bal_l is not None else None,
             "grad_norm": gn.item(), "max_load_over_mean": imbalance, "t": time.time() - t_loop}
        rec["steps"].append(r)
        if step % 10 == 0 or step == 1:
            log(f"step {step} lr {lr:.2e} loss {r['loss']:.4f} main {r['main']:.4f} mtp {r['mtp']:.4f} "
                f"idx_kl {r['idx_kl'] if r['idx_kl'] is None else round(r['idx_kl'], 4)} gn {r['grad_norm']:.2f} "
                f"load {imbalance if imbalance is None else round(imbalance, 2)} t {r['t']:.1f}s")
        in_decay = decay_at is not None and step > decay_at
        last = decay_at is not None and step >= decay_at + decay_len
        if step % args.eval_every == 0 or last:
            vm, vmt, vacc = evaluate(model, val, L, args.batch, dev, args.val_windows or None)
            score = vm + args.mtp_weight * vmt
            v = {"step": step, "lr": lr, "val_main": vm, "val_mtp": vmt, "val_mtp_acc": vacc,
                 "val_ppl": math.exp(vm), "epoch": step * args.batch * L / train.numel(), "t": time.time() - t_loop}
            rec["val"].append(v)
            improved = score < best[0]
            if improved:
                best = (score, {k: t.detach().to("cpu", copy=True) for k, t in model.state_dict().items()}, step)
                bad = 0
            else:
                bad += 1
            log(f"  val step {step} (epoch {v['epoch']:.2f}): main {vm:.4f} (ppl {v['val_ppl']:.2f}) mtp {vmt:.4f} "
                f"mtp_acc {vacc:.4f} {'*' if improved else ''}")
            if decay_at is None:
                why = None
                if bad >= args.plateau:
                    why = f"plateau ({bad} evaluations without improvement)"
                elif step >= args.epochs * (train.numel() // L) // args.batch:
                    why = f"{args.epochs} epochs done"
                elif time.time() - t_loop > 0.75 * args.time_budget:
                    why = "75% of the time budget used"
                if why:
                    decay_at = step
                    decay_len = max(args.min_decay, int(args.decay_frac * step))
                    if per_step:
                        left = args.time_budget - (time.time() - t_loop)
                        decay_len = max(10, min(decay_len, int(left / (per_step * 1.15))))
                    rec["decay_reason"] = why
                    log(f"  decay starts at step {decay_at} for {decay_len} steps: {why}")
        del in_decay
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t_train = time.time() - t_loop
    rec.update({"steps_run": step, "decay_at": decay_at, "decay_len": decay_len, "stop_reason": stop_reason,
                "best_step": best[2], "best_val_score": best[0], "train_seconds": t_train,
                "tokens_seen": step * args.batch * args.seq})
    log(f"done: {step} steps in {t_train:.1f}s ({stop_reason}); best val at step {best[2]}")
    files = save_state(best[1], args.out)
    rec["state_files"] = files
    rec["total_seconds"] = time.time() - t_start
    with open(os.path.join(args.out, "log.json"), "w") as f:
        json.dump(rec, f)
    log(f"saved {files} and log.json; total {rec['total_seconds']:.1f}s")


if __name__ == "__main__":
    main()
