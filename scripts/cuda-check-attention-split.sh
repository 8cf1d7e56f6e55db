#!/usr/bin/env bash
# ONE device call (~7 min): the split (flash-decoding) attention (opt-in, STRATA_CUDA_ATTENTION=split)
# and the read-ahead kernel without the job-header read, each against the form before it in the
# same binary.
#   1. builds every CUDA test and bench_cuda_decode; writes the skewed + correlated 48 x 512 file
#      meanwhile;
#   2. the attention test (both forms against the CPU; rows alone, wider launch bounds and the
#      split form's single-split rows bitwise), then the whole `cuda` label with the split form on
#      (STRATA_CUDA_ATTENTION=split: the condition for making it the default);
#   3. the 25 % tier: default against STRATA_TIER_RA_PENDING=1 (read-ahead kernels handed the
#      pending rows, so every block reads the job header's has_row across PCIe, as before),
#      ROUNDS rounds, separate processes, prompt 64;
#   4. decode after a PROMPTS-token prompt, STRATA_CUDA_ATTENTION=split against the default form.
# From the project root, carrying [".device/cuda-kit"] after scripts/device-stash.sh out:
#   OUT=$OUT scripts/cuda-check-attention-split.sh
# Outputs under $OUT: build.log, synth.txt, attention.log, ctest-split.log, tier.txt, context.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-attention-split}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
source .device/cuda-kit/env.sh
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
targets=$(ninja -C build-cuda -t targets all | sed -n 's/^\(cuda_[a-z_]*_test\|bench_cuda_decode\): .*/\1/p' | sort -u)
ninja -C build-cuda -j 16 $targets >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
stamp "built"
B=./build-cuda/bench/bench_cuda_decode
skew=/root/skew.gguf
$B -m $skew --synth 48:512:1:0.9 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 --tokens 1 \
  --repeats 1 >"$out/synth.txt" 2>&1 &
synth_pid=$!
./build-cuda/tests/cuda/cuda_attention_test >"$out/attention.log" 2>&1
stamp "attention test rc=$?"; grep -E "\[ cuda \]|PASSED|FAILED|Failure" "$out/attention.log" | head -30
STRATA_CUDA_ATTENTION=split ctest --test-dir build-cuda -L cuda --output-on-failure -j 1 >"$out/ctest-split.log" 2>&1
stamp "cuda label with the split form rc=$?"; grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest-split.log" | tail -20
wait "$synth_pid"
stamp "synth done"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in - STRATA_TIER_RA_PENDING=1; do
    echo "=== [$v] round $r ($(date +%T))" >>"$out/tier.txt"
    ( [ "$v" != - ] && export "$v"; timeout 60 $B -m $skew --backends cuda,cuda@25% --prompt 64 --tokens 64 \
      --repeats 1 >>"$out/tier.txt" 2>&1 )
  done
done
stamp "tier a/b done"
grep -E "^===|^\| (all|25%)|read-ahead per token" "$out/tier.txt"
for p in ${PROMPTS:-1024}; do
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in - STRATA_CUDA_ATTENTION=split; do
      echo "=== prompt $p [$v] round $r ($(date +%T))" >>"$out/context.txt"
      ( [ "$v" != - ] && export "$v"; timeout 60 $B -m $skew --backends cuda --prompt "$p" --tokens 32 --repeats 1 \
        >>"$out/context.txt" 2>&1 )
    done
  done
done
stamp "context a/b done"
grep -E "^===|^cuda +decode|greedy" "$out/context.txt"
