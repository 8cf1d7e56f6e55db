#!/usr/bin/env bash
# Session 36's chunked Gated DeltaNet kernel (compute/cuda/deltanet.h, delta_rule_chunked; written
# without a GPU, off unless STRATA_CUDA_CHUNKED_DELTANET=1) checked and timed in ONE device call
# (~5 min):
#   1. the CudaDeltaNet tests (the chunked form against the CPU's chunked form and the CUDA
#      recurrent form, awkward shapes; prepare's decay = expf(decay_log) bitwise);
#   2. compute-sanitizer racecheck and memcheck on the chunked tests;
#   3. the model-level CUDA tests with the flag on (CudaFixture: every prefill logit against
#      transformers; CudaBackend: graph replay, spec windows), so the backend path runs end to end;
#   4. prefill (512-token prompt, 64-row windows) and decode, flag off against on, alternated over
#      ROUNDS rounds on the 48 x 512 mid-qwen4exp file (synthesised if missing), greedy tokens compared.
# From the project root, carrying [".device/cuda-kit"] after scripts/device-stash.sh out:
#   OUT=$OUT scripts/cuda-check-chunked-deltanet.sh
# Outputs under $OUT: build.log, deltanet.log, racecheck.log, memcheck.log, flag-on.log, prefill.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-chunked}
mkdir -p "$out"
source .device/cuda-kit/env.sh
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
ninja -C build-cuda -j 12 cuda_deltanet_test cuda_backend_test bench_cuda_decode >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
model=/root/big.gguf
B=./build-cuda/bench/bench_cuda_decode
[ -f "$model" ] || $B -m "$model" --synth 48:512 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 \
  --tokens 1 --repeats 1 >"$out/synth.txt" 2>&1 &
synth_pid=$!
T=./build-cuda/tests/cuda/cuda_deltanet_test
$T >"$out/deltanet.log" 2>&1
tail -3 "$out/deltanet.log"
grep -E "FAILED|Failure" "$out/deltanet.log" | head -10
compute-sanitizer --tool racecheck $T --gtest_filter='*Chunked*' >"$out/racecheck.log" 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$out/racecheck.log" | tail -3
compute-sanitizer --tool memcheck $T --gtest_filter='*Chunked*' >"$out/memcheck.log" 2>&1
grep -E "ERROR SUMMARY" "$out/memcheck.log" | tail -2
STRATA_CUDA_CHUNKED_DELTANET=1 ctest --test-dir build-cuda -L cuda -R 'CudaFixture|CudaBackend' --output-on-failure \
  >"$out/flag-on.log" 2>&1
grep -E "tests passed|tests failed|Failed" "$out/flag-on.log" | tail -10
wait "$synth_pid"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for flag in 0 1; do
    echo "=== STRATA_CUDA_CHUNKED_DELTANET=$flag, round $r" >>"$out/prefill.txt"
    STRATA_CUDA_CHUNKED_DELTANET=$flag timeout 120 $B -m "$model" --backends cuda --prompt 512 --tokens 32 \
      --repeats 1 >>"$out/prefill.txt" 2>&1
  done
done
grep -E "===|prefill|decode|tok/s" "$out/prefill.txt" | head -60
