#!/usr/bin/env bash
# Decode tok/s of `--backend cuda` (window graphs, the default) and its eager path next to
# llama.cpp's CUDA backend on the 48-layer, 512-expert qwen4exp file of issue 15, in one call on
# the GPU box. Starts llama.cpp's llama-bench build in the background (its bundled source,
# .device/peer), builds strata and bench_cuda_decode meanwhile, writes the file with `strata
# synth`, and once llama.cpp is built (so the two never share the host's cores while timed) runs
# bench_cuda_decode (cuda and cuda-eager, interleaved, medians of 3), a 512-token prompt, then
# llama-bench -ngl 99 (pp512 and tg128, 3 repetitions), then a 512-token prompt and a 2200-token one
# (past QSA's selection budget) on both strata paths.
# Needs the full kit (.device/build: its ICU and test tokenizer) and .device/peer; the transfer
# limit (64 MiB) then leaves no room for the model fixtures, so the caller leaves
# tests/data/models and models/*.gguf out of the call (they are not needed here).
# Outputs under $OUT: build.log, synth.log, decode_big.{txt,json}, llama.txt, prompt512.txt,
# long.txt, llbuild.log.
set -uo pipefail
cd "$(dirname "$0")/.."
source .device/build/env.sh
source scripts/lib/llama-peer.sh
out=${OUT:-/tmp/cuda-bench}
mkdir -p "$out" /root/ll
model=/root/big.gguf
start_llama_build cuda /root/ll /tmp/llama-done "$out/llbuild.log" 10
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >/dev/null
ninja -C build-cuda -j 6 strata bench_cuda_decode >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
./build-cuda/strata synth --shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 --expert-type iq2_xs \
  --tokenizer .device/build/tok "$model" >"$out/synth.log" 2>&1 || { tail -5 "$out/synth.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
./build-cuda/strata run --backend cuda -m "$model" -p "The" -n 32 --temp 0 2>&1 | tail -3
while [ ! -f /tmp/llama-done ]; do sleep 3; done
./build-cuda/bench/bench_cuda_decode -m "$model" --prompt 64 --tokens 128 --repeats 3 --backends cuda,cuda-eager \
  --json "$out/decode_big.json" >"$out/decode_big.txt" 2>&1
tail -6 "$out/decode_big.txt"
/root/ll/build/bin/llama-bench -m "$model" -ngl 99 -n 128 -p 512 -r 3 >"$out/llama.txt" 2>&1
tail -5 "$out/llama.txt"
./build-cuda/bench/bench_cuda_decode -m "$model" --prompt 512 --tokens 32 --repeats 3 --backends cuda \
  >"$out/prompt512.txt" 2>&1
tail -4 "$out/prompt512.txt"
# Past QSA's selection budget (2048 tokens) and three KV growths: graphs against the eager path.
STRATA_CUDA_GRAPH_STATS=1 ./build-cuda/bench/bench_cuda_decode -m "$model" --prompt 2200 --tokens 64 --repeats 1 \
  --backends cuda,cuda-eager >"$out/long.txt" 2>&1
grep -E "median|agree|windows \(|rror" "$out/long.txt" | tail -5
