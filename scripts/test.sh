#!/usr/bin/env bash
# Builds strata and runs every test, the way CI does:
#   1. g++ 12 Release build (warnings as errors) + full ctest suite
#   2. clang-14 build of everything (library, binary, tests, fuzz targets) with ASan+UBSan and
#      warnings as errors (the second compiler), + full ctest suite under the sanitizers, then a
#      libFuzzer run of every fuzz target from that build for a bounded time (FUZZ_SECONDS, default
#      60 in total). One build serves the sanitizers, the second compiler and the fuzzers: a separate
#      g++ sanitizer build was a third full build on CI's 2 cores (docs/ci.md has the numbers).
# The CUDA backend is OFF here (CI has no GPU); scripts/cuda-test.sh builds and runs it on the GPU box.
# First, where npm exists, it installs the llama.cpp peer the parity test drives
# (scripts/install-llama-cpp-peer.sh; without npm that test reports itself skipped).
# Exits non-zero on any failure. Set STRATA_TEST_QUICK=1 to run only step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fuzz_seconds=${FUZZ_SECONDS:-60}

if command -v npm >/dev/null; then
  echo "== llama.cpp peer (node-llama-cpp@3.21.1, prebuilt) for the parity test"
  [ -d tools/llama_cpp/node_modules/@node-llama-cpp/linux-x64/bins ] || scripts/install-llama-cpp-peer.sh
fi

stage() { echo "== $1"; stage_start=$(date +%s); }
stage_done() { echo "== $1: $(( $(date +%s) - stage_start )) s"; }

stage "release build (g++ 12, warnings as errors)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON -DSTRATA_CUDA=OFF >/dev/null
cmake --build build -j "$jobs"
stage_done "release build"
stage "release tests"
ctest --test-dir build --output-on-failure -j "$jobs" -LE slow
stage_done "release tests"

[ "${STRATA_TEST_QUICK:-0}" = 1 ] && exit 0

# lld (Debian's lld-14): the sanitizer build links ~50 test binaries against an instrumented
# strata_core; see docs/ci.md for the measured link times. -gline-tables-only instead of -g: the
# sanitizers' stack traces keep every frame's file:line (inlined frames too), and objects are ~40 %
# smaller, which the compiler and lld write and read faster (docs/ci.md, session 50).
stage "clang-14 ASan+UBSan build, warnings as errors (library, binary, tests, fuzz targets)"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
  -DSTRATA_FUZZ=ON -DSTRATA_FUZZ_BUILD_TESTS=ON -DSTRATA_WERROR=ON -DSTRATA_CUDA=OFF \
  -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld >/dev/null
cmake --build build-fuzz -j "$jobs"
stage_done "clang-14 sanitizer build"
stage "ASan+UBSan tests (clang-14 build)"
# Speculative-decoding equivalence grids run in the release stage only: each repeats the same spec
# code over a grid of settings (drafters, depths, gate, seeds, models), which under the sanitizers
# is many times the CPU of the code it covers (docs/ci.md has the measured seconds). What still
# covers that code under ASan+UBSan is named per entry.
release_only=(
  # `strata chat`/`run --telemetry` with --spec over every drafter: the chat loop's spec path is
  # SpecFlows.MultiTurnSessionsMatchThePlainChatLoop, the CLI's flags ChatRepl and cli_test.
  'SpecCli\.ChatAndTelemetryMatchPlain'
  # Sampled spec decoding on a model over a grid: Acceptance's distribution unit tests and
  # SpecFlows.MultiTurnSessionsMatchThePlainChatLoop (sampled turns, every drafter).
  'Acceptance\.SpeculativeSamplingMatchesPlainSamplingOnAModel'
  # Greedy exactness with long accepted runs on the default model: Fixtures/FixtureGreedy.* (the
  # same expect_exact with the oracle drafter, on the three fixtures).
  'DefaultModelGreedy\.SameTokensAsPlainGreedyWithLongAcceptedRuns'
  # The same on two synthetic skewed models: Fixtures/FixtureGreedy.* as above.
  'SyntheticGreedy\.SameTokensAsPlainGreedyOnSkewedSyntheticModels'
  # Single-turn sampled decoding, 4 models x 2 seeds x every drafter config: the multi-turn test
  # below runs the same grid (greedy and sampled) and stays here.
  'SpecFlows\.SampledSameSeedEmitsPlainSamplingsTokens'
  # serve --spec answers equal the plain server's, over drafters: ServeSpec.ClientDisconnect...
  # (serve's spec path) and the library-level SpecFlows tests.
  'ServeSpec\.AnswersAndStreamsEqualThePlainServers'
  # serve --spec under logit_bias/penalties/logprobs/n, two drafters: the rules themselves are the
  # other ServeSampling tests, serve's spec path ServeSpec.ClientDisconnect....
  'ServeSampling\.SpecDecodingAnswersTheRulesAsThePlainServer'
)
release_only_regex="^($(IFS='|'; echo "${release_only[*]}"))\$"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-fuzz --output-on-failure -j "$jobs" -LE slow -E "$release_only_regex"
stage_done "ASan+UBSan tests"

stage "fuzz (${fuzz_seconds}s in total)"
scripts/fuzz.sh "$fuzz_seconds"
stage_done "fuzz"
