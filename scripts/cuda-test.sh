#!/usr/bin/env bash
# Builds the CUDA backend with its tests and benchmarks and runs them: the `cuda` ctest label,
# then (unless CUDA_TEST_NO_BENCH=1) bench_cuda_matvec. Meant for the GPU box (device tool), from
# the project root, carrying .device/build (../shared/device/make-kit.sh), where the Debian
# dependencies are unpacked by .device/build/env.sh; elsewhere it uses the system's.
# Outputs: build-cuda/, and with OUT set, $OUT/cuda-test.log and $OUT/matvec.json.
# The CUDA targets link nothing of ICU (the linker drops it), so a slimmer kit without ICU's 31 MB
# data library fits the device's 64 MiB transfer next to the tracked files: .device/cuda-kit/
# (make-kit.sh's deps.tar.xz minus ICU and OpenSSL's loadable modules, recompressed; its
# env.sh unpacks .device/cuda-kit/deps.tar.xz; plus valijson's headers). It is used when present;
# scripts/make-cuda-kit.sh makes it from .device/build.
set -euo pipefail
cd "$(dirname "$0")/.."
for kit in .device/cuda-kit .device/build; do
  if [ -f "$kit/env.sh" ]; then source "$kit/env.sh"; break; fi
done
out=${OUT:-build-cuda}
mkdir -p "$out"
jobs=$(nproc)
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
targets=$(ninja -C build-cuda -t targets all | sed -n 's/^\(cuda_[a-z_]*_test\|bench_cuda_[a-z_]*\): .*/\1/p' | sort -u | tr '\n' ' ')
ninja -C build-cuda -j "$jobs" $targets ${CUDA_TEST_EXTRA_TARGETS:-}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv || true
set -o pipefail
ctest --test-dir build-cuda -L cuda --output-on-failure -j 1 2>&1 | tee "$out/cuda-test.log"
if [ "${CUDA_TEST_NO_BENCH:-0}" != 1 ]; then
  ./build-cuda/bench/bench_cuda_matvec --json "$out/matvec.json" 2>&1 | tee -a "$out/cuda-test.log"
fi
