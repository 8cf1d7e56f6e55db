#!/usr/bin/env bash
# Runs every libFuzzer target in build-fuzz/fuzz for a share of SECONDS (default 60), each seeded
# from tests/data/fuzz/<target-without-fuzz_>/ and a scratch corpus under build-fuzz/corpus.
# A crash leaves its input in build-fuzz/crashes and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
total=${1:-60}
targets=(build-fuzz/fuzz/fuzz_*)
[ -e "${targets[0]}" ] || { echo "no fuzz targets built (build-fuzz/fuzz)"; exit 1; }
per_target=$(( total / ${#targets[@]} ))
[ "$per_target" -ge 1 ] || per_target=1
mkdir -p build-fuzz/crashes
for target in "${targets[@]}"; do
  name=$(basename "$target"); seed_dir="tests/data/fuzz/${name#fuzz_}"
  work="build-fuzz/corpus/${name}"; mkdir -p "$work"
  echo "-- $name for ${per_target}s (seeds: $seed_dir)"
  "$target" -max_total_time="$per_target" -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix=build-fuzz/crashes/"$name"- -print_final_stats=1 "$work" "$seed_dir" 2>&1 | tail -n 12
done
