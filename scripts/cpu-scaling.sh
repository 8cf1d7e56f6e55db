#!/usr/bin/env bash
# CPU decode and 512-token prompt at 1, 2, 4, 8 and 16 threads, per part of the layer, next to
# llama.cpp's CPU backend on the same file (issue 16 item 1), in ONE device call on the H200 box's
# 16 host cores (no GPU used). From the project root:
#   OUT=$OUT scripts/cpu-scaling.sh [MODEL.gguf]
# carrying [".device/build", ".device/peer"] (the strata CLI links ICU, so the full kit; the peer's
# source for llama-bench). The 64 MiB transfer limit then leaves no room for the model fixtures:
# move models/ and tests/data/models out of the working tree for the call (nothing here needs them).
# Steps:
#   1. llama.cpp's llama-bench, a CPU build (GGML_NATIVE, no CUDA), from .device/peer's source in
#      the background (skipped when LLAMA_BENCH names a binary, or without .device/peer);
#   2. strata (CPU only, no tests) in build-cpu/;
#   3. the model, unless given: `strata synth --shape mid-qwen4exp --layers 48 --experts 512
#      --type q8_0 --expert-type iq2_xs` (11.0 GiB, ~14 s on that box) to /root/cpu-scaling.gguf;
#   4. once llama-bench is built (never timed while a build runs; a build still running at
#      LLAMA_WAIT s is stopped and strata runs alone), `strata bench cpu`: REPEATS interleaved
#      rounds of decode (-n DECODE steps after a 16-token prompt) at each of THREADS, the first
#      PROMPT_REPEATS rounds also a PROMPT-token prompt (CHUNK-row windows, 512) at each of PROMPT_THREADS,
#      llama-bench at the same count right after strata's runs (-r 1, its own warm-up), the tables
#      after every round (tok/s and the ratio to llama.cpp, ms per part, pool hand-outs). The bench
#      runs under `timeout` so the call ends by LIMIT s (default 480) with what it has.
# Knobs (environment): THREADS (1,2,4,8,16), PROMPT_THREADS (2,4,8,16: a 1-thread pp512 costs
# ~1 min per engine), PROMPT (512), DECODE (32), REPEATS (3), PROMPT_REPEATS (1), JOBS (build jobs,
# nproc), LLAMA_BENCH (a prebuilt CPU llama-bench: no build), LLAMA_WAIT (240), LIMIT (480),
# BENCH_ARGS (more `bench cpu` options, e.g. --mapped-weights for the weights as file pages).
# Expected wall time there (estimated, not yet run there): ~3 min until the bench starts
# (llama-bench's build the longer, overlapped with strata's build and the synth), then ~3 min for
# round 1 (with the prompts; llama-bench's pp512 warm-up doubles its prompt time) and ~45 s per
# further round: ~7.5 min; LIMIT cuts it at 8 min with the rounds done. docs/bench-cpu-scaling.md.
# Outputs under $OUT: llbuild.log, build.log, synth.log, bench.txt (the tables), bench.json,
# bench.svg (the plot).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .device/build/env.sh ] && source .device/build/env.sh
source scripts/lib/llama-peer.sh
out=${OUT:-/tmp/cpu-scaling}
mkdir -p "$out"
model=${1:-/root/cpu-scaling.gguf}
threads=${THREADS:-1,2,4,8,16}
prompt_threads=${PROMPT_THREADS:-2,4,8,16}
jobs=${JOBS:-$(nproc)}
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|L3)' || true

llama=${LLAMA_BENCH:-}
if [ -z "$llama" ] && [ -f .device/peer/llama-src.tar.xz ]; then
  llama=/root/llcpu/build/bin/llama-bench
  # All cores, beside strata's build and the synth (nothing is timed until both builds are done).
  start_llama_build cpu /root/llcpu /root/llcpu-done "$out/llbuild.log" "$jobs"
  llama_build=$LLAMA_BUILD_PID
  stamp "llama.cpp CPU llama-bench build started"
elif [ -z "$llama" ]; then
  stamp "no .device/peer/llama-src.tar.xz and no LLAMA_BENCH: strata alone"
fi

cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >"$out/build.log" 2>&1 &&
  ninja -C build-cpu -j "$jobs" strata >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
stamp "strata built"
if [ ! -f "$model" ]; then
  tok=()
  [ -d .device/build/tok ] && tok=(--tokenizer .device/build/tok)
  ./build-cpu/strata synth --shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 --expert-type iq2_xs \
    "${tok[@]}" "$model" >"$out/synth.log" 2>&1 || { tail -5 "$out/synth.log"; exit 1; }
  stamp "synth: $(tail -1 "$out/synth.log")"
fi
peer=()
if [ -n "$llama" ]; then
  if [ -z "${LLAMA_BENCH:-}" ]; then
    while [ ! -f /root/llcpu-done ] && [ $(($(date +%s) - start)) -lt "${LLAMA_WAIT:-240}" ]; do sleep 2; done
    if [ ! -f /root/llcpu-done ]; then
      kill -- -"$llama_build" 2>/dev/null  # its own session (setsid): the build's process group
      stamp "llama-bench still building at ${LLAMA_WAIT:-240} s: stopped"
      llama=/nonexistent  # a half-linked binary is no peer
    fi
  fi
  if [ -x "$llama" ]; then
    peer=(--llama-bench "$llama")
    stamp "llama-bench ready: $llama"
  else
    stamp "llama-bench did not build (tail of $out/llbuild.log below): strata alone"
    tail -15 "$out/llbuild.log" 2>/dev/null
  fi
fi
left=$(( ${LIMIT:-480} - ($(date +%s) - start) ))
[ "$left" -lt 60 ] && left=60  # at least one decode round
stamp "bench cpu, ${left} s left"
timeout "$left" ./build-cpu/strata bench cpu -m "$model" --threads "$threads" --prompt-threads "$prompt_threads" \
  --prompt-tokens "${PROMPT:-512}" --chunk "${CHUNK:-512}" -n "${DECODE:-32}" --repeats "${REPEATS:-3}" \
  --prompt-repeats "${PROMPT_REPEATS:-1}" "${peer[@]}" ${BENCH_ARGS:-} --json "$out/bench.json" \
  --svg "$out/bench.svg" 2>&1 | tee "$out/bench.txt"
stamp "done"
