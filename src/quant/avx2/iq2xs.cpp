// AVX2 kernels for IQ2_XS weights (Q8_K activations).
//
// Per sub-block of 32 weights: the four grid points (unsigned bytes 8/25/43) are loaded from the
// table; the sign bytes are rebuilt in registers (7 stored bits plus their parity) and applied
// to the activations with sign_epi8, so maddubs(grid, ±a) gives exact i16 pair sums
// (≤ 2·43·127). The sub-block scale enters as the integer 2s+1 (db = d·(2s+1)/8).
#include <cstring>

#include "quant/avx2/common.h"
#include "quant/blocks.h"
#include "quant/iq2xs_tables.h"
#include "quant/kernels.h"

namespace strata::quant::avx2 {
namespace {

// The four grid points of one sub-block. The four words come in one 64-bit load and are split
// with shifts: the kernel is bound by loads, and the scalar ALUs have room.
inline __m256i grid_points(const uint16_t* words) {
  uint64_t packed;
  std::memcpy(&packed, words, 8);
  // BMI1 bextr: one instruction per 9-bit field.
  return _mm256_set_epi64x(static_cast<int64_t>(kIq2xsGrid[_bextr_u64(packed, 48, 9)]),
                           static_cast<int64_t>(kIq2xsGrid[_bextr_u64(packed, 32, 9)]),
                           static_cast<int64_t>(kIq2xsGrid[_bextr_u64(packed, 16, 9)]),
                           static_cast<int64_t>(kIq2xsGrid[packed & 511]));
}

}  // namespace

void dequantize_iq2_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(src);
  const __m256i bit_of_lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i sign_bit = _mm256_set1_epi32(int(0x80000000u));
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    float* y = dst + b * kBlockK;
    for (int sub = 0; sub < 8; ++sub) {
      for (int group = 0; group < 4; ++group) {
        const int nibble = group < 2 ? (block.scales[sub] & 15) : (block.scales[sub] >> 4);
        const float db = d * (0.5f + nibble) * 0.25f;
        const uint16_t word = block.qs[4 * sub + group];
        const __m256 magnitudes = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
            _mm_cvtsi64_si128(static_cast<int64_t>(kIq2xsGrid[word & 511]))));
        const __m256i sign_set = _mm256_cmpeq_epi32(
            _mm256_and_si256(_mm256_set1_epi32(kIq2xsSigns[word >> 9]), bit_of_lane), bit_of_lane);
        const __m256 scaled = _mm256_mul_ps(_mm256_set1_ps(db), magnitudes);
        _mm256_storeu_ps(y + 32 * sub + 8 * group,
                         _mm256_xor_ps(scaled, _mm256_castsi256_ps(_mm256_and_si256(sign_set, sign_bit))));
      }
    }
  }
}

float dot_iq2_xs(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  // parity(i) << 7 for i < 16: completes a 7-bit sign index to its 8-bit sign byte.
  const __m256i parity_high_bit = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
  const __m256i bit_of_byte = _mm256_set1_epi64x(0x8040201008040201);
  const __m256i bias = _mm256_set1_epi8(0x7f);
  // A 128-bit lane of sign words holds two sub-blocks (u16 lanes 0-3, 4-7; the sign byte is the
  // low byte). For sub-block k of the lane: output bytes 8g..8g+7 repeat the sign byte of group g.
  const __m256i sign_spread[2] = {
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2,  //
                       4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6),
      _mm256_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, 10, 10, 10, 10, 10, 10, 10, 10,  //
                       12, 12, 12, 12, 12, 12, 12, 12, 14, 14, 14, 14, 14, 14, 14, 14)};
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    __m256i sums = _mm256_setzero_si256();
    for (int quad = 0; quad < 2; ++quad) {
      const __m256i words = load32(block.qs + 16 * quad);
      const __m256i low_bits = _mm256_srli_epi16(words, 9);
      const __m256i folded = _mm256_xor_si256(low_bits, _mm256_srli_epi16(low_bits, 4));
      const __m256i sign_bytes = _mm256_or_si256(low_bits, _mm256_shuffle_epi8(parity_high_bit, folded));
      for (int lane = 0; lane < 2; ++lane) {
        const __m256i lane_signs = _mm256_broadcastsi128_si256(
            lane == 0 ? _mm256_castsi256_si128(sign_bytes) : _mm256_extracti128_si256(sign_bytes, 1));
        for (int k = 0; k < 2; ++k) {
          const int sub = 4 * quad + 2 * lane + k;
          const __m256i spread = _mm256_shuffle_epi8(lane_signs, sign_spread[k]);
          // Byte j keeps bit j of its sign byte (0 or 2^j); adding 127 makes it negative (as i8)
          // exactly when the bit is set and never zero, which is what sign_epi8 needs.
          const __m256i sign_selector = _mm256_add_epi8(_mm256_and_si256(spread, bit_of_byte), bias);
          const __m256i signed_acts = _mm256_sign_epi8(load32(act.qs + 32 * sub), sign_selector);
          const __m256i products = _mm256_maddubs_epi16(grid_points(block.qs + 4 * sub), signed_acts);
          // Scale vector from a table: no vector instruction (madd reads it from memory).
          const __m256i scale =
              _mm256_load_si256(reinterpret_cast<const __m256i*>(iq2xs_scale_vector(block.scales[sub])));
          sums = _mm256_add_epi32(sums, _mm256_madd_epi16(products, scale));
        }
      }
    }
    const float d = f16_scalar_to_f32(block.d) * act.d * 0.125f;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
  return horizontal_sum(acc);
}

