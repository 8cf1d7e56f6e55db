#!/usr/bin/env bash
# Builds strata and runs every test, the way CI does:
#   1. Release build + full ctest suite
#   2. ASan+UBSan build + full ctest suite
#   3. clang-14 build of everything (library, binary, tests, fuzz targets) with warnings as errors
#      (the second compiler: g++ 12 builds steps 1 and 2), then a libFuzzer run of every fuzz target
#      from that build for a bounded time (FUZZ_SECONDS, default 60 in total); its tests are
#      compiled only (they run in steps 1 and 2)
# The CUDA backend is OFF here (CI has no GPU); scripts/cuda-test.sh builds and runs it on the GPU box.
# First, where npm exists, it installs the llama.cpp peer the parity test drives
# (scripts/install-llama-cpp-peer.sh; without npm that test reports itself skipped).
# Exits non-zero on any failure. Set STRATA_TEST_QUICK=1 to run only step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fuzz_seconds=${FUZZ_SECONDS:-60}

if command -v npm >/dev/null; then
  echo "== llama.cpp peer (node-llama-cpp@3.21.1, prebuilt) for the parity test"
  [ -d tools/llama_cpp/node_modules/@node-llama-cpp/linux-x64/bins ] || scripts/install-llama-cpp-peer.sh
fi

echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" -LE slow

[ "${STRATA_TEST_QUICK:-0}" = 1 ] && exit 0

echo "== ASan+UBSan build + tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=ON \
  -DSTRATA_BUILD_BENCH=OFF -DSTRATA_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE slow

echo "== clang-14 build, warnings as errors (library, binary, tests, fuzz targets)"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTRATA_FUZZ=ON -DSTRATA_FUZZ_BUILD_TESTS=ON -DSTRATA_WERROR=ON -DSTRATA_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$jobs"

echo "== fuzz (${fuzz_seconds}s in total)"
scripts/fuzz.sh "$fuzz_seconds"
