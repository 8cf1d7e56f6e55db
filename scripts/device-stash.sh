#!/usr/bin/env bash
# The device tool sends the working tree (tracked files, on-disk size) plus what a call carries,
# at most 64 MiB; the tracked tree is ~60 MiB, so a call that carries the CUDA kit leaves the HF
# checkpoints of the fixtures (tests/data/models/*/hf, ~15 MiB, read only by the CPU convert
# tests, never by the `cuda` label) outside the tree for the call:
#   scripts/device-stash.sh out    moves them to /tmp/strata-hf-stash
#   scripts/device-stash.sh back   puts them back (git status is clean again)
set -euo pipefail
cd "$(dirname "$0")/.."
stash=/tmp/strata-hf-stash
case "${1:-}" in
  out) for d in tests/data/models/*/hf; do mkdir -p "$stash/$(dirname "$d")"; mv "$d" "$stash/$d"; done ;;
  back) for d in "$stash"/tests/data/models/*/hf; do mv "$d" "${d#"$stash"/}"; done ;;
  *) echo "usage: $0 out|back" >&2; exit 2 ;;
esac
