#!/usr/bin/env python3
"""Speculative decoding benchmark: plain vs fixed depth 1/2/3 vs SpecGate, on three kinds of text.

Drives `strata run` (one process per measurement, so every run starts with a cold expert cache
under the same --ram-budget) and prints a Markdown table of decode tok/s (median, min, max over
--repeats runs) with the acceptance and the gate's summary line per configuration.

  bench/spec_bench.py --strata build-spec/strata -m /tmp/strata-default.gguf \
      --ram-budget 25% --repeats 5 -n 128

Kinds of text (prompts chosen for the embedded default model, which continues man pages, Bible
verses, Python and fortunes):
  tool    command/tool output (a man page / listing): repetitive, greedy
  json    JSON chat messages: structured, greedy
  prose   free prose at temperature 0.6 (top-p 0.95), a fixed seed per repeat
"""
import argparse
import re
import statistics
import subprocess
import sys

KINDS = {
    "tool": dict(
        prompt="NAME\n       ls - list directory contents\n\nSYNOPSIS\n       ls [OPTION]... [FILE]...\n\n"
               "DESCRIPTION\n       List information about the FILEs (the current directory by default).\n"
               "       -a, --all\n              do not ignore entries starting with .\n\n"
               "       -A, --almost-all\n              do not list implied . and ..\n\n       -b, --",
        sampling=["--temp", "0"]),
    "json": dict(
        prompt='[{"role": "user", "content": "What is the capital of France?"}, '
               '{"role": "assistant", "content": "The capital of France is Paris."}, '
               '{"role": "user", "content": "And of Spain?"}, '
               '{"role": "assistant", "content": "The capital of Spain is Madrid."}, '
               '{"role": "user", "content": "',
        sampling=["--temp", "0"]),
    "prose": dict(
        prompt="And it came to pass, when the king heard the words of the book of the law, that he",
        sampling=["--temp", "0.6", "--top-p", "0.95"]),
}

CONFIGS = [
    ("plain", ["--spec", "off"]),
    ("fixed 1", ["--spec-gate", "off", "--draft-max", "1"]),
    ("fixed 2", ["--spec-gate", "off", "--draft-max", "2"]),
    ("fixed 3", ["--spec-gate", "off", "--draft-max", "3"]),
    ("SpecGate", ["--spec-gate", "on", "--draft-max", "3"]),
]

TPS = re.compile(r"generated (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s")
SPEC = re.compile(r"strata: (spec:.*)")
HIT = re.compile(r"hit ([\d.]+)%")


def run_once(args, kind, config_args, seed):
    k = KINDS[kind]
    cmd = [args.strata, "run", "-m", args.model, "-p", k["prompt"], "-n", str(args.n_predict),
           "--ignore-eos", "-t", str(args.threads), "--seed", str(seed)] + k["sampling"]
    if args.ram_budget:
        cmd += ["--ram-budget", args.ram_budget]
    if config_args[:2] != ["--spec", "off"]:
        cmd += ["--spec", args.spec]
    cmd += config_args
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    m = TPS.search(out.stderr)
    spec = SPEC.search(out.stderr)
    hits = HIT.findall(out.stderr)
    return float(m.group(3)), (spec.group(1) if spec else ""), (hits[-1] if hits else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default="build-spec/strata")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--ram-budget", default="25%")
    ap.add_argument("--spec", default="both", help="drafters for the speculative rows (mtp|suffix|both)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kinds", default="tool,json,prose")
    args = ap.parse_args()

    print(f"| text | config | tok/s median | min | max | expert hit | spec summary (last run) |")
    print(f"|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        # Interleave configurations per repeat so drift (thermal, page cache) hits all alike.
        results = {name: [] for name, _ in CONFIGS}
        last = {}
        for r in range(args.repeats):
            for name, config_args in CONFIGS:
                tps, spec, hit = run_once(args, kind, config_args, seed=r + 1)
                results[name].append(tps)
                last[name] = (spec, hit)
        for name, _ in CONFIGS:
            v = results[name]
            spec, hit = last[name]
            print(f"| {kind} | {name} | {statistics.median(v):.1f} | {min(v):.1f} | {max(v):.1f} | "
                  f"{hit}% | {spec.replace('|', '/')} |", flush=True)


if __name__ == "__main__":
    main()
