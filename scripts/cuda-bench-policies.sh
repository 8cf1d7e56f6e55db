#!/usr/bin/env bash
# Issue 20 items 4-5 and two rows of its target table on the GPU box, in one device call (~8 min):
#   1. the policies on the GPU arena through the CLI: a first `strata run` under --gpu-budget 25 %
#      with --usage (the history counts the GPU windows) and --pin-hot, then a second run whose
#      GPU arena is filled from that history at start; each prints its "gpu experts:" line;
#   2. SpecGate on the GPU path: MTP speculative decoding on the default model, tier of 2 slots per
#      layer, gate on (T(n) measured on the GPU path, handshake waits included) — the spec summary;
#   3. the flagship shape with 16 experts per layer (issue 20's 89.6 tok/s llama.cpp anchor): all in
#      VRAM and at 25 %;
#   4. skewed + correlated routing (48 x 512, skew 1, correlation 0.9): 25 % against all in VRAM
#      (target: >= 90 %);
#   5. time to first token after 60 s idle against hot (item 5: does a warm-up pay?).
# Usage: scripts/cuda-bench-policies.sh [policies] [spec] [flagship] [skew] [idle]  (none: all five)
# Needs build-cuda/ with strata and bench_cuda_decode built (carry .device/build: the CLI links ICU).
# Outputs under $OUT (or /tmp/cuda-bench-policies): policies.log, spec.log, flagship16.txt, skew.txt, idle.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-bench-policies}
mkdir -p "$out"
S=./build-cuda/strata
B=./build-cuda/bench/bench_cuda_decode
tok=tests/data/tokenizer
big=/root/big.gguf
parts=" ${*:-policies spec flagship skew idle} "
want() { [[ "$parts" == *" $1 "* ]]; }
if { want policies || want idle; } && [ ! -f $big ]; then
  $S synth --shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 --expert-type iq2_xs --tokenizer $tok $big \
    >/dev/null 2>&1
fi
prompt="In the beginning God created the heaven and the earth. And the earth was without form, and void."
want policies && {
  rm -f /root/big.usage
  for run in 1 2; do
    echo "== run $run (--usage /root/big.usage --pin-hot 4 --gpu-budget 25%)"
    $S run -m $big --backend cuda --gpu-budget 25% --usage /root/big.usage --pin-hot 4 -p "$prompt" -n 64 --temp 0 \
      2>&1 >/dev/null | grep -E "gpu experts|usage history|generated|prompt-hot|error"
  done
} 2>&1 | tee "$out/policies.log"
want spec && {
  for gate in on off; do
    echo "== spec mtp, gate $gate, 2 GPU slots per layer"
    $S run -m models/strata-default.gguf --backend cuda --gpu-slots-per-layer 2 --spec mtp --spec-gate $gate \
      -p "And God said" -n 96 --temp 0 2>&1 >/dev/null | grep -E "spec|generated|gpu experts|error"
  done
} 2>&1 | tee "$out/spec.log"
want flagship && $B -m /root/flag16.gguf --synth qwen3.8-flash-next:48:16 --synth-tokenizer $tok --backends cuda,cuda@25% \
  --prompt 64 --tokens 64 --repeats 3 2>&1 | tee "$out/flagship16.txt" | grep -E "^\||wrote|greedy|decode"
rm -f /root/flag16.gguf
want skew && $B -m /root/skew.gguf --synth 48:512:1:0.9 --synth-tokenizer $tok --backends cuda,cuda@25% \
  --prompt 64 --tokens 64 --repeats 3 2>&1 | tee "$out/skew.txt" | grep -E "^\||wrote|greedy|decode"
rm -f /root/skew.gguf
want idle && $B -m $big --backends cuda@50% --prompt 64 --tokens 8 --repeats 1 --idle-ttft 60 2>&1 | tee "$out/idle.txt" |
  grep -E "TTFT"
