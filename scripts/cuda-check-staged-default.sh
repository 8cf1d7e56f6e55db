#!/usr/bin/env bash
# ONE device call (~7 min): session 38's default for the staged matvec (compute/cuda/matmul.h:
# Q8_0 and Q4_K windows of 1-4 rows, the other staged types 2-4 rows, 3 stages, activations in
# shared memory) through the whole `cuda` label, and end to end against the direct kernel
# (STRATA_CUDA_STAGED=0) in the same binary.
#   1. builds every CUDA test, bench_cuda_decode and bench_cuda_matvec (matmul.cu alone ~3.5 min; see scripts/pending/split-matmul.mbox);
#      writes the skewed + correlated 48 x 512 file meanwhile;
#   2. the whole `cuda` label (the new default everywhere a matvec runs: graph capture, replay,
#      window identity, the fixtures against transformers, the tier);
#   3. decode, all in VRAM and at a 25 % tier, prompt 64, 64 tokens: default against
#      STRATA_CUDA_STAGED=0, ROUNDS rounds, separate processes alternated.
# From the project root, carrying [".device/cuda-kit"] after scripts/device-stash.sh out:
#   OUT=$OUT scripts/cuda-check-staged-default.sh
# Outputs under $OUT: build.log, synth.txt, ctest.log, decode.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-staged-default}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
source .device/cuda-kit/env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
targets=$(ninja -C build-cuda -t targets all | sed -n 's/^\(cuda_[a-z_]*_test\|bench_cuda_decode\|bench_cuda_matvec\): .*/\1/p' | sort -u)
ninja -C build-cuda -j 16 $targets >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
stamp "built"
B=./build-cuda/bench/bench_cuda_decode
skew=/root/skew.gguf
$B -m $skew --synth 48:512:1:0.9 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 --tokens 1 \
  --repeats 1 >"$out/synth.txt" 2>&1 &
synth_pid=$!
ctest --test-dir build-cuda -L cuda --output-on-failure -j 1 >"$out/ctest.log" 2>&1
stamp "cuda label rc=$?"; grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tail -20
wait "$synth_pid"
stamp "synth done"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in - STRATA_CUDA_STAGED=0; do
    echo "=== [$v] round $r ($(date +%T))" >>"$out/decode.txt"
    ( [ "$v" != - ] && export "$v"; timeout 60 $B -m $skew --backends cuda,cuda@25% --prompt 64 --tokens 64 \
      --repeats 1 >>"$out/decode.txt" 2>&1 )
  done
done
stamp "decode a/b done"
grep -E "^===|^\| (all|25%)|greedy" "$out/decode.txt"
