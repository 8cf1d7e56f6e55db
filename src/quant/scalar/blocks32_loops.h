// Block loops and element helpers the 32-weight scalar kernels share (scalar/blocks32.cpp for
// Q5_0, scalar/iq4.cpp for IQ4_NL): symmetric types decode to d·value(block, j), and their dot with
// Q8_0 activations accumulates one f64 term per block.
#pragma once

#include <cmath>
#include <cstdint>

#include "quant/blocks.h"
#include "util/fp16.h"

namespace strata::quant::scalar {

// The nibble of element j (j < 32) placed as Q4_0's: low nibbles of qs first, then high ones.
inline int q4_quant(const uint8_t qs[16], int j) {
  return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}

// The signed value of largest magnitude (Q4_0/Q5_0's reference picks d from it).
inline float extreme_value(const float* x, int n) {
  float amax = 0.0f, extreme = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      extreme = x[j];
    }
  }
  return extreme;
}

// The block loops of the symmetric types (Q5_0, IQ4_NL): y = d·value(block, j).
template <typename Block, typename Value>
void dequantize_symmetric32(const void* src, float* dst, int64_t n, Value value) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    for (int j = 0; j < 32; ++j) dst[32 * b + j] = d * float(value(blocks[b], j));
  }
}

template <typename Block, typename Value>
float dot_symmetric32(const void* w, const void* a, int64_t n, Value value) {
  const auto* blocks = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += value(blocks[b], j) * acts[b].qs[j];
    sum += double(f16_to_f32(blocks[b].d)) * double(f16_to_f32(acts[b].d)) * isum;
  }
  return static_cast<float>(sum);
}

}  // namespace strata::quant::scalar
