// gemm_f32: every ISA level the CPU has, and the dispatched entry point, bitwise equal to the
// reference's per-element sequence (compute/cpu/gemm_f32.h) on random inputs, for shapes around
// every vector width and register tile, strided operands, both start values, and values that
// make the rounding order visible (wide magnitude range, signed zeros, infinities and NaN).
#include "compute/cpu/gemm_f32.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "quant/quant.h"

namespace strata::compute {
namespace {

struct Level {
  std::string name;
  GemmF32Fn fn;
};

std::vector<Level> available_levels() {
  std::vector<Level> levels = {{"sse", gemm_level::gemm_f32_sse}, {"dispatched", gemm_f32}};
  if (quant::cpu_has_avx2()) levels.push_back({"avx2", gemm_level::gemm_f32_avx2});
  if (quant::cpu_has_avx512()) levels.push_back({"avx512", gemm_level::gemm_f32_avx512});
  return levels;
}

std::vector<float> random_values(size_t count, std::mt19937& rng, bool specials) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::uniform_int_distribution<int> special(0, 199);
  std::vector<float> v(count);
  for (float& x : v) {
    x = std::ldexp(mantissa(rng), exponent(rng));
    if (specials) {
      const int s = special(rng);
      if (s == 0) x = -0.0f;
      if (s == 1) x = 0.0f;
      if (s == 2) x = std::numeric_limits<float>::infinity();
      if (s == 3) x = std::numeric_limits<float>::quiet_NaN();
    }
  }
  return v;
}

TEST(GemmF32, EveryLevelIsBitwiseTheReference) {
  std::mt19937 rng(1234);
  const int64_t sizes_m[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 64};
  const int64_t sizes_n[] = {1, 3, 4, 7, 8, 15, 16, 17, 24, 31, 32, 33, 48, 64, 100, 128};
  const int64_t sizes_k[] = {0, 1, 2, 16, 24, 64, 129};
  for (const Level& level : available_levels()) {
    for (int64_t m : sizes_m)
      for (int64_t n : sizes_n)
        for (int64_t k : sizes_k)
          for (int variant = 0; variant < 4; ++variant) {
            const bool accumulate = variant & 1, specials = variant & 2;
            // Padded leading dimensions: the kernel must read and write only the m × n / k views.
            const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
            const std::vector<float> a = random_values(size_t(m * lda), rng, specials);
            const std::vector<float> b =
                random_values(size_t(std::max<int64_t>(k, 1) * ldb), rng, specials);
            const std::vector<float> c0 = random_values(size_t(m * ldc), rng, specials);
            std::vector<float> want = c0, got = c0;
            ref::gemm_f32(m, n, k, a.data(), lda, b.data(), ldb, want.data(), ldc, accumulate);
            level.fn(m, n, k, a.data(), lda, b.data(), ldb, got.data(), ldc, accumulate);
            for (size_t i = 0; i < want.size(); ++i) {
              // NaN payloads may differ between a scalar and a vector add; a NaN is a NaN.
              if (std::isnan(want[i]) && std::isnan(got[i])) continue;
              ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
                  << level.name << " m=" << m << " n=" << n << " k=" << k
                  << " accumulate=" << accumulate << " specials=" << specials << " at " << i;
            }
          }
  }
}

// The specification itself on a hand-computed case: the sum runs in r order from the start value,
// each product rounded before it is added (1 + 2^-24 + 2^-24 stays 1 in f32; a fused or
// reordered sum would not).
TEST(GemmF32, ReferenceRoundsEachStepInOrder) {
  const float tiny = std::ldexp(1.0f, -24);
  const float a[3] = {1.0f, 1.0f, 1.0f};
  const float b[3] = {1.0f, tiny, tiny};
  float c = 0.0f;
  ref::gemm_f32(1, 1, 3, a, 3, b, 1, &c, 1, false);
  EXPECT_EQ(c, 1.0f);
  float reordered = 0.0f;
  const float b2[3] = {tiny, tiny, 1.0f};
  ref::gemm_f32(1, 1, 3, a, 3, b2, 1, &reordered, 1, false);
  EXPECT_GT(reordered, 1.0f);
  for (const Level& level : available_levels()) {
    float got = 0.0f;
    level.fn(1, 1, 3, a, 3, b, 1, &got, 1, false);
    EXPECT_EQ(got, 1.0f) << level.name;
  }
}

}  // namespace
}  // namespace strata::compute
