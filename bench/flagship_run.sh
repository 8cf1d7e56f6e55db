#!/usr/bin/env bash
# The flagship at full scale on the CPU (issue 16 item 5; docs/bench-experts.md, "The flagship at full
# scale"): on one qwen3.8-flash-next GGUF, from a cold page cache each time,
#   strata run --ram-budget 25% and 10% (REPEATS cold runs each, interleaved; --profile, --telemetry),
#   strata bench experts --budgets 25%,10% (its read bandwidth with the miss pattern, I/O ceilings),
#   the disk's O_DIRECT read bandwidth for whole experts (bench/flagship_disk_read.py),
#   llama.cpp on the same file (bench/flagship_llama_decode.mjs, 2 threads, LLAMA_N tokens, bounded by
#   LLAMA_TIMEOUT seconds, inside a memory cgroup of LLAMA_LIMIT so an OOM stays inside it).
# Every run goes through bench/flagship_measure.py (drop_caches, stderr timestamps, /proc/PID/io, RSS,
# load average) and leaves OUT/NAME.json.
#
# Usage: bench/flagship_run.sh MODEL.gguf OUT_DIR [STEPS]
#   STEPS: any of run,bench,disk,llama,llama-norepack (default all), comma-separated.
# Environment: STRATA (default /tmp/flagship/strata), THREADS (2), N (40 generated tokens),
#   REPEATS (2), BENCH_N (32), BENCH_REPEATS (2), LLAMA_N (3), LLAMA_TIMEOUT (600), LLAMA_LIMIT (20G).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=$1 out=$2 steps=${3:-run,bench,disk,llama,llama-norepack}
strata=${STRATA:-/tmp/flagship/strata}
threads=${THREADS:-2} n=${N:-40} repeats=${REPEATS:-2}
prompt=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
mkdir -p "$out"
measure() { python3 "$here/flagship_measure.py" "$@"; }
has() { [[ ",$steps," == *",$1,"* ]]; }

if has run; then
  for rep in $(seq 1 "$repeats"); do
    for budget in 25 10; do
      measure --out "$out/run-$budget-$rep.json" -- "$strata" run -m "$model" --tokens "$prompt" -n "$n" \
        --temp 0 --ignore-eos --print-ids -t "$threads" --ram-budget "$budget%" --profile \
        --telemetry "$out/run-$budget-$rep.telemetry.jsonl"
    done
  done
fi
if has bench; then
  measure --out "$out/bench.json" -- "$strata" bench experts -m "$model" --budgets 25%,10% \
    -n "${BENCH_N:-32}" --repeats "${BENCH_REPEATS:-2}" --disk-seconds 20 -t "$threads" \
    --svg "$out/bench.svg" --json "$out/bench-experts.json"
fi
if has disk; then
  python3 "$here/flagship_disk_read.py" "$model" --seconds 20 --json "$out/disk.json"
fi
if has llama; then
  # As shipped: this CPU backend repacks the IQ4_NL ffn_down_exps into anonymous memory at load
  # (21.1 GiB for 48 layers); the cgroup keeps an OOM inside it.
  measure --timeout "${LLAMA_TIMEOUT:-600}" --out "$out/llama.json" -- \
    "$here/run_with_memory_limit.sh" "${LLAMA_LIMIT:-20G}" -- \
    node "$here/flagship_llama_decode.mjs" --model "$model" --tokens 1,2,3,4 --n "${LLAMA_N:-3}" \
    --threads "$threads" --log-level info || true
fi
if has llama-norepack; then
  # llama.cpp's --no-repack (use_extra_bufts = false) through bench/llama_no_repack.c: all weights mmapped.
  so=${LLAMA_NO_REPACK_SO:-/tmp/flagship/llama_no_repack.so}
  measure --timeout "${LLAMA_TIMEOUT:-600}" --out "$out/llama-norepack.json" -- \
    "$here/run_with_memory_limit.sh" "${LLAMA_LIMIT:-20G}" -- \
    env LD_PRELOAD="$so" LLAMA_LIB="${LLAMA_LIB:-$here/../tools/llama_cpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.4.0.so}" node "$here/flagship_llama_decode.mjs" --model "$model" --tokens 1,2,3,4 \
    --n "${LLAMA_N:-3}" --threads "$threads" --log-level info || true
fi
