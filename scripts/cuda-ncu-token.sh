#!/usr/bin/env bash
# ONE device call (~2 min): what each kernel of a replayed decode token costs. Builds
# bench_cuda_decode, writes the 48 x 512 mid-qwen4exp file (IQ2_XS experts) unless it is there,
# and runs Nsight Compute over COUNT consecutive kernels after SKIP (defaults: one decode token,
# past the model load, the prompt and the first recorded windows), each kernel profiled alone
# with warm caches and free clocks; then scripts/ncu-kernel-summary.py sums them by kernel.
# Alone, a kernel also pays its own ramp (~2.5 µs on an H100) that a replayed graph with
# programmatic dependent launch overlaps: compare the busy sum with the replayed token time.
# From the project root, carrying [".device/cuda-kit"]:
#   OUT=$OUT [SKIP=5000] [COUNT=1700] scripts/cuda-ncu-token.sh
# Outputs under $OUT: build.log, ncu.csv (raw, one line per kernel: name, grid, block, duration),
# ncu.err, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-ncu-token}
mkdir -p "$out"
source .device/cuda-kit/env.sh
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >/dev/null
ninja -C build-cuda -j "$(nproc)" bench_cuda_decode >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
B=./build-cuda/bench/bench_cuda_decode
model=/root/mid-48x512.gguf
[ -f "$model" ] || $B -m "$model" --synth 48:512 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 \
  --tokens 1 --repeats 1 >/dev/null 2>&1
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 "$ncu" --clock-control none --cache-control none --graph-profiling node \
  --metrics gpu__time_duration.sum --csv --page raw --launch-skip "${SKIP:-5000}" --launch-count "${COUNT:-1700}" \
  $B -m "$model" --backends cuda --prompt 1 --tokens 5 --repeats 1 >"$out/ncu.csv" 2>"$out/ncu.err"
echo "ncu rc=$?"
python3 scripts/ncu-kernel-summary.py "$out/ncu.csv" | tee "$out/summary.txt" | head -40
