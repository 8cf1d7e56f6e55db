#!/usr/bin/env python3
"""Before/after speed of two strata binaries, side by side in one run.

Runs `BIN run ...` for each binary in interleaved rounds (A, B, A, B, ...) on the same model and
arguments, reads the prompt and decode tok/s from the summary line `strata run` prints on stderr,
checks that both binaries generated the same token ids, and prints every run and the medians with
the B/A ratio. Interleaving keeps a shared machine's load changes from landing on one side only.

  bench/compare_binaries.py --a OLD/strata --b NEW/strata --rounds 3 -- \\
      -m models/strata-default.gguf --tokens 1,2,3 -n 128 -t 2 --temp 0 --ignore-eos

The arguments after `--` go to `strata run` unchanged (`--print-ids` is added).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

SUMMARY = re.compile(
    r"prompt (\d+) tokens in [\d.]+ s \(([\d.]+) tok/s\); generated (\d+) tokens in [\d.]+ s "
    r"\(([\d.]+) tok/s")


def run_once(binary, args):
    proc = subprocess.run([binary, "run", *args, "--print-ids"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{binary} run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    match = SUMMARY.search(proc.stderr)
    if not match:
        sys.exit(f"{binary}: no 'prompt ... generated ...' summary on stderr:\n{proc.stderr[-2000:]}")
    return float(match.group(2)), float(match.group(4)), proc.stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="the 'before' strata binary")
    parser.add_argument("--b", required=True, help="the 'after' strata binary")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("run_args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = opts.run_args[1:] if opts.run_args[:1] == ["--"] else opts.run_args
    results = {"a": [], "b": []}
    ids = {}
    for r in range(opts.rounds):
        for side in ("a", "b"):
            prompt, decode, out = run_once(getattr(opts, side), args)
            ids.setdefault(side, out)
            if out != ids["a"]:
                sys.exit(f"round {r + 1}: binary {side} generated other ids than binary a")
            results[side].append((prompt, decode))
            print(f"round {r + 1} {side}: prompt {prompt:8.1f} tok/s  decode {decode:8.1f} tok/s  "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    for what, i in (("prompt", 0), ("decode", 1)):
        med = {s: statistics.median(v[i] for v in results[s]) for s in results}
        print(f"median {what}: a {med['a']:.1f}  b {med['b']:.1f} tok/s  b/a {med['b'] / med['a']:.3f}")
    print("generated ids: equal in every run")


if __name__ == "__main__":
    main()
