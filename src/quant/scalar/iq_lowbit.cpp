// Scalar dequantization and dot products of the low-bit IQ formats (IQ2_XXS, IQ2_S, IQ3_XXS,
// IQ3_S, IQ1_S, IQ1_M): the specification, written from the block layouts in
// iq_lowbit_blocks.h. Every block is eight 32-weight sub-blocks of four 8-weight groups.
//
// Each type has one decoder that yields a group's eight signed integer grid values (sign
// applied) and the sub-block's integer scale; dequantize turns them into floats with ggml's
// float expressions (so the results are bit-identical to llama.cpp's), dot accumulates the
// integer sums exactly and applies d·d_act once per block, in double.
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq2xs_tables.h"
#include "quant/iq_lowbit_blocks.h"
#include "quant/iq_lowbit_tables.h"
#include "quant/kernels.h"
#include "util/fp16.h"

namespace strata::quant::scalar {
namespace {

// Element j of a packed u64 grid point (unsigned magnitudes) with sign bit j of `signs`.
void unpack_signed_u64(uint64_t grid, uint8_t signs, int values[8]) {
  for (int j = 0; j < 8; ++j) {
    const int magnitude = static_cast<uint8_t>(grid >> (8 * j));
    values[j] = (signs >> j) & 1 ? -magnitude : magnitude;
  }
}

// Two packed u32 4-D points (elements 0-3, 4-7) with sign bit j of `signs`.
void unpack_signed_u32_pair(uint32_t first, uint32_t second, uint8_t signs, int values[8]) {
  for (int j = 0; j < 4; ++j) {
    const int a = static_cast<uint8_t>(first >> (8 * j));
    const int b = static_cast<uint8_t>(second >> (8 * j));
    values[j] = (signs >> j) & 1 ? -a : a;
    values[j + 4] = (signs >> (j + 4)) & 1 ? -b : b;
  }
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

int group_dot(const int values[8], const int8_t* act) {
  int sum = 0;
  for (int j = 0; j < 8; ++j) sum += values[j] * act[j];
  return sum;
}

// ---- IQ2_XXS: db = d·(0.5 + s)·0.25 = d·(2s + 1)/8 per sub-block.
int iq2xxs_scale(const BlockIQ2_XXS& block, int sub) {
  return static_cast<int>(load_u32(reinterpret_cast<const uint8_t*>(block.qs) + 8 * sub + 4) >> 28);
}
void iq2xxs_group(const BlockIQ2_XXS& block, int group, int values[8]) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(block.qs) + 8 * (group / 4);
  const uint32_t sign_word = load_u32(bytes + 4);
  const int g = group % 4;
  unpack_signed_u64(kIq2xxsGrid[bytes[g]], kIq2xsSigns[(sign_word >> (7 * g)) & 127], values);
}

// ---- IQ2_S: db = d·(0.5 + nibble)·0.25 per 16 weights.
int iq2s_scale(const BlockIQ2_S& block, int group) {
  const uint8_t byte = block.scales[group / 4];
  return (group % 4) < 2 ? (byte & 15) : (byte >> 4);
}
void iq2s_group(const BlockIQ2_S& block, int group, int values[8]) {
  const int g = group % 4;
  const int index = block.qs[group] | ((block.qh[group / 4] >> (2 * g)) & 3) << 8;
  unpack_signed_u64(kIq2sGrid[index], block.qs[32 + group], values);
}

// ---- IQ3_XXS: db = d·(0.5 + s)·0.5 = d·(2s + 1)/4 per sub-block.
int iq3xxs_scale(const BlockIQ3_XXS& block, int sub) {
  return static_cast<int>(load_u32(block.qs + 64 + 4 * sub) >> 28);
}
void iq3xxs_group(const BlockIQ3_XXS& block, int group, int values[8]) {
  const uint32_t sign_word = load_u32(block.qs + 64 + 4 * (group / 4));
  const uint8_t signs = kIq2xsSigns[(sign_word >> (7 * (group % 4))) & 127];
  unpack_signed_u32_pair(kIq3xxsGrid[block.qs[2 * group]], kIq3xxsGrid[block.qs[2 * group + 1]],
                         signs, values);
}

// ---- IQ3_S: db = d·(1 + 2·nibble) per sub-block.
int iq3s_scale(const BlockIQ3_S& block, int sub) {
  const uint8_t byte = block.scales[sub / 2];
  return sub % 2 == 0 ? (byte & 15) : (byte >> 4);
}
void iq3s_group(const BlockIQ3_S& block, int group, int values[8]) {
  const int sub = group / 4;
  const int point = 2 * (group % 4);  // index of the group's first 4-D point in the sub-block
  const uint8_t high = block.qh[sub];
  const int first = block.qs[2 * group] | ((high >> point) & 1) << 8;
  const int second = block.qs[2 * group + 1] | ((high >> (point + 1)) & 1) << 8;
  unpack_signed_u32_pair(kIq3sGrid[first], kIq3sGrid[second], block.signs[group], values);
}

// ---- IQ1_S / IQ1_M: y = dl·(grid + delta), delta = ±1/8; grid values are signed bytes.
void unpack_ternary(uint64_t grid, int values[8]) {
  for (int j = 0; j < 8; ++j)
    values[j] = static_cast<int8_t>(static_cast<uint8_t>(grid >> (8 * j)));
}
int iq1s_scale(const BlockIQ1_S& block, int sub) {
  return (block.qh[sub] >> 12) & 7;
}
bool iq1s_delta_negative(const BlockIQ1_S& block, int sub) {
  return (block.qh[sub] & 0x8000) != 0;
}
void iq1s_group(const BlockIQ1_S& block, int group, int values[8]) {
  const int index = block.qs[group] | ((block.qh[group / 4] >> (3 * (group % 4))) & 7) << 8;
  unpack_ternary(kIq1sGrid[index], values);
}

uint16_t iq1m_scale_word(const BlockIQ1_M& block, int word) {
  uint16_t v;
  std::memcpy(&v, block.scales + 2 * word, 2);
  return v;
}
uint16_t iq1m_d_bits(const BlockIQ1_M& block) {
  return static_cast<uint16_t>(
      (iq1m_scale_word(block, 0) >> 12) | ((iq1m_scale_word(block, 1) >> 8) & 0x00f0) |
      ((iq1m_scale_word(block, 2) >> 4) & 0x0f00) | (iq1m_scale_word(block, 3) & 0xf000));
}
// 3-bit scale of group `group` (groups 0-1 of a sub-block use the low field, 2-3 the high one).
int iq1m_scale(const BlockIQ1_M& block, int group) {
  const int sub = group / 4;
  const int shift = 6 * (sub % 2) + ((group % 4) < 2 ? 0 : 3);
  return (iq1m_scale_word(block, sub / 2) >> shift) & 7;
}
uint8_t iq1m_high_nibble(const BlockIQ1_M& block, int group) {
  const uint8_t byte = block.qh[group / 2];
  return group % 2 == 0 ? (byte & 15) : (byte >> 4);
}
bool iq1m_delta_negative(const BlockIQ1_M& block, int group) {
  return (iq1m_high_nibble(block, group) & 8) != 0;
}
void iq1m_group(const BlockIQ1_M& block, int group, int values[8]) {
  const int index = block.qs[group] | (iq1m_high_nibble(block, group) & 7) << 8;
  unpack_ternary(kIq1sGrid[index], values);
}

int act_sum8(const int8_t* act) {
  int sum = 0;
  for (int j = 0; j < 8; ++j) sum += act[j];
  return sum;
}

// The block loops shared by the formats. A Format names its Block and gives
//   group(block, group, values): the group's eight signed grid values,
//   odd_scale(block, group): the group's integer scale multiplier (2s + 1 or 1 + 2s),
// and for the signed-grid formats (IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S)
//   group_scale(d, block, group): db, in ggml's float expression,
//   kDotFactor: the constant that turns Σ odd_scale·Σ value·a into the block's f64 dot share;
// for the ternary formats (IQ1_S, IQ1_M)
//   d(block), delta_negative(block, group): the block scale and the sign of the group's ±1/8.
template <typename Format>
void dequantize_signed_grid(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const typename Format::Block*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    for (int group = 0; group < 32; ++group) {
      const float db = Format::group_scale(d, blocks[b], group);
      int values[8];
      Format::group(blocks[b], group, values);
      for (int j = 0; j < 8; ++j) dst[b * kBlockK + 8 * group + j] = db * float(values[j]);
    }
  }
}

template <typename Format>
float dot_signed_grid(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const typename Format::Block*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    int64_t scaled = 0;  // Σ odd_scale·Σ value·a
    for (int group = 0; group < 32; ++group) {
      int values[8];
      Format::group(blocks[b], group, values);
      scaled +=
          int64_t(Format::odd_scale(blocks[b], group)) * group_dot(values, acts[b].qs + 8 * group);
    }
    sum += double(f16_to_f32(blocks[b].d)) * acts[b].d * double(scaled) * Format::kDotFactor;
  }
  return static_cast<float>(sum);
}

