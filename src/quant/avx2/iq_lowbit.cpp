// AVX2 kernels for the low-bit IQ weights (Q8_K activations): IQ2_XXS and IQ3_XXS (the most
// common expert types of llama.cpp's low-bit files), IQ2_S, IQ3_S, IQ1_S and IQ1_M.
// Reference: scalar/iq_lowbit.cpp.
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

#include "quant/avx2/common.h"
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

// The block loop of every dot here: sub_block_sums(block, act_qs, sub) gives the exact i32 lanes of
// sub-block sub (32 weights, its integer scale applied), block_d(block) the block's f32 d; each
// block adds one FMA per lane of (d·d_act·factor) into the accumulator. factor is 1/8, 1/4 or 1,
// so multiplying by it is exact. Lambdas, not function pointers, so that everything inlines.
template <typename Block, typename BlockD, typename SubBlockSums>
[[gnu::always_inline]] inline float dot_iq_blocks(const void* w, const void* a, int64_t n,
                                                  float factor, BlockD block_d,
                                                  SubBlockSums sub_block_sums) {
  const auto* blocks = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const Block& block = blocks[b];
    __m256i sums = _mm256_setzero_si256();
    for (int sub = 0; sub < 8; ++sub) {
      sums = _mm256_add_epi32(sums, sub_block_sums(block, acts[b].qs + 32 * sub, sub));
    }
    const float d = block_d(block) * acts[b].d * factor;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
  return horizontal_sum(acc);
}

// f16 d of the block types that store it in `d`.
const auto stored_d = [](const auto& block) { return f16_scalar_to_f32(block.d); };

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
  return dot_iq_blocks<BlockIQ2_XXS>(
      w, a, n, 0.125f, stored_d, [](const BlockIQ2_XXS& block, const int8_t* act, int sub) {
        const uint8_t* index = reinterpret_cast<const uint8_t*>(block.qs) + 8 * sub;
        const uint32_t sign_word = load_u32(index + 4);
        const __m256i grid = _mm256_set_epi64x(static_cast<int64_t>(kIq2xxsGrid[index[3]]),
                                               static_cast<int64_t>(kIq2xxsGrid[index[2]]),
                                               static_cast<int64_t>(kIq2xxsGrid[index[1]]),
                                               static_cast<int64_t>(kIq2xxsGrid[index[0]]));
        const int scale = 2 * static_cast<int>(sign_word >> 28) + 1;
        return scaled_sub_block_sum(grid, sign_masks(sign_word), act, scale);
      });
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
  return dot_iq_blocks<BlockIQ3_XXS>(
      w, a, n, 0.25f, stored_d, [](const BlockIQ3_XXS& block, const int8_t* act, int sub) {
        const uint8_t* index = block.qs + 8 * sub;
        const uint32_t sign_word = load_u32(block.qs + 64 + 4 * sub);
        const __m256i grid = _mm256_set_epi32(
            static_cast<int>(kIq3xxsGrid[index[7]]), static_cast<int>(kIq3xxsGrid[index[6]]),
            static_cast<int>(kIq3xxsGrid[index[5]]), static_cast<int>(kIq3xxsGrid[index[4]]),
            static_cast<int>(kIq3xxsGrid[index[3]]), static_cast<int>(kIq3xxsGrid[index[2]]),
            static_cast<int>(kIq3xxsGrid[index[1]]), static_cast<int>(kIq3xxsGrid[index[0]]));
        const int scale = 2 * static_cast<int>(sign_word >> 28) + 1;
        return scaled_sub_block_sum(grid, sign_masks(sign_word), act, scale);
      });
}

// ---- IQ2_S, IQ3_S: full sign bytes (no parity), 10-/9-bit grid indices.

namespace {

// The negation mask of four groups whose sign bytes are the bytes of `signs` (bit j of byte g
// negates element j of group g).
inline __m256i sign_byte_masks(uint32_t signs) {
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(signs)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit_of_byte = _mm256_set1_epi64x(0x8040201008040201);
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
}

inline int iq2s_index(const BlockIQ2_S& block, int group) {
  return block.qs[group] | ((block.qh[group / 4] >> (2 * (group % 4))) & 3) << 8;
}

inline int iq3s_index(const BlockIQ3_S& block, int point) {
  return block.qs[point] | ((block.qh[point / 8] >> (point % 8)) & 1) << 8;
}

}  // namespace

void dequantize_iq2_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_S*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ2_S& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    for (int group = 0; group < 32; ++group) {
      const uint8_t scale_byte = block.scales[group / 4];
      const int nibble = (group % 4) < 2 ? (scale_byte & 15) : (scale_byte >> 4);
      const float db = d * (0.5f + nibble) * 0.25f;
      store_group(dst + b * kBlockK + 8 * group, db, kIq2sGrid[iq2s_index(block, group)],
                  block.qs[32 + group]);
    }
  }
}

