#!/usr/bin/env bash
# The short probes of docs/bench-cuda.md and docs/bench-cpu-scaling.md ("Session 47") in ONE
# device call (~2 min there): what one dependent GPU step costs (bench_cuda_link, built straight
# with nvcc: no strata libraries needed), and on the box's host CPU how one chunked Gated DeltaNet
# head and a layer's 12 heads run (bench_deltanet_heads: the 16-core prompt's delta rule read as
# if its heads ran one after another) and how far the quantized matvecs are from the host's DRAM
# rate at 1 and 2 threads (bench_matvec; the Xeon's 2-thread decode is at parity with
# llama.cpp). From the project root:
#   OUT=$OUT scripts/kernel-probes.sh
# carrying [".device/build"] (the Debian dependencies: fmt, google benchmark). Without nvcc the
# GPU part is skipped. Knobs: JOBS (build jobs, nproc), SKIP_GPU=1, SKIP_CPU=1.
# Outputs under $OUT: link.txt, heads.txt, matvec.txt, build.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kernel-probes}
mkdir -p "$out"
jobs=${JOBS:-$(nproc)}
export PATH=$PATH:/usr/local/cuda/bin

if [ "${SKIP_GPU:-0}" != 1 ] && command -v nvcc >/dev/null; then
  nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/bench_cuda_link bench/cuda/link_bench.cu &&
    {
      /tmp/bench_cuda_link --blocks 32,66,132
      /tmp/bench_cuda_link --stages 128 --rows 2048 --width 2048 --blocks 66,132
      /tmp/bench_cuda_link --stages 512 --rows 512 --width 512 --blocks 16,32,66
    } >"$out/link.txt" 2>&1
  cat "$out/link.txt"
fi

if [ "${SKIP_CPU:-0}" != 1 ]; then
  [ -f .device/build/env.sh ] && source .device/build/env.sh
  lscpu | grep -E '^(Model name|CPU\(s\)|Flags)' | cut -c1-200
  cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF -DSTRATA_WERROR=OFF \
    -DSTRATA_BUILD_TESTS=OFF >"$out/build.log" 2>&1 &&
    ninja -C build-cpu -j "$jobs" bench_deltanet_heads bench_matvec >>"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; exit 1; }
  timeout 120 build-cpu/bench/bench_deltanet_heads --benchmark_min_time=0.3 >"$out/heads.txt" 2>&1
  grep -E "^BM_" "$out/heads.txt"
  timeout 120 build-cpu/bench/bench_matvec --benchmark_min_time=0.5 \
    --benchmark_filter='BM_DramRead|BM_Matvec/(q8_0|q4_K|iq2_xs)/|BM_MatvecInCache/(q8_0|q4_K|iq2_xs)/' \
    >"$out/matvec.txt" 2>&1
  grep -E "^BM_|quant_kernels" "$out/matvec.txt"
fi
