#!/usr/bin/env bash
# Decode tok/s of `--backend cuda` (eager) next to llama.cpp's CUDA backend on the 48-layer,
# 512-expert qwen4exp file of issue 15, in one call on the GPU box. Starts llama.cpp's
# llama-bench build in the background (its bundled source, .device/peer), builds strata and
# bench_cuda_decode meanwhile, writes the file with `strata synth`, runs bench_cuda_decode (cuda and
# cpu, interleaved, medians), then llama-bench -ngl 99 (tg128, 3 repetitions).
# Needs the full kit (.device/build: its ICU and test tokenizer) and .device/peer; the transfer
# limit (64 MiB) then leaves no room for the model fixtures, so the caller leaves
# tests/data/models and models/*.gguf out of the call (they are not needed here).
# Outputs under $OUT: build.log, synth.log, decode_big.{txt,json}, llama.txt, llbuild.log.
set -uo pipefail
cd "$(dirname "$0")/.."
source .device/build/env.sh
out=${OUT:-/tmp/cuda-bench}
mkdir -p "$out" /root/ll
model=/root/big.gguf
(tar xJf .device/peer/llama-src.tar.xz -C /root/ll && cd /root/ll &&
  cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build build --target llama-bench -j 10 >"$out/llbuild.log" 2>&1; touch /tmp/llama-done) &
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >/dev/null
ninja -C build-cuda -j 6 strata bench_cuda_decode >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
./build-cuda/strata synth --shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 --expert-type iq2_xs \
  --tokenizer .device/build/tok "$model" >"$out/synth.log" 2>&1 || { tail -5 "$out/synth.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
./build-cuda/bench/bench_cuda_decode -m "$model" --prompt 64 --tokens 128 --repeats 3 --backends cuda,cpu \
  --json "$out/decode_big.json" >"$out/decode_big.txt" 2>&1
tail -9 "$out/decode_big.txt"
./build-cuda/strata run --backend cuda -m "$model" -p "The" -n 32 --temp 0 2>&1 | tail -3
while [ ! -f /tmp/llama-done ]; do sleep 3; done
/root/ll/build/bin/llama-bench -m "$model" -ngl 99 -n 128 -p 0 -r 3 >"$out/llama.txt" 2>&1
tail -4 "$out/llama.txt"
