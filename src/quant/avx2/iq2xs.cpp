// AVX2 kernels for IQ2_XS weights (Q8_K activations).
//
// Per sub-block of 32 weights: the four grid points (unsigned bytes 8/25/43) are loaded from the
// table; the sign bytes are rebuilt in registers (7 stored bits plus their parity) and applied
// to the activations with sign_epi8, so maddubs(grid, ±a) gives exact i16 pair sums
// (≤ 2·43·127). The sub-block scale enters as the integer 2s+1 (db = d·(2s+1)/8).
#include <algorithm>
#include <cstddef>
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

// The vectors every AVX2 IQ2_XS decode builds its grid points and sign selectors from
// (dot_iq2_xs, the tile, the wide path's widen_weights).
struct SignDecodeConstants {
  __m256i parity_high_bit;  // parity(i) << 7 for i < 16: completes a 7-bit sign index to its byte
  __m256i bit_of_byte;
  __m256i bias;
  // A 128-bit lane of sign words holds two sub-blocks (u16 lanes 0-3, 4-7; the sign byte is the
  // low byte). For sub-block k of the lane: output bytes 8g..8g+7 repeat the sign byte of group g.
  __m256i sign_spread[2];
};
[[gnu::always_inline]] inline SignDecodeConstants sign_decode_constants() {
  return {_mm256_broadcastsi128_si256(_mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0,
                                                    -128, 0, -128, -128, 0)),
          _mm256_set1_epi64x(0x8040201008040201),
          _mm256_set1_epi8(0x7f),
          {_mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2,  //
                            4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6),
           _mm256_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, 10, 10, 10, 10, 10, 10, 10, 10,  //
                            12, 12, 12, 12, 12, 12, 12, 12, 14, 14, 14, 14, 14, 14, 14, 14)}};
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
        const __m256 magnitudes = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kIq2xsGrid[word & 511]))));
        const __m256i sign_set = _mm256_cmpeq_epi32(
            _mm256_and_si256(_mm256_set1_epi32(kIq2xsSigns[word >> 9]), bit_of_lane), bit_of_lane);
        const __m256 scaled = _mm256_mul_ps(_mm256_set1_ps(db), magnitudes);
        _mm256_storeu_ps(
            y + 32 * sub + 8 * group,
            _mm256_xor_ps(scaled, _mm256_castsi256_ps(_mm256_and_si256(sign_set, sign_bit))));
      }
    }
  }
}

