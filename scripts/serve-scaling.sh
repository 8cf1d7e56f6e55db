#!/usr/bin/env bash
# Issue 17's parallel target on many cores: 16 concurrent streams against one, `strata serve
# --parallel 16` on the embedded default model, with the batched steps in one window or cut into
# --batch-groups 2, 4, 8 (docs/serve.md "Batch groups"), in ONE device call on the H200 box's 16
# host cores (no GPU used). From the project root:
#   OUT=$OUT scripts/serve-scaling.sh
# carrying [".device/build"] (the strata CLI links ICU: the kit's env.sh). It needs
# models/strata-default.gguf in the tree; `scripts/device-stash.sh out-hf` leaves room for it.
# Steps: strata (CPU only, no tests) in build-cpu/ unless already there (scripts/cpu-scaling.sh
# builds the same), then ROUNDS rounds, each running bench/serve/parallel_bench.py once per
# BATCH_GROUPS value in rotating order (--parallel 16, streams 16 then 1, --runs 3, MAX_TOKENS tokens
# per stream, no load test): tok/s of 16 streams and of one, ITL, rows per step, replies equal.
# The whole call ends by LIMIT s (default 540) with the rounds done.
# Knobs: BATCH_GROUPS (1,2,4,8; `auto` is the server's default rule, and the summary says what it
# chose), ROUNDS (2), MAX_TOKENS (128), THREADS (server --threads; default all cores), JOBS (build
# jobs), LIMIT (540).
# Outputs under $OUT: build.log, serve.txt (every bench's lines, then a summary per group count).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .device/build/env.sh ] && source .device/build/env.sh
out=${OUT:-/tmp/serve-scaling}
mkdir -p "$out"
jobs=${JOBS:-$(nproc)}
limit=${LIMIT:-540}
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|L3)' || true

if [ ! -x build-cpu/strata ]; then
  cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF -DSTRATA_WERROR=OFF \
    -DSTRATA_BUILD_TESTS=OFF >"$out/build.log" 2>&1 &&
    ninja -C build-cpu -j "$jobs" strata >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
stamp "strata built"
[ -f models/strata-default.gguf ] || { echo "models/strata-default.gguf is not in the tree" >&2; exit 1; }

IFS=, read -r -a groups <<<"${BATCH_GROUPS:-1,2,4,8}"
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
for round in $(seq 1 "${ROUNDS:-2}"); do
  n=${#groups[@]}
  for i in $(seq 0 $((n - 1))); do
    g=${groups[$(((i + round - 1) % n))]}
    left=$((limit - ($(date +%s) - start)))
    if [ "$left" -lt 30 ]; then stamp "out of time"; break 2; fi
    stamp "round $round, --batch-groups $g"
    timeout "$left" python3 bench/serve/parallel_bench.py --binary build-cpu/strata --parallel 16 \
      --streams 16,1 --runs 3 --max-tokens "${MAX_TOKENS:-128}" --load-streams 0 \
      --server-args "--batch-groups $g ${threads[*]}" 2>&1 | grep -E '^parallel|equal' |
      sed "s/^/round $round groups $g: /" | tee -a "$out/serve.txt"
  done
done
echo "== summary: 16-stream tok/s per --batch-groups (each bench's median of 3 runs), one stream," \
  "16 streams / one stream (median of each), what the server chose" | tee -a "$out/serve.txt"
for g in "${groups[@]}"; do
  sixteen=$(grep "groups $g: parallel 16 streams 16:" "$out/serve.txt" | awk '{print $9}' | paste -sd' ')
  one=$(grep "groups $g: parallel 16 streams  1:" "$out/serve.txt" | awk '{print $9}' | paste -sd' ')
  ratio=$(python3 -c 'import statistics, sys
a, b = ([float(v) for v in s.split()] for s in sys.argv[1:3])
print(f"{statistics.median(a) / statistics.median(b):.2f}x" if a and b else "n/a")' "$sixteen" "$one")
  chose=$(grep "groups $g: parallel 16 batch groups" "$out/serve.txt" | head -1 | sed 's/.*batch groups //')
  echo "groups $g: $sixteen | one stream: $one | $ratio | $chose" | tee -a "$out/serve.txt"
done
stamp "done"
