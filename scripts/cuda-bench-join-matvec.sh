#!/usr/bin/env bash
# Session 35 on the GPU box in one device call (~8 min): builds the CUDA tests and benches of the
# working tree, and bench_cuda_matvec of a baseline source tarball beside them; runs the `cuda`
# ctest label while the skewed + correlated 48 x 512 file is written; then
#   1. where the read-ahead branch joins (expert_tier.h): before the next wait (STRATA_TIER_JOIN=wait)
#      against before the next publish (the default, session 33's placement), all in VRAM and
#      at a 25 % GPU budget with self-release off and on, alternated over 3 rounds in separate processes;
#   2. bench_cuda_matvec baseline against the working tree, alternated over 2 rounds (session 35's
#      load changes, reverted unmeasured, are commit 7f7d7ff's src/compute/cuda/quant/*.cuh).
#   git archive BASE CMakeLists.txt cmake src bench scripts | xz > .baseline/src.tar.xz
#   device: OUT=$OUT scripts/cuda-bench-join-matvec.sh .baseline/src.tar.xz
# carrying [".device/cuda-kit", ".baseline"] after scripts/device-stash.sh out.
# Outputs under $OUT: build-*.log, ctest.log, synth.txt, join.txt, matvec.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
base_tar=${1:?usage: scripts/cuda-bench-join-matvec.sh BASE.tar.xz}
out=${OUT:-/tmp/cuda-join-matvec}
mkdir -p "$out"
source .device/cuda-kit/env.sh
base_dir=/root/ab-base
rm -rf "$base_dir" && mkdir -p "$base_dir" && tar xJf "$base_tar" -C "$base_dir"
cmake -S "$base_dir" -B "$base_dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >/dev/null
(ninja -C "$base_dir/build" -j 4 bench_cuda_matvec >"$out/build-base.log" 2>&1; echo $? >"$out/build-base.rc") &
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
targets=$(ninja -C build-cuda -t targets all |
  sed -n 's/^\(cuda_[a-z_]*_test\|bench_cuda_decode\|bench_cuda_matvec\): .*/\1/p' | sort -u)
ninja -C build-cuda -j 12 $targets >"$out/build-new.log" 2>&1 || { tail -40 "$out/build-new.log"; exit 1; }
B=./build-cuda/bench/bench_cuda_decode
skew=/root/skew.gguf
$B -m $skew --synth 48:512:1:0.9 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 --tokens 1 \
  --repeats 1 >"$out/synth.txt" 2>&1 &
synth_pid=$!
ctest --test-dir build-cuda -L cuda --output-on-failure -j 1 >"$out/ctest.log" 2>&1
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tail -20
wait "$synth_pid"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for r in 1 2 3; do
  for join in wait publish; do
    echo "=== join before $join, round $r ($(date +%T))" >>"$out/join.txt"
    export STRATA_TIER_JOIN=$join
    $B -m $skew --backends cuda,cuda@25%,cuda@25%/self --prompt 64 --tokens 64 --repeats 1 >>"$out/join.txt" 2>&1
  done
done
unset STRATA_TIER_JOIN
grep -E "^===|decode .*median|per token \(ms\)|greedy" "$out/join.txt"
wait
[ "$(cat "$out/build-base.rc")" = 0 ] || { tail -20 "$out/build-base.log"; exit 1; }
types=q8_0,q4_0,q4_K,q5_K,q6_K,q3_K,iq4_nl,iq2_xs
for r in 1 2; do
  for which in base new; do
    bin=./build-cuda/bench/bench_cuda_matvec
    [ $which = base ] && bin=$base_dir/build/bench/bench_cuda_matvec
    echo "=== $which round $r ($(date +%T))" >>"$out/matvec.txt"
    $bin --types $types --rows 1,4 >>"$out/matvec.txt" 2>&1
    $bin --types q8_0,q4_K,iq2_xs --rows 1 --n-in 2560 --n-out 10240 >>"$out/matvec.txt" 2>&1
  done
done
grep -E "^===|^(q|iq)" "$out/matvec.txt"
