#!/usr/bin/env bash
# The full Qwen3.8-Flash-Next shape (48 layers x 512 experts, IQ2_XS experts, the 248,320-token
# head, skewed + correlated routing) and the 48 x 512 mid file next to llama.cpp's CUDA backend, on
# the GPU box, in one device call (`all`, ~9-10 min: the llama.cpp build is the long pole) or two
# made back to back (the machine stays warm ~30 s between them):
#   scripts/cuda-bench-flagship.sh prepare   in the background (setsid, so they outlive the call):
#                                            llama.cpp's CUDA llama-bench (.device/peer, ~6 min),
#                                            strata + bench_cuda_decode with CUDA, a 248,320-token
#                                            tokenizer (bench/make_flagship_tokenizer.py: llama.cpp
#                                            refuses a GGUF without one) and the flagship file
#                                            (`strata synth`, ~1 min, to FLAG, default /dev/shm: the
#                                            disk's 64 GiB do not hold it beside the mid file);
#                                            returns at once. The mid file is MID (default
#                                            /root/cpu-scaling.gguf, written by scripts/cpu-bench-ab.sh
#                                            or cpu-scaling.sh), written here if missing.
#   scripts/cuda-bench-flagship.sh bench     waits for all of it, then: the flagship through
#                                            `strata bench gpu` at all in VRAM and a 16 GiB GPU
#                                            budget, then llama-bench -ngl 99 and -ncmoe K at the
#                                            same VRAM use; the mid file through
#                                            bench_cuda_decode (graphs and eager, 3 rounds) and
#                                            llama-bench -ngl 99 (tg128, pp512, 3 repetitions; its
#                                            stderr kept).
#   scripts/cuda-bench-flagship.sh all       both in one call.
# Carry [".device/build", ".device/cuda-kit/deps.tar.xz", ".device/peer"] after
# `scripts/device-stash.sh out-hf` with models/ moved out (the 64 MiB limit).
# Outputs under $OUT: prepare.txt, flag-all.{txt,json}, flag-16G.{txt,json}, mid.txt, llama-mid.txt (and the
# build logs when a build fails).
set -uo pipefail
cd "$(dirname "$0")/.."
source .device/build/env.sh
source scripts/lib/llama-peer.sh
[ -d /opt/deps/usr/include/valijson ] || tar xJf .device/cuda-kit/deps.tar.xz -C /opt/deps usr/include/valijson
out=${OUT:-/tmp/cuda-bench-flagship}
mkdir -p "$out"
flag=${FLAG:-/dev/shm/flag.gguf}
mid=${MID:-/root/cpu-scaling.gguf}
state=/root/flagship-bench
case "${1:-}" in
  prepare)
    rm -rf "$state" && mkdir -p "$state"
    start_llama_build cuda /root/ll $state/llama-done $state/llbuild.log 12
    setsid bash -c "cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
        -DSTRATA_BUILD_TESTS=OFF >$state/build.log 2>&1 &&
      ninja -C build-cuda -j 5 strata bench_cuda_decode >>$state/build.log 2>&1; echo \$? >$state/strata-rc
      python3 bench/make_flagship_tokenizer.py /root/flagtok >$state/synth.log 2>&1
      [ -f $flag ] || ./build-cuda/strata synth --shape qwen3.8-flash-next --type q8_0 --expert-type iq2_xs \
        --routing-skew 1 --routing-correlation 0.9 --tokenizer /root/flagtok $flag >>$state/synth.log 2>&1
      [ -f $mid ] || ./build-cuda/strata synth --shape mid-qwen4exp --layers 48 --experts 512 --type q8_0 \
        --expert-type iq2_xs --tokenizer .device/build/tok $mid >>$state/synth.log 2>&1
      touch $state/files-done" </dev/null >/dev/null 2>&1 &
    sleep 2
    df -h /dev/shm /root | tail -2 | tee "$out/prepare.txt"
    ;;
  bench)
    start=$(date +%s)
    while [ ! -f $state/files-done ] || [ ! -f $state/llama-done ]; do sleep 2; done
    echo "waited $(($(date +%s) - start)) s for the builds and files" | tee "$out/prepare.txt"
    [ "$(cat $state/strata-rc)" = 0 ] || { cp $state/build.log "$out/"; tail -20 $state/build.log; exit 1; }
    [ -x /root/ll/build/bin/llama-bench ] || { cp $state/llbuild.log "$out/"; tail -20 $state/llbuild.log; exit 1; }
    tail -3 $state/synth.log | tee -a "$out/prepare.txt"
    ls -la "$flag" "$mid" | tee -a "$out/prepare.txt"
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$out/prepare.txt"
    # One process per budget: each entry of `bench gpu` holds its own device copy of the model, and
    # the two (48.4 + 21 GiB) would leave an 80 GiB H100 little room.
    for budget in all 16G; do
      ./build-cuda/strata bench gpu -m "$flag" --budgets $budget --prompt-tokens 64 -n 64 --repeats 2 \
        --llama-bench /root/ll/build/bin/llama-bench --llama-repeats 2 --json "$out/flag-$budget.json" \
        >"$out/flag-$budget.txt" 2>&1
      grep -E "median|llama.cpp|^\| (all|16G)" "$out/flag-$budget.txt"
    done
    ./build-cuda/bench/bench_cuda_decode -m "$mid" --prompt 64 --tokens 128 --repeats 3 --backends cuda,cuda-eager \
      >"$out/mid.txt" 2>&1
    grep -E "median|agree" "$out/mid.txt"
    /root/ll/build/bin/llama-bench -m "$mid" -ngl 99 -n 128 -p 512 -r 3 >"$out/llama-mid.txt" 2>"$state/llama-mid.err" ||
      tail -20 "$state/llama-mid.err" >>"$out/llama-mid.txt"
    grep -E "tg128|pp512" "$out/llama-mid.txt"
    echo "bench took $(($(date +%s) - start)) s"
    ;;
  all)
    "$0" prepare && "$0" bench ;;
  *) echo "usage: $0 prepare|bench|all" >&2; exit 2 ;;
esac
