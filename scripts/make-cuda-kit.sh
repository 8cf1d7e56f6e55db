#!/usr/bin/env bash
# Builds .device/cuda-kit/, the slim kit scripts/cuda-test.sh carries to the GPU box, from the full
# kit of ../shared/device/make-kit.sh (.device/build/: run that first): its deps.tar.xz minus ICU's
# data and the ICU libraries src/text does not link (the CUDA targets never call into ICU, so its
# 31 MB data library is not needed at run time; configure still finds uc and i18n) and OpenSSL's
# loadable engines and modules (never loaded by the tests), so the kit and the tracked tree stay
# under the device tool's 64 MiB carry limit; plus valijson's headers
# (libvalijson-dev, header-only: tests/serve's configure needs them and make-kit.sh's package list
# predates them), recompressed; its env.sh pointed at the new archive; the test tokenizer (tok/).
# Needs apt-get (run apt-get update first). Usage, from the project root: scripts/make-cuda-kit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .device/build/deps.tar.xz ] || { echo "run ../shared/device/make-kit.sh first (.device/build/deps.tar.xz)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root" .device/cuda-kit
tar xJf .device/build/deps.tar.xz -C "$work/root"
rm -rf "$work/root"/usr/lib/x86_64-linux-gnu/libicu{data,io,test,tu}.so* "$work/root"/usr/share/icu \
  "$work/root"/usr/lib/x86_64-linux-gnu/icu "$work/root"/usr/lib/x86_64-linux-gnu/engines-3 \
  "$work/root"/usr/lib/x86_64-linux-gnu/ossl-modules
(cd "$work" && apt-get download libvalijson-dev >/dev/null) || { echo "apt-get download libvalijson-dev failed"; exit 1; }
dpkg -x "$work"/libvalijson-dev_*.deb "$work/valijson"
cp -r "$work/valijson/usr/include/valijson" "$work/root/usr/include/"
tar cJf .device/cuda-kit/deps.tar.xz -C "$work/root" usr
sed 's|\.device/build/deps\.tar\.xz|.device/cuda-kit/deps.tar.xz|' .device/build/env.sh > .device/cuda-kit/env.sh
# No unity batches with this kit (the top-level CMakeLists reads STRATA_UNITY from the environment):
# a static library's batch object is linked whole when a binary needs any one symbol of it (the
# archive search even picks one up for an inline std::string function GoogleTest needs), so with
# batches the CUDA tests link text/'s ICU caller, whose libicuuc then needs the ICU data library
# this kit leaves out (31 MB; the link fails: undefined icudt72_dat). Without batches they link the
# objects they did before (the `cuda` label has always passed so).
cat >> .device/cuda-kit/env.sh <<'KIT'
export STRATA_UNITY=OFF  # scripts/make-cuda-kit.sh: this kit has no ICU data library
KIT
[ -d .device/build/tok ] && rm -rf .device/cuda-kit/tok && cp -r .device/build/tok .device/cuda-kit/tok
du -sh .device/cuda-kit
