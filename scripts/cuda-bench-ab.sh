#!/usr/bin/env bash
# Before vs after on the GPU box, in one device call: bench_cuda_decode built from a baseline
# source tarball and from the working tree, run alternately on the same model, so the ratio is
# measured side by side (the box is shared and every call may be a fresh machine).
#   git archive BASE_COMMIT CMakeLists.txt cmake src bench scripts | xz > .baseline/src.tar.xz
#   device: OUT=$OUT scripts/cuda-bench-ab.sh .baseline/src.tar.xz [ROUNDS] [BACKENDS]
# carrying [".device/cuda-kit/deps.tar.xz", ".device/cuda-kit/env.sh", ".baseline"].
# With AB_TESTS=1 the working tree's `cuda` ctest label runs too (while the baseline builds).
# With AB_MATVEC=TYPES (e.g. q8_0,iq2_xs) bench_cuda_matvec of both runs too, alternated over the
# same rounds after the decode rounds (windows of 1 and 4 rows on its default 8192 x 16384 shape,
# and 1 row on 2560 x 10240): matvec.txt.
# With AB_AFTER_ENV="VAR=value ..." each round also runs the working tree's binary under those
# variables ("after+env": e.g. STRATA_CUDA_IN_BLOCK=0 to take one change back out without a
# rebuild), so one call separates the changes that have a switch; several variants are separated
# by ';' (e.g. "STRATA_CUDA_EXPERT_SHAPE=0;STRATA_CUDA_EXPERT_PREFETCH=0"), each run every round.
# AB_SYNTH=[SHAPE:]LAYERS:EXPERTS picks the synthetic model (default 48:512, written once to
# AB_MODEL, default /root/big.gguf; e.g. AB_SYNTH=qwen3.8-flash-next:48:16 AB_MODEL=/root/flag16.gguf).
# AB_KEEP_BASE=1 keeps an earlier run's baseline build in the same call (a second model, no rebuild).
# Outputs under $OUT: build-*.log, cuda-test.log, ab.txt (every run's table and the graph
# statistics: nodes captured per window), synth.log.
set -uo pipefail
cd "$(dirname "$0")/.."
base_tar=${1:?usage: scripts/cuda-bench-ab.sh BASE.tar.xz [ROUNDS] [BACKENDS]}
rounds=${2:-3}
backends=${3:-cuda,cuda@50%,cuda@1G}
for kit in .device/cuda-kit .device/build; do
  if [ -f "$kit/env.sh" ]; then source "$kit/env.sh"; break; fi
done
out=${OUT:-/tmp/cuda-bench-ab}
mkdir -p "$out"
model=${AB_MODEL:-/root/big.gguf}
synth=${AB_SYNTH:-48:512}
base_dir=/root/ab-base
if [ "${AB_KEEP_BASE:-0}" != 1 ] || [ ! -d "$base_dir/build" ]; then
  rm -rf "$base_dir" && mkdir -p "$base_dir" && tar xJf "$base_tar" -C "$base_dir"
fi
configure() {  # source dir, build dir, tests ON|OFF
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
    -DSTRATA_BUILD_TESTS="$3" >/dev/null
}
configure "$base_dir" "$base_dir/build" OFF
base_targets=bench_cuda_decode
[ -n "${AB_MATVEC:-}" ] && base_targets="$base_targets bench_cuda_matvec"
(ninja -C "$base_dir/build" -j 6 $base_targets >"$out/build-base.log" 2>&1; echo $? >"$out/build-base.rc") &
base_pid=$!
configure . build-cuda "$([ "${AB_TESTS:-0}" = 1 ] && echo ON || echo OFF)"
targets=bench_cuda_decode
[ -n "${AB_MATVEC:-}" ] && targets="$targets bench_cuda_matvec"
[ "${AB_TESTS:-0}" = 1 ] &&
  targets="$targets $(ninja -C build-cuda -t targets all | sed -n 's/^\(cuda_[a-z_]*_test\): .*/\1/p' | sort -u | tr '\n' ' ')"
ninja -C build-cuda -j 10 $targets >"$out/build-new.log" 2>&1 || { tail -40 "$out/build-new.log"; exit 1; }
if [ "${AB_TESTS:-0}" = 1 ]; then
  ctest --test-dir build-cuda -L cuda --output-on-failure -j 1 >"$out/cuda-test.log" 2>&1
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/cuda-test.log" | tail -15
fi
wait "$base_pid"
[ "$(cat "$out/build-base.rc")" = 0 ] || { tail -40 "$out/build-base.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
run() {  # label command... (the binary last, e.g. env VAR=value binary)
  echo "=== $1 ($(date +%T))" >>"$out/ab.txt"
  shift
  STRATA_CUDA_GRAPH_STATS=1 "$@" -m "$model" --synth "$synth" --prompt 64 --tokens 64 --repeats 1 \
    --backends "$backends" >>"$out/ab.txt" 2>&1
}
run synth-and-warm ./build-cuda/bench/bench_cuda_decode
for r in $(seq 1 "$rounds"); do
  run "after round $r" ./build-cuda/bench/bench_cuda_decode
  if [ -n "${AB_AFTER_ENV:-}" ]; then
    IFS=';' read -r -a after_envs <<<"$AB_AFTER_ENV"
    for words in "${after_envs[@]}"; do
      # shellcheck disable=SC2086  # the variables split into words on purpose
      run "after+env ($words) round $r" env $words ./build-cuda/bench/bench_cuda_decode
    done
  fi
  run "before round $r" "$base_dir/build/bench/bench_cuda_decode"
done
grep -E "^===|tok/s|nodes captured" "$out/ab.txt" | head -120
[ -n "${AB_MATVEC:-}" ] || exit 0
for r in $(seq 1 "$rounds"); do
  for which in after before; do
    bin=./build-cuda/bench/bench_cuda_matvec
    [ $which = before ] && bin=$base_dir/build/bench/bench_cuda_matvec
    echo "=== matvec $which round $r ($(date +%T))" >>"$out/matvec.txt"
    "$bin" --types "$AB_MATVEC" --rows 1,4 >>"$out/matvec.txt" 2>&1
    "$bin" --types "$AB_MATVEC" --rows 1 --n-in 2560 --n-out 10240 >>"$out/matvec.txt" 2>&1
  done
done
grep -E "^===|^(q|iq)" "$out/matvec.txt"
