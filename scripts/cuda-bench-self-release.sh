#!/usr/bin/env bash
# Issue 20, the self-releasing wait (compute/cuda/expert_tier.h), on the GPU box in one device call
# (~9 min): builds every CUDA test and bench_cuda_decode, runs the `cuda` ctest label while the
# skewed + correlated 48 x 512 file (skew 1, correlation 0.9) is written, then alternates all in
# VRAM against 25 % and 10 % budgets with self-release off (the default: every wait hears from
# the host) and on (`/self`), 3 rounds, prompt 64, 64 decode tokens.
# Carry .device/cuda-kit (scripts/make-cuda-kit.sh) after `scripts/device-stash.sh out` here.
# Outputs under $OUT (or /tmp/cuda-self-release): ctest.log, synth.txt, skew.txt.
# STAGE=tests runs only the build, the tests and the synth; STAGE=bench only the comparison (after a
# STAGE=tests call on the same, still warm, machine: the build and /root/skew.gguf are reused), so
# the whole fits two calls of the device tool's 10-minute limit. Default: both.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-self-release}
mkdir -p "$out"
source .device/cuda-kit/env.sh
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
targets=$(ninja -C build-cuda -t targets all | sed -n 's/^\(cuda_[a-z_]*_test\|bench_cuda_decode\): .*/\1/p' | sort -u)
ninja -C build-cuda -j "$(nproc)" $targets >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
B=./build-cuda/bench/bench_cuda_decode
skew=/root/skew.gguf
# Written on the CPU while the tests use the GPU (one CPU token after it: the bench needs a backend).
stage=${STAGE:-all}
if [ "$stage" != bench ]; then
  $B -m $skew --synth 48:512:1:0.9 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 --tokens 1 \
    --repeats 1 >"$out/synth.txt" 2>&1 &
  ctest --test-dir build-cuda -L cuda --output-on-failure -j 1 >"$out/ctest.log" 2>&1
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tail -20
  grep -h "released by the GPU itself" build-cuda/Testing/Temporary/LastTest.log | head -40 >"$out/self-released.txt"
  wait
  grep wrote "$out/synth.txt"
fi
[ "$stage" = tests ] && exit 0
# STAGE=bench on a fresh machine: TEST_REGEX reruns those tests first; the file is written if missing.
if [ -n "${TEST_REGEX:-}" ]; then
  ctest --test-dir build-cuda -R "$TEST_REGEX" --output-on-failure >"$out/ctest-rerun.log" 2>&1
  grep -E "tests passed|tests failed|Failed|\*\*\*|released by the GPU" "$out/ctest-rerun.log" | tail -40
fi
[ -f $skew ] || $B -m $skew --synth 48:512:1:0.9 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 \
  --tokens 1 --repeats 1 >"$out/synth.txt" 2>&1
$B -m $skew --backends "${SELF_RELEASE_BACKENDS:-cuda,cuda@25%,cuda@25%/self,cuda@10%,cuda@10%/self}" --prompt 64 \
  --tokens 64 --repeats 3 >"$out/skew.txt" 2>&1
grep -E "decode|released by|greedy|per token" "$out/skew.txt"
