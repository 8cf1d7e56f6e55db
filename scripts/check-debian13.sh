#!/usr/bin/env bash
# Builds and tests the tree on Debian 13 (trixie) from a Debian 12 machine, in a debootstrap
# chroot: Debian 13's compiler (g++ 14) builds everything with -Werror and runs `ctest -LE slow`;
# g++ 13 (Ubuntu 24.04's, the GPU box's) compiles every object with -Werror (it cannot link there:
# Debian 13's C++ libraries are built by g++ 14). Debian 13's libraries differ from Debian 12's
# (cpp-httplib 0.18 vs 0.11, gtest 1.15, fmt 10.1), which is what this catches (README, Compilers).
# Needs root and the Debian mirror (nothing else is fetched); ~2 GB under ROOT; about an hour of
# two cores for the two builds.
#   sudo scripts/check-debian13.sh [ROOT=/var/tmp/trixie]
# Outputs under ROOT/tmp: build14.log, ctest14.log, build13.log (grep FAILED / warning:).
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-/var/tmp/trixie}
export DEBIAN_FRONTEND=noninteractive
if [ ! -x "$root/usr/bin/apt-get" ]; then
  apt-get install -y --no-install-recommends debootstrap >/dev/null
  debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian
fi
mountpoint -q "$root/proc" || mount --bind /proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
mountpoint -q "$root/dev/pts" || mount --bind /dev/pts "$root/dev/pts"  # tmux (ChatRepl test)
chroot "$root" bash -c 'apt-get update -q && apt-get install -y -q --no-install-recommends \
  g++ g++-13 cmake ninja-build pkg-config git ca-certificates libfmt-dev nlohmann-json3-dev libcli11-dev \
  libcpp-httplib-dev liburing-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libvalijson-dev libicu-dev python3 curl tmux' >/dev/null
rm -rf "$root/src"
git clone -q . "$root/src"
chroot "$root" bash -c '
  cd /src
  cmake -S . -B build14 -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON -DSTRATA_CUDA=OFF >/dev/null
  cmake --build build14 -j "$(nproc)" >/tmp/build14.log 2>&1 && echo "g++ 14: built" || echo "g++ 14: BUILD FAILED"
  ctest --test-dir build14 -LE slow -j "$(nproc)" >/tmp/ctest14.log 2>&1; grep -E "tests passed|tests failed" /tmp/ctest14.log
  CC=gcc-13 CXX=g++-13 cmake -S . -B build13 -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON \
    -DSTRATA_CUDA=OFF >/dev/null
  # Every object; the links fail on Debian 13 (its libraries need g++ 14'"'"'s libstdc++).
  cmake --build build13 -j "$(nproc)" -- -k 0 >/tmp/build13.log 2>&1 || true
  echo "g++ 13: $(grep -c "warning:" /tmp/build13.log) warnings, compile failures:" \
    "$(grep "^FAILED: .*\.o " /tmp/build13.log | wc -l)"'
