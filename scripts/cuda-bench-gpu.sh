#!/usr/bin/env bash
# `strata bench gpu` next to llama.cpp's CUDA backend on the 48-layer, 512-expert qwen4exp file of
# issues 15/20, on the GPU box, in two device calls (a call is limited to 10 minutes; the machine
# stays warm ~30 s between calls, so make the second at once):
#   scripts/cuda-bench-gpu.sh build   starts llama.cpp's llama-bench build in the background (its
#                                     bundled source, .device/peer; ~6 min), builds strata, the CUDA
#                                     tests and bench_cuda_decode, runs the `cuda` ctest label and
#                                     writes the model with `strata synth`
#   scripts/cuda-bench-gpu.sh bench   waits for llama-bench, then runs `strata bench gpu` at
#                                     all / 50 % / 25 % / 1 GiB (each also without read-ahead) and
#                                     llama-bench -ngl 99 / -ncmoe K at the same VRAM use
# Carry [".device/build", ".device/cuda-kit/deps.tar.xz", ".device/peer"] (the full kit: the
# strata CLI links ICU; the slim kit only for valijson's headers); the 64 MiB transfer limit then
# leaves no room for the model fixtures, so the caller moves models/ and tests/data/models out of
# the working tree for the call (the fixture tests then skip or fail: this script does not run
# them; scripts/cuda-test.sh does).
# Outputs under $OUT: llbuild.log, build.log, cuda-test.log, synth.log, gpu.txt, gpu.json, gpu.svg.
set -uo pipefail
cd "$(dirname "$0")/.."
source .device/build/env.sh
source scripts/lib/llama-peer.sh
[ -d /opt/deps/usr/include/valijson ] || tar xJf .device/cuda-kit/deps.tar.xz -C /opt/deps usr/include/valijson
out=${OUT:-/tmp/cuda-bench-gpu}
mkdir -p "$out"
model=/root/big.gguf
case "${1:-}" in
  build)
    start_llama_build cuda /root/ll /root/llama-done /root/llbuild.log 10
    cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
    targets=$(ninja -C build-cuda -t targets all | sed -n 's/^\(cuda_[a-z_]*_test\|bench_cuda_[a-z_]*\): .*/\1/p' |
      sort -u | tr '\n' ' ')
    ninja -C build-cuda -j 6 strata $targets >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    ctest --test-dir build-cuda -L cuda -j 1 2>&1 | tee "$out/cuda-test.log" | tail -4
    ./build-cuda/strata synth --shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 --expert-type iq2_xs \
      --tokenizer .device/build/tok "$model" >"$out/synth.log" 2>&1 || { tail -5 "$out/synth.log"; exit 1; }
    ls -la "$model"
    ;;
  bench)
    while [ ! -f /root/llama-done ]; do sleep 2; done
    cp /root/llbuild.log "$out/llbuild.log"
    [ -x /root/ll/build/bin/llama-bench ] || { tail -20 "$out/llbuild.log"; exit 1; }
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
    ./build-cuda/strata bench gpu -m "$model" --budgets all,50%,25%,1G --no-read-ahead-too --prompt-tokens 64 -n 64 \
      --repeats 3 --llama-bench /root/ll/build/bin/llama-bench --llama-repeats 3 --svg "$out/gpu.svg" \
      --json "$out/gpu.json" 2>&1 | tee "$out/gpu.txt" | tail -30
    ;;
  *)
    echo "usage: scripts/cuda-bench-gpu.sh build|bench" >&2
    exit 2
    ;;
esac
