// AVX2 kernels for IQ2_XXS and IQ3_XXS weights (Q8_K activations), the most common expert types
// of llama.cpp's low-bit files. Reference: scalar_iq_lowbit.cpp.
//
// Dot: per 32-weight sub-block the grid points (unsigned bytes ≤ 62) are gathered from the table
// into one vector; the four 7-bit sign indices become a byte mask (0xFF = negative) through a
// 128-entry u64 table derived from kIq2xsSigns, which conditionally negates the activations
// ((a ^ m) − m; activations are within ±127, so nothing overflows). maddubs(grid, ±a) gives exact
// i16 pair sums (≤ 2·62·127), madd with the integer sub-block scale 2s+1 exact i32 sums; the
// block's f32 factor d·d_act·(1/8 or 1/4) is applied once per block with one FMA per lane.
// Dequantize: the scalar float expressions lane by lane (bitwise equal to the reference).
#include <array>
#include <cstring>

#include "quant/avx2_common.h"
#include "quant/blocks.h"
#include "quant/iq2xs_tables.h"
#include "quant/iq_lowbit_blocks.h"
#include "quant/iq_lowbit_tables.h"
#include "quant/kernels.h"

namespace strata::quant::avx2 {
namespace {

// kSignMasks[i]: byte j is 0xFF when bit j of kIq2xsSigns[i] is set (element j negative).
constexpr std::array<uint64_t, 128> make_sign_masks() {
  std::array<uint64_t, 128> masks{};
  for (int i = 0; i < 128; ++i) {
    // Same rule as kIq2xsSigns: the 7 bits of i plus their parity in bit 7.
    const int parity = __builtin_popcount(static_cast<unsigned>(i)) & 1;
    const int sign_byte = i | (parity << 7);
    for (int j = 0; j < 8; ++j) {
      if ((sign_byte >> j) & 1) masks[static_cast<size_t>(i)] |= uint64_t(0xff) << (8 * j);
    }
  }
  return masks;
}
constexpr std::array<uint64_t, 128> kSignMasks = make_sign_masks();

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The negation mask of the four 8-weight groups whose 7-bit sign indices are packed in `word`.
inline __m256i sign_masks(uint32_t word) {
  return _mm256_set_epi64x(static_cast<int64_t>(kSignMasks[(word >> 21) & 127]),
                           static_cast<int64_t>(kSignMasks[(word >> 14) & 127]),
                           static_cast<int64_t>(kSignMasks[(word >> 7) & 127]),
                           static_cast<int64_t>(kSignMasks[word & 127]));
}

// Σ over 32 weights of grid·sign·a, as 8 i32 lanes scaled by `scale`.
inline __m256i scaled_sub_block_sum(__m256i grid, __m256i negate, const int8_t* act, int scale) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act));
  const __m256i signed_acts = _mm256_sub_epi8(_mm256_xor_si256(a, negate), negate);
  const __m256i products = _mm256_maddubs_epi16(grid, signed_acts);
  return _mm256_madd_epi16(products, _mm256_set1_epi16(static_cast<int16_t>(scale)));
}

// y[0..7] = db·magnitude_j, negated where bit j of the sign byte is set (exactly the scalar
// db·float(±magnitude): negation commutes with rounding).
inline void store_group(float* y, float db, uint64_t magnitudes, uint8_t sign_byte) {
  const __m256i bit_of_lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 values =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(magnitudes))));
  const __m256i negative =
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(sign_byte), bit_of_lane), bit_of_lane);
  const __m256 scaled = _mm256_mul_ps(_mm256_set1_ps(db), values);
  const __m256i sign_bit = _mm256_and_si256(negative, _mm256_set1_epi32(int(0x80000000u)));
  _mm256_storeu_ps(y, _mm256_xor_ps(scaled, _mm256_castsi256_ps(sign_bit)));
}

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XXS*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float d = f16_scalar_to_f32(blocks[b].d);
    const auto* bytes = reinterpret_cast<const uint8_t*>(blocks[b].qs);
    for (int sub = 0; sub < 8; ++sub) {
      const uint32_t sign_word = load_u32(bytes + 8 * sub + 4);
      const float db = d * (0.5f + static_cast<int>(sign_word >> 28)) * 0.25f;
      for (int g = 0; g < 4; ++g) {
        store_group(dst + b * kBlockK + 32 * sub + 8 * g, db, kIq2xxsGrid[bytes[8 * sub + g]],
                    kIq2xsSigns[(sign_word >> (7 * g)) & 127]);
      }
    }
  }
}

