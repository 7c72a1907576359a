#!/usr/bin/env python3
"""ktime_sum.py - summarise tests/ops/gpu_ktime.sh's Nsight Compute CSV (one gpu__time_duration
row per kernel launch, in launch order, mixed with the program's own output).

A decode step starts with the embedding kernel (k_embed), so the launches between two k_embed
launches are one step. Prints each step's kernel count and summed kernel time, then, for the
largest step without the head (the full 4-layer step), the time per kernel name (calls, total,
mean) and the launches in order. Usage: python3 tools/ktime_sum.py ktime_b1.csv [--list]"""
import csv
import re
import sys
from collections import OrderedDict


def short(name):
    """The kernel's name without its parameter list; template arguments kept."""
    depth = 0
    for i, ch in enumerate(name):
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth -= 1
        elif ch == '(' and depth == 0:
            return name[:i]
    return name


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = [l for l in open(sys.argv[1], errors='replace') if l.startswith('"')]
    reader = csv.reader(rows)
    head = next(reader, None)
    if not head or 'Kernel Name' not in head or 'Metric Value' not in head:
        sys.exit('%s: no ncu CSV header (Kernel Name, Metric Value)' % sys.argv[1])
    ki, vi, mi = head.index('Kernel Name'), head.index('Metric Value'), head.index('Metric Name')
    gi = head.index('Grid Size') if 'Grid Size' in head else None
    launches = []
    for r in reader:
        if len(r) <= max(ki, vi) or r[mi] != 'gpu__time_duration.sum':
            continue
        ns = float(re.sub('[^0-9.]', '', r[vi]) or 0)
        launches.append((short(r[ki]), ns / 1000.0, r[gi] if gi is not None else ''))
    steps, cur = [], None
    for l in launches:
        if l[0].startswith('k_embed'):
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append(l)
    print('# %d launches, %d steps (from k_embed to the next)' % (len(launches), len(steps)))
    for i, s in enumerate(steps):
        print('# step %d: %d kernels, %.1f us' % (i, len(s), sum(x[1] for x in s)))
    full = [s for s in steps if not any('head' in x[0] or 'logit' in x[0] for x in s)]
    if not full:
        return
    s = max(full, key=len)
    agg = OrderedDict()
    for name, us, _ in s:
        a = agg.setdefault(name, [0, 0.0])
        a[0] += 1
        a[1] += us
    tot = sum(x[1] for x in s)
    print('# the largest step without the head: %d kernels, %.1f us of kernel time' % (len(s), tot))
    print('%8s %6s %9s %7s  %s' % ('total_us', 'calls', 'mean_us', 'share', 'kernel'))
    for name, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print('%8.1f %6d %9.2f %6.1f%%  %s' % (us, n, us / n, 100 * us / tot, name))
    if '--list' in sys.argv:
        for name, us, grid in s:
            print('%8.2f  %-14s %s' % (us, grid, name))


if __name__ == '__main__':
    main()
