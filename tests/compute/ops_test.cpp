#include "compute/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "util/error.h"

namespace strata::compute {
namespace {

// Hand-computed values below are written with ~10 digits; fp32 results agree to a few ulp.
constexpr float kTol = 2e-6f;

TEST(Ops, RmsNormMatchesHandComputedValues) {
  const float x[4] = {1, 2, 3, 4};  // Σx² = 30, mean 7.5
  float out[4];
  rms_norm(x, nullptr, 4, 0.0f, out);  // r = 1/sqrt(7.5) = 0.3651483717
  EXPECT_NEAR(out[0], 0.3651483717f, kTol);
  EXPECT_NEAR(out[1], 0.7302967433f, kTol);
  EXPECT_NEAR(out[2], 1.0954451150f, kTol);
  EXPECT_NEAR(out[3], 1.4605934867f, kTol);

  rms_norm(x, nullptr, 4, 0.5f, out);  // eps counts: r = 1/sqrt(8) = 0.3535533906
  EXPECT_NEAR(out[0], 0.3535533906f, kTol);
  EXPECT_NEAR(out[3], 1.4142135624f, kTol);

  const float weight[4] = {1, 0.5f, 2, -1};
  rms_norm(x, weight, 4, 0.0f, out);
  EXPECT_NEAR(out[0], 0.3651483717f, kTol);
  EXPECT_NEAR(out[1], 0.3651483717f, kTol);
  EXPECT_NEAR(out[2], 2.1908902300f, kTol);
  EXPECT_NEAR(out[3], -1.4605934867f, kTol);
}

TEST(Ops, RmsNormInPlaceEqualsOutOfPlace) {
  std::vector<float> x(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * 3.0f;
  std::vector<float> out(x.size());
  rms_norm(x.data(), nullptr, int64_t(x.size()), 1e-6f, out.data());
  rms_norm(x.data(), nullptr, int64_t(x.size()), 1e-6f, x.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], out[i]);
}

TEST(Ops, RmsNormGroupedNormalisesEachChunkWithFullWidthWeight) {
  const float x[8] = {1, 2, 3, 4, 3, 4, 0, 0};  // group 1: Σx² = 25, mean 6.25, r = 0.4
  const float weight[8] = {1, 1, 1, 1, 2, 2, 2, 2};
  float out[8];
  rms_norm_grouped(x, weight, 2, 4, 0.0f, out);
  EXPECT_NEAR(out[0], 0.3651483717f, kTol);
  EXPECT_NEAR(out[3], 1.4605934867f, kTol);
  EXPECT_NEAR(out[4], 2.4f, kTol);
  EXPECT_NEAR(out[5], 3.2f, kTol);
  EXPECT_EQ(out[6], 0.0f);
  EXPECT_EQ(out[7], 0.0f);
}

TEST(Ops, SumOfSquaresIsAccurateOnLongRows) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {1, 7, 8, 9, 2560, 10240}) {
    std::vector<float> x(static_cast<size_t>(n));
    double exact = 0;
    for (float& value : x) {
      value = normal(rng);
      exact += double(value) * double(value);
    }
    // Eight lanes of n/8 serial terms each: relative error well under n/8 · 2^-24.
    EXPECT_NEAR(sum_of_squares(x.data(), n), exact, exact * 1e-5) << "n " << n;
  }
}

TEST(Ops, SoftmaxMatchesExpFormulaAndSumsToOne) {
  float x[3] = {1, 2, 3};
  softmax(x, 3);
  EXPECT_NEAR(x[0], 0.0900305732f, kTol);
  EXPECT_NEAR(x[1], 0.2447284711f, kTol);
  EXPECT_NEAR(x[2], 0.6652409558f, kTol);

  // Large logits: subtracting the max avoids overflow.
  float big[2] = {1000, 1001};
  softmax(big, 2);
  EXPECT_NEAR(big[0], 0.2689414214f, kTol);
  EXPECT_NEAR(big[1], 0.7310585786f, kTol);

  // -inf (a masked entry) becomes exactly 0.
  float masked[3] = {0.5f, -std::numeric_limits<float>::infinity(), 0.5f};
  softmax(masked, 3);
  EXPECT_EQ(masked[1], 0.0f);
  EXPECT_NEAR(masked[0], 0.5f, kTol);

  std::vector<float> logits(512);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-8.0f, 8.0f);
  for (float& value : logits) value = uniform(rng);
  std::vector<double> expected(logits.size());
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += expected[i] = std::exp(logits[i] - max_logit);
  softmax(logits.data(), int64_t(logits.size()));
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(logits[i], expected[i] / total, 1e-7 + 1e-5 * expected[i] / total);
    sum += logits[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
}

