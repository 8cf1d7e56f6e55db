#!/usr/bin/env bash
# The full-length load test of `strata serve`: 32 concurrent streams for 60 s against loopback.
# Usage: bench/serve/load.sh [BUILD_DIR=build] [extra load_test.py options, e.g. --duration 120]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
shift || true
exec python3 tests/serve/load_test.py --binary "$build/strata" --duration 60 --concurrency 32 "$@"
