#!/usr/bin/env bash
# Session 37 in ONE device call (~9 min): where did the 25 % tier's speed go? Session 32 (bfe79b6)
# measured 25 % / all in VRAM = 0.83 on the skewed + correlated 48 x 512 file; sessions 35/36
# measured 0.66-0.69 with the tree of their day. This builds bench_cuda_decode of a baseline source
# tarball and of the working tree, then alternates them (ROUNDS rounds, separate processes, the same
# arguments) on one file: all in VRAM and a 25 % GPU budget. Meanwhile it finishes session 36's
# chunked DeltaNet check: memcheck of the chunked tests, the backend tests with the flag on, and
# 512-token prefill flag off vs on.
#   git archive bfe79b6 CMakeLists.txt cmake src bench scripts tests/data/tokenizer | xz > .baseline/src.tar.xz
#   device: OUT=$OUT scripts/cuda-bench-regress.sh .baseline/src.tar.xz
# carrying [".device/cuda-kit", ".baseline"] after scripts/device-stash.sh out.
# Knobs: ROUNDS (3); VARIANTS: space-separated environment settings the working tree's binary runs
# under, one process each per round ("-" for none; default "-"); CHECKS=0 skips the chunked
# DeltaNet steps and the in-process repeats (the A/B alone).
# Outputs under $OUT: build-*.log, synth.txt, memcheck.log, flag-on.log, ab.txt, prefill.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
base_tar=${1:?usage: scripts/cuda-bench-regress.sh BASE.tar.xz}
out=${OUT:-/tmp/cuda-regress}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
source .device/cuda-kit/env.sh
base_dir=/root/ab-base
rm -rf "$base_dir" && mkdir -p "$base_dir" && tar xJf "$base_tar" -C "$base_dir"
cmake -S "$base_dir" -B "$base_dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >"$out/build-base.log" 2>&1
(ninja -C "$base_dir/build" -j 6 bench_cuda_decode >>"$out/build-base.log" 2>&1; echo $? >"$out/build-base.rc") &
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF >/dev/null
checks=${CHECKS:-1}
new_targets="bench_cuda_decode"
[ "$checks" = 1 ] && new_targets="$new_targets cuda_deltanet_test cuda_backend_test"
ninja -C build-cuda -j 10 $new_targets >"$out/build-new.log" 2>&1 ||
  { tail -40 "$out/build-new.log"; exit 1; }
stamp "new build done"
B=./build-cuda/bench/bench_cuda_decode
skew=/root/skew.gguf
$B -m $skew --synth 48:512:1:0.9 --synth-tokenizer tests/data/tokenizer --backends cpu --prompt 1 --tokens 1 \
  --repeats 1 >"$out/synth.txt" 2>&1 &
synth_pid=$!
T=./build-cuda/tests/cuda/cuda_deltanet_test
[ "$checks" = 1 ] && timeout 120 compute-sanitizer --tool memcheck $T --gtest_filter='*Chunked*' >"$out/memcheck.log" 2>&1
stamp "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | tail -3
wait "$synth_pid"
stamp "synth done"
wait
stamp "base build rc=$(cat "$out/build-base.rc")"
[ "$(cat "$out/build-base.rc")" = 0 ] || { tail -20 "$out/build-base.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for r in $(seq 1 "${ROUNDS:-3}"); do
  echo "=== base round $r ($(date +%T))" >>"$out/ab.txt"
  timeout 100 $base_dir/build/bench/bench_cuda_decode -m $skew --backends cuda,cuda@25% --prompt 64 --tokens 64 \
    --repeats 1 >>"$out/ab.txt" 2>&1
  for v in ${VARIANTS:--}; do
    echo "=== new [$v] round $r ($(date +%T))" >>"$out/ab.txt"
    ( [ "$v" != - ] && export "$v"; timeout 100 $B -m $skew --backends cuda,cuda@25% --prompt 64 --tokens 64 \
      --repeats 1 >>"$out/ab.txt" 2>&1 )
  done
done
stamp "a/b done"
grep -E "^===|^\| 25%|read-ahead per token" "$out/ab.txt" | head -80
[ "$checks" = 1 ] || exit 0
# Session 32 measured with --repeats 3 in ONE process: the tier's residency carries over from run
# to run there, where separate processes start it cold each time. Both binaries, that way.
for which in base new; do
  bin=$B
  [ $which = base ] && bin=$base_dir/build/bench/bench_cuda_decode
  echo "=== $which, --repeats 4 in one process ($(date +%T))" >>"$out/repeats.txt"
  timeout 120 $bin -m $skew --backends cuda,cuda@25% --prompt 64 --tokens 64 --repeats 4 >>"$out/repeats.txt" 2>&1
done
stamp "repeats done"
grep -E "^===|run [0-9]|decode .*median|per token \(ms\)" "$out/repeats.txt" | head -60
left() { echo $((${LIMIT:-570} - ($(date +%s) - start))); }
[ "$(left)" -gt 200 ] && STRATA_CUDA_CHUNKED_DELTANET=1 timeout $(($(left) - 60)) ctest --test-dir build-cuda -R 'CudaFixture|CudaBackend' \
  --output-on-failure >"$out/flag-on.log" 2>&1
stamp "flag-on ctest"; grep -E "tests passed|tests failed|Failed" "$out/flag-on.log" | tail -10
for r in 1 2; do
  for flag in 0 1; do
    echo "=== STRATA_CUDA_CHUNKED_DELTANET=$flag, round $r" >>"$out/prefill.txt"
    [ "$(left)" -gt 40 ] || break
    STRATA_CUDA_CHUNKED_DELTANET=$flag timeout 40 $B -m $skew --backends cuda --prompt 512 --tokens 16 \
      --repeats 1 >>"$out/prefill.txt" 2>&1
  done
done
stamp "prefill done"
grep -E "===|prefill|prompt|tok/s|greedy" "$out/prefill.txt" | head -40