namespace {

// Activation rows per IQ2_XS register tile: an i32 sum and an f32 accumulator per row.
constexpr int kIq2xsTileActs = 8;

// Tile form of dot_iq2_xs: one weight row against kA activation rows. Each sub-block's grid
// vector and sign selector is built once (the same values dot_iq2_xs builds per sub-block) for
// all kA rows. Bitwise dot_iq2_xs per row: the i32 lanes are the same exact sums, the block scale
// the same f32 product (d·d_a)·0.125, one FMA per block into one accumulator.
template <int kA>
[[gnu::always_inline]] inline void iq2_xs_tile(const BlockIQ2_XS* blocks, const std::byte* acts,
                                               size_t act_stride, int64_t n_blocks, float* out,
                                               size_t out_stride) {
  const __m256i parity_high_bit = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
  const __m256i bit_of_byte = _mm256_set1_epi64x(0x8040201008040201);
  const __m256i bias = _mm256_set1_epi8(0x7f);
  const __m256i sign_spread[2] = {
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2,  //
                       4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6),
      _mm256_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, 10, 10, 10, 10, 10, 10, 10, 10,  //
                       12, 12, 12, 12, 12, 12, 12, 12, 14, 14, 14, 14, 14, 14, 14, 14)};
  const auto act = [&](int t) {
    return reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride);
  };
  __m256 acc[kA];
  for (int t = 0; t < kA; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    // Sub-block outer, rows inner: a sub-block's grid points, sign selector and scale vector
    // stay in registers while the kA rows pass.
    __m256i sums[kA];
    for (int t = 0; t < kA; ++t) sums[t] = _mm256_setzero_si256();
    for (int quad = 0; quad < 2; ++quad) {
      const __m256i words = load32(block.qs + 16 * quad);
      const __m256i low_bits = _mm256_srli_epi16(words, 9);
      const __m256i folded = _mm256_xor_si256(low_bits, _mm256_srli_epi16(low_bits, 4));
      const __m256i sign_bytes =
          _mm256_or_si256(low_bits, _mm256_shuffle_epi8(parity_high_bit, folded));
      for (int lane = 0; lane < 2; ++lane) {
        const __m256i lane_signs = _mm256_broadcastsi128_si256(
            lane == 0 ? _mm256_castsi256_si128(sign_bytes)
                      : _mm256_extracti128_si256(sign_bytes, 1));
        for (int k = 0; k < 2; ++k) {
          const int sub = 4 * quad + 2 * lane + k;
          const __m256i spread = _mm256_shuffle_epi8(lane_signs, sign_spread[k]);
          const __m256i selector = _mm256_add_epi8(_mm256_and_si256(spread, bit_of_byte), bias);
          const __m256i grid = grid_points(block.qs + 4 * sub);
          const __m256i scale = _mm256_load_si256(
              reinterpret_cast<const __m256i*>(iq2xs_scale_vector(block.scales[sub])));
          for (int t = 0; t < kA; ++t) {
            const __m256i signed_acts =
                _mm256_sign_epi8(load32(act(t)[b].qs + 32 * sub), selector);
            const __m256i products = _mm256_maddubs_epi16(grid, signed_acts);
            sums[t] = _mm256_add_epi32(sums[t], _mm256_madd_epi16(products, scale));
          }
        }
      }
    }
    const float d_w = f16_scalar_to_f32(block.d);
    for (int t = 0; t < kA; ++t) {
      const float d = d_w * act(t)[b].d * 0.125f;
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums[t]), acc[t]);
    }
  }
  for (int t = 0; t < kA; ++t) out[size_t(t) * out_stride] = canonical_nan(horizontal_sum(acc[t]));
}

}  // namespace

void dot_tile_iq2_xs(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride) {
  one_row_tiles<kIq2xsTileActs>(
      w, w_stride, n_w, a, a_stride, n_acts, out, out_w_stride, out_a_stride,
      [&](auto a_rows, const std::byte* weight, const std::byte* acts, float* tile_out) {
        iq2_xs_tile<decltype(a_rows)::value>(reinterpret_cast<const BlockIQ2_XS*>(weight), acts,
                                             a_stride, n / kBlockK, tile_out, out_a_stride);
      });
}

}  // namespace strata::quant::avx2
