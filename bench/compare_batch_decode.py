#!/usr/bin/env python3
"""Before/after of bench_batch_decode binaries, per part of the layer, in alternated rounds.

Runs each binary's `--benchmark_filter=FILTER --benchmark_format=json` once per round, the order
reversed every other round (A B, B A, ...) so that a shared machine's drifting speed lands on both
sides, and prints the medians of the whole step and of every part (the counters util/phase_timer.h
fills) for each window size the filter selects.

  bench/compare_batch_decode.py --rounds 6 \\
      base=/work/wt-batch-base/build/bench/bench_batch_decode new=build/bench/bench_batch_decode

STRATA_BENCH_THREADS (the pool's size, default 2) passes through to the binaries.
"""
import argparse
import json
import statistics
import subprocess
import sys

NOT_PARTS = {"real_time", "cpu_time", "iterations", "tok/s", "repetitions", "repetition_index",
             "threads", "family_index", "per_family_instance_index"}


def run_once(binary, bench_filter):
    proc = subprocess.run([binary, f"--benchmark_filter={bench_filter}", "--benchmark_format=json"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{binary} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["benchmarks"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binaries", nargs="+", help="NAME=PATH of a bench_batch_decode binary")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--filter", default="DecodeTogether/(1|16)/")
    args = parser.parse_args()
    binaries = [b.split("=", 1) for b in args.binaries]
    # results[name][rows][part] = [ms per step, one per round]
    results = {name: {} for name, _ in binaries}
    for r in range(args.rounds):
        for name, path in (binaries if r % 2 == 0 else binaries[::-1]):
            for bm in run_once(path, args.filter):
                rows = bm["name"].split("/")[1]
                parts = results[name].setdefault(rows, {})
                parts.setdefault("step", []).append(bm["real_time"] / 1e6)
                for key, value in bm.items():
                    if isinstance(value, float) and key not in NOT_PARTS:
                        parts.setdefault(key, []).append(value)
        print(f"round {r}: " + ", ".join(
            f"{name} " + " / ".join(f"{rows} rows {parts['step'][-1]:.3f}"
                                    for rows, parts in sorted(results[name].items(),
                                                              key=lambda item: int(item[0])))
            for name, _ in binaries), file=sys.stderr)
    names = [name for name, _ in binaries]
    first = results[names[0]]
    for rows in sorted(first, key=int):
        print(f"\n{rows} rows, medians of {args.rounds} rounds (ms per step)")
        print("part".ljust(26) + "".join(name.rjust(10) for name in names))
        for part in sorted(first[rows], key=lambda p: -statistics.median(first[rows][p])):
            if all(part in results[name].get(rows, {}) for name in names):
                print(part.ljust(26) + "".join(
                    f"{statistics.median(results[name][rows][part]):10.3f}" for name in names))


if __name__ == "__main__":
    main()
