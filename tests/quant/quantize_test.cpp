// Quantizers: round-trip error on Gaussian data, idempotence, edge inputs, and the activation
// quantizers' exact rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace strata::quant {
namespace {

using testing::gaussian;
using testing::relative_rmse;

std::vector<float> round_trip(GgmlType type, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(row_bytes(type, n));
  quantize_row(type, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  dequantize_row(type, q.data(), y.data(), n);
  return y;
}

struct RmseBound {
  GgmlType type;
  double max_relative_rmse;
};

// Bounds are the measured values (printed by the test; unit Gaussian, 64 K values, seeds 1..3:
// f16 0.00021, bf16 0.00167, q8_0 0.00536, q4_0 0.0860, q2_K 0.2863, q4_K 0.0717, q6_K 0.0173)
// plus ~5% slack. The targets were ggml-like quality: q2_K ≈ 0.35, q4_K ≈ 0.1, q6_K ≈ 0.03,
// q8_0 ≈ 0.005.
constexpr RmseBound kRmseBounds[] = {
    {GgmlType::F16, 0.00022}, {GgmlType::BF16, 0.00175}, {GgmlType::Q8_0, 0.0057},
    {GgmlType::Q4_0, 0.090},  {GgmlType::Q2_K, 0.30},    {GgmlType::Q4_K, 0.075},
    {GgmlType::Q6_K, 0.0182},
};

TEST(QuantQuantize, RoundTripErrorOnGaussianData) {
  for (const RmseBound& bound : kRmseBounds) {
    double worst = 0.0;
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const std::vector<float> x = gaussian(65536, seed);
      worst = std::max(worst, relative_rmse(x, round_trip(bound.type, x)));
    }
    std::printf("relRMSE %-6s %.5f\n", std::string(type_name(bound.type)).c_str(), worst);
    EXPECT_LT(worst, bound.max_relative_rmse) << type_name(bound.type);
    EXPECT_GT(worst, 0.0) << type_name(bound.type);
  }
}

TEST(QuantQuantize, F32IsExact) {
  const std::vector<float> x = gaussian(1000, 4);
  EXPECT_EQ(round_trip(GgmlType::F32, x), x);
}

TEST(QuantQuantize, Q8_0AndQ4_0AreIdempotent) {
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      const std::vector<float> x = gaussian(4096, seed, 0.02f * seed);
      std::vector<uint8_t> first(row_bytes(type, 4096)), second(first.size());
      ref::quantize_row(type, x.data(), first.data(), 4096);
      std::vector<float> y(4096);
      ref::dequantize_row(type, first.data(), y.data(), 4096);
      ref::quantize_row(type, y.data(), second.data(), 4096);
      EXPECT_EQ(first, second) << type_name(type) << " seed " << seed;
    }
  }
}

TEST(QuantQuantize, Q8_0MapsLargestMagnitudeTo127) {
  const std::vector<float> x = gaussian(32 * 50, 9);
  std::vector<BlockQ8_0> blocks(50);
  ref::quantize_row(GgmlType::Q8_0, x.data(), blocks.data(), 32 * 50);
  for (int b = 0; b < 50; ++b) {
    int arg = 0;
    for (int j = 1; j < 32; ++j)
      if (std::fabs(x[32 * b + j]) > std::fabs(x[32 * b + arg])) arg = j;
    EXPECT_EQ(blocks[b].qs[arg], x[32 * b + arg] > 0 ? 127 : -127);
    EXPECT_EQ(blocks[b].d, f32_to_f16(std::fabs(x[32 * b + arg]) / 127.0f));
  }
}

TEST(QuantQuantize, Q4_0MapsSignedExtremeToLevelZero) {
  const std::vector<float> x = gaussian(32 * 50, 10);
  std::vector<BlockQ4_0> blocks(50);
  ref::quantize_row(GgmlType::Q4_0, x.data(), blocks.data(), 32 * 50);
  for (int b = 0; b < 50; ++b) {
    int arg = 0;
    for (int j = 1; j < 32; ++j)
      if (std::fabs(x[32 * b + j]) > std::fabs(x[32 * b + arg])) arg = j;
    const int nibble = arg < 16 ? blocks[b].qs[arg] & 15 : blocks[b].qs[arg - 16] >> 4;
    EXPECT_EQ(nibble, 0);  // d = v / −8, so v itself decodes as d·(0 − 8)
    EXPECT_EQ(blocks[b].d, f32_to_f16(x[32 * b + arg] / -8.0f));
  }
}