float dot_iq2_xs(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  const SignDecodeConstants constants = sign_decode_constants();
  const __m256i &parity_high_bit = constants.parity_high_bit, &bit_of_byte = constants.bit_of_byte,
                &bias = constants.bias;
  const __m256i(&sign_spread)[2] = constants.sign_spread;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    __m256i sums = _mm256_setzero_si256();
    for (int quad = 0; quad < 2; ++quad) {
      const __m256i words = load32(block.qs + 16 * quad);
      const __m256i low_bits = _mm256_srli_epi16(words, 9);
      const __m256i folded = _mm256_xor_si256(low_bits, _mm256_srli_epi16(low_bits, 4));
      const __m256i sign_bytes =
          _mm256_or_si256(low_bits, _mm256_shuffle_epi8(parity_high_bit, folded));
      for (int lane = 0; lane < 2; ++lane) {
        const __m256i lane_signs =
            _mm256_broadcastsi128_si256(lane == 0 ? _mm256_castsi256_si128(sign_bytes)
                                                  : _mm256_extracti128_si256(sign_bytes, 1));
        for (int k = 0; k < 2; ++k) {
          const int sub = 4 * quad + 2 * lane + k;
          const __m256i spread = _mm256_shuffle_epi8(lane_signs, sign_spread[k]);
          // Byte j keeps bit j of its sign byte (0 or 2^j); adding 127 makes it negative (as i8)
          // exactly when the bit is set and never zero, which is what sign_epi8 needs.
          const __m256i sign_selector =
              _mm256_add_epi8(_mm256_and_si256(spread, bit_of_byte), bias);
          const __m256i signed_acts = _mm256_sign_epi8(load32(act.qs + 32 * sub), sign_selector);
          const __m256i products =
              _mm256_maddubs_epi16(grid_points(block.qs + 4 * sub), signed_acts);
          // Scale vector from a table: no vector instruction (madd reads it from memory).
          const __m256i scale = _mm256_load_si256(
              reinterpret_cast<const __m256i*>(iq2xs_scale_vector(block.scales[sub])));
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
  const SignDecodeConstants constants = sign_decode_constants();
  const __m256i &parity_high_bit = constants.parity_high_bit, &bit_of_byte = constants.bit_of_byte,
                &bias = constants.bias;
  const __m256i(&sign_spread)[2] = constants.sign_spread;
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
        const __m256i lane_signs =
            _mm256_broadcastsi128_si256(lane == 0 ? _mm256_castsi256_si128(sign_bytes)
                                                  : _mm256_extracti128_si256(sign_bytes, 1));
        for (int k = 0; k < 2; ++k) {
          const int sub = 4 * quad + 2 * lane + k;
          const __m256i spread = _mm256_shuffle_epi8(lane_signs, sign_spread[k]);
          const __m256i selector = _mm256_add_epi8(_mm256_and_si256(spread, bit_of_byte), bias);
          const __m256i grid = grid_points(block.qs + 4 * sub);
          const __m256i scale = _mm256_load_si256(
              reinterpret_cast<const __m256i*>(iq2xs_scale_vector(block.scales[sub])));
          for (int t = 0; t < kA; ++t) {
            const __m256i signed_acts = _mm256_sign_epi8(load32(act(t)[b].qs + 32 * sub), selector);
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

// ---- Windows of many activation rows: blocks decoded once per call, activations biased -----
//
// iq2_xs_tile's per-row work is 4 vector ops per 32 weights (sign, maddubs, madd, add) and it
// rebuilds each sub-block's grid and signs for every group of 8 rows. For a window with enough
// activation rows the weights are decoded once per call into signed bytes (±8/25/43, the values
// sign_epi8 puts on the activations in dot_iq2_xs, moved onto the weights), and the activations
// are biased to unsigned bytes x + 128 once per call. A 32-weight step is then maddubs(x + 128, w)
// (exact i16 pair sums: |.| <= 2·255·43 = 21930), madd with the sub-block's scale vector and an
// add per (weight row, activation row): 3 ops where the i16 form this replaced took 4, and half
// the activation bytes per multiply.
//
// Lane order: maddubs pairs bytes 2k, 2k+1 and madd pairs words 2k, 2k+1, so i32 lane k holds
// bytes 4k..4k+3 of the sub-block times the scale of those bytes (iq2xs_scale_vector, the vector
// dot_iq2_xs multiplies by): dot_iq2_xs's lane k plus 128·Σ scale·w of the same bytes. That bias
// term is the same madd(maddubs(128, w), scale) summed over the block's sub-blocks, computed once
// per weight block at decode and subtracted after the block's last sub-block, so the block's 8
// lane sums are exactly dot_iq2_xs's integers; the f32 step is the same (d·d_a)·0.125 and one FMA
// per block.

// One decoded weight block: per sub-block its 32 signed bytes and its 16 i16 scales (one ymm
// each), then the 8 i32 lanes of the bias term.
constexpr int64_t kWideVectorsPerBlock = 17;
// Biased activation bytes per block.
constexpr int64_t kWideActBytesPerBlock = kBlockK;

// Activation rows [0, n_rows) (Q8_K, row t at acts + t·act_stride) biased: row t's block b at
// bytes + (t·n_blocks + b)·256, its d at d[t·n_blocks + b].
void bias_activations(const std::byte* acts, size_t act_stride, int64_t n_rows, int64_t n_blocks,
                      uint8_t* bytes, float* d) {
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  for (int64_t t = 0; t < n_rows; ++t) {
    const auto* row = reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride);
    for (int64_t b = 0; b < n_blocks; ++b) {
      uint8_t* out = bytes + (t * n_blocks + b) * kWideActBytesPerBlock;
      for (int sub = 0; sub < 8; ++sub) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * sub),
                           _mm256_xor_si256(load32(row[b].qs + 32 * sub), bias));
      }
      d[t * n_blocks + b] = row[b].d;
    }
  }
}

// One weight row in the wide layout: block b at vectors + b·kWideVectorsPerBlock, its d at d[b].
// Grid points and sign selectors as dot_iq2_xs builds them.
void decode_weights(const BlockIQ2_XS* blocks, int64_t n_blocks, __m256i* vectors, float* d) {
  const SignDecodeConstants constants = sign_decode_constants();
  const __m256i &parity_high_bit = constants.parity_high_bit, &bit_of_byte = constants.bit_of_byte,
                &bias = constants.bias;
  const __m256i(&sign_spread)[2] = constants.sign_spread;
  const __m256i activation_bias = _mm256_set1_epi8(char(0x80));
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    __m256i* out = vectors + b * kWideVectorsPerBlock;
    __m256i bias_sums = _mm256_setzero_si256();
    for (int quad = 0; quad < 2; ++quad) {
      const __m256i words16 = load32(block.qs + 16 * quad);
      const __m256i low_bits = _mm256_srli_epi16(words16, 9);
      const __m256i folded = _mm256_xor_si256(low_bits, _mm256_srli_epi16(low_bits, 4));
      const __m256i sign_bytes =
          _mm256_or_si256(low_bits, _mm256_shuffle_epi8(parity_high_bit, folded));
      for (int lane = 0; lane < 2; ++lane) {
        const __m256i lane_signs =
            _mm256_broadcastsi128_si256(lane == 0 ? _mm256_castsi256_si128(sign_bytes)
                                                  : _mm256_extracti128_si256(sign_bytes, 1));
        for (int k = 0; k < 2; ++k) {
          const int sub = 4 * quad + 2 * lane + k;
          const __m256i spread = _mm256_shuffle_epi8(lane_signs, sign_spread[k]);
          const __m256i selector = _mm256_add_epi8(_mm256_and_si256(spread, bit_of_byte), bias);
          // Grid bytes are <= 43, so the signed weights are plain i8.
          const __m256i signed_w = _mm256_sign_epi8(grid_points(block.qs + 4 * sub), selector);
          const __m256i scale = _mm256_load_si256(
              reinterpret_cast<const __m256i*>(iq2xs_scale_vector(block.scales[sub])));
          _mm256_store_si256(out + 2 * sub, signed_w);
          _mm256_store_si256(out + 2 * sub + 1, scale);
          bias_sums = _mm256_add_epi32(
              bias_sums, _mm256_madd_epi16(_mm256_maddubs_epi16(activation_bias, signed_w), scale));
        }
      }
    }
    _mm256_store_si256(out + 16, bias_sums);
    d[b] = f16_scalar_to_f32(block.d);
  }
}

// The wide path's register tile: kWideW weight rows × kWideA activation rows (i32 sums, one
// weight vector per row and one activation vector in registers; the scales are memory operands).
// Measured in bench_matmul_tile (1024 -> 512, 32 rows, box loaded to 2-6 by other builds; ns per
// block-row): 4 × 2 5.7-6.0, 3 × 3 5.4-6.1, 3 × 2 4.9-5.7, 2 × 4 5.9, 5 × 2 6.4-6.5; the i16 wide
// path this replaced 7.2-7.6 in the same runs.
constexpr int kWideW = 4;
constexpr int kWideA = 2;

// kW decoded weight rows (row r at w_vectors + r·n_blocks·17, d at w_d + r·n_blocks) × kA biased
// activation rows (row t at a_bytes + t·n_blocks·256, d at a_d + t·n_blocks) into
// out[r·out_w_stride + t·out_a_stride].
template <int kW, int kA>
[[gnu::always_inline]] inline void wide_tile(const __m256i* w_vectors, const float* w_d,
                                             const uint8_t* a_bytes, const float* a_d,
                                             int64_t n_blocks, float* out, size_t out_w_stride,
                                             size_t out_a_stride) {
  const int64_t row_vectors = n_blocks * kWideVectorsPerBlock;
  const int64_t row_bytes = n_blocks * kWideActBytesPerBlock;
  __m256 acc[kW][kA];
  for (auto& row_acc : acc) {
    for (__m256& a : row_acc) a = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m256i sums[kW][kA];
    for (auto& row_sums : sums) {
      for (__m256i& sum : row_sums) sum = _mm256_setzero_si256();
    }
    const __m256i* block_w = w_vectors + b * kWideVectorsPerBlock;
    const uint8_t* block_a = a_bytes + b * kWideActBytesPerBlock;
#pragma GCC unroll 1
    for (int sub = 0; sub < 8; ++sub) {
      __m256i w[kW];
      for (int r = 0; r < kW; ++r) w[r] = _mm256_load_si256(block_w + r * row_vectors + 2 * sub);
      for (int t = 0; t < kA; ++t) {
        const __m256i x =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(block_a + t * row_bytes + 32 * sub));
        for (int r = 0; r < kW; ++r) {
          const __m256i products = _mm256_maddubs_epi16(x, w[r]);
          sums[r][t] = _mm256_add_epi32(
              sums[r][t], _mm256_madd_epi16(products, _mm256_load_si256(block_w + r * row_vectors +
                                                                        2 * sub + 1)));
        }
      }
    }
    for (int r = 0; r < kW; ++r) {
      const __m256i bias_sums = _mm256_load_si256(block_w + r * row_vectors + 16);
      const float d_w = w_d[r * n_blocks + b];
      for (int t = 0; t < kA; ++t) {
        const float d = d_w * a_d[t * n_blocks + b] * 0.125f;
        acc[r][t] =
            _mm256_fmadd_ps(_mm256_set1_ps(d),
                            _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r][t], bias_sums)), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < kA; ++t)
      out[size_t(r) * out_w_stride + size_t(t) * out_a_stride] =
          canonical_nan(horizontal_sum(acc[r][t]));
  }
}