float dot_iq2_s(const void* w, const void* a, int64_t n) {
  return dot_iq_blocks<BlockIQ2_S>(
      w, a, n, 0.125f, stored_d, [](const BlockIQ2_S& block, const int8_t* act_qs, int sub) {
        const int g = 4 * sub;
        const __m256i grid =
            _mm256_set_epi64x(static_cast<int64_t>(kIq2sGrid[iq2s_index(block, g + 3)]),
                              static_cast<int64_t>(kIq2sGrid[iq2s_index(block, g + 2)]),
                              static_cast<int64_t>(kIq2sGrid[iq2s_index(block, g + 1)]),
                              static_cast<int64_t>(kIq2sGrid[iq2s_index(block, g)]));
        const __m256i negate = sign_byte_masks(load_u32(block.qs + 32 + g));
        const __m256i act = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act_qs));
        const __m256i products =
            _mm256_maddubs_epi16(grid, _mm256_sub_epi8(_mm256_xor_si256(act, negate), negate));
        // Same scale layout as IQ2_XS: 2·nibble + 1, low nibble for i16 lanes 0-7 (weights 0-15).
        const __m256i scale = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(iq2xs_scale_vector(block.scales[sub])));
        return _mm256_madd_epi16(products, scale);
      });
}

void dequantize_iq3_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ3_S*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ3_S& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    for (int group = 0; group < 32; ++group) {
      const int sub = group / 4;
      const int nibble = sub % 2 == 0 ? (block.scales[sub / 2] & 15) : (block.scales[sub / 2] >> 4);
      const float db = d * float(1 + 2 * nibble);
      const uint64_t magnitudes = uint64_t(kIq3sGrid[iq3s_index(block, 2 * group)]) |
                                  uint64_t(kIq3sGrid[iq3s_index(block, 2 * group + 1)]) << 32;
      store_group(dst + b * kBlockK + 8 * group, db, magnitudes, block.signs[group]);
    }
  }
}

float dot_iq3_s(const void* w, const void* a, int64_t n) {
  return dot_iq_blocks<BlockIQ3_S>(
      w, a, n, 1.0f, stored_d, [](const BlockIQ3_S& block, const int8_t* act, int sub) {
        const int p = 8 * sub;
        const __m256i grid = _mm256_set_epi32(static_cast<int>(kIq3sGrid[iq3s_index(block, p + 7)]),
                                              static_cast<int>(kIq3sGrid[iq3s_index(block, p + 6)]),
                                              static_cast<int>(kIq3sGrid[iq3s_index(block, p + 5)]),
                                              static_cast<int>(kIq3sGrid[iq3s_index(block, p + 4)]),
                                              static_cast<int>(kIq3sGrid[iq3s_index(block, p + 3)]),
                                              static_cast<int>(kIq3sGrid[iq3s_index(block, p + 2)]),
                                              static_cast<int>(kIq3sGrid[iq3s_index(block, p + 1)]),
                                              static_cast<int>(kIq3sGrid[iq3s_index(block, p)]));
        const int nibble =
            sub % 2 == 0 ? (block.scales[sub / 2] & 15) : (block.scales[sub / 2] >> 4);
        return scaled_sub_block_sum(grid, sign_byte_masks(load_u32(block.signs + 4 * sub)), act,
                                    1 + 2 * nibble);
      });
}

// ---- IQ1_S, IQ1_M: ternary grid values g plus a delta of ±1/8. The dot multiplies the
// activations by v = 8·g ± 1 (never zero, |v| ≤ 9, so maddubs(|v|, sign(a, v)) is exact) and
// applies the 1/8 with the block factor.

namespace {

// y[0..7] = dl·(g_j + delta), the scalar expression lane by lane.
inline void store_ternary_group(float* y, float dl, float delta, uint64_t grid) {
  const __m256 values =
      _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(grid))));
  _mm256_storeu_ps(y,
                   _mm256_mul_ps(_mm256_set1_ps(dl), _mm256_add_ps(values, _mm256_set1_ps(delta))));
}

// Σ over 32 weights of (8·g + delta_sign)·a as i16 pair sums; `delta_signs` holds ±1 per byte.
inline __m256i ternary_products(__m256i grid, __m256i delta_signs, const int8_t* act) {
  const __m256i g2 = _mm256_add_epi8(grid, grid);
  const __m256i g4 = _mm256_add_epi8(g2, g2);
  const __m256i v = _mm256_add_epi8(_mm256_add_epi8(g4, g4), delta_signs);
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act));
  return _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(a, v));
}

inline int iq1s_index(const BlockIQ1_S& block, int group) {
  return block.qs[group] | ((block.qh[group / 4] >> (3 * (group % 4))) & 7) << 8;
}

inline uint16_t iq1m_word(const BlockIQ1_M& block, int word) {
  uint16_t v;
  std::memcpy(&v, block.scales + 2 * word, 2);
  return v;
}