TEST(QuantQuantize, ZeroInputGivesZeroOutput) {
  const std::vector<float> zeros(512, 0.0f);
  for (GgmlType type : testing::kKernelTypes) {
    const std::vector<float> y = round_trip(type, zeros);
    for (float v : y) ASSERT_EQ(v, 0.0f) << type_name(type);
  }
}

TEST(QuantQuantize, ConstantAndOutlierRowsStayClose) {
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q2_K, GgmlType::Q4_K,
                        GgmlType::Q6_K}) {
    std::vector<float> constant(256, 0.3f);
    const std::vector<float> y = round_trip(type, constant);
    // Any type can hit a constant to within its coarsest step relative to the value.
    EXPECT_LT(relative_rmse(constant, y), 0.15) << type_name(type);
    std::vector<float> outlier = gaussian(256, 11, 0.01f);
    outlier[77] = 5.0f;
    const std::vector<float> z = round_trip(type, outlier);
    EXPECT_NEAR(z[77], 5.0f, 0.05f) << type_name(type);
  }
}

TEST(QuantQuantize, IQ2_XSWithoutImatrixRoundTrips) {
  // Measured 0.288 (printed; unit Gaussian, 4 K values); a 2.3-bit code without an importance
  // matrix, about as good as Q2_K (2.6 bits) here.
  const std::vector<float> x = gaussian(256 * 16, 21);
  const std::vector<float> y = round_trip(GgmlType::IQ2_XS, x);
  const double rmse = relative_rmse(x, y);
  std::printf("relRMSE iq2_xs %.5f\n", rmse);
  EXPECT_LT(rmse, 0.30);
  // Signs: every weight of clear magnitude keeps its sign (only the smallest of a group with an
  // odd number of negatives may flip).
  int flipped = 0;
  for (size_t i = 0; i < x.size(); ++i) flipped += (x[i] < 0) != (y[i] < 0);
  EXPECT_LE(flipped, int(x.size() / 8));
  // The codes decode to what the quantizer chose, so quantizing the decoded row again is
  // nearly lossless (the grid contains the decoded points).
  const std::vector<float> z = round_trip(GgmlType::IQ2_XS, y);
  EXPECT_LT(relative_rmse(y, z), 0.2 * rmse);
}

TEST(QuantQuantize, Q8_KActivationRoundsToNearestEven) {
  // max|x| = 127 makes d = 1 and the inverse exactly 1, so the quants are round(x) by hand.
  std::vector<float> x(256, 0.0f);
  const float values[] = {127.0f, -63.5f, 0.5f, 1.5f, -2.5f, 100.2f, -127.0f, 3.49f};
  const int expected[] = {127, -64, 0, 2, -2, 100, -127, 3};
  for (int i = 0; i < 8; ++i) x[i] = values[i];
  for (int i = 16; i < 32; ++i) x[i] = -1.0f;  // bsums[1] = −16
  for (bool fast : {false, true}) {
    BlockQ8_K block;
    if (fast) {
      quantize_activation(GgmlType::Q4_K, x.data(), &block, 256);
    } else {
      ref::quantize_activation(GgmlType::Q4_K, x.data(), &block, 256);
    }
    EXPECT_EQ(block.d, 1.0f);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(block.qs[i], expected[i]) << i;
    EXPECT_EQ(block.bsums[0], 127 - 64 + 0 + 2 - 2 + 100 - 127 + 3);
    EXPECT_EQ(block.bsums[1], -16);
    for (int g = 2; g < 16; ++g) EXPECT_EQ(block.bsums[g], 0);
  }
}

TEST(QuantQuantize, QuantizersAreDeterministic) {
  const std::vector<float> x = gaussian(2048, 12);
  for (GgmlType type : testing::kKernelTypes) {
    std::vector<uint8_t> a(row_bytes(type, 2048)), b(a.size());
    quantize_row(type, x.data(), a.data(), 2048);
    quantize_row(type, x.data(), b.data(), 2048);
    EXPECT_EQ(a, b) << type_name(type);
  }
}

}  // namespace
}  // namespace strata::quant
