#!/usr/bin/env python3
"""Reference side of `dsinfer bench grammar`: XGrammar and llguidance on the same grammars and
token sequences, one core, in the same run.

Input (--cases FILE, written by the bench): {"tokenizer": DIR, "vocab_size": N, "cases":
[{"name", "schema": TEXT or null (json_object), "seqs": [[ids...], ...]}]}.
Output (stdout): {"cases": [{"xgrammar": {...}, "llguidance": {...}}], "note": "..."} with
compile_ms, median_us, p99_us, mean_us, n_masks per engine (null when the engine is missing or
fails). Both engines use flexible whitespace (XGrammar any_whitespace=True, strict mode;
llguidance whitespace_flexible) like dsinfer's bench grammar. Each step times one
fill_next_token_bitmask call from Python (the call overhead, about 1 us, is included); the mask
after the last token counts too. Compile time: XGrammar's compile_json_schema with the cache
off; llguidance's LLMatcher constructor plus its first mask (it compiles lazily).
Also usable alone: grammar_bench.py --cases FILE --pretty
"""
import argparse
import json
import os
import statistics
import sys
import time


def stats(times_us):
    if not times_us:
        return None
    s = sorted(times_us)
    return {"median_us": s[len(s) // 2], "p99_us": s[int((len(s) - 1) * 0.99)],
            "mean_us": statistics.fmean(s), "max_us": s[-1], "n_masks": len(s)}


def bench_xgrammar(tok, n_vocab, cases):
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=n_vocab)
    out = []
    for c in cases:
        try:
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            schema = c["schema"] if c["schema"] is not None else json.dumps({"type": "object"})
            t0 = time.perf_counter()
            cg = compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=True)
            compile_ms = (time.perf_counter() - t0) * 1e3
            bm = xgr.allocate_token_bitmask(1, n_vocab)
            times = []
            for seq in c["seqs"]:
                m = xgr.GrammarMatcher(cg)
                for i in range(len(seq) + 1):
                    t0 = time.perf_counter_ns()
                    m.fill_next_token_bitmask(bm)
                    times.append((time.perf_counter_ns() - t0) / 1e3)
                    if i < len(seq) and not m.accept_token(seq[i]):
                        break
            r = stats(times)
            r["compile_ms"] = compile_ms
            out.append(r)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"grammar_bench: xgrammar {c['name']}: {e}", file=sys.stderr)
            out.append(None)
    return out


def bench_llguidance(tok, n_vocab, cases):
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lln

    lt = llguidance.hf.from_tokenizer(tok, n_vocab=n_vocab)
    out = []
    for c in cases:
        try:
            schema = c["schema"] if c["schema"] is not None else json.dumps({"type": "object"})
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
            bm = lln.allocate_token_bitmask(1, n_vocab)
            t0 = time.perf_counter()
            m = llguidance.LLMatcher(lt, grammar)
            lln.fill_next_token_bitmask(m, bm, 0)
            compile_ms = (time.perf_counter() - t0) * 1e3
            if m.is_error():
                raise RuntimeError(m.get_error())
            times = []
            refused = 0
            for seq in c["seqs"]:
                m = llguidance.LLMatcher(lt, grammar)
                lln.fill_next_token_bitmask(m, bm, 0)  # warm: the lazy first mask is compile time
                m.reset()
                for i in range(len(seq) + 1):
                    t0 = time.perf_counter_ns()
                    lln.fill_next_token_bitmask(m, bm, 0)
                    times.append((time.perf_counter_ns() - t0) / 1e3)
                    if i < len(seq) and not m.consume_token(seq[i]):
                        refused += 1
                        break
            r = stats(times)
            r["compile_ms"] = compile_ms
            r["refused_seqs"] = refused
            out.append(r)
        except Exception as e:  # noqa: BLE001
            print(f"grammar_bench: llguidance {c['name']}: {e}", file=sys.stderr)
            out.append(None)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--pretty", action="store_true")
    args = ap.parse_args()
    doc = json.load(open(args.cases, encoding="utf-8"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(doc["tokenizer"])
    n = doc["vocab_size"]
    cases = doc["cases"]
    res = [{} for _ in cases]
    notes = []
    for name, fn in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
        try:
            rs = fn(tok, n, cases)
            for i, r in enumerate(rs):
                res[i][name] = r
            mod = __import__(name)
            notes.append(f"{name} {getattr(mod, '__version__', '') or _version(name)}")
        except ImportError as e:
            print(f"grammar_bench: {name} not installed ({e})", file=sys.stderr)
    out = {"cases": res, "note": "reference engines timed from Python (call overhead ~1 us included): " + ", ".join(notes)}
    json.dump(out, sys.stdout, indent=1 if args.pretty else None)
    sys.stdout.write("\n")


def _version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    main()
