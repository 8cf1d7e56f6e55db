#!/usr/bin/env bash
# Before/after of a CPU change on the GPU box's 16 host cores, in ONE device call (~5 min; no GPU
# used): strata (CPU only, no tests) built from a baseline source tarball and from the working
# tree side by side, the 48 x 512 mid-qwen4exp file written meanwhile, then `strata bench cpu` of
# each binary in alternation, ROUNDS rounds (separate processes), and llama.cpp's llama-bench
# beside the working tree's binary in the last round when LLAMA_BENCH names one or .device/peer is
# carried (a CPU build in the background, waited for before the first timed run: never timed
# while it builds).
#   git archive HEAD~1 CMakeLists.txt cmake src bench scripts tests/CMakeLists.txt | xz > .baseline/src.tar.xz
#   device: OUT=$OUT scripts/cpu-bench-ab.sh .baseline/src.tar.xz
# carrying [".device/build", ".baseline"] (and ".device/peer" for llama.cpp) after
# scripts/device-stash.sh out-hf with models/ moved out (the 64 MiB limit).
# Knobs: AB_AFTER_ENV (one "VAR=value ..." variant of the working tree's binary, run every round),
# MODEL (a GGUF instead of the synthesized file; written with `strata synth AB_SYNTH_ARGS` when it does not
# exist, default "--shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 --expert-type iq2_xs"), AB_KEEP_BASE (1: keep an earlier call's
# baseline build), AB_BUILD_ONLY (1: build both and write the model, no runs), ROUNDS (3), THREADS (8,16), PROMPT_THREADS (16), PROMPT (512), CHUNK (512: the prefill window, both sides alike; llama-bench batches 512), DECODE (32), LIMIT (420).
# Outputs under $OUT: build-*.log, synth.log, base-<r>.txt, new-<r>.txt (each run's tables, with
# the pool's measured hand-out cost), summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
base_tar=${1:?usage: scripts/cpu-bench-ab.sh BASE.tar.xz}
out=${OUT:-/tmp/cpu-bench-ab}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
[ -f .device/build/env.sh ] && source .device/build/env.sh
source scripts/lib/llama-peer.sh
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|L3)' || true
llama=${LLAMA_BENCH:-}
if [ -z "$llama" ] && [ -x /root/llcpu/build/bin/llama-bench ] && [ -f /root/llcpu-done ]; then
  llama=/root/llcpu/build/bin/llama-bench  # built by an earlier call on this (warm) machine
  LLAMA_BENCH=$llama
elif [ -z "$llama" ] && [ -f .device/peer/llama-src.tar.xz ]; then
  llama=/root/llcpu/build/bin/llama-bench
  start_llama_build cpu /root/llcpu /root/llcpu-done "$out/llbuild.log" "$(nproc)"
  stamp "llama.cpp CPU llama-bench build started"
fi
base_dir=/root/cpu-ab-base
# AB_KEEP_BASE=1: an earlier call's baseline build on the same (warm) machine is kept.
if [ "${AB_KEEP_BASE:-0}" != 1 ] || [ ! -x "$base_dir/build/strata" ]; then
  rm -rf "$base_dir" && mkdir -p "$base_dir" && tar xJf "$base_tar" -C "$base_dir"
fi
configure() {  # source dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF -DSTRATA_WERROR=OFF \
    -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF
}
(configure "$base_dir" "$base_dir/build" && ninja -C "$base_dir/build" -j 8 strata) >"$out/build-base.log" 2>&1 &
base_pid=$!
(configure . build-cpu && ninja -C build-cpu -j 8 strata) >"$out/build-new.log" 2>&1 ||
  { tail -30 "$out/build-new.log"; exit 1; }
wait "$base_pid" || { tail -30 "$out/build-base.log"; exit 1; }
stamp "both built"
model=${MODEL:-/root/cpu-scaling.gguf}
if [ ! -f "$model" ]; then
  tok=()
  [ -d .device/build/tok ] && tok=(--tokenizer .device/build/tok)
  read -r -a synth_args <<<"${AB_SYNTH_ARGS:---shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 --expert-type iq2_xs}"
  ./build-cpu/strata synth "${synth_args[@]}" "${tok[@]}" "$model" >"$out/synth.log" 2>&1 || { tail -5 "$out/synth.log"; exit 1; }
  stamp "synth done"
fi
[ "${AB_BUILD_ONLY:-0}" = 1 ] && { stamp "built (AB_BUILD_ONLY)"; exit 0; }
limit=${LIMIT:-420}
if [ -n "$llama" ] && [ -z "${LLAMA_BENCH:-}" ]; then
  while [ ! -f /root/llcpu-done ] && [ $(($(date +%s) - start)) -lt 240 ]; do sleep 2; done
  [ -x "$llama" ] && stamp "llama-bench ready" || { stamp "llama-bench did not build"; tail -5 "$out/llbuild.log"; llama=; }
fi
bench() {  # binary, output file, more `bench cpu` options...
  local bin=$1 file=$2 left=$((limit - ($(date +%s) - start)))
  shift 2
  [ "$left" -lt 30 ] && { stamp "out of time"; return 1; }
  timeout "$left" "$bin" bench cpu -m "$model" --threads "${THREADS:-8,16}" --prompt-threads "${PROMPT_THREADS:-16}" \
    --prompt-tokens "${PROMPT:-512}" --chunk "${CHUNK:-512}" -n "${DECODE:-32}" --repeats 1 "$@" >"$file" 2>&1
}
# AB_AFTER_ENV="VAR=value ...[;VAR=value ...]": each round also runs the working tree's binary under
# each variant's variables (side "env<i>", e.g. STRATA_PHASE_CHAINS=1), between new and base.
IFS=';' read -r -a env_variants <<<"${AB_AFTER_ENV:-}"
sides_a="base new" sides_b="new base"
for i in "${!env_variants[@]}"; do sides_a="base new env$i" sides_b="env$i new base"; done
[ "${#env_variants[@]}" -gt 1 ] && { echo "cpu-bench-ab: AB_AFTER_ENV takes one variant" >&2; exit 2; }
for r in $(seq 1 "${ROUNDS:-3}"); do
  if [ $((r % 2)) = 1 ]; then order=$sides_a; else order=$sides_b; fi
  for side in $order; do
    bin=./build-cpu/strata peer=() vars=()
    [ "$side" = base ] && bin=$base_dir/build/strata
    [ "$side" = env0 ] && read -r -a vars <<<"${env_variants[0]}"
    [ "$side" = new ] && [ "$r" = "${ROUNDS:-3}" ] && [ -n "$llama" ] && peer=(--llama-bench "$llama")
    if [ "${#vars[@]}" -gt 0 ]; then
      (export "${vars[@]}"; bench "$bin" "$out/$side-$r.txt" "${peer[@]}") || break 2
    else
      bench "$bin" "$out/$side-$r.txt" "${peer[@]}" || break 2
    fi
    stamp "round $r $side${vars[*]:+ (${vars[*]})}"
  done
done
{
  echo "== per run: threads, decode tok/s, prompt tok/s (the first table of each run), then the pool's hand-out cost"
  for f in "$out"/base-*.txt "$out"/new-*.txt "$out"/env0-*.txt; do
    [ -f "$f" ] || continue
    echo "--- $(basename "$f")"
    awk '/^\| threads/{t=1; next} t && /^\|---/{next} t && /^\|/{print; next} t{exit}' "$f"
    grep -E "^- (8|16) threads" "$f"
  done
} | tee "$out/summary.txt"
stamp "done"
