// The AVX2 exp forms (compute/cpu/exp_avx2.cpp) against the scalar std::exp formulas they replace:
// bitwise, because the engine's outputs are specified through std::exp (ops.h) and must not move.
// The default suite checks a sample (every 4099th bit pattern, all floats in [-2, 2] at a stride,
// the edges of glibc's fast path, specials); ExpExhaustive.* (test binary compute_exp_exhaustive_test,
// ctest label `slow`) checks all 2^32 floats.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "compute/cpu/exp_avx2.h"
#include "compute/cpu/exp_avx512.h"
#include "compute/cpu/ops.h"
#include "quant/quant.h"

namespace strata::compute {
namespace {

float scalar_exp(float v) { return std::exp(v); }
float scalar_sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
float scalar_silu(float v) { return v / (1.0f + std::exp(-v)); }

// Bits equal, any NaN equal to any NaN (std::exp passes a NaN's payload through; the vector path
// does too, lane by lane through std::exp, but the payload is not what the engine promises).
bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (a != a && b != b);
}

// One level's forms (exp_avx2.h, exp_avx512.h: the same signatures).
struct ExpForms {
  void (*exp)(const float*, int64_t, float*);
  void (*exp_minus)(const float*, float, int64_t, float*);
  void (*sigmoid)(const float*, int64_t, float*);
  void (*silu)(const float*, int64_t, float*);
  void (*silu_mul)(float*, const float*, int64_t);
};
constexpr ExpForms kAvx2{avx2::exp_f32, avx2::exp_minus_f32, avx2::sigmoid_f32, avx2::silu_f32,
                         avx2::silu_mul_f32};
constexpr ExpForms kAvx512{avx512::exp_f32, avx512::exp_minus_f32, avx512::sigmoid_f32,
                           avx512::silu_f32, avx512::silu_mul_f32};

// Checks every form of a level on `x` (any length; the vector groups and the scalar tail both
// run). Returns the number of mismatches and reports the first few.
int64_t mismatches(const std::vector<float>& x, const ExpForms& forms) {
  const int64_t n = int64_t(x.size());
  std::vector<float> out(x.size()), g(x.size());
  int64_t bad = 0;
  auto check = [&](const char* what, auto scalar) {
    for (int64_t i = 0; i < n; ++i) {
      const float want = scalar(x[size_t(i)]);
      if (!same_bits(out[size_t(i)], want)) {
        if (++bad <= 5)
          ADD_FAILURE() << what << "(" << std::hexfloat << x[size_t(i)] << ") = " << out[size_t(i)]
                        << ", std::exp formula gives " << want;
      }
    }
  };
  forms.exp(x.data(), n, out.data());
  check("exp", scalar_exp);
  forms.sigmoid(x.data(), n, out.data());
  check("sigmoid", scalar_sigmoid);
  forms.silu(x.data(), n, out.data());
  check("silu", scalar_silu);
  forms.exp_minus(x.data(), 0.75f, n, out.data());
  check("exp_minus", [](float v) { return std::exp(v - 0.75f); });
  g = x;
  std::vector<float> u(x.size());
  for (size_t i = 0; i < u.size(); ++i) u[i] = float(int(i % 7) - 3) * 0.375f;
  forms.silu_mul(g.data(), u.data(), n);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = g[size_t(i)];
  {
    int64_t i = 0;
    auto silu_mul = [&](float v) { return scalar_silu(v) * u[size_t(i++)]; };
    check("silu_mul", silu_mul);
  }
  return bad;
}

// The default suite's sample (see the top of the file).
std::vector<float> sampled_floats() {
  std::vector<float> x;
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 4099)
    x.push_back(std::bit_cast<float>(uint32_t(bits)));
  for (float v = -2.0f; v <= 2.0f; v = std::nextafter(v, 3.0f) + 0x1p-14f) x.push_back(v);
  // Around the fast path's ends and the overflow / underflow thresholds.
  for (float edge : {88.0f, -88.0f, 88.72283f, -103.27892f, -103.97208f, 80.0f, -80.0f}) {
    float v = edge;
    for (int k = 0; k < 300; ++k) v = std::nextafter(v, -std::numeric_limits<float>::infinity());
    for (int k = 0; k < 600; ++k, v = std::nextafter(v, std::numeric_limits<float>::infinity()))
      x.push_back(v);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::max()})
    x.push_back(v);
  x.push_back(1.0f);  // a tail of 3 after the groups of 8 (of 11 after AVX-512's groups of 16)
  x.push_back(2.0f);
  return x;
}

TEST(ExpAvx2, SampledFloatsAreBitwiseTheStdExpFormulas) {
  if (!quant::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  EXPECT_EQ(mismatches(sampled_floats(), kAvx2), 0);
}

TEST(ExpAvx512, SampledFloatsAreBitwiseTheStdExpFormulas) {
  if (!quant::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const std::vector<float> x = sampled_floats();
  EXPECT_EQ(mismatches(x, kAvx512), 0);
  // Every tail length after the groups of 16 (and the groups at every offset).
  for (size_t n = 1; n <= 40; ++n)
    EXPECT_EQ(mismatches(std::vector<float>(x.begin() + 1000, x.begin() + 1000 + n), kAvx512), 0);
}

// The dispatched ops (what the layers call) are the scalar functions, bitwise.
TEST(ExpAvx2, DispatchedOpsAreTheScalarOps) {
  std::vector<float> x(1003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i) - 500) * 0.0371f;
  std::vector<float> out(x.size());
  sigmoid(x.data(), int64_t(x.size()), out.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(out[i], sigmoid(x[i]))) << i;
  silu(x.data(), int64_t(x.size()), out.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(out[i], silu(x[i]))) << i;
  std::vector<float> g = x, u(x.size(), 1.5f);
  silu_mul(g.data(), u.data(), int64_t(g.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(g[i], silu(x[i]) * 1.5f)) << i;
  std::vector<float> o(x.size(), 0.8125f), o_silu(x.size(), -1.25f);
  mul_sigmoid(o.data(), x.data(), int64_t(x.size()));
  mul_silu(o_silu.data(), x.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    float want = 0.8125f, want_silu = -1.25f;
    want *= sigmoid(x[i]);
    want_silu *= silu(x[i]);
    ASSERT_TRUE(same_bits(o[i], want)) << i;
    ASSERT_TRUE(same_bits(o_silu[i], want_silu)) << i;
  }
  std::vector<float> p = x, q = x;
  softmax(p.data(), int64_t(p.size()));
  float m = -std::numeric_limits<float>::infinity();
  for (float v : q) m = std::fmax(m, v);
  for (float& v : q) v = std::exp(v - m);
  float lanes[8] = {};
  size_t i = 0;
  for (; i + 8 <= q.size(); i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += q[i + size_t(j)];
  for (int j = 0; i + size_t(j) < q.size(); ++j) lanes[j] += q[i + size_t(j)];
  const float inv = 1.0f / (((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                            ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])));
  for (size_t k = 0; k < q.size(); ++k) ASSERT_TRUE(same_bits(p[k], q[k] * inv)) << k;
}

}  // namespace
}  // namespace strata::compute
