// Scalar helpers shared by the K-quant specification kernels (scalar/kquants.cpp,
// scalar/iq4.cpp): the block loops of dequantization and dots, the per-block mins term,
// the f64 block contribution, and the block bodies Q4_K and Q5_K share.
#pragma once

#include <cstdint>

#include "quant/blocks.h"
#include "util/fp16.h"

namespace strata::quant::scalar {

// Σ_j m_j·(bsums[2j] + bsums[2j+1]) over the eight 32-weight sub-blocks of a Q4_K/Q5_K block:
// the mins term of the dot with Q8_K activations, exact in i64.
[[gnu::always_inline]] inline int64_t k4_min_sum(const uint8_t mins[8], const int16_t bsums[16]) {
  int64_t min_sum = 0;
  for (int sub = 0; sub < 8; ++sub) {
    min_sum += int64_t(mins[sub]) * (bsums[2 * sub] + bsums[2 * sub + 1]);
  }
  return min_sum;
}

// One block's share of a K-quant dot: d·d_a·scaled − dmin·d_a·min_sum in f64 (d, dmin as f16).
[[gnu::always_inline]] inline double k_block_dot(uint16_t d, uint16_t dmin, float act_d,
                                                 int64_t scaled, int64_t min_sum) {
  return double(f16_to_f32(d)) * act_d * double(scaled) -
         double(f16_to_f32(dmin)) * act_d * double(min_sum);
}

// Q2_K / Q3_K: the two low bits of element 16·sub + l (l < 16). Sub-block sub = 8·half + 2·step +
// part keeps them in bits 2·step of qs[32·half + 16·part + l].
[[gnu::always_inline]] inline int k2_low_bits(const uint8_t qs[64], int sub, int l) {
  const int half = sub / 8, step = (sub % 8) / 2, part = sub % 2;
  return (qs[32 * half + 16 * part + l] >> (2 * step)) & 3;
}

// Dequantizes n weights in 256-weight blocks: dequantize_block(block b, dst + 256·b).
template <typename Block, typename DequantizeBlock>
[[gnu::always_inline]] inline void dequantize_k_blocks(const void* src, float* dst, int64_t n,
                                                       DequantizeBlock dequantize_block) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) dequantize_block(blocks[b], dst + b * kBlockK);
}

// Dot of n weights in 256-weight blocks with Q8_K activations: Σ_b block_dot(block b, act b), the
// f64 terms added in block order, rounded to f32 once.
template <typename Block, typename BlockDot>
[[gnu::always_inline]] inline float dot_k_blocks(const void* w, const void* a, int64_t n,
                                                 BlockDot block_dot) {
  const auto* blocks = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlockK; ++b) sum += block_dot(blocks[b], acts[b]);
  return static_cast<float>(sum);
}

// Q4_K / Q5_K: eight 32-weight sub-blocks, each with a 6-bit scale and min (unpack_q4_K_scales);
// quant(chunk, upper, l) is the unsigned quant of element 64·chunk + 32·upper + l, which lies in
// sub-block 2·chunk + upper. The two types differ only in how they store that quant.
template <typename Block, typename Quant>
[[gnu::always_inline]] inline void dequantize_k4_block(const Block& block, float* y, Quant quant) {
  const float d = f16_to_f32(block.d);
  const float dmin = f16_to_f32(block.dmin);
  uint8_t scales[8];
  uint8_t mins[8];
  unpack_q4_K_scales(block.scales, scales, mins);
  for (int chunk = 0; chunk < 4; ++chunk) {
    for (int upper = 0; upper < 2; ++upper) {
      const float dl = d * scales[2 * chunk + upper];
      const float ml = dmin * mins[2 * chunk + upper];
      for (int l = 0; l < 32; ++l) {
        y[64 * chunk + 32 * upper + l] = dl * float(quant(chunk, upper, l)) - ml;
      }
    }
  }
}

// The Q4_K / Q5_K block share of a dot with Q8_K activations (quant as dequantize_k4_block).
template <typename Block, typename Quant>
[[gnu::always_inline]] inline double dot_k4_block(const Block& block, const BlockQ8_K& act,
                                                  Quant quant) {
  uint8_t scales[8];
  uint8_t mins[8];
  unpack_q4_K_scales(block.scales, scales, mins);
  int64_t scaled = 0;
  for (int chunk = 0; chunk < 4; ++chunk) {
    for (int upper = 0; upper < 2; ++upper) {
      const int sub = 2 * chunk + upper;
      int isum = 0;
      for (int l = 0; l < 32; ++l) isum += quant(chunk, upper, l) * act.qs[32 * sub + l];
      scaled += int64_t(scales[sub]) * isum;
    }
  }
  return k_block_dot(block.d, block.dmin, act.d, scaled, k4_min_sum(mins, act.bsums));
}

}  // namespace strata::quant::scalar