float dot_iq2_xxs(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XXS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(blocks[b].qs);
    __m256i sums = _mm256_setzero_si256();
    for (int sub = 0; sub < 8; ++sub) {
      const uint8_t* index = bytes + 8 * sub;
      const uint32_t sign_word = load_u32(index + 4);
      const __m256i grid = _mm256_set_epi64x(
          static_cast<int64_t>(kIq2xxsGrid[index[3]]), static_cast<int64_t>(kIq2xxsGrid[index[2]]),
          static_cast<int64_t>(kIq2xxsGrid[index[1]]), static_cast<int64_t>(kIq2xxsGrid[index[0]]));
      const int scale = 2 * static_cast<int>(sign_word >> 28) + 1;
      sums = _mm256_add_epi32(
          sums, scaled_sub_block_sum(grid, sign_masks(sign_word), acts[b].qs + 32 * sub, scale));
    }
    const float d = f16_scalar_to_f32(blocks[b].d) * acts[b].d * 0.125f;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
  return horizontal_sum(acc);
}

void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ3_XXS*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float d = f16_scalar_to_f32(blocks[b].d);
    const uint8_t* qs = blocks[b].qs;
    for (int sub = 0; sub < 8; ++sub) {
      const uint32_t sign_word = load_u32(qs + 64 + 4 * sub);
      const float db = d * (0.5f + static_cast<int>(sign_word >> 28)) * 0.5f;
      for (int g = 0; g < 4; ++g) {
        const int group = 4 * sub + g;
        const uint64_t magnitudes =
            uint64_t(kIq3xxsGrid[qs[2 * group]]) | uint64_t(kIq3xxsGrid[qs[2 * group + 1]]) << 32;
        store_group(dst + b * kBlockK + 8 * group, db, magnitudes,
                    kIq2xsSigns[(sign_word >> (7 * g)) & 127]);
      }
    }
  }
}

float dot_iq3_xxs(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ3_XXS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const uint8_t* qs = blocks[b].qs;
    __m256i sums = _mm256_setzero_si256();
    for (int sub = 0; sub < 8; ++sub) {
      const uint8_t* index = qs + 8 * sub;
      const uint32_t sign_word = load_u32(qs + 64 + 4 * sub);
      const __m256i grid = _mm256_set_epi32(
          static_cast<int>(kIq3xxsGrid[index[7]]), static_cast<int>(kIq3xxsGrid[index[6]]),
          static_cast<int>(kIq3xxsGrid[index[5]]), static_cast<int>(kIq3xxsGrid[index[4]]),
          static_cast<int>(kIq3xxsGrid[index[3]]), static_cast<int>(kIq3xxsGrid[index[2]]),
          static_cast<int>(kIq3xxsGrid[index[1]]), static_cast<int>(kIq3xxsGrid[index[0]]));
      const int scale = 2 * static_cast<int>(sign_word >> 28) + 1;
      sums = _mm256_add_epi32(
          sums, scaled_sub_block_sum(grid, sign_masks(sign_word), acts[b].qs + 32 * sub, scale));
    }
    const float d = f16_scalar_to_f32(blocks[b].d) * acts[b].d * 0.25f;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
  return horizontal_sum(acc);
}

}  // namespace strata::quant::avx2
