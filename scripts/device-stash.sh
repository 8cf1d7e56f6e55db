#!/usr/bin/env bash
# The device tool sends the working tree (tracked files, on-disk size) plus what a call carries,
# at most 64 MiB; the tracked tree is ~60 MiB. What the `cuda` ctest label never reads can stay
# behind for a call:
#   scripts/device-stash.sh out     moves the fixtures' f32 GGUFs (tests/data/models/*/model-f32.gguf,
#                                   8.5 MiB: the CPU tests' copies; the CUDA fixture tests convert
#                                   the HF checkpoints) and tests/data/fuzz to /tmp/strata-device-stash:
#                                   the tree then fits beside .device/cuda-kit, and every CUDA test runs
#   scripts/device-stash.sh out-hf  also the HF checkpoints (tests/data/models/*/hf, 15 MiB; the 12
#                                   CudaFixture tests need them): room for the full kit, .device/build,
#                                   that the strata CLI needs (it links ICU)
#   scripts/device-stash.sh back    puts everything back (git status is clean again)
set -euo pipefail
cd "$(dirname "$0")/.."
stash=/tmp/strata-device-stash
move_out() { for p in "$@"; do [ -e "$p" ] || continue; mkdir -p "$stash/$(dirname "$p")"; mv "$p" "$stash/$p"; done; }
case "${1:-}" in
  out) move_out tests/data/models/*/model-f32.gguf tests/data/fuzz ;;
  out-hf) move_out tests/data/models/*/model-f32.gguf tests/data/fuzz tests/data/models/*/hf ;;
  back)
    [ -d "$stash" ] || exit 0
    (cd "$stash" && find . -mindepth 1 \( -type f -o -type d -empty \) -print) | while read -r p; do
      p=${p#./}; mkdir -p "$(dirname "$p")"; [ -e "$p" ] || mv "$stash/$p" "$p"
    done
    rm -rf "$stash" ;;
  *) echo "usage: $0 out|out-hf|back" >&2; exit 2 ;;
esac
