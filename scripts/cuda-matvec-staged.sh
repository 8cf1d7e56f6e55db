#!/usr/bin/env bash
# Session 37's staged matvec kernel (compute/cuda/matmul.h MatmulTuning::staging, written without a
# GPU) checked and timed in ONE device call (~5 min; each step has its own timeout):
#   1. build cuda_matmul_test and bench_cuda_matvec in build-cuda (-j 12);
#   2. cuda_matmul_test, all of it: the direct kernel against the CPU for every type, the staged one
#      bitwise against the direct one (CudaMatmulStaged.*: every launch shape, widths 256-8192,
#      T 1-8 and 11, a tall matrix, many matrices, experts and pairs);
#   3. compute-sanitizer racecheck on CudaMatmulStagedRacecheck.* (the stage ring's __syncwarp and
#      cp.async waits, the shared activations' __syncthreads);
#   4. bench_cuda_matvec --compare --sweep, two rounds: direct vs staged (2 stages; 2 stages with the
#      activations in shared memory; 3 stages with them; best rows-per-warp shape) for q8_0, q4_K,
#      iq4_nl, q3_K, iq2_xs at T = 1 and 4 on 8192x16384 and 2560x10240, every staged result checked
#      bitwise against the direct one. The summary tables come last.
# Optional, MUTATE=1 (~3 more minutes): the staged copy broken on purpose (the last 16-byte vector of
# every staged row not copied), rebuilt, CudaMatmulStaged.* must FAIL; the source is restored after.
# From the project root, carrying [".device/cuda-kit"]:
#   OUT=$OUT scripts/cuda-matvec-staged.sh
# matmul.cu takes ~3.5 min to compile; PREBUILT=dir (cuda_matmul_test, bench_cuda_matvec and, for
# MUTATE, cuda_matmul_test.mutated, built where the code is written with the same CUDA 13 and
# sm_90a, carried) skips the build.
# Outputs under $OUT: build.log, matmul_test.log, racecheck.log, compare-1.txt/json, compare-2.txt/json
# (and mutate-build.log, mutate-test.log).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-matvec-staged}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
source .device/cuda-kit/env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1
# -Werror is checked where the code is written (g++ 12); the device's g++ warns where 12 does not.
if [ -n "${PREBUILT:-}" ]; then
  T=$PREBUILT/cuda_matmul_test
  B=$PREBUILT/bench_cuda_matvec
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64:/usr/local/cuda/lib
else
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >"$out/cmake.log" 2>&1 ||
    { tail -20 "$out/cmake.log"; exit 1; }
  ninja -C build-cuda -j 12 cuda_matmul_test bench_cuda_matvec >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  T=./build-cuda/tests/cuda/cuda_matmul_test
  B=./build-cuda/bench/bench_cuda_matvec
fi
stamp "built"

timeout 150 $T >"$out/matmul_test.log" 2>&1
stamp "cuda_matmul_test rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran" "$out/matmul_test.log" | tail -4
grep -E "^\[  FAILED|Failure|differs" "$out/matmul_test.log" | head -12

timeout 90 compute-sanitizer --tool racecheck $T --gtest_filter='CudaMatmulStagedRacecheck.*' >"$out/racecheck.log" 2>&1
stamp "racecheck rc=$?"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|[Hh]azard|PASSED|FAILED" "$out/racecheck.log" | head -8

for r in 1 2; do
  timeout 75 $B --compare --sweep --json "$out/compare-$r.json" >"$out/compare-$r.txt" 2>&1
  stamp "bench round $r rc=$?"
done

if [ "${MUTATE:-0}" = 1 ] && [ -n "${PREBUILT:-}" ]; then
  timeout 120 $PREBUILT/cuda_matmul_test.mutated --gtest_filter='*CudaMatmulStaged.*' >"$out/mutate-test.log" 2>&1
  rc=$?
  stamp "MUTATE: the broken staged copy gives rc=$rc (must be non-zero): $(grep -c '^\[  FAILED' "$out/mutate-test.log") failed lines"
elif [ "${MUTATE:-0}" = 1 ]; then
  file=src/compute/cuda/quant/staging.cuh
  cp "$file" "$out/staging.cuh.orig"
  sed -i 's/if (j < n_vectors)/if (j + 1 < n_vectors)/' "$file"
  if cmp -s "$file" "$out/staging.cuh.orig"; then
    echo "MUTATE: the pattern was not found; nothing broken"
  else
    ninja -C build-cuda -j 12 cuda_matmul_test >"$out/mutate-build.log" 2>&1 &&
      timeout 120 $T --gtest_filter='*CudaMatmulStaged.*' >"$out/mutate-test.log" 2>&1
    rc=$?
    stamp "MUTATE: the broken staged copy gives rc=$rc (must be non-zero): $(grep -c '^\[  FAILED' "$out/mutate-test.log") failed lines"
  fi
  cp "$out/staging.cuh.orig" "$file"
fi

for r in 1 2; do
  echo "=== round $r"
  grep -E "^device|HBM read-only" "$out/compare-$r.txt"
  sed -n '/^GB\/s of weights/,$p' "$out/compare-$r.txt"
done
