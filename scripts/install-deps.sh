#!/usr/bin/env bash
# Installs every build and test dependency of strata from Debian 12 packages.
# Safe to run repeatedly; uses sudo only when not already root.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends \
  build-essential g++-12 cmake ninja-build pkg-config git \
  libfmt-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev liburing-dev libxxhash-dev \
  libgtest-dev libgmock-dev libbenchmark-dev libvalijson-dev \
  clang-14 libclang-rt-14-dev lld-14 clang-format-14 \
  libicu-dev \
  python3 tmux curl \
  chromium chromium-driver
# chromium + chromium-driver: the web page's browser test (tests/web/), headless.
# libvalijson-dev: the independent JSON Schema validator of the structured-output tests.
# lld-14: the linker of the clang-14 sanitizer + fuzz build (scripts/test.sh).
