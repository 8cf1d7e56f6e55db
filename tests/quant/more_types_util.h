// Test helpers for the types of kernels.h kTableKernels (Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K, Q5_K, IQ4_XS):
// random valid rows and per-element weight magnitudes for error bounds. Kept apart from
// quant_test_util.h so the two type lists grow independently.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "quant/kernels.h"
#include "quant_test_util.h"

namespace strata::quant::testing {

inline constexpr GgmlType kMoreTypes[] = {GgmlType::Q4_1,   GgmlType::Q5_0, GgmlType::Q5_1,
                                          GgmlType::IQ4_NL, GgmlType::Q3_K, GgmlType::Q5_K,
                                          GgmlType::IQ4_XS};

// Byte offsets of the f16 fields (d, m, dmin) inside one block, which must hold finite values.
inline std::vector<size_t> f16_field_offsets(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q5_K:
      return {0, 2};
    case GgmlType::Q3_K:
      return {108};
    default:  // Q5_0, IQ4_NL, IQ4_XS
      return {0};
  }
}

// A random row of `type` (kMoreTypes) whose bytes are all valid: random quants, finite scales.
inline std::vector<uint8_t> random_more_row(GgmlType type, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> row(row_bytes(type, n));
  for (uint8_t& byte : row) byte = static_cast<uint8_t>(rng());
  const size_t block = type_traits(type).block_bytes;
  for (size_t b = 0; b < row.size() / block; ++b) {
    for (size_t offset : f16_field_offsets(type)) {
      const uint16_t value = random_scale_f16(rng);
      std::memcpy(&row[b * block + offset], &value, 2);
    }
  }
  return row;
}

// |scale part| + |offset part| per element: the offset part is what the row decodes to with all
// quants zeroed (Q4_1/Q5_1: +m, Q5_K: −min, Q3_K: −4·dl, which its kernels sum separately).
inline std::vector<double> more_weight_magnitudes(GgmlType type, const std::vector<uint8_t>& row,
                                                  int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  ref::dequantize_row(type, row.data(), w.data(), n);
  std::vector<uint8_t> offsets_only = row;
  const size_t block = type_traits(type).block_bytes;
  bool has_offset = true;
  for (size_t b = 0; b < row.size() / block; ++b) {
    uint8_t* base = offsets_only.data() + b * block;
    if (type == GgmlType::Q4_1)
      std::memset(base + 4, 0, 16);
    else if (type == GgmlType::Q5_1)
      std::memset(base + 4, 0, 20);
    else if (type == GgmlType::Q5_K)
      std::memset(base + 16, 0, 160);
    else if (type == GgmlType::Q3_K)
      std::memset(base, 0, 96);
    else
      has_offset = false;
  }
  std::vector<float> offsets(w.size(), 0.0f);
  if (has_offset) ref::dequantize_row(type, offsets_only.data(), offsets.data(), n);
  std::vector<double> magnitude(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    magnitude[i] = std::fabs(double(w[i]) - double(offsets[i])) + std::fabs(double(offsets[i]));
  }
  return magnitude;
}

inline const TableKernels& more_kernels(GgmlType type) {
  for (const TableKernels& k : kTableKernels) {
    if (k.type == type) return k;
  }
  return kTableKernels[0];  // unreachable for kMoreTypes
}

}  // namespace strata::quant::testing
