#!/usr/bin/env bash
# ONE device call: where a decode token's GPU time goes on a synthetic model, and what switches
# (environment variables) change it. Builds bench_cuda_decode (and bench_cuda_matvec), writes the
# model once, then for each variant prints the GPU time by op of the decode windows
# (STRATA_CUDA_PROFILE=1: events between the ops of an eager capture, so the ops' own times, not
# the replayed token's) and times it in ROUNDS alternated runs (replayed graphs, all in VRAM).
# From the project root, carrying [".device/cuda-kit"]:
#   OUT=$OUT [SYNTH=qwen3.8-flash-next:48:16] [MODEL=/root/flag16.gguf] [ROUNDS=2] \
#     [VARIANTS="default;STRATA_CUDA_IN_BLOCK=0;STRATA_CUDA_STAGED=1"] [BACKENDS="cuda cuda@25%"] \
#     [MATVEC="bench_cuda_matvec args"] scripts/cuda-profile-decode.sh
# A variant is "default" or space-separated VAR=value words; each runs on every backend of
# BACKENDS (space-separated bench_cuda_decode entries, default "cuda": all in VRAM; a budget such as
# cuda@25% profiles the GPU expert tier's windows). MATVEC, when set, runs bench_cuda_matvec with
# those arguments after the decode runs.
# Outputs under $OUT: build.log, profile.txt (one table per variant), decode.txt, matvec.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-profile-decode}
mkdir -p "$out"
source .device/cuda-kit/env.sh
synth=${SYNTH:-qwen3.8-flash-next:48:16}
model=${MODEL:-/root/flag16.gguf}
rounds=${ROUNDS:-2}
IFS=';' read -r -a variants <<<"${VARIANTS:-default}"
read -r -a backends <<<"${BACKENDS:-cuda}"
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >/dev/null
ninja -C build-cuda -j "$(nproc)" bench_cuda_decode bench_cuda_matvec >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
B=./build-cuda/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
decode() {  # backend, variant, extra environment words...
  local b=$1 v=$2
  shift 2
  local words=()
  [ "$v" = default ] || read -r -a words <<<"$v"
  env "${words[@]}" "$@" "$B/bench_cuda_decode" -m "$model" --synth "$synth" --prompt 64 --tokens 64 --repeats 1 \
    --backends "$b" 2>&1
}
decode cuda default >"$out/synth.log"  # writes the model, warms the page cache
for b in "${backends[@]}"; do
  for v in "${variants[@]}"; do
    echo "=== $b, $v" >>"$out/profile.txt"
    decode "$b" "$v" STRATA_CUDA_PROFILE=1 | sed -n '/^profiled windows/,/kernel launches per window/p' >>"$out/profile.txt"
  done
done
for r in $(seq 1 "$rounds"); do
  for b in "${backends[@]}"; do
    for v in "${variants[@]}"; do
      echo "=== $b, $v round $r: $(decode "$b" "$v" | grep -m1 'decode .*median')" >>"$out/decode.txt"
    done
  done
done
cat "$out/decode.txt"
head -30 "$out/profile.txt"
if [ -n "${MATVEC:-}" ]; then
  # shellcheck disable=SC2086  # the arguments split into words on purpose
  "$B/bench_cuda_matvec" $MATVEC >"$out/matvec.txt" 2>&1
  grep -vE "^\s*$" "$out/matvec.txt" | tail -60
fi
