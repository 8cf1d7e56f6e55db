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
  return {_mm256_broadcastsi128_si256(
              _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0)),
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

// ---- Windows of many activation rows: blocks decoded once per call into i16 -----------------
//
// iq2_xs_tile's per-row work is 4 vector ops per 32 weights (sign, maddubs, madd, add) and it
// rebuilds each sub-block's grid and signs for every group of 8 rows. For a window with enough
// activation rows the weights are decoded once per call into signed i16 values already times
// their sub-block scale (|w·(2s+1)| <= 43·31 = 1333) and the activations are widened to i16 once
// per call; a 16-weight step is then one madd + one add per (weight row, activation row).
//
// Lane order: each 32-weight sub-block is stored as two vectors, "low" with bytes 4k, 4k+1 and
// "high" with bytes 4k+2, 4k+3 (k = 0..7) as words 2k, 2k+1 (weights and activations alike), so
// i32 lane k of either madd belongs to dot_iq2_xs's lane k (bytes 4k..4k+3): the block's 8 lane
// sums are the same exact integers, and the f32 step is the same (d·d_a)·0.125 and one FMA per
// block. The scale of word e of either vector is word e of iq2xs_scale_vector (e < 8: bytes
// 0-15, the low nibble), the vector dot_iq2_xs multiplies its maddubs pairs by.

constexpr int64_t kWideWordsPerBlock = 256;  // 16 vectors of 16 i16

// 32 signed bytes in element order as the low and high i16 vectors of the wide layout.
[[gnu::always_inline]] inline void widen_sub_block(__m256i bytes, __m256i& low, __m256i& high) {
  // Per 128-bit lane: bytes 4k, 4k+1 of its 4 groups, then bytes 4k+2, 4k+3; then the two
  // lanes' low halves together and their high halves together.
  const __m256i in_lane =
      _mm256_shuffle_epi8(bytes, _mm256_broadcastsi128_si256(_mm_setr_epi8(
                                     0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)));
  const __m256i grouped = _mm256_permute4x64_epi64(in_lane, 0xd8);
  low = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(grouped));
  high = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(grouped, 1));
}

// Activation rows [0, n_rows) (Q8_K, row t at acts + t·act_stride) in the wide layout: row t's
// block b at words + (t·n_blocks + b)·256, its d at d[t·n_blocks + b].
void widen_activations(const std::byte* acts, size_t act_stride, int64_t n_rows, int64_t n_blocks,
                       int16_t* words, float* d) {
  for (int64_t t = 0; t < n_rows; ++t) {
    const auto* row = reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride);
    for (int64_t b = 0; b < n_blocks; ++b) {
      int16_t* out = words + (t * n_blocks + b) * kWideWordsPerBlock;
      for (int sub = 0; sub < 8; ++sub) {
        __m256i low, high;
        widen_sub_block(load32(row[b].qs + 32 * sub), low, high);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * sub), low);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * sub + 16), high);
      }
      d[t * n_blocks + b] = row[b].d;
    }
  }
}

// One weight row in the wide layout: block b's signed, scaled words at words + b·256, its d at
// d[b]. Grid points and sign selectors as dot_iq2_xs builds them.
void widen_weights(const BlockIQ2_XS* blocks, int64_t n_blocks, int16_t* words, float* d) {
  const SignDecodeConstants constants = sign_decode_constants();
  const __m256i &parity_high_bit = constants.parity_high_bit, &bit_of_byte = constants.bit_of_byte,
                &bias = constants.bias;
  const __m256i(&sign_spread)[2] = constants.sign_spread;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    int16_t* out = words + b * kWideWordsPerBlock;
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
          __m256i low, high;
          widen_sub_block(signed_w, low, high);
          _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * sub),
                             _mm256_mullo_epi16(low, scale));
          _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * sub + 16),
                             _mm256_mullo_epi16(high, scale));
        }
      }
    }
    d[b] = f16_scalar_to_f32(block.d);
  }
}

// The wide path's register tile: 3 weight rows × 2 activation rows (6 i32 sums, 3 weight
// vectors; with 16 ymm registers larger tiles spill). Measured in bench_matmul_tile (1024 -> 512,
// 32 rows, loaded box): 3 × 2 4.8–5.0 ns per block-row, 4 × 1 4.9, 2 × 3 5.0–6.0, 4 × 2 5.9,
// 3 × 3 and 4 × 3 6.1, 2 × 4 6.5–7.7; iq2_xs_tile 7.0.
constexpr int kWideW = 3;
constexpr int kWideA = 2;

