#!/usr/bin/env bash
# ONE device call (~6 min): builds every CUDA test and the decode benchmark, runs the whole `cuda`
# label, then measures decode on the 48 x 512 mid-qwen4exp file (IQ2_XS experts, uniform routing):
# plain tok/s (ROUNDS runs), and one run with STRATA_CUDA_PROFILE=1, which prints the GPU time and
# the number of launches per op of the replayed windows (where a token's time goes; what to fuse).
#   SKIP_LABEL=1   only the benchmark part (the build is reused when the machine is still warm).
# From the project root, carrying [".device/cuda-kit"] after scripts/device-stash.sh out:
#   OUT=$OUT scripts/cuda-label-profile.sh
# Outputs under $OUT: build.log, synth.txt, ctest.log, decode.txt, profile.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-label-profile}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
source .device/cuda-kit/env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
targets=$(ninja -C build-cuda -t targets all | sed -n 's/^\(cuda_[a-z_]*_test\|bench_cuda_decode\): .*/\1/p' | sort -u)
ninja -C build-cuda -j "$(nproc)" $targets >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
stamp "built"
B=./build-cuda/bench/bench_cuda_decode
model=/root/mid-48x512.gguf
synth_pid=
if [ ! -f "$model" ]; then
  $B -m $model --synth 48:512 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 --tokens 1 \
    --repeats 1 >"$out/synth.txt" 2>&1 &
  synth_pid=$!
fi
if [ "${SKIP_LABEL:-0}" != 1 ]; then
  ctest --test-dir build-cuda -L cuda --output-on-failure -j 1 >"$out/ctest.log" 2>&1
  stamp "cuda label rc=$?"; grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tail -20
fi
[ -n "$synth_pid" ] && wait "$synth_pid"
stamp "model ready"
for r in $(seq 1 "${ROUNDS:-3}"); do
  echo "=== round $r ($(date +%T))" >>"$out/decode.txt"
  timeout 90 $B -m $model --backends cuda --prompt 64 --tokens 64 --repeats 1 >>"$out/decode.txt" 2>&1
done
grep -E "^===|^\| cuda" "$out/decode.txt"
STRATA_CUDA_PROFILE=1 STRATA_CUDA_GRAPH_STATS=1 timeout 120 $B -m $model --backends cuda --prompt 8 --tokens 64 \
  --repeats 1 >"$out/profile.txt" 2>&1
stamp "profiled rc=$?"
cat "$out/profile.txt" | tail -60
