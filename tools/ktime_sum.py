#!/usr/bin/env python3
"""ktime_sum.py - summarise tests/ops/gpu_ktime.sh's Nsight Compute CSV (one gpu__time_duration
row per kernel launch, in launch order, mixed with the program's own output).

A decode step starts with the embedding kernel (k_embed), so the launches between two k_embed
launches are one step. Prints each step's kernel count and summed kernel time, then, for the
largest step without the head (the full 4-layer step), the time per kernel name (calls, total,
mean) and the launches in order. With --vs OTHER.csv: the per-name totals of both files'
largest steps side by side (OTHER first), largest differences first.
Usage: python3 tools/ktime_sum.py ktime_b1.csv [--list] [--vs before.csv]"""
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


def largest_step(path):
    """The launches of path's largest step without the head, or [] (and the step list)."""
    rows = [l for l in open(path, errors='replace') if l.startswith('"')]
    reader = csv.reader(rows)
    head = next(reader, None)
    if not head or 'Kernel Name' not in head or 'Metric Value' not in head:
        sys.exit('%s: no ncu CSV header (Kernel Name, Metric Value)' % path)
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
    full = [s for s in steps if not any('head' in x[0] or 'logit' in x[0] for x in s)]
    return (max(full, key=len) if full else []), steps, len(launches)


def per_name(s):
    agg = OrderedDict()
    for name, us, _ in s:
        a = agg.setdefault(name, [0, 0.0])
        a[0] += 1
        a[1] += us
    return agg


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    s, steps, n = largest_step(sys.argv[1])
    if '--vs' in sys.argv:
        i = sys.argv.index('--vs')
        if i + 1 >= len(sys.argv):
            sys.exit('--vs: want the other CSV')
        o, _, _ = largest_step(sys.argv[i + 1])
        a, b = per_name(o), per_name(s)
        print('# %s: %d kernels, %.1f us; %s: %d kernels, %.1f us' %
              (sys.argv[i + 1], len(o), sum(x[1] for x in o), sys.argv[1], len(s),
               sum(x[1] for x in s)))
        print('%9s %9s %9s  %s' % ('other_us', 'this_us', 'diff', 'kernel'))
        names = sorted(set(a) | set(b),
                       key=lambda k: -abs(b.get(k, [0, 0.0])[1] - a.get(k, [0, 0.0])[1]))
        for k in names:
            x, y = a.get(k, [0, 0.0])[1], b.get(k, [0, 0.0])[1]
            print('%9.1f %9.1f %+9.1f  %s' % (x, y, y - x, k))
        return
    print('# %d launches, %d steps (from k_embed to the next)' % (n, len(steps)))
    for i, st in enumerate(steps):
        print('# step %d: %d kernels, %.1f us' % (i, len(st), sum(x[1] for x in st)))
    if not s:
        return
    agg = per_name(s)
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
