// The quantizers synth leans on were made faster without changing their output: the IQ4_NL
// quantizer (reference and dispatched) still writes the bits of its definition, the plain scan
// over the codebook kept here, on blocks of many distributions and magnitudes; and every
// quantizer writes the same bytes as before the speed-ups (hashes from commit 74315d1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/quant.h"
#include "util/fp16.h"

namespace strata {
namespace {

constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                1,    13,   25,  38,  53,  69,  89,  113};

// The definition (the quantizer before it was sped up), verbatim.
int nearest_index(float v) {
  int best = 0;
  float best_error = std::fabs(v - float(kValues[0]));
  for (int k = 1; k < 16; ++k) {
    const float error = std::fabs(v - float(kValues[k]));
    if (error < best_error) {
      best_error = error;
      best = k;
    }
  }
  return best;
}

float extreme_value(const float* x, int n) {
  float amax = 0.0f, extreme = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      extreme = x[j];
    }
  }
  return extreme;
}

float fit(const float* x, int n) {
  const float extreme = extreme_value(x, n);
  if (extreme == 0.0f) return 0.0f;
  float best_scale = extreme / float(kValues[0]);
  double best_gain = -1.0;
  for (int t = -7; t <= 7; ++t) {
    const float inverse = (float(kValues[0]) + float(t)) / extreme;
    double sum_qx = 0.0, sum_qq = 0.0;
    for (int j = 0; j < n; ++j) {
      const double weight = double(x[j]) * x[j];
      const double q = kValues[nearest_index(inverse * x[j])];
      sum_qx += weight * q * x[j];
      sum_qq += weight * q * q;
    }
    if (sum_qq > 0.0 && sum_qx * sum_qx / sum_qq > best_gain) {
      best_gain = sum_qx * sum_qx / sum_qq;
      best_scale = float(sum_qx / sum_qq);
    }
  }
  return best_scale;
}

std::vector<uint8_t> definition_iq4_nl(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 32 * 18);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* block = x.data() + 32 * b;
    const uint16_t d = f32_to_f16(fit(block, 32));
    std::memcpy(out.data() + 18 * b, &d, 2);
    const float step = f16_to_f32(d);
    const float inverse = step != 0.0f ? 1.0f / step : 0.0f;
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) q[j] = uint8_t(nearest_index(inverse * block[j]));
    for (int j = 0; j < 16; ++j) out[18 * b + 2 + size_t(j)] = uint8_t(q[j] | (q[j + 16] << 4));
  }
  return out;
}

TEST(FastQuantizers, Iq4nlWritesTheBitsOfItsDefinition) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int> small_int(-127, 127);
  const int n_blocks = 512;
  for (float magnitude : {1e-30f, 1e-7f, 1e-3f, 0.02f, 1.0f, 113.0f, 1e4f, 1e20f}) {
    for (int distribution = 0; distribution < 5; ++distribution) {
      std::vector<float> x(size_t(n_blocks) * 32);
      for (size_t i = 0; i < x.size(); ++i) {
        float v = 0.0f;
        switch (distribution) {
          case 0:
            v = normal(rng);
            break;
          case 1:
            v = uniform(rng);
            break;
          case 2:
            v = normal(rng) * (i % 32 == 7 ? 50.0f : 1.0f);
            break;  // an outlier per block
          case 3:
            v = float(small_int(rng)) / 127.0f;
            break;  // many exact ties
          case 4:
            v = i % 3 == 0 ? 0.0f : (i % 5 == 0 ? 1.0f : -0.5f);
            break;  // few values
        }
        x[i] = v * magnitude;
      }
      const std::vector<uint8_t> expected = definition_iq4_nl(x);
      std::vector<uint8_t> reference(expected.size()), fast(expected.size());
      quant::ref::quantize_row(GgmlType::IQ4_NL, x.data(), reference.data(), int64_t(x.size()));
      quant::quantize_row(GgmlType::IQ4_NL, x.data(), fast.data(), int64_t(x.size()));
      EXPECT_EQ(reference, expected)
          << "magnitude " << magnitude << " distribution " << distribution;
      EXPECT_EQ(fast, expected) << "magnitude " << magnitude << " distribution " << distribution;
    }
  }
}

uint64_t test_splitmix(uint64_t v) {
  v += 0x9E3779B97F4A7C15ull;
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  return v ^ (v >> 31);
}

TEST(FastQuantizers, EveryQuantizerWritesTheBytesOfEarlierBuilds) {
  // 64 blocks of 256: triangular values, magnitudes 2^-12 .. 2^11 by block, an outlier every 97.
  const int64_t n = 256 * 64;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = test_splitmix(uint64_t(i));
    const float u = float(r >> 40) * (1.0f / 16777216.0f);
    const float u2 = float(test_splitmix(r) >> 40) * (1.0f / 16777216.0f);
    float v = u + u2 - 1.0f;
    if (i % 97 == 0) v *= 30;
    x[size_t(i)] = v * std::ldexp(1.0f, int((i / 256) % 24) - 12);
  }
  struct Expected {
    GgmlType type;
    uint64_t hash;  // FNV-1a of quantize_row's output, at commit 74315d1 (ref and dispatched)
  };
  const Expected expected[] = {
      {GgmlType::Q8_0, 0x8606a0bf69660ab6ull},   {GgmlType::Q4_0, 0x80c86db14c2d8de6ull},
      {GgmlType::Q4_1, 0x537a6dbc7396ddd9ull},   {GgmlType::Q5_0, 0xe7da99215ba96be9ull},
      {GgmlType::Q5_1, 0xf1477b4bda40520full},   {GgmlType::IQ4_NL, 0x73a475bf12b8543cull},
      {GgmlType::Q2_K, 0x4a3571d127d2afadull},   {GgmlType::Q3_K, 0x1a3c826039178af5ull},
      {GgmlType::Q4_K, 0x567743aaf5f0ae60ull},   {GgmlType::Q5_K, 0x26a00c5c6ffef338ull},
      {GgmlType::Q6_K, 0x130193862e76ee03ull},   {GgmlType::IQ4_XS, 0xed5aa18ff5be4811ull},
      {GgmlType::IQ2_XS, 0x58f7c299e7ea9d53ull},  // the first 8 blocks only: it is slow
  };
  for (const Expected& e : expected) {
    const int64_t m = e.type == GgmlType::IQ2_XS ? 256 * 8 : n;
    std::vector<uint8_t> reference(row_bytes(e.type, m)), fast(reference.size());
    quant::ref::quantize_row(e.type, x.data(), reference.data(), m);
    quant::quantize_row(e.type, x.data(), fast.data(), m);
    for (const std::vector<uint8_t>* bytes : {&reference, &fast}) {
      uint64_t h = 1469598103934665603ull;
      for (uint8_t c : *bytes) h = (h ^ c) * 1099511628211ull;
      EXPECT_EQ(h, e.hash) << type_traits(e.type).name
                           << (bytes == &fast ? " (dispatched)" : " (ref)");
    }
  }
}

}  // namespace
}  // namespace strata
