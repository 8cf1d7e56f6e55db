// Helpers for the quant tests: random valid rows of every kernel type, dequantized magnitudes
// for error bounds, and small numeric utilities.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "util/fp16.h"

namespace strata::quant::testing {

inline constexpr GgmlType kKernelTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,
                                           GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q2_K,
                                           GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ2_XS};

inline std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

// A random finite f16 scale: mostly normal values of varied magnitude, sometimes zero or
// subnormal (the edge cases dequantization must get right).
inline uint16_t random_scale_f16(std::mt19937& rng) {
  const uint32_t kind = rng() % 16;
  if (kind == 0) return 0;                                   // d = 0
  if (kind == 1) return uint16_t(1 + rng() % 0x3ff);         // subnormal
  if (kind == 2) return uint16_t(0x8000 | (1 + rng() % 0x3ff));  // negative subnormal
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  const int exponent = -int(rng() % 14);  // 2^-13 .. 1
  const float value = std::ldexp(mantissa(rng), exponent) * (rng() % 4 == 0 ? -1.0f : 1.0f);
  return f32_to_f16(value);
}

// A random row of `type` whose bytes are all valid: random quants, finite scales.
inline std::vector<uint8_t> random_row(GgmlType type, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> row(row_bytes(type, n));
  for (uint8_t& byte : row) byte = static_cast<uint8_t>(rng());
  auto put_f16 = [&](size_t offset, uint16_t value) { std::memcpy(&row[offset], &value, 2); };
  const int64_t n_blocks = n / type_traits(type).block_elems;
  switch (type) {
    case GgmlType::F32: {
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float v = dist(rng);
        std::memcpy(&row[size_t(i) * 4], &v, 4);
      }
      break;
    }
    case GgmlType::F16:
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, &row[size_t(i) * 2], 2);
        // Clearing bit 14 (the exponent's top bit) keeps f16 and bf16 values finite.
        bits = uint16_t(bits & 0xbfff);
        put_f16(size_t(i) * 2, bits);
      }
      break;
    case GgmlType::Q8_0:
      for (int64_t b = 0; b < n_blocks; ++b) put_f16(size_t(b) * 34, random_scale_f16(rng));
      break;
    case GgmlType::Q4_0:
      for (int64_t b = 0; b < n_blocks; ++b) put_f16(size_t(b) * 18, random_scale_f16(rng));
      break;
    case GgmlType::Q2_K:
      for (int64_t b = 0; b < n_blocks; ++b) {
        put_f16(size_t(b) * 84 + 80, random_scale_f16(rng));
        put_f16(size_t(b) * 84 + 82, random_scale_f16(rng));
      }
      break;
    case GgmlType::Q4_K:
      for (int64_t b = 0; b < n_blocks; ++b) {
        put_f16(size_t(b) * 144, random_scale_f16(rng));
        put_f16(size_t(b) * 144 + 2, random_scale_f16(rng));
      }
      break;
    case GgmlType::Q6_K:
      for (int64_t b = 0; b < n_blocks; ++b) put_f16(size_t(b) * 210 + 208, random_scale_f16(rng));
      break;
    case GgmlType::IQ2_XS:
      for (int64_t b = 0; b < n_blocks; ++b) put_f16(size_t(b) * 74, random_scale_f16(rng));
      break;
    default:
      break;
  }
  return row;
}

// Per-element magnitude |scale part| + |offset part| of a dequantized row, so error bounds see
// the size of the terms before they cancel: Q2_K/Q4_K subtract a min from every weight, and
// the Q6_K kernels compute Σ sc·q·a − 32·Σ sc·a as two separate sums.
inline std::vector<double> weight_magnitudes(GgmlType type, const std::vector<uint8_t>& row,
                                             int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  ref::dequantize_row(type, row.data(), w.data(), n);
  std::vector<double> magnitude(w.size());
  if (type != GgmlType::Q2_K && type != GgmlType::Q4_K && type != GgmlType::Q6_K) {
    for (size_t i = 0; i < w.size(); ++i) magnitude[i] = std::fabs(double(w[i]));
    return magnitude;
  }
  // Zeroing the quants leaves y = −min (Q2_K, Q4_K) or y = d·sc·(−32) (Q6_K) per element.
  std::vector<uint8_t> mins_only = row;
  const size_t block = type_traits(type).block_bytes;
  for (size_t b = 0; b < row.size() / block; ++b) {
    uint8_t* base = mins_only.data() + b * block;
    if (type == GgmlType::Q2_K) std::memset(base + 16, 0, 64);
    if (type == GgmlType::Q4_K) std::memset(base + 16, 0, 128);
    if (type == GgmlType::Q6_K) std::memset(base, 0, 192);
  }
  std::vector<float> mins(w.size());
  ref::dequantize_row(type, mins_only.data(), mins.data(), n);
  for (size_t i = 0; i < w.size(); ++i) {
    magnitude[i] = std::fabs(double(w[i]) - double(mins[i])) + std::fabs(double(mins[i]));
  }
  return magnitude;
}

// The activation row of `weight_type` for x, and its dequantized values (what the dot sees).
struct Activation {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

inline Activation make_activation(GgmlType weight_type, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  Activation act;
  act.bytes.resize(activation_row_bytes(weight_type, n));
  ref::quantize_activation(weight_type, x.data(), act.bytes.data(), n);
  act.values.resize(x.size());
  const GgmlType type = activation_type(weight_type);
  if (type == GgmlType::F32) {
    act.values = x;
  } else if (type == GgmlType::Q8_0) {
    ref::dequantize_row(GgmlType::Q8_0, act.bytes.data(), act.values.data(), n);
  } else {  // Q8_K has no dequantizer in the API: d·q by definition.
    const auto* blocks = reinterpret_cast<const BlockQ8_K*>(act.bytes.data());
    for (int64_t i = 0; i < n; ++i) act.values[i] = blocks[i / 256].d * blocks[i / 256].qs[i % 256];
  }
  return act;
}

inline double relative_rmse(const std::vector<float>& reference, const std::vector<float>& approx) {
  double err = 0.0, sig = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    err += (double(approx[i]) - reference[i]) * (double(approx[i]) - reference[i]);
    sig += double(reference[i]) * reference[i];
  }
  return std::sqrt(err / sig);
}

inline uint32_t float_bits(float f) { return f32_to_bits(f); }

// Error bounds of the SIMD dots against the reference (see kernels_test.cpp for the derivation):
// u = 2^-24, `chain` terms accumulate per f32 lane, S = Σ_i m_i·|a_i| (magnitude_sum).
inline constexpr double kUnitRoundoff = 1.0 / 16777216.0;

inline int64_t accumulation_chain(GgmlType type, int64_t n) {
  const int64_t block = type_traits(type).block_elems;
  return block == 1 ? n / 32 : n / block;
}

inline double magnitude_sum(const std::vector<double>& weight_magnitude,
                            const std::vector<float>& act) {
  double sum = 0.0;
  for (size_t i = 0; i < act.size(); ++i) sum += weight_magnitude[i] * std::fabs(double(act[i]));
  return sum;
}

}  // namespace strata::quant::testing