TEST(Ops, ActivationsMatchTorchFormulas) {
  EXPECT_EQ(sigmoid(0.0f), 0.5f);
  EXPECT_NEAR(sigmoid(1.0f), 0.7310585786f, kTol);
  EXPECT_NEAR(silu(1.0f), 0.7310585786f, kTol);
  EXPECT_NEAR(silu(-2.0f), -0.2384058440f, kTol);
  EXPECT_EQ(silu(0.0f), 0.0f);
  EXPECT_NEAR(softplus(0.0f), 0.6931471806f, kTol);
  EXPECT_NEAR(softplus(-30.0f), 9.357622969e-14f, 1e-19f);
  // Identity strictly above the threshold (torch: x * beta > threshold).
  EXPECT_EQ(softplus(20.5f), 20.5f);
  EXPECT_EQ(softplus(1000.0f), 1000.0f);  // no overflow to inf
  // Extreme inputs stay finite and saturate.
  EXPECT_EQ(sigmoid(-200.0f), 0.0f);
  EXPECT_EQ(sigmoid(200.0f), 1.0f);

  const float x[4] = {-2, 0, 1, 25};
  float out[4];
  silu(x, 4, out);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], silu(x[i]));
  sigmoid(x, 4, out);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], sigmoid(x[i]));
  softplus(x, 4, out);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], softplus(x[i]));
}

TEST(Ops, RopeNeoxRotatesPairsByKnownAngles) {
  // head_dim 8, n_rot 4, theta 1e4: inv_freq = {1, 1e4^(-1/2) = 0.01}; at pos 3 the angles are
  // 3 and 0.03. Pairs (0, 2) and (1, 3); dims 4..7 pass through.
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  rope_neox(x, 8, 4, 3, 10000.0f);
  EXPECT_NEAR(x[0], -1.4133525208f, kTol);  // 1·cos 3 − 3·sin 3
  EXPECT_NEAR(x[2], -2.8288574817f, kTol);  // 3·cos 3 + 1·sin 3
  EXPECT_NEAR(x[1], 1.8791180667f, kTol);   // 2·cos .03 − 4·sin .03
  EXPECT_NEAR(x[3], 4.0581911354f, kTol);   // 4·cos .03 + 2·sin .03
  EXPECT_EQ(x[4], 5.0f);
  EXPECT_EQ(x[5], 6.0f);
  EXPECT_EQ(x[6], 7.0f);
  EXPECT_EQ(x[7], 8.0f);
}

TEST(Ops, RopeAtPositionZeroIsIdentityAndTablesMatch) {
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = float(i) - 3.5f;
  float copy[16];
  std::copy(x, x + 16, copy);
  rope_neox(x, 16, 16, 0, 1e7f);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(x[i], copy[i]);

  // rope_neox == rope_cos_sin + rope_neox_apply, bit for bit, and rotation keeps pair norms.
  float cos_values[8];
  float sin_values[8];
  rope_cos_sin(16, 12345, 1e7f, cos_values, sin_values);
  float a[16];
  float b[16];
  std::copy(copy, copy + 16, a);
  std::copy(copy, copy + 16, b);
  rope_neox(a, 16, 16, 12345, 1e7f);
  rope_neox_apply(b, 16, 16, cos_values, sin_values);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a[i], b[i]);
  for (int j = 0; j < 8; ++j) {
    const float before = copy[j] * copy[j] + copy[j + 8] * copy[j + 8];
    const float after = a[j] * a[j] + a[j + 8] * a[j + 8];
    EXPECT_NEAR(after, before, 1e-5f * before);
  }
  EXPECT_THROW(rope_neox(x, 16, 18, 1, 1e4f), Error);
  EXPECT_THROW(rope_neox(x, 16, 3, 1, 1e4f), Error);
}

TEST(Ops, TopKOrdersByValueThenLowerIndex) {
  const float v[6] = {1, 3, 3, 2, 3, -1};
  int32_t idx[4];
  top_k(v, 6, 3, idx);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 2);
  EXPECT_EQ(idx[2], 4);
  top_k(v, 6, 4, idx);
  EXPECT_EQ(idx[3], 3);

  const float zeros[3] = {-0.0f, 0.0f, -1.0f};  // -0 and +0 are equal: lower index first
  top_k(zeros, 3, 2, idx);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 1);

  const float with_nan[3] = {1, std::numeric_limits<float>::quiet_NaN(), 5};
  top_k(with_nan, 3, 2, idx);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 2);

  EXPECT_THROW(top_k(v, 6, 7, idx), Error);
}

TEST(Ops, TopKMatchesStableSortOnManyTies) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(0, 20);  // many equal values
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + trial * 10;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& value : v) value = float(small(rng)) * 0.25f;
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    const int k = std::min(n, 10);
    std::vector<int32_t> idx(static_cast<size_t>(k));
    top_k(v.data(), n, k, idx.data());
    for (int i = 0; i < k; ++i) ASSERT_EQ(idx[size_t(i)], order[size_t(i)]) << "n " << n;
    EXPECT_EQ(argmax(v.data(), n), order[0]);
  }
}

TEST(Ops, ArgmaxTakesFirstOfTiesAndNan) {
  const float v[4] = {1, 5, 5, 2};
  EXPECT_EQ(argmax(v, 4), 1);
  const float with_nan[3] = {1, 9, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(argmax(with_nan, 3), 2);
  EXPECT_THROW(argmax(v, 0), Error);
}

}  // namespace
}  // namespace strata::compute
