// All 2^32 floats through the AVX2 exp (compute/cpu/exp_avx2.cpp) against std::exp, bitwise
// (any NaN matching any NaN). ctest label `slow` (not in CI's default run): ~1-2 min on 2 cores.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "compute/cpu/exp_avx2.h"
#include "quant/quant.h"

namespace strata::compute {
namespace {

TEST(ExpExhaustive, EveryFloatIsBitwiseStdExp) {
  if (!quant::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  constexpr uint64_t kChunk = uint64_t(1) << 16;
  constexpr uint64_t kChunks = (uint64_t(1) << 32) / kChunk;
  std::atomic<uint64_t> next{0}, bad{0}, first_bad{~uint64_t(0)};
  auto work = [&] {
    std::vector<float> x(kChunk), y(kChunk);
    for (uint64_t c; (c = next.fetch_add(1)) < kChunks;) {
      for (uint64_t i = 0; i < kChunk; ++i) x[i] = std::bit_cast<float>(uint32_t(c * kChunk + i));
      avx2::exp_f32(x.data(), int64_t(kChunk), y.data());
      for (uint64_t i = 0; i < kChunk; ++i) {
        const float want = std::exp(x[i]);
        if (std::bit_cast<uint32_t>(y[i]) != std::bit_cast<uint32_t>(want) &&
            !(want != want && y[i] != y[i])) {
          if (bad.fetch_add(1) == 0) first_bad = c * kChunk + i;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t)
    threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u) << "first mismatch at bits 0x" << std::hex << first_bad.load();
}

}  // namespace
}  // namespace strata::compute