// The activation group (biased once per call) is at most kWideActBytes bytes (64 KiB, as the
// i16 group this replaced).
constexpr int64_t kWideActBytes = 65536;
// The longest row the wide path takes (16 rows of it fill the activation group; the weight
// panel's buffer is sized for it).
constexpr int64_t kWideMaxN = 4096;
// Below this many activation rows the decode (~20 ns per block and weight row) is not worth
// doing once per call. bench_matmul_tile (loaded box), ns per block-row: 8 rows 6.6-7.2 here vs
// 7.7-8.0 for iq2_xs_tile; 4 rows 8.3 vs 7.3-8.3.
constexpr int64_t kWideMinActs = 8;

inline bool wide_path_fits(int64_t n_acts, int64_t n) {
  return n_acts >= kWideMinActs && n <= kWideMaxN;
}

void wide_tiles(const std::byte* weights, size_t w_stride, int64_t n_w, const std::byte* acts,
                size_t a_stride, int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                size_t out_a_stride) {
  const int64_t n_blocks = n / kBlockK;
  const int64_t group_rows = std::min<int64_t>(n_acts, kWideActBytes / n);
  alignas(64) uint8_t act_bytes[kWideActBytes];
  float a_d[kWideActBytes / kBlockK];
  __m256i w_vectors[kWideW * kWideMaxN / kBlockK * kWideVectorsPerBlock];
  float w_d[kWideW * kWideMaxN / kBlockK];
  for (int64_t a_first = 0; a_first < n_acts; a_first += group_rows) {
    const int64_t a_count = std::min(group_rows, n_acts - a_first);
    bias_activations(acts + size_t(a_first) * a_stride, a_stride, a_count, n_blocks, act_bytes,
                     a_d);
    for (int64_t w_first = 0; w_first < n_w; w_first += kWideW) {
      const int64_t w_count = std::min<int64_t>(kWideW, n_w - w_first);
      for (int64_t r = 0; r < w_count; ++r) {
        decode_weights(
            reinterpret_cast<const BlockIQ2_XS*>(weights + size_t(w_first + r) * w_stride),
            n_blocks, w_vectors + r * n_blocks * kWideVectorsPerBlock, w_d + r * n_blocks);
      }
      for (int64_t t_first = 0; t_first < a_count; t_first += kWideA) {
        const int64_t t_count = std::min<int64_t>(kWideA, a_count - t_first);
        float* tile_out =
            out + size_t(w_first) * out_w_stride + size_t(a_first + t_first) * out_a_stride;
        tiles::with_count<kWideW>(w_count, [&](auto w_rows) {
          tiles::with_count<kWideA>(t_count, [&](auto a_rows) {
            wide_tile<decltype(w_rows)::value, decltype(a_rows)::value>(
                w_vectors, w_d, act_bytes + t_first * n_blocks * kWideActBytesPerBlock,
                a_d + t_first * n_blocks, n_blocks, tile_out, out_w_stride, out_a_stride);
          });
        });
      }
    }
  }
}

}  // namespace

void dot_tile_iq2_xs(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride) {
  if (wide_path_fits(n_acts, n)) {
    wide_tiles(static_cast<const std::byte*>(w), w_stride, n_w, static_cast<const std::byte*>(a),
               a_stride, n_acts, n, out, out_w_stride, out_a_stride);
    return;
  }
  one_row_tiles<kIq2xsTileActs>(
      w, w_stride, n_w, a, a_stride, n_acts, out, out_w_stride, out_a_stride,
      [&](auto a_rows, const std::byte* weight, const std::byte* acts, float* tile_out) {
        iq2_xs_tile<decltype(a_rows)::value>(reinterpret_cast<const BlockIQ2_XS*>(weight), acts,
                                             a_stride, n / kBlockK, tile_out, out_a_stride);
      });
}

}  // namespace strata::quant::avx2
