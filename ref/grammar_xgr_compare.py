#!/usr/bin/env python3
"""Mask equality between dsinfer's grammar engine and XGrammar on the same grammar and tokenizer.

For each case (an EBNF file, a JSON schema with a whitespace policy, or a regex):
  1. dsinfer walks: `dsinfer grammar sample ... --ids-out --masks-out` gives random walks and
     dsinfer's mask before every step; XGrammar replays the same tokens and its mask must be
     the same at every step.
  2. XGrammar walks: random walks through XGrammar's masks; `dsinfer grammar masks --ids`
     replays them and the masks must be the same.
Masks are compared on the text tokens and EOS. Added tokens (<think>, placeholders, BOS, ...)
are control tokens for dsinfer (never allowed) while XGrammar treats them as text, so they are
left out of the comparison.

Whitespace: dsinfer's flexible policy == XGrammar's any_whitespace=True (unbounded) or with
max_whitespace_cnt=N (--max-ws N); compact == any_whitespace=False, separators=(",", ":").

Usage:
  grammar_xgr_compare.py --dsinfer build/dsinfer -m TOKDIR [--walks N] [--seed S] CASE...
  CASE: ebnf:FILE | schema:FILE[:compact|:flexible] | schema-ebnf:FILE[:ws] | regex:RE |
        json_object | schemas:DIR[:ws] | schemas-ebnf:DIR[:ws]
  schema: XGrammar compiles the schema itself (the languages agree on the common subset: see
  src/grammar/schema.c); schema-ebnf: XGrammar compiles dsinfer's grammar for the schema
  (`dsinfer grammar print`), which checks the engine on every schema.
Exit status 0 when every mask matched, 1 on a mismatch (details printed), 3 when xgrammar is
not importable (the CLI test turns that into a skip).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import xgrammar as xgr
except ImportError as e:  # pragma: no cover - CI without xgrammar
    print(f"SKIP: xgrammar not importable ({e}); pip install xgrammar", file=sys.stderr)
    sys.exit(3)


def load_tokenizer(tokdir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokdir)
    with open(os.path.join(tokdir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    n = max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"])) + 1
    added = {a["id"] for a in tj["added_tokens"]}
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=n)
    return info, n, added


class Case:
    def __init__(self, spec, args):
        self.spec = spec
        self.args = args
        kind, _, rest = spec.partition(":")
        self.kind = kind
        self.ws = "flexible"
        if kind == "ebnf":
            self.path = rest
            self.text = open(rest, encoding="utf-8").read()
            self.src = ["--ebnf", rest]
        elif kind in ("schema", "schema-ebnf"):
            path, _, ws = rest.partition(":")
            self.path = path
            self.ws = ws or "flexible"
            self.text = open(path, encoding="utf-8").read()
            self.src = ["--schema", path, "--ws", self.ws]
        elif kind == "regex":
            self.text = rest
            self.src = ["--regex", rest]
        elif kind == "json_object":
            self.src = ["--json-object", "--ws", "flexible"]
        else:
            raise SystemExit(f"unknown case {spec}")
        if args.max_ws and kind in ("schema", "json_object") and self.ws == "flexible":
            self.src += ["--max-ws", str(args.max_ws)]

    def xgr_compiled(self, compiler):
        if self.kind == "ebnf":
            return compiler.compile_grammar(self.text)
        if self.kind == "schema-ebnf":  # dsinfer's grammar for the schema, printed as EBNF
            r = subprocess.run([self.args.dsinfer, "grammar", "print", *self.src], capture_output=True, check=True)
            return compiler.compile_grammar(r.stdout.decode())
        if self.kind == "regex":
            return compiler.compile_regex(self.text)
        if self.kind == "json_object":
            g = xgr.Grammar.from_json_schema(json.dumps({"type": "object"}), any_whitespace=True,
                                             **({"max_whitespace_cnt": self.args.max_ws} if self.args.max_ws else {}))
            return compiler.compile_grammar(g)
        kw = {}
        if self.ws == "compact":
            kw = {"any_whitespace": False, "separators": (",", ":")}
        else:
            kw = {"any_whitespace": True}
            if self.args.max_ws:
                kw["max_whitespace_cnt"] = self.args.max_ws
        return compiler.compile_json_schema(self.text, strict_mode=True, **kw)


def mask_bits(words, n):
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:n]
    return bits.astype(bool)


def describe(ids, info_vocab, limit=12):
    out = []
    for i in list(ids)[:limit]:
        out.append(f"{i}:{info_vocab[i]!r}")
    return ", ".join(out) + (" ..." if len(ids) > limit else "")


def compare_walk(case, cg, ids, masks, n, keep, vocab, label):
    """ids: the tokens; masks: dsinfer's masks before each step (len(ids) + 0 or + 1)."""
    m = xgr.GrammarMatcher(cg)
    bm = xgr.allocate_token_bitmask(1, n)
    eos = 1
    for step in range(len(masks)):
        m.fill_next_token_bitmask(bm)
        xm = mask_bits(bm[0].numpy().view(np.uint32), n) & keep
        dm = mask_bits(masks[step], n) & keep
        if not np.array_equal(xm, dm):
            only_d = np.nonzero(dm & ~xm)[0]
            only_x = np.nonzero(xm & ~dm)[0]
            prefix = b"".join(vocab[t] if t != eos else b"" for t in ids[:step])
            print(f"MISMATCH {case.spec} {label} step {step}: prefix={prefix[-120:]!r}\n"
                  f"  only dsinfer ({len(only_d)}): {describe(only_d, vocab)}\n"
                  f"  only xgrammar ({len(only_x)}): {describe(only_x, vocab)}", file=sys.stderr)
            return False
        if step < len(ids):
            if not m.accept_token(int(ids[step])):
                print(f"MISMATCH {case.spec} {label}: xgrammar refuses token {ids[step]} at step {step}", file=sys.stderr)
                return False
    return True