template <typename Format>
void dequantize_ternary(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const typename Format::Block*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float d = Format::d(blocks[b]);
    for (int group = 0; group < 32; ++group) {
      const float dl = d * float(Format::odd_scale(blocks[b], group));
      const float delta = Format::delta_negative(blocks[b], group) ? -kIq1Delta : kIq1Delta;
      int values[8];
      Format::group(blocks[b], group, values);
      for (int j = 0; j < 8; ++j)
        dst[b * kBlockK + 8 * group + j] = dl * (float(values[j]) + delta);
    }
  }
}

// dl·(g + delta)·a summed: (2s + 1)·(8·Σ g·a ± Σ a)/8, exact in integers.
template <typename Format>
float dot_ternary(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const typename Format::Block*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    int64_t scaled = 0;
    for (int group = 0; group < 32; ++group) {
      int values[8];
      Format::group(blocks[b], group, values);
      const int8_t* act = acts[b].qs + 8 * group;
      const int delta_sum =
          Format::delta_negative(blocks[b], group) ? -act_sum8(act) : act_sum8(act);
      scaled +=
          int64_t(Format::odd_scale(blocks[b], group)) * (8 * group_dot(values, act) + delta_sum);
    }
    sum += double(Format::d(blocks[b])) * acts[b].d * double(scaled) * 0.125;
  }
  return static_cast<float>(sum);
}