inline float iq1m_d(const BlockIQ1_M& block) {
  const uint16_t bits =
      static_cast<uint16_t>((iq1m_word(block, 0) >> 12) | ((iq1m_word(block, 1) >> 8) & 0x00f0) |
                            ((iq1m_word(block, 2) >> 4) & 0x0f00) | (iq1m_word(block, 3) & 0xf000));
  return f16_scalar_to_f32(bits);
}

// Scale of groups 2h, 2h+1 of sub-block `sub` (h = 0: bits 0-2, h = 1: bits 3-5 of its field).
inline int iq1m_scale(const BlockIQ1_M& block, int sub, int h) {
  return (iq1m_word(block, sub / 2) >> (6 * (sub % 2) + 3 * h)) & 7;
}

inline uint8_t iq1m_nibble(const BlockIQ1_M& block, int group) {
  const uint8_t byte = block.qh[group / 2];
  return group % 2 == 0 ? (byte & 15) : (byte >> 4);
}

inline int64_t delta_bytes(bool negative) {
  return negative ? int64_t(-1) : int64_t(0x0101010101010101);
}

}  // namespace

void dequantize_iq1_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ1_S*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ1_S& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    for (int group = 0; group < 32; ++group) {
      const uint16_t high = block.qh[group / 4];
      const float dl = d * float(2 * ((high >> 12) & 7) + 1);
      const float delta = (high & 0x8000) != 0 ? -kIq1Delta : kIq1Delta;
      store_ternary_group(dst + b * kBlockK + 8 * group, dl, delta,
                          kIq1sGrid[iq1s_index(block, group)]);
    }
  }
}

float dot_iq1_s(const void* w, const void* a, int64_t n) {
  return dot_iq_blocks<BlockIQ1_S>(
      w, a, n, 0.125f, stored_d, [](const BlockIQ1_S& block, const int8_t* act, int sub) {
        const int g = 4 * sub;
        const __m256i grid =
            _mm256_set_epi64x(static_cast<int64_t>(kIq1sGrid[iq1s_index(block, g + 3)]),
                              static_cast<int64_t>(kIq1sGrid[iq1s_index(block, g + 2)]),
                              static_cast<int64_t>(kIq1sGrid[iq1s_index(block, g + 1)]),
                              static_cast<int64_t>(kIq1sGrid[iq1s_index(block, g)]));
        const uint16_t high = block.qh[sub];
        const __m256i products =
            ternary_products(grid, _mm256_set1_epi64x(delta_bytes((high & 0x8000) != 0)), act);
        const int scale = 2 * ((high >> 12) & 7) + 1;
        return _mm256_madd_epi16(products, _mm256_set1_epi16(static_cast<int16_t>(scale)));
      });
}

void dequantize_iq1_m(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ1_M*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ1_M& block = blocks[b];
    const float d = iq1m_d(block);
    for (int group = 0; group < 32; ++group) {
      const float dl = d * float(2 * iq1m_scale(block, group / 4, (group % 4) / 2) + 1);
      const uint8_t nibble = iq1m_nibble(block, group);
      const float delta = (nibble & 8) != 0 ? -kIq1Delta : kIq1Delta;
      store_ternary_group(dst + b * kBlockK + 8 * group, dl, delta,
                          kIq1sGrid[block.qs[group] | (nibble & 7) << 8]);
    }
  }
}

float dot_iq1_m(const void* w, const void* a, int64_t n) {
  const auto block_d = [](const BlockIQ1_M& block) { return iq1m_d(block); };
  return dot_iq_blocks<BlockIQ1_M>(
      w, a, n, 0.125f, block_d, [](const BlockIQ1_M& block, const int8_t* act, int sub) {
        uint64_t grid[4];
        int64_t delta[4];
        for (int k = 0; k < 4; ++k) {
          const int group = 4 * sub + k;
          const uint8_t nibble = iq1m_nibble(block, group);
          grid[k] = kIq1sGrid[block.qs[group] | (nibble & 7) << 8];
          delta[k] = delta_bytes((nibble & 8) != 0);
        }
        const __m256i products = ternary_products(
            _mm256_set_epi64x(static_cast<int64_t>(grid[3]), static_cast<int64_t>(grid[2]),
                              static_cast<int64_t>(grid[1]), static_cast<int64_t>(grid[0])),
            _mm256_set_epi64x(delta[3], delta[2], delta[1], delta[0]), act);
        // i16 lanes 0-7 hold weights 0-15 (groups 0-1), lanes 8-15 weights 16-31 (groups 2-3).
        const __m256i scale = _mm256_set_m128i(
            _mm_set1_epi16(static_cast<int16_t>(2 * iq1m_scale(block, sub, 1) + 1)),
            _mm_set1_epi16(static_cast<int16_t>(2 * iq1m_scale(block, sub, 0) + 1)));
        return _mm256_madd_epi16(products, scale);
      });
}

}  // namespace strata::quant::avx2
