#!/usr/bin/env python3
"""Sums Nsight Compute's gpu__time_duration.sum per kernel name.

Usage: ncu_kernel_sums.py NCU_CSV
Input: `ncu --metrics gpu__time_duration.sum --csv ...` output (any lines before the CSV header
are skipped). Prints per kernel (template arguments and parameter lists kept short): launches,
total microseconds, microseconds a launch, share of the total; sorted by total. Then the kernels
in launch order of the last LAST (env, default 0 = none) launches, to read one step's sequence.
"""
import csv
import os
import re
import sys
from collections import OrderedDict


def short(name: str) -> str:
    name = re.sub(r"\(.*\)$", "", name)  # parameter list
    return name[:110]


def main() -> int:
    path = sys.argv[1]
    with open(path, newline="") as f:
        lines = f.readlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"ncu_kernel_sums: no CSV header in {path}")
        return 1
    rows = list(csv.DictReader(lines[start:]))
    seq = []
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        us = v / 1000.0 if unit.startswith("n") else v * 1000.0 if unit.startswith("m") else v
        seq.append((short(r["Kernel Name"]), us))
    sums = OrderedDict()
    for name, us in seq:
        n, t = sums.get(name, (0, 0.0))
        sums[name] = (n + 1, t + us)
    total = sum(t for _, t in sums.values())
    print(f"{len(seq)} launches, {total:.1f} us in all")
    print(f"{'launches':>8} {'total_us':>10} {'us_each':>9} {'share':>6}  kernel")
    for name, (n, t) in sorted(sums.items(), key=lambda kv: -kv[1][1]):
        print(f"{n:8d} {t:10.1f} {t / n:9.2f} {100 * t / total:5.1f}%  {name}")
    last = int(os.environ.get("LAST", "0"))
    if last:
        print(f"\nthe last {last} launches in order:")
        for name, us in seq[-last:]:
            print(f"{us:9.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