struct Iq2xxs {
  using Block = BlockIQ2_XXS;
  static constexpr double kDotFactor = 0.125;
  static float group_scale(float d, const Block& block, int group) {
    return d * (0.5f + iq2xxs_scale(block, group / 4)) * 0.25f;
  }
  static int odd_scale(const Block& block, int group) {
    return 2 * iq2xxs_scale(block, group / 4) + 1;
  }
  static void group(const Block& block, int group, int values[8]) {
    iq2xxs_group(block, group, values);
  }
};

struct Iq2s {
  using Block = BlockIQ2_S;
  static constexpr double kDotFactor = 0.125;
  static float group_scale(float d, const Block& block, int group) {
    return d * (0.5f + iq2s_scale(block, group)) * 0.25f;
  }
  static int odd_scale(const Block& block, int group) { return 2 * iq2s_scale(block, group) + 1; }
  static void group(const Block& block, int group, int values[8]) {
    iq2s_group(block, group, values);
  }
};

struct Iq3xxs {
  using Block = BlockIQ3_XXS;
  static constexpr double kDotFactor = 0.25;
  static float group_scale(float d, const Block& block, int group) {
    return d * (0.5f + iq3xxs_scale(block, group / 4)) * 0.5f;
  }
  static int odd_scale(const Block& block, int group) {
    return 2 * iq3xxs_scale(block, group / 4) + 1;
  }
  static void group(const Block& block, int group, int values[8]) {
    iq3xxs_group(block, group, values);
  }
};

struct Iq3s {
  using Block = BlockIQ3_S;
  static constexpr double kDotFactor = 1.0;  // x·1.0 is exact: the dot share is d·d_act·scaled
  static float group_scale(float d, const Block& block, int group) {
    return d * float(odd_scale(block, group));
  }
  static int odd_scale(const Block& block, int group) {
    return 1 + 2 * iq3s_scale(block, group / 4);
  }
  static void group(const Block& block, int group, int values[8]) {
    iq3s_group(block, group, values);
  }
};

struct Iq1s {
  using Block = BlockIQ1_S;
  static float d(const Block& block) { return f16_to_f32(block.d); }
  static int odd_scale(const Block& block, int group) {
    return 2 * iq1s_scale(block, group / 4) + 1;
  }
  static bool delta_negative(const Block& block, int group) {
    return iq1s_delta_negative(block, group / 4);
  }
  static void group(const Block& block, int group, int values[8]) {
    iq1s_group(block, group, values);
  }
};

struct Iq1m {
  using Block = BlockIQ1_M;
  static float d(const Block& block) { return f16_to_f32(iq1m_d_bits(block)); }
  static int odd_scale(const Block& block, int group) { return 2 * iq1m_scale(block, group) + 1; }
  static bool delta_negative(const Block& block, int group) {
    return iq1m_delta_negative(block, group);
  }
  static void group(const Block& block, int group, int values[8]) {
    iq1m_group(block, group, values);
  }
};

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) {
  dequantize_signed_grid<Iq2xxs>(src, dst, n);
}
float dot_iq2_xxs(const void* w, const void* a, int64_t n) {
  return dot_signed_grid<Iq2xxs>(w, a, n);
}

void dequantize_iq2_s(const void* src, float* dst, int64_t n) {
  dequantize_signed_grid<Iq2s>(src, dst, n);
}
float dot_iq2_s(const void* w, const void* a, int64_t n) {
  return dot_signed_grid<Iq2s>(w, a, n);
}

void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) {
  dequantize_signed_grid<Iq3xxs>(src, dst, n);
}
float dot_iq3_xxs(const void* w, const void* a, int64_t n) {
  return dot_signed_grid<Iq3xxs>(w, a, n);
}

void dequantize_iq3_s(const void* src, float* dst, int64_t n) {
  dequantize_signed_grid<Iq3s>(src, dst, n);
}
float dot_iq3_s(const void* w, const void* a, int64_t n) {
  return dot_signed_grid<Iq3s>(w, a, n);
}

void dequantize_iq1_s(const void* src, float* dst, int64_t n) {
  dequantize_ternary<Iq1s>(src, dst, n);
}
float dot_iq1_s(const void* w, const void* a, int64_t n) {
  return dot_ternary<Iq1s>(w, a, n);
}

void dequantize_iq1_m(const void* src, float* dst, int64_t n) {
  dequantize_ternary<Iq1m>(src, dst, n);
}
float dot_iq1_m(const void* w, const void* a, int64_t n) {
  return dot_ternary<Iq1m>(w, a, n);
}

}  // namespace strata::quant::scalar
