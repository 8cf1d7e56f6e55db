#!/usr/bin/env python3
"""Prompt and decode speed of strata (before and after) and llama.cpp on the same GGUF, one run.

For each model, each round runs `BEFORE run`, `AFTER run` and llama.cpp (node-llama-cpp 3.21.1's
prebuilt CPU libllama, tools/llama_cpp/decode_speed.mjs; scripts/install-llama-cpp-peer.sh) in turn,
so a shared machine's load changes land on every side alike, each round in the next of the sides'
orders (all 6 permutations in turn; 2 with --no-llama): on the 2-vCPU build VM a strata run right
after the other strata binary's read its prompt 1.1-1.3x faster than one that ran first or right
after llama.cpp (session 41), so the fixed order this script had (before, after, llama.cpp)
favoured `after`. Use a multiple of 6 rounds (2 with --no-llama) for every order equally often. Every run gets the same prompt of
--prompt-tokens ids ((i·7919 + 13) mod --vocab, no tokenizer involved), --threads threads, the
whole prompt as one window (strata --chunk = prompt length; llama.cpp one batch), then -n greedy
decode steps. strata's prompt and decode tok/s come from the summary line `strata run` prints on
stderr; llama.cpp's prompt tok/s is prompt tokens / prompt_ms and its decode tok/s is its own. The
two strata binaries must generate the same ids (checked every round). Prints every run, then a
table of medians and the after/llama.cpp ratios.

  bench/prompt_side_by_side.py --before OLD/strata --after build/strata --rounds 6 \\
      /tmp/q4k.gguf /tmp/iq2xs.gguf

STRATA_QUANT_MAX in the environment (e.g. avx2) caps both strata binaries' kernel level.
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA = os.path.join(HERE, "..", "tools", "llama_cpp", "decode_speed.mjs")
sys.path.insert(0, HERE)
from compare_binaries import run_once  # noqa: E402  (one parser of `strata run`'s summary line)


def run_strata(binary, model, ids, opts):
    return run_once(binary, ["-m", model, "--tokens", ",".join(map(str, ids)), "-n", str(opts.n),
                             "--threads", str(opts.threads), "--chunk", str(len(ids)), "--temp", "0",
                             "--ignore-eos"])


def run_llama(model, ids, opts):
    args = ["node", LLAMA, "--model", model, "--tokens", ",".join(map(str, ids)), "--n", str(opts.n),
            "--threads", str(opts.threads), "--repeats", "1"]
    proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        sys.exit(f"llama.cpp failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    repeat = result["repeats"][0]
    return len(ids) / (repeat["prompt_ms"] / 1e3), repeat["tok_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the 'before' strata binary")
    parser.add_argument("--after", required=True, help="the 'after' strata binary")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=3007, help="ids are taken mod this")
    parser.add_argument("-n", type=int, default=32, help="greedy decode steps after the prompt")
    parser.add_argument("--no-llama", action="store_true", help="strata before/after only")
    parser.add_argument("models", nargs="+")
    opts = parser.parse_args()
    ids = [(i * 7919 + 13) % opts.vocab for i in range(opts.prompt_tokens)]
    sides = ["before", "after"] + ([] if opts.no_llama else ["llama.cpp"])
    table = []
    for model in opts.models:
        results = {s: [] for s in sides}
        strata_ids = None
        orders = list(itertools.permutations(sides))
        for r in range(opts.rounds):
            for side in orders[r % len(orders)]:
                if side == "llama.cpp":
                    prompt, decode = run_llama(model, ids, opts)
                else:
                    prompt, decode, out = run_strata(getattr(opts, side), model, ids, opts)
                    strata_ids = strata_ids or out
                    if out != strata_ids:
                        sys.exit(f"{model} round {r + 1}: {side} generated other ids than before")
                results[side].append((prompt, decode))
                print(f"{os.path.basename(model)} round {r + 1} {side:9}: prompt {prompt:7.1f} tok/s  "
                      f"decode {decode:6.1f} tok/s  (load {os.getloadavg()[0]:.1f})", flush=True)
        med = {s: [statistics.median(v[i] for v in results[s]) for i in (0, 1)] for s in sides}
        table.append((os.path.basename(model), med))
    print(f"\nmedians of {opts.rounds} rounds, {opts.prompt_tokens}-token prompt, {opts.threads} "
          f"threads, {opts.n} decode steps; STRATA_QUANT_MAX={os.environ.get('STRATA_QUANT_MAX', '')}"
          " (tok/s)")
    head = "| model | what | strata before | strata after | after/before |"
    head += "" if opts.no_llama else " llama.cpp | after/llama.cpp |"
    print(head)
    print("|---|---|---:|---:|---:|" + ("" if opts.no_llama else "---:|---:|"))
    for name, med in table:
        for i, what in enumerate(("prompt", "decode")):
            b, a = med["before"][i], med["after"][i]
            row = f"| {name} | {what} | {b:.1f} | {a:.1f} | {a / b:.2f}x |"
            if not opts.no_llama:
                l = med["llama.cpp"][i]
                row += f" {l:.1f} | {a / l:.2f}x |"
            print(row)
    print("strata generated ids: before and after equal in every round")


if __name__ == "__main__":
    main()