// kW wide weight rows (row r at w_words + r·n_blocks·256, d at w_d + r·n_blocks) × kA wide
// activation rows (row t at a_words + t·n_blocks·256, d at a_d + t·n_blocks) into
// out[r·out_w_stride + t·out_a_stride].
template <int kW, int kA>
[[gnu::always_inline]] inline void wide_tile(const int16_t* w_words, const float* w_d,
                                             const int16_t* a_words, const float* a_d,
                                             int64_t n_blocks, float* out, size_t out_w_stride,
                                             size_t out_a_stride) {
  const int64_t row_words = n_blocks * kWideWordsPerBlock;
  __m256 acc[kW][kA];
  for (auto& row_acc : acc) {
    for (__m256& a : row_acc) a = _mm256_setzero_ps();
  }
  const auto load_words = [](const int16_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  };
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m256i sums[kW][kA];
    for (auto& row_sums : sums) {
      for (__m256i& sum : row_sums) sum = _mm256_setzero_si256();
    }
    const int64_t block_word = b * kWideWordsPerBlock;
    // Not unrolled: a 16-fold unroll makes GCC spill the sums.
#pragma GCC unroll 1
    for (int v = 0; v < 16; ++v) {
      __m256i w[kW];
      for (int r = 0; r < kW; ++r) w[r] = load_words(w_words + r * row_words + block_word + 16 * v);
      for (int t = 0; t < kA; ++t) {
        const __m256i x = load_words(a_words + t * row_words + block_word + 16 * v);
        for (int r = 0; r < kW; ++r)
          sums[r][t] = _mm256_add_epi32(sums[r][t], _mm256_madd_epi16(x, w[r]));
      }
    }
    for (int r = 0; r < kW; ++r) {
      const float d_w = w_d[r * n_blocks + b];
      for (int t = 0; t < kA; ++t) {
        const float d = d_w * a_d[t * n_blocks + b] * 0.125f;
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums[r][t]), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < kA; ++t)
      out[size_t(r) * out_w_stride + size_t(t) * out_a_stride] =
          canonical_nan(horizontal_sum(acc[r][t]));
  }
}

// The activation group (widened once per call) is at most kWideActWords words (64 KiB).
constexpr int64_t kWideActWords = 32768;
// Below this many activation rows the decode (~20 ns per block and weight row) is not worth
// doing once per call: at 8 rows the wide path measured 7.2 ns per block-row, iq2_xs_tile 6.8.
constexpr int64_t kWideMinActs = 12;

inline bool wide_path_fits(int64_t n_acts, int64_t n) {
  return n_acts >= kWideMinActs && kWideMinActs * n <= kWideActWords;
}

void wide_tiles(const std::byte* weights, size_t w_stride, int64_t n_w, const std::byte* acts,
                size_t a_stride, int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                size_t out_a_stride) {
  const int64_t n_blocks = n / kBlockK;
  const int64_t group_rows = std::min<int64_t>(n_acts, kWideActWords / n);
  alignas(64) int16_t act_words[kWideActWords];
  float a_d[kWideActWords / kBlockK];
  alignas(64) int16_t w_words[kWideW * kWideActWords / kWideMinActs];
  float w_d[kWideW * kWideActWords / kWideMinActs / kBlockK];
  for (int64_t a_first = 0; a_first < n_acts; a_first += group_rows) {
    const int64_t a_count = std::min(group_rows, n_acts - a_first);
    widen_activations(acts + size_t(a_first) * a_stride, a_stride, a_count, n_blocks, act_words,
                      a_d);
    for (int64_t w_first = 0; w_first < n_w; w_first += kWideW) {
      const int64_t w_count = std::min<int64_t>(kWideW, n_w - w_first);
      for (int64_t r = 0; r < w_count; ++r) {
        widen_weights(
            reinterpret_cast<const BlockIQ2_XS*>(weights + size_t(w_first + r) * w_stride),
            n_blocks, w_words + r * n_blocks * kWideWordsPerBlock, w_d + r * n_blocks);
      }
      for (int64_t t_first = 0; t_first < a_count; t_first += kWideA) {
        const int64_t t_count = std::min<int64_t>(kWideA, a_count - t_first);
        float* tile_out =
            out + size_t(w_first) * out_w_stride + size_t(a_first + t_first) * out_a_stride;
        tiles::with_count<kWideW>(w_count, [&](auto w_rows) {
          tiles::with_count<kWideA>(t_count, [&](auto a_rows) {
            wide_tile<decltype(w_rows)::value, decltype(a_rows)::value>(
                w_words, w_d, act_words + t_first * n_blocks * kWideWordsPerBlock,
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
