#!/usr/bin/env python3
"""ncu_src_sum.py - summarise Nsight Compute's source page of one kernel launch
(`ncu -i REPORT --page source --csv --print-source sass --print-units base`, as
tests/ops/gpu_ktime.sh writes it with KT_DETAIL_SRC=1; plain or gzipped): where the warp-state
samples fall in the kernel's SASS.

Prints the kernel's name, its instruction count, the samples and instructions executed in all;
then the SASS in consecutive blocks of --block instructions (default 48): each block's share of
the samples, its executed instructions and the notable opcodes in it (tensor-core, shared-memory,
global, barrier, double-precision, call), so a kernel's phases (staging, loop, epilogue,
out-of-line functions) show as runs of blocks; then the --top (default 30) instructions with the
most samples, in address order. Step 39 read the attention at batch 256 this way (docs/cuda.md).
With several launches in the page (KT_DETAIL_COUNT > 1), ncu prints one table per kernel: each
is summarised in turn.
Usage: python3 tools/ncu_src_sum.py src.csv[.gz] [--block N] [--top N]"""
import csv
import gzip
import io
import sys

NOTABLE = (
    "HMMA", "IMMA", "HGMMA", "QGMMA", "LDSM", "LDS", "STS", "LDG", "STG", "LDGSTS", "UBLKCP",
    "BAR", "SYNCS", "MUFU", "DFMA", "DADD", "DMUL", "SHFL", "CALL", "RET", "ATOM", "RED",
    "LDL", "STL",
)


def num(s):
    s = s.replace(",", "").strip()
    try:
        return int(float(s))
    except ValueError:
        return 0


def opcode(sass):
    """The instruction's opcode without predicate and modifiers."""
    parts = sass.split()
    if not parts:
        return ""
    if parts[0].startswith("@") and len(parts) > 1:
        parts = parts[1:]
    return parts[0].split(".")[0]


def tables(lines):
    """(kernel name, header, rows) for each kernel's table in the page."""
    name, header, rows = None, None, []
    for row in csv.reader(lines):
        if not row:
            continue
        if row[0] == "Kernel Name":
            if header is not None:
                yield name, header, rows
            name = row[1] if len(row) > 1 else "?"
            header, rows = None, []
        elif header is None and "Address" in row and "Source" in row:
            header = row
        elif header is not None and len(row) == len(header):
            rows.append(row)
    if header is not None:
        yield name, header, rows


def summarise(name, header, rows, block, top, out):
    i_src = header.index("Source")
    i_smp = header.index("Warp Stall Sampling (All Samples)")
    i_exe = header.index("Instructions Executed")
    smp = [num(r[i_smp]) for r in rows]
    exe = [num(r[i_exe]) for r in rows]
    tot_s, tot_e = sum(smp), sum(exe)
    out.write(f"{name}\n  {len(rows)} instructions, {tot_s} samples, {tot_e} executed\n")
    out.write("  first  samples      %   executed  notable\n")
    for b in range(0, len(rows), block):
        s, e = sum(smp[b:b + block]), sum(exe[b:b + block])
        ops = sorted({opcode(r[i_src]) for r in rows[b:b + block]} & set(NOTABLE))
        pct = 100.0 * s / tot_s if tot_s else 0.0
        out.write(f"  {b:5d} {s:8d} {pct:6.1f} {e:10d}  {' '.join(ops)}\n")
    out.write(f"  the {top} instructions with the most samples:\n")
    best = sorted(range(len(rows)), key=lambda i: -smp[i])[:top]
    for i in sorted(best):
        out.write(f"  {i:5d} {smp[i]:8d} {exe[i]:10d}  {rows[i][i_src].strip()[:90]}\n")


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        sys.stdout.write(__doc__ + "\n")
        return 0 if len(argv) >= 2 else 2
    path, block, top = argv[1], 48, 30
    args = argv[2:]
    while args:
        if args[0] == "--block" and len(args) > 1 and args[1].isdigit() and int(args[1]) > 0:
            block, args = int(args[1]), args[2:]
        elif args[0] == "--top" and len(args) > 1 and args[1].isdigit():
            top, args = int(args[1]), args[2:]
        else:
            sys.stderr.write(f"ncu_src_sum.py: unknown argument {args[0]!r} (see --help)\n")
            return 2
    try:
        raw = open(path, "rb").read()
    except OSError as e:
        sys.stderr.write(f"ncu_src_sum.py: {path}: {e.strerror}\n")
        return 1
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    found = 0
    for name, header, rows in tables(io.StringIO(raw.decode("utf-8", "replace"))):
        need = ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed")
        if not all(h in header for h in need):
            sys.stderr.write(f"ncu_src_sum.py: {path}: no {need} columns for {name}\n")
            return 1
        summarise(name, header, rows, block, top, sys.stdout)
        found += 1
    if not found:
        sys.stderr.write(f"ncu_src_sum.py: {path}: no source table (expected ncu --page source "
                         "--csv --print-source sass)\n")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BrokenPipeError:  # (a pager or head closed the output)
        sys.exit(0)
