#!/usr/bin/env python3
"""HF `tokenizers` side of `dsinfer bench tokenize`: prints the encode throughput (MB/s of UTF-8
input, best of --repeat runs, one thread) of the given text file, as one number.

    python3 ref/tok_bench.py --tokenizer DIR [--repeat N] FILE

DIR holds tokenizer.json (tests/golden/tok/v4 keeps it gzipped: tokenizer.json.gz is read too).
The text is encoded as one string with Tokenizer.encode (add_special_tokens has no effect on this
tokenizer), the way dsinfer encodes a prompt.
"""
import argparse
import gzip
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("file")
    a = ap.parse_args()
    from tokenizers import Tokenizer
    p = os.path.join(a.tokenizer, "tokenizer.json")
    if os.path.exists(p):
        tok = Tokenizer.from_file(p)
    else:
        tok = Tokenizer.from_str(gzip.open(p + ".gz").read().decode("utf-8"))
    raw = open(a.file, "rb").read()
    text = raw.decode("utf-8", "replace")
    best = float("inf")
    for _ in range(max(1, a.repeat)):
        t0 = time.perf_counter()
        tok.encode(text)
        best = min(best, time.perf_counter() - t0)
    print(f"{len(raw) / best / 1e6:.3f}")


if __name__ == "__main__":
    main()
