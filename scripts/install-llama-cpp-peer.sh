#!/usr/bin/env bash
# Installs the llama.cpp peer used by the parity test (tests/llama_cpp, docs/llama-cpp-parity.md):
# node-llama-cpp@3.21.1 exactly as pinned in tools/llama_cpp/package-lock.json, whose prebuilt
# CPU libllama (@node-llama-cpp/linux-x64) is what the test drives. Needs Node.js >= 20 and npm
# with access to the npm registry. Install scripts are skipped: the package's postinstall only
# checks for (and could fall back to building) a binary, and this repository never builds llama.cpp.
# Without this step the parity test skips with a message saying so.
set -euo pipefail
cd "$(dirname "$0")/../tools/llama_cpp"
command -v npm >/dev/null || { echo "install-llama-cpp-peer: npm not found (install Node.js >= 20)" >&2; exit 1; }
npm ci --ignore-scripts --no-audit --no-fund
test -d node_modules/@node-llama-cpp/linux-x64/bins || {
  echo "install-llama-cpp-peer: the prebuilt @node-llama-cpp/linux-x64 binary was not installed" >&2; exit 1; }
