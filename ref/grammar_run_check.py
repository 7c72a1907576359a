#!/usr/bin/env python3
"""Structured outputs through the serving engine: `dsinfer run` with response_format, every
output checked by an outside parser (the checks of ref/grammar_check.py).

For every case (same syntax as grammar_check.py: schemas:DIR[:ws], schema:FILE[:ws],
json_object[:ws], regexes:FILE, regex:RE, ebnf-json:FILE, ebnf-arith:FILE, ebnf-sql:FILE) it
writes --seeds request lines (seed base+i, temperature --temperature, n completions each),
runs the engine once on all of them, and checks:
  - no request fails (an error line is a failure);
  - every completion that finished with "stop" is a complete member of the language:
    jsonschema-valid / json.loads / re.fullmatch / ast / sqlite as grammar_check.py;
  - completions cut by max_tokens ("length") are counted; their share must stay below
    --max-length-share (a grammar that never lets the model finish is a failure too);
  - with --special RANGES (e.g. 0-2,8000-8191): no such id among the tokens, except EOS
    (--eos) as the last token of a completion that stopped on it;
  - with --min-schemas N: at least N distinct schema files got a complete, validated output.
Exit 0 when everything holds, 1 otherwise (failures printed).

Usage: grammar_run_check.py --dsinfer build/dsinfer -m MODEL [--tokenizer DIR] [--seeds N]
       [--n K] [--max-tokens T] [--ws-limit W] CASE...
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grammar_check as gc  # noqa: E402


def response_format(kind, target, ws, ws_limit):
    if kind == "schema":
        rf = {"type": "json_schema",
              "json_schema": {"name": os.path.basename(target).rsplit(".", 1)[0],
                              "schema": json.load(open(target, encoding="utf-8")),
                              "strict": True}}
    elif kind == "json_object":
        rf = {"type": "json_object"}
    elif kind == "regex":
        rf = {"type": "regex", "regex": target}
    else:
        rf = {"type": "grammar", "grammar": open(target, encoding="utf-8").read()}
    if kind in ("schema", "json_object"):
        rf["whitespace"] = ws or "flexible"
        if rf["whitespace"] == "flexible" and ws_limit:
            rf["max_whitespace"] = ws_limit
    return rf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsinfer", default="build/dsinfer")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--seeds", type=int, default=4, help="request lines per case")
    ap.add_argument("--seed", type=int, default=1, help="first seed")
    ap.add_argument("--n", type=int, default=1, help="completions per request")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--ws-limit", type=int, default=0, help="max_whitespace for flexible JSON")
    ap.add_argument("--max-length-share", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-seqs", type=int, default=64)
    ap.add_argument("--special", default="", help="ids never allowed, e.g. 0-2,8000-8191")
    ap.add_argument("--eos", type=int, default=1)
    ap.add_argument("--min-schemas", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="per-case counts")
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args()
    if gc.jsonschema is None and any(c.startswith("schema") for c in args.cases):
        print("SKIP: python jsonschema not installed (pip install jsonschema)", file=sys.stderr)
        sys.exit(3)
    cases = gc.expand(args.cases)
    special = set()
    for part in filter(None, args.special.split(",")):
        lo, _, hi = part.partition("-")
        special.update(range(int(lo), int(hi or lo) + 1))
    tmp = tempfile.mkdtemp()
    inp, outp = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    lines = []  # (case index, seed)
    with open(inp, "w", encoding="utf-8") as f:
        for ci, (kind, target, ws) in enumerate(cases):
            rf = response_format(kind, target, ws, args.ws_limit)
            for i in range(args.seeds):
                seed = args.seed + i
                req = {"id": f"{ci}.{i}", "prompt": [5 + seed % 97, 17, 300 + ci % 50, 42],
                       "max_tokens": args.max_tokens, "temperature": args.temperature,
                       "seed": seed, "n": args.n, "response_format": rf}
                f.write(json.dumps(req) + "\n")
                lines.append((ci, seed))
    cmd = [args.dsinfer, "run", "-m", args.model, "--input", inp, "--output", outp,
           "--no-progress", "--max-seqs", str(args.max_seqs),
           "--max-ctx", str(args.max_tokens + 64)]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True)
    el = time.time() - t0
    if r.returncode != 0:
        print(f"FAIL: {' '.join(cmd)}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
        sys.exit(1)
    results = [json.loads(x) for x in open(outp, encoding="utf-8") if x.strip()]
    if len(results) != len(lines):
        print(f"FAIL: {len(results)} output lines for {len(lines)} requests")
        sys.exit(1)
    failed = 0
    n_stop = n_len = 0
    per_case = {}
    for res, (ci, seed) in zip(results, lines):
        kind, target, ws = cases[ci]
        label = f"{kind}:{target}" + (f":{ws}" if ws else "")
        st = per_case.setdefault(ci, {"label": label, "stop": [], "length": 0, "bad": []})
        if "error" in res:
            st["bad"].append((f"seed {seed}", f"request failed: {res['error']['message']}"))
            continue
        for ch in res["choices"]:
            ids = ch["token_ids"]
            if ch["finish_reason"] == "stop" and ch["stop_reason"] == args.eos:
                ids = ids[:-1]
            if special & set(ids):
                st["bad"].append((ch.get("text", ""), f"special ids {sorted(special & set(ids))}"))
            if ch["finish_reason"] == "stop":
                st["stop"].append(ch["text"])
            elif ch["finish_reason"] == "length":
                st["length"] += 1
            else:
                st["bad"].append((ch.get("text", ""), f"finish_reason {ch['finish_reason']}"))
    for ci, st in per_case.items():
        kind, target, ws = cases[ci]
        bad = st["bad"] = st["bad"] + gc.check_outputs(kind, target, st["stop"], ws)
        n_stop += len(st["stop"])
        n_len += st["length"]
        if args.verbose:
            print(f"{'FAIL' if bad else 'ok  '} {st['label']}: {len(st['stop'])} complete, "
                  f"{st['length']} cut", file=sys.stderr)
        if bad:
            failed += 1
            print(f"FAIL {st['label']}: {len(bad)}/{len(st['stop'])} invalid", file=sys.stderr)
            for text, why in bad[:3]:
                print(f"   {why}: {text[:300]!r}", file=sys.stderr)
    total = n_stop + n_len
    schemas_ok = {cases[ci][1] for ci, st in per_case.items()
                  if cases[ci][0] == "schema" and st["stop"] and not st["bad"]}
    share = n_len / total if total else 1.0
    print(f"grammar run check: {len(cases)} cases, {total} completions ({n_stop} complete and "
          f"checked, {n_len} cut by max_tokens = {share:.1%}), {failed} failing cases, "
          f"{len(schemas_ok)} schemas validated, engine {el:.1f} s")
    if len(schemas_ok) < args.min_schemas:
        print(f"FAIL: only {len(schemas_ok)} schemas got a complete output (want {args.min_schemas})")
        failed += 1
    if share > args.max_length_share:
        print(f"FAIL: {share:.1%} of the completions were cut by max_tokens "
              f"(limit {args.max_length_share:.0%})")
        failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
