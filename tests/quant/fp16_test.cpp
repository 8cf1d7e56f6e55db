// util/fp16.h: f16/bf16 <-> f32 conversions, checked exhaustively, against hand-picked values,
// and against the CPU's own F16C conversions (an independent implementation) where available.
#include <cpuid.h>
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <random>

#include "util/fp16.h"

namespace strata {
namespace {

__attribute__((target("f16c"))) float hardware_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t hardware_f32_to_f16(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
bool has_f16c() {  // CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports lacks "f16c")
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0 &&
         __builtin_cpu_supports("avx");
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    const uint16_t back = f32_to_f16(f);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_EQ(back & 0x7c00, 0x7c00) << h;
      EXPECT_NE(back & 0x3ff, 0) << "NaN " << h << " must stay NaN, got " << back;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << h;
    } else {
      EXPECT_EQ(back, h) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Fp16, DecodesKnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);  // 0x155/1024 + 1, times 2^-2
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));   // smallest normal
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));   // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_EQ(f16_to_f32(0xfc00), -INFINITY);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x8000), 0.0f);
}

TEST(Fp16, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and the next half 1 + 2^-10: ties go to the even mantissa.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  // Overflow: 65520 is halfway between 65504 and 2^16 and rounds (to even) to infinity.
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  // Subnormal results: 2^-25 is halfway between 0 and 2^-24 -> 0; 3·2^-25 -> 2·2^-24.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::ldexp(5.0f, -26)), 0x8001);  // 1.25·2^-24 -> 2^-24
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);
  EXPECT_EQ(f32_to_f16(NAN) & 0x7e00, 0x7e00);
}

TEST(Fp16, MatchesHardwareConversion) {
  if (!has_f16c()) GTEST_SKIP() << "CPU lacks F16C; no hardware reference";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    const float hw = hardware_f16_to_f32(uint16_t(h));
    if (std::isnan(hw)) {
      EXPECT_TRUE(std::isnan(f));
    } else {
      EXPECT_EQ(f32_to_bits(f), f32_to_bits(hw)) << h;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns concentrated on the f16 range (exponents 100..150) plus any pattern.
    uint32_t bits = rng();
    if (i % 2 == 0) bits = (bits & 0x807fffffu) | ((100u + bits % 51u) << 23);
    const float f = bits_to_f32(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), hardware_f32_to_f16(f)) << std::hex << bits;
  }
}

TEST(Bf16, DecodesByShifting) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  EXPECT_EQ(bf16_to_f32(0x0001), bits_to_f32(0x00010000));  // subnormal stays exact
  for (uint32_t h = 0; h < 65536; ++h) {
    EXPECT_EQ(f32_to_bits(bf16_to_f32(uint16_t(h))), h << 16);
  }
}

TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  // 1 + 2^-8 is halfway between bf16 1.0 (0x3f80) and 1 + 2^-7 (0x3f81): ties to even.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-1.0f - std::ldexp(1.0f, -9)), 0xbf80);
  // The largest finite f32 rounds up to infinity.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x7f7fffff)), 0x7f80);
  // A signalling NaN (quiet bit clear, payload only in the low bits) stays NaN, made quiet.
  const uint16_t nan = f32_to_bf16(bits_to_f32(0x7f800001));
  EXPECT_EQ(nan, 0x7fc0);
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0xffc12345)), 0xffc1);
  // Every bf16 value survives bf16 -> f32 -> bf16.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      EXPECT_EQ(f32_to_bf16(f), h);
    }
  }
}

}  // namespace
}  // namespace strata
