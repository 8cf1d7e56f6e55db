#!/usr/bin/env python3
"""Where a decode token's GPU time goes, kernel by kernel, from Nsight Compute's raw CSV.

  ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv --page raw \
      ./build-cuda/bench/bench_cuda_decode ... > ncu.csv
  scripts/ncu-kernel-summary.py ncu.csv [--minus short.csv] [--per N]

ncu runs each kernel alone (no overlap with its neighbours, no dependent launch), so the sum of
durations is the GPU's busy time without launch gaps; the replayed token time minus this sum is
what the gaps and the serial dependencies cost. Prints, per kernel name (template arguments
kept, parameters dropped), the launches, total and mean µs, sorted by total; --per N divides the
totals by N (e.g. the number of decode tokens profiled) to give per-token figures. --minus
subtracts a second profile name by name: profile the same run with T and T + N decode tokens and
the difference over N is one decode token's kernels, without the load, prefill and first windows.
"""
import argparse
import csv
import collections
import re
import sys


def short_name(name):
    name = re.sub(r"\(.*\)$", "", name.strip())  # parameter list
    name = re.sub(r"strata::compute::cuda::(\(anonymous namespace\)::)?", "", name)
    name = re.sub(r"strata::compute::cuda::quant_device::", "", name)
    return name[:110]


def load(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{path}: no CSV rows (did ncu profile anything?)")
    header = rows[0]
    try:
        name_col = header.index("Kernel Name")
        dur_col = header.index("gpu__time_duration.sum")
    except ValueError:
        sys.exit(f"{path}: expected columns 'Kernel Name' and 'gpu__time_duration.sum', found {header[:12]}")
    unit = rows[1][dur_col] if len(rows) > 1 else ""
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}.get(unit)
    data = rows[2:] if scale is not None else rows[1:]
    scale = scale or 1e-3
    total = collections.defaultdict(float)
    count = collections.Counter()
    for r in data:
        try:
            d = float(r[dur_col].replace(",", "")) * scale
        except (ValueError, IndexError):
            continue
        k = short_name(r[name_col])
        total[k] += d
        count[k] += 1
    return total, count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--minus")
    ap.add_argument("--per", type=float, default=1.0)
    a = ap.parse_args()
    total, count = load(a.csv)
    if a.minus:
        t2, c2 = load(a.minus)
        for k in set(t2):
            total[k] -= t2[k]
            count[k] -= c2[k]
        for k in [k for k in total if count[k] <= 0]:
            del total[k]
    all_us = sum(total.values())
    n = sum(count.values())
    print(f"{n} kernels, {all_us / 1e3:.3f} ms busy in all; per {a.per:g}: {n / a.per:.0f} kernels, "
          f"{all_us / a.per / 1e3:.3f} ms")
    print(f"{'kernel':110s} {'launches':>9s} {'µs total':>10s} {'µs mean':>8s} {'share':>6s}")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:45]:
        print(f"{k:110s} {count[k] / a.per:9.1f} {v / a.per:10.1f} {v / count[k]:8.2f} {v / all_us:6.1%}")


if __name__ == "__main__":
    main()