def run_case(case, args, info, n, added, compiler, words):
    keep = np.ones(n, dtype=bool)
    for a in added:
        keep[a] = False
    keep[1] = True  # EOS
    vocab = info.decoded_vocab
    try:
        cg = case.xgr_compiled(compiler)
    except Exception as e:  # noqa: BLE001 - XGrammar rejects some schemas dsinfer supports
        print(f"skip {case.spec}: xgrammar cannot compile it: {str(e).splitlines()[-1][:200]}", file=sys.stderr)
        return None, 0
    ok = True
    n_masks = 0
    with tempfile.TemporaryDirectory() as td:
        ids_f, masks_f = os.path.join(td, "ids"), os.path.join(td, "masks")
        cmd = [args.dsinfer, "grammar", "sample", *case.src, "-m", args.model, "--seed", str(args.seed),
               "--count", str(args.walks), "--ids-out", ids_f, "--masks-out", masks_f,
               "--max-tokens", str(args.max_tokens), "--soft-max", str(args.soft_max)]
        r = subprocess.run(cmd, capture_output=True)
        if r.returncode != 0:
            print(f"FAIL {case.spec}: {' '.join(cmd)}: {r.stderr.decode(errors='replace')}", file=sys.stderr)
            return False, 0
        walks = [[int(x) for x in line.split()] for line in open(ids_f) if line.strip()]
        allm = np.fromfile(masks_f, dtype=np.uint32).reshape(-1, words)
        pos = 0
        for w, ids in enumerate(walks):
            ms = allm[pos:pos + len(ids)]
            pos += len(ids)
            n_masks += len(ms)
            if not compare_walk(case, cg, ids, ms, n, keep, vocab, f"dsinfer-walk {w}"):
                ok = False
                break
        # XGrammar's own walks, replayed through dsinfer (one call for all of them)
        rng = random.Random(args.seed)
        xwalks = []
        for w in range(args.walks if ok else 0):
            m = xgr.GrammarMatcher(cg)
            bm = xgr.allocate_token_bitmask(1, n)
            ids = []
            soft = rng.randrange(0, 60)
            for step in range(args.max_tokens):
                m.fill_next_token_bitmask(bm)
                allowed = np.nonzero(mask_bits(bm[0].numpy().view(np.uint32), n) & keep)[0]
                if len(allowed) == 0:
                    break
                if 1 in allowed and (step >= soft or rng.random() < 0.1):
                    break
                t = int(rng.choice(allowed))
                if t == 1:
                    break
                m.accept_token(t)
                ids.append(t)
            xwalks.append(ids)
        if xwalks:
            idf, out = os.path.join(td, "xids"), os.path.join(td, "xmasks")
            with open(idf, "w") as f:
                for ids in xwalks:
                    f.write(" ".join(map(str, ids)) + "\n")
            cmd = [args.dsinfer, "grammar", "masks", *case.src, "-m", args.model, "--ids-file", idf, "--out", out]
            r = subprocess.run(cmd, capture_output=True)
            if r.returncode != 0:
                print(f"MISMATCH {case.spec}: dsinfer refuses an xgrammar walk: {r.stderr.decode(errors='replace')}",
                      file=sys.stderr)
                return False, n_masks
            allm = np.fromfile(out, dtype=np.uint32).reshape(-1, words)
            pos = 0
            for w, ids in enumerate(xwalks):
                ms = allm[pos:pos + len(ids) + 1]
                pos += len(ids) + 1
                n_masks += len(ms)
                if not compare_walk(case, cg, ids, ms, n, keep, vocab, f"xgrammar-walk {w}"):
                    ok = False
                    break
    return ok, n_masks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsinfer", default="build/dsinfer")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--walks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--soft-max", type=int, default=100)
    ap.add_argument("--max-ws", type=int, default=0)
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args()
    info, n, added = load_tokenizer(args.model)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    words = (n + 31) // 32
    specs = []
    for c in args.cases:
        if c.startswith("schemas:") or c.startswith("schemas-ebnf:"):
            kind, _, rest = c.partition(":")
            d, _, ws = rest.partition(":")
            one = "schema" if kind == "schemas" else "schema-ebnf"
            for f in sorted(os.listdir(d)):
                if f.endswith(".json"):
                    specs.append(f"{one}:{os.path.join(d, f)}" + (f":{ws}" if ws else ""))
        else:
            specs.append(c)
    bad = skipped = 0
    total = 0
    for s in specs:
        case = Case(s, args)
        ok, nm = run_case(case, args, info, n, added, compiler, words)
        total += nm
        if ok is None:
            skipped += 1
            continue
        print(f"{'ok  ' if ok else 'FAIL'} {s}: {nm} masks", file=sys.stderr)
        bad += not ok
    print(f"xgrammar compare: {len(specs) - bad - skipped}/{len(specs) - skipped} cases equal "
          f"({skipped} skipped), {total} masks compared")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
