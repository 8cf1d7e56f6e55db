#!/usr/bin/env bash
# Runs every libFuzzer target in build-fuzz/fuzz for a share of SECONDS (default 60), each seeded
# from tests/data/fuzz/<target-without-fuzz_>/ and a scratch corpus under build-fuzz/corpus.
# A crash leaves its input in build-fuzz/crashes and fails the script.
# Each target is one single-threaded process, so FUZZ_JOBS of them (default: the number of cores)
# run at once; every target still gets SECONDS / n_targets of fuzzing on a core of its own, and the
# stage takes about SECONDS / FUZZ_JOBS (on CI's 2 cores: 36 s instead of 60 for 5 targets).
set -euo pipefail
cd "$(dirname "$0")/.."
total=${1:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
targets=(build-fuzz/fuzz/fuzz_*)
[ -e "${targets[0]}" ] || { echo "no fuzz targets built (build-fuzz/fuzz)"; exit 1; }
per_target=$(( total / ${#targets[@]} ))
[ "$per_target" -ge 1 ] || per_target=1
mkdir -p build-fuzz/crashes build-fuzz/fuzz-logs

fuzz_one() {
  local target=$1 name seed_dir work
  name=$(basename "$target"); seed_dir="tests/data/fuzz/${name#fuzz_}"
  work="build-fuzz/corpus/${name}"; mkdir -p "$work"
  "$target" -max_total_time="$per_target" -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix=build-fuzz/crashes/"$name"- -print_final_stats=1 "$work" "$seed_dir" \
    >"build-fuzz/fuzz-logs/$name.log" 2>&1
}

# Start up to $jobs targets at a time; report each one's tail in target order.
declare -A pid_of
failed=0
report() {
  local target=$1 name status=0
  name=$(basename "$target")
  wait "${pid_of[$target]}" || status=$?
  echo "-- $name for ${per_target}s (seeds: tests/data/fuzz/${name#fuzz_})"
  tail -n 12 "build-fuzz/fuzz-logs/$name.log"
  if [ "$status" -ne 0 ]; then
    echo "-- $name FAILED (exit $status): see build-fuzz/crashes/ and build-fuzz/fuzz-logs/$name.log"
    failed=1
  fi
}
running=()
for target in "${targets[@]}"; do
  if [ "${#running[@]}" -ge "$jobs" ]; then
    report "${running[0]}"
    running=("${running[@]:1}")
  fi
  fuzz_one "$target" &
  pid_of[$target]=$!
  running+=("$target")
done
for target in "${running[@]}"; do report "$target"; done
exit "$failed"
