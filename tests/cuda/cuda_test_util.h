// Shared helpers of the CUDA tests: skip without a device, random weights of any GGUF type,
// upload/download of vectors.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "compute/cuda/runtime.h"
#include "quant/ggml_type.h"
#include "util/fp16.h"

namespace strata::test_support {

#define STRATA_REQUIRE_CUDA_DEVICE()                                                   \
  do {                                                                                 \
    if (!::strata::compute::cuda::usable_device())                                     \
      GTEST_SKIP() << "no usable CUDA device: " << ::strata::compute::cuda::describe_device(); \
  } while (0)

// Byte offsets of the f16 scale fields of one block of `type` (d, dmin, m): random bytes
// everywhere else make every bit pattern of quants and packed scales appear, and these fields
// get small finite values so sums stay in a realistic range.
inline std::vector<int> f16_scale_offsets(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_1: case GgmlType::Q5_1: return {0, 2};  // d, m
    case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};  // d, dmin
    case GgmlType::Q2_K: return {80, 82};                     // d, dmin after scales and qs
    case GgmlType::Q3_K: return {108};                        // d after hmask, qs, scales
    case GgmlType::Q6_K: return {208};                        // d after ql, qh, scales
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:  // d, then scales_h (u16 bits, random)
    case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ1_S:
      return {0};  // d first
    default: return {};  // float types (not block types), IQ1_M (d split over the scale words:
                         // random_weights sets it)
  }
}

// IQ1_M has no d field: its f16 super-scale is the top nibbles of the four u16 scale words at
// bytes 48..55 (word w's nibble is bits 4w..4w+3 of d).
inline void set_iq1_m_scale(uint8_t* block, uint16_t d) {
  for (int w = 0; w < 4; ++w) {
    uint16_t word;
    std::memcpy(&word, block + 48 + 2 * w, 2);
    word = uint16_t((word & 0x0fffu) | (((d >> (4 * w)) & 15u) << 12));
    std::memcpy(block + 48 + 2 * w, &word, 2);
  }
}

// n_out rows of n_in weights of `type`, rows row_stride bytes apart (>= row_bytes).
inline std::vector<uint8_t> random_weights(GgmlType type, int64_t n_in, int64_t n_out, size_t row_stride,
                                           std::mt19937& rng) {
  std::vector<uint8_t> bytes(row_stride * size_t(n_out));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f), scale(0.0005f, 0.004f);
  std::uniform_int_distribution<int> byte(0, 255);
  const TypeTraits& traits = type_traits(type);
  for (int64_t o = 0; o < n_out; ++o) {
    uint8_t* row = bytes.data() + size_t(o) * row_stride;
    if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) {
      for (int64_t i = 0; i < n_in; ++i) {
        const float v = value(rng);
        if (type == GgmlType::F32) std::memcpy(row + 4 * i, &v, 4);
        const uint16_t h = type == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
        if (type != GgmlType::F32) std::memcpy(row + 2 * i, &h, 2);
      }
      continue;
    }
    const int64_t n_blocks = n_in / traits.block_elems;
    for (int64_t b = 0; b < n_blocks; ++b) {
      uint8_t* block = row + size_t(b) * traits.block_bytes;
      for (size_t i = 0; i < traits.block_bytes; ++i) block[i] = uint8_t(byte(rng));
      for (int offset : f16_scale_offsets(type)) {
        const uint16_t h = f32_to_f16(scale(rng));
        std::memcpy(block + offset, &h, 2);
      }
      if (type == GgmlType::IQ1_M) set_iq1_m_scale(block, f32_to_f16(scale(rng)));
    }
  }
  return bytes;
}

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> value(lo, hi);
  std::vector<float> out(n);
  for (float& v : out) v = value(rng);
  return out;
}

template <typename T>
compute::cuda::DeviceBuffer to_device(const std::vector<T>& host) {
  compute::cuda::DeviceBuffer buffer(std::max<size_t>(1, host.size() * sizeof(T)));
  if (!host.empty()) buffer.upload(host.data(), host.size() * sizeof(T));
  return buffer;
}

template <typename T>
std::vector<T> from_device(const compute::cuda::DeviceBuffer& buffer, size_t count, size_t offset_bytes = 0) {
  std::vector<T> host(count);
  if (count) buffer.download(host.data(), count * sizeof(T), offset_bytes);
  return host;
}

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

}  // namespace strata::test_support
