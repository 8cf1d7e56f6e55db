#!/usr/bin/env bash
# The load test of issue 17's "Done when": 64 concurrent streams for 10 minutes against
# `strata serve --parallel 8` (continuous batching), 0 errors, RSS sampled every 30 s.
# Usage: bench/serve/load_parallel.sh [BUILD_DIR=build] [extra load_test.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
shift || true
exec python3 tests/serve/load_test.py --binary "$build/strata" --duration 600 --concurrency 64 \
  --server-args "--parallel 8" --rss-every 30 "$@"
