#!/usr/bin/env bash
# The official openai npm client (tests/serve/openai_client/client.mjs) against `strata serve`.
# Usage: openai_client_test.sh STRATA SOURCE_DIR WORK_DIR
#   SOURCE_DIR  tests/serve/openai_client (package.json, package-lock.json pinning openai, client.mjs)
#   WORK_DIR    where `npm ci` installs the pinned client (the build tree; reused while the lock is unchanged)
# Without node or npm the test is skipped: it prints SKIPPED and the reason and exits 77, which
# CTest reports as "Skipped". With npm present, a failed install fails the test (as the llama.cpp
# peer's install does in scripts/test.sh).
set -euo pipefail
strata=$1 source_dir=$2 work=$3

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIPPED: node and npm are needed to install and run the openai npm client (install Node.js >= 18)"
  exit 77
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 18 ]; then
  echo "SKIPPED: node $(node --version) is too old for the openai client (needs >= 18)"
  exit 77
fi

mkdir -p "$work"
cp "$source_dir/package.json" "$source_dir/package-lock.json" "$source_dir/client.mjs" "$work/"
if ! cmp -s "$source_dir/package-lock.json" "$work/installed.lock" || [ ! -d "$work/node_modules/openai" ]; then
  echo "== npm ci (openai as pinned in package-lock.json)"
  (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund)
  cp "$source_dir/package-lock.json" "$work/installed.lock"
fi

log=$(mktemp)
# With an API key: the SDK sends it on every call (Authorization: Bearer), and a wrong one is
# checked to come back as the SDK's AuthenticationError.
# --parallel 16 for the check of 16 concurrent streams. One server for every check rather than a
# second one for that check alone (one start, one port, one SIGTERM check): a request on it
# answers bitwise as on a --parallel 1 server (ServeParallel.* compare the two), and the curl
# tests keep the single-slot server covered. --parallel > 1 refuses --spec, --moce and --backend
# cuda; none is used here.
key="strata-test-key-$$"
"$strata" serve --port 0 --quiet --parallel 16 --api-key "$key" >"$log" 2>&1 &
server=$!
cleanup() { kill "$server" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's|.* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$log")
  [ -n "$port" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$log"; echo "FAIL: strata serve exited at start"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log"; echo "FAIL: strata serve did not start"; exit 1; }

node "$work/client.mjs" "http://127.0.0.1:$port/v1" "$key"

kill -TERM "$server"
status=0
wait "$server" || status=$?
[ "$status" -eq 0 ] || { cat "$log"; echo "FAIL: strata serve exited $status after SIGTERM"; exit 1; }
echo "PASS: openai npm client against strata serve; server exited 0 on SIGTERM"
