// The low-bit IQ kernels (IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M):
// - hand-built blocks whose expected floats are worked out here from the block definitions
//   (iq_lowbit_blocks.h) and the grid entries quoted in the comments;
// - the reference dot against a double-precision dot of the dequantized operands;
// - AVX2 against the reference on random blocks (1..N blocks, many seeds, every allowed
//   alignment of weights and activations);
// - dispatch and the API's promises (activation format, no quantizer).
// Tolerances as in kernels_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "iq_lowbit_test_util.h"
#include "quant/iq_lowbit_blocks.h"
#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant_test_util.h"
#include "util/error.h"

namespace strata::quant {
namespace {

using testing::gaussian;
using testing::kIqLowbitTypes;
using testing::kUnitRoundoff;
using testing::make_activation;
using testing::random_iq_row;

constexpr uint16_t kHalfOne = 0x3c00;
constexpr uint16_t kHalfHalf = 0x3800;
constexpr uint16_t kHalfQuarter = 0x3400;
constexpr uint16_t kHalfTiny = 0x0001;  // 2^-24

template <typename Block>
std::vector<float> dequantize_both(GgmlType type, const Block* blocks, int n_blocks) {
  const int n = n_blocks * 256;
  std::vector<float> ref_out(n), fast_out(n);
  ref::dequantize_row(type, blocks, ref_out.data(), n);
  dequantize_row(type, blocks, fast_out.data(), n);
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(std::memcmp(&ref_out[i], &fast_out[i], 4), 0) << "element " << i;
  return ref_out;
}

void put_u32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}

void expect_values(const std::vector<float>& y, int first, std::initializer_list<float> expected) {
  int i = first;
  for (float v : expected) {
    EXPECT_EQ(y[i], v) << "element " << i;
    ++i;
  }
}

TEST(IqLowbitHandBlocks, IQ2_XXS) {
  BlockIQ2_XXS blocks[2];
  std::memset(blocks, 0, sizeof blocks);
  blocks[0].d = kHalfOne;
  auto* bytes = reinterpret_cast<uint8_t*>(blocks[0].qs);
  // Sub-block 0: grid indices 1, 2, 255, 0; sign indices 1, 0, 127, 3; s = 3 -> db = 3.5/4.
  bytes[0] = 1;    // 0x080808080808082b: 43, 8, 8, 8, 8, 8, 8, 8
  bytes[1] = 2;    // 0x0808080808081919: 25, 25, 8, ...
  bytes[2] = 255;  // 0x2b2b2b1908081908: 8, 25, 8, 8, 25, 43, 43, 43
  bytes[3] = 0;    // all 8
  put_u32(bytes + 4, 1u | 0u << 7 | 127u << 14 | 3u << 21 | 3u << 28);
  // Sub-block 7: grid 0, no signs, s = 15 -> db = 15.5/4 = 3.875.
  put_u32(bytes + 60, 15u << 28);
  // Sub-blocks 1-6: s = 0 -> db = 0.125, grid 0 (8) -> 1.0. Block 1: d = 2^-24 -> 2^-24.
  blocks[1].d = kHalfTiny;
  const std::vector<float> y = dequantize_both(GgmlType::IQ2_XXS, blocks, 2);
  // Sign index 1 -> sign byte 0b10000001 (bit 0 plus the parity bit 7).
  expect_values(y, 0, {-37.625f, 7, 7, 7, 7, 7, 7, -7});
  expect_values(y, 8, {21.875f, 21.875f, 7, 7, 7, 7, 7, 7});
  // Sign index 127 -> 0xff: all negative.
  expect_values(y, 16, {-7, -21.875f, -7, -7, -21.875f, -37.625f, -37.625f, -37.625f});
  // Sign index 3 -> 0b00000011 (even parity already).
  expect_values(y, 24, {-7, -7, 7, 7, 7, 7, 7, 7});
  for (int j = 32; j < 224; ++j) EXPECT_EQ(y[j], 1.0f) << j;
  for (int j = 224; j < 256; ++j) EXPECT_EQ(y[j], 31.0f) << j;
  for (int j = 256; j < 512; ++j) EXPECT_EQ(y[j], std::ldexp(1.0f, -24)) << j;
}

TEST(IqLowbitHandBlocks, IQ2_S) {
  BlockIQ2_S block;
  std::memset(&block, 0, sizeof block);
  block.d = kHalfHalf;
  block.scales[0] = 0x21;  // groups 0-1: 0.5·1.5/4 = 0.1875; groups 2-3: 0.5·2.5/4 = 0.3125
  // Grid indices: group 0: 0x300 | 5 = 773, group 1: 1, group 2: 0x300 | 255 = 1023,
  // group 3: 0x100 | 0 = 256 (high bits 2g..2g+1 of qh[0]).
  block.qs[0] = 5;
  block.qs[1] = 1;
  block.qs[2] = 255;
  block.qs[3] = 0;
  block.qh[0] = uint8_t(3 | 0 << 2 | 3 << 4 | 1 << 6);
  block.qs[32] = 0x01;  // sign bytes, bit j negates element j
  block.qs[33] = 0x00;
  block.qs[34] = 0xff;
  block.qs[35] = 0x80;
  const std::vector<float> y = dequantize_both(GgmlType::IQ2_S, &block, 1);
  // 773 = 0x192b08082b190808: 8, 8, 25, 43, 8, 8, 43, 25.
  expect_values(y, 0, {-1.5f, 1.5f, 4.6875f, 8.0625f, 1.5f, 1.5f, 8.0625f, 4.6875f});
  // 1 = 0x080808080808082b.
  expect_values(y, 8, {8.0625f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f});
  // 1023 = all 43, all negative: −0.3125·43.
  for (int j = 16; j < 24; ++j) EXPECT_EQ(y[j], -13.4375f) << j;
  // 256 = 0x0819081919191919: 25, 25, 25, 25, 25, 8, 25, 8; element 7 negative.
  expect_values(y, 24, {7.8125f, 7.8125f, 7.8125f, 7.8125f, 7.8125f, 2.5f, 7.8125f, -2.5f});
  // Other sub-blocks: nibble 0 -> 0.5·0.5/4 = 0.0625, grid 0 (8) -> 0.5.
  for (int j = 32; j < 256; ++j) EXPECT_EQ(y[j], 0.5f) << j;
}

TEST(IqLowbitHandBlocks, IQ3_XXS) {
  BlockIQ3_XXS block;
  std::memset(&block, 0, sizeof block);
  block.d = kHalfOne;
  // Sub-block 0: s = 1 -> db = 1.5/2 = 0.75; sign indices 1 (group 0), 0 (others).
  block.qs[0] = 0;    // 0x04040404: 4, 4, 4, 4
  block.qs[1] = 255;  // 0x3e341c04: 4, 28, 52, 62
  block.qs[2] = 1;    // 0x04040414: 20, 4, 4, 4
  block.qs[3] = 2;    // 0x04040424: 36, 4, 4, 4
  put_u32(block.qs + 64, 1u | 1u << 28);
  const std::vector<float> y = dequantize_both(GgmlType::IQ3_XXS, &block, 1);
  expect_values(y, 0, {-3, 3, 3, 3, 3, 21, 39, -46.5f});  // sign byte 0b10000001
  expect_values(y, 8, {15, 3, 3, 3, 27, 3, 3, 3});
  for (int j = 16; j < 32; ++j) EXPECT_EQ(y[j], 3.0f) << j;
  // Other sub-blocks: s = 0 -> db = 0.25, grid 0 (4) -> 1.0.
  for (int j = 32; j < 256; ++j) EXPECT_EQ(y[j], 1.0f) << j;
}

TEST(IqLowbitHandBlocks, IQ3_S) {
  BlockIQ3_S block;
  std::memset(&block, 0, sizeof block);
  block.d = kHalfQuarter;
  block.scales[0] = 0x31;  // sub-block 0: 0.25·(1 + 2) = 0.75; sub-block 1: 0.25·(1 + 6) = 1.75
  // Group 0: points 0x100 | 0 = 256 and 0x100 | 255 = 511 (qh[0] bits 0 and 1).
  block.qs[0] = 0;
  block.qs[1] = 255;
  block.qh[0] = 0x03;
  block.signs[0] = 0x0f;  // elements 0-3 negative
  // Group 1: points 1 and 0.
  block.qs[2] = 1;
  const std::vector<float> y = dequantize_both(GgmlType::IQ3_S, &block, 1);
  // 256 = 0x05090507: 7, 5, 9, 5; 511 = 0x0f0f0101: 1, 1, 15, 15.
  expect_values(y, 0, {-5.25f, -3.75f, -6.75f, -3.75f, 0.75f, 0.75f, 11.25f, 11.25f});
  // 1 = 0x01010103: 3, 1, 1, 1; 0 = 0x01010101.
  expect_values(y, 8, {2.25f, 0.75f, 0.75f, 0.75f, 0.75f, 0.75f, 0.75f, 0.75f});
  for (int j = 16; j < 32; ++j) EXPECT_EQ(y[j], 0.75f) << j;
  for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 1.75f) << j;
  for (int j = 64; j < 256; ++j) EXPECT_EQ(y[j], 0.25f) << j;  // 0.25·(1 + 0)·1
}

TEST(IqLowbitHandBlocks, IQ1_S) {
  BlockIQ1_S block;
  std::memset(&block, 0, sizeof block);
  block.d = kHalfOne;
  // Sub-block 0: s = 2 -> dl = 5, delta +1/8. Indices: group 0: 0, group 1: 1,
  // group 2: 7 << 8 | 255 = 2047, group 3: 1 << 8 | 0 = 256.
  block.qs[1] = 1;
  block.qs[2] = 255;
  block.qh[0] = uint16_t(2 << 12 | 7 << 6 | 1 << 9);
  // Sub-block 1: s = 0 (dl = 1), delta −1/8 (bit 15).
  block.qh[1] = 0x8000;
  const std::vector<float> y = dequantize_both(GgmlType::IQ1_S, &block, 1);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y[j], -4.375f) << j;  // grid 0: all −1 -> 5·(−7/8)
  expect_values(y, 8, {5.625f, -4.375f, -4.375f, -4.375f, -4.375f, -4.375f, -4.375f, -4.375f});
  for (int j = 16; j < 24; ++j) EXPECT_EQ(y[j], 5.625f) << j;  // 2047: all +1 -> 5·(9/8)
  // 256 = 0xff00ff01000100ff: −1, 0, +1, 0, +1, −1, 0, −1.
  expect_values(y, 24, {-4.375f, 0.625f, 5.625f, 0.625f, 5.625f, -4.375f, 0.625f, -4.375f});
  for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], -1.125f) << j;   // 1·(−1 − 1/8)
  for (int j = 64; j < 256; ++j) EXPECT_EQ(y[j], -0.875f) << j;  // 1·(−1 + 1/8)
}

TEST(IqLowbitHandBlocks, IQ1_M) {
  BlockIQ1_M block;
  std::memset(&block, 0, sizeof block);
  // d = 1.0 = 0x3c00: nibbles 0, 0, 0xc, 0x3 in the tops of scale words 0, 1, 2, 3.
  // Word 0 also holds sub-block 0 (bits 0-2: s = 2 -> dl 5; bits 3-5: s = 1 -> dl 3) and
  // sub-block 1 (bits 6-8: s = 0 -> 1; bits 9-11: s = 7 -> 15).
  const uint16_t words[4] = {uint16_t(2 | 1 << 3 | 7 << 9), 0, 0xc000, 0x3000};
  std::memcpy(block.scales, words, 8);
  // Sub-block 0: group 0 index 0, delta +; group 1 index 7 << 8 | 255 = 2047, delta −
  // (qh[0] high nibble 0xf); group 2 index 1 << 8 | 0 = 256, delta +; group 3 index 1, delta −.
  block.qs[1] = 255;
  block.qs[3] = 1;
  block.qh[0] = 0xf0;
  block.qh[1] = 0x81;
  const std::vector<float> y = dequantize_both(GgmlType::IQ1_M, &block, 1);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y[j], -4.375f) << j;  // 5·(−1 + 1/8)
  for (int j = 8; j < 16; ++j) EXPECT_EQ(y[j], 4.375f) << j;  // 5·(1 − 1/8)
  // 256: −1, 0, +1, 0, +1, −1, 0, −1 times 3, plus 3/8.
  expect_values(y, 16, {-2.625f, 0.375f, 3.375f, 0.375f, 3.375f, -2.625f, 0.375f, -2.625f});
  // 1: +1 then −1 ×7, delta −1/8, dl 3.
  expect_values(y, 24, {2.625f, -3.375f, -3.375f, -3.375f, -3.375f, -3.375f, -3.375f, -3.375f});
  for (int j = 32; j < 48; ++j) EXPECT_EQ(y[j], -0.875f) << j;
  for (int j = 48; j < 64; ++j) EXPECT_EQ(y[j], -13.125f) << j;  // 15·(−7/8)
  for (int j = 64; j < 256; ++j) EXPECT_EQ(y[j], -0.875f) << j;
}

// A hand-checked dot: the IQ1_S block above against activations d_act = 0.5, q = 1 for the first
// 8 and q = −2 for the next 8, zero elsewhere: 0.5·(8·(−4.375) − 2·(5.625 − 7·4.375)) = 7.5.
TEST(IqLowbitHandBlocks, IQ1_SDot) {
  BlockIQ1_S block;
  std::memset(&block, 0, sizeof block);
  block.d = kHalfOne;
  block.qs[1] = 1;
  block.qs[2] = 255;
  block.qh[0] = uint16_t(2 << 12 | 7 << 6 | 1 << 9);
  BlockQ8_K act;
  std::memset(&act, 0, sizeof act);
  act.d = 0.5f;
  for (int j = 0; j < 8; ++j) act.qs[j] = 1;
  for (int j = 8; j < 16; ++j) act.qs[j] = -2;
  EXPECT_EQ(ref::dot(GgmlType::IQ1_S, &block, &act, 256), 7.5f);
  EXPECT_EQ(dot(GgmlType::IQ1_S, &block, &act, 256), 7.5f);
}

struct Avx2Pair {
  GgmlType type;
  DequantizeFn scalar_dequantize;
  DequantizeFn avx2_dequantize;
  DotFn scalar_dot;
  DotFn avx2_dot;
};

const Avx2Pair kAvx2Pairs[] = {
    {GgmlType::IQ2_XXS, scalar::dequantize_iq2_xxs, avx2::dequantize_iq2_xxs, scalar::dot_iq2_xxs,
     avx2::dot_iq2_xxs},
    {GgmlType::IQ2_S, scalar::dequantize_iq2_s, avx2::dequantize_iq2_s, scalar::dot_iq2_s,
     avx2::dot_iq2_s},
    {GgmlType::IQ3_XXS, scalar::dequantize_iq3_xxs, avx2::dequantize_iq3_xxs, scalar::dot_iq3_xxs,
     avx2::dot_iq3_xxs},
    {GgmlType::IQ3_S, scalar::dequantize_iq3_s, avx2::dequantize_iq3_s, scalar::dot_iq3_s,
     avx2::dot_iq3_s},
    {GgmlType::IQ1_S, scalar::dequantize_iq1_s, avx2::dequantize_iq1_s, scalar::dot_iq1_s,
     avx2::dot_iq1_s},
    {GgmlType::IQ1_M, scalar::dequantize_iq1_m, avx2::dequantize_iq1_m, scalar::dot_iq1_m,
     avx2::dot_iq1_m},
};

#define SKIP_WITHOUT_AVX2()                                                \
  if (!cpu_has_avx2())                                                     \
  GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C/BMI1; AVX2 kernels cannot run " \
                  "here"

// S = Σ |w_i|·|a_i| over the dequantized operands. Every kernel sums exact integers per block
// (for IQ1, (8·g ± 1)·a, whose magnitude is 8·|w|·|a|/dl), so no cancellation hides in S.
double magnitude_sum(const std::vector<float>& w, const std::vector<float>& a) {
  double sum = 0.0;
  for (size_t i = 0; i < w.size(); ++i) sum += std::fabs(double(w[i])) * std::fabs(double(a[i]));
  return sum;
}

// A buffer whose data() sits `offset` bytes past a 64-byte boundary.
struct OffsetBuffer {
  std::vector<uint8_t> storage;
  uint8_t* data = nullptr;
  OffsetBuffer(const std::vector<uint8_t>& bytes, size_t offset)
      : storage(bytes.size() + 64 + offset) {
    const auto base = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + ((64 - base % 64) % 64) + offset;
    if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
  }
};

TEST(IqLowbitKernels, Avx2DequantizeIsBitwiseEqual) {
  SKIP_WITHOUT_AVX2();
  for (const Avx2Pair& pair : kAvx2Pairs) {
    for (int n_blocks = 1; n_blocks <= 12; ++n_blocks) {
      const int64_t n = 256 * int64_t(n_blocks);
      for (uint32_t seed = 0; seed < 16; ++seed) {
        const size_t offset = 2 * (seed % 16);  // every 2-byte alignment within 32 bytes
        const OffsetBuffer row(random_iq_row(pair.type, n, seed * 7919 + uint32_t(n)), offset);
        std::vector<float> expected(n), actual(n);
        pair.scalar_dequantize(row.data, expected.data(), n);
        pair.avx2_dequantize(row.data, actual.data(), n);
        ASSERT_EQ(std::memcmp(expected.data(), actual.data(), size_t(n) * 4), 0)
            << type_name(pair.type) << " blocks=" << n_blocks << " seed=" << seed;
      }
    }
  }
}

TEST(IqLowbitKernels, Avx2DotMatchesReferenceWithinRoundingBound) {
  SKIP_WITHOUT_AVX2();
  for (const Avx2Pair& pair : kAvx2Pairs) {
    for (int n_blocks = 1; n_blocks <= 16; ++n_blocks) {
      const int64_t n = 256 * int64_t(n_blocks);
      for (uint32_t seed = 0; seed < 16; ++seed) {
        const OffsetBuffer row(random_iq_row(pair.type, n, seed * 104729 + uint32_t(n)),
                               2 * (seed % 16));
        const testing::Activation act = make_activation(pair.type, gaussian(n, seed + 1000));
        const OffsetBuffer act_bytes(act.bytes, 4 * (seed % 8));
        std::vector<float> w(n);
        pair.scalar_dequantize(row.data, w.data(), n);
        const double bound =
            double(n_blocks + 16) * 2 * kUnitRoundoff * magnitude_sum(w, act.values);
        const float expected = pair.scalar_dot(row.data, act_bytes.data, n);
        const float actual = pair.avx2_dot(row.data, act_bytes.data, n);
        ASSERT_LE(std::fabs(double(expected) - double(actual)), bound)
            << type_name(pair.type) << " blocks=" << n_blocks << " seed=" << seed
            << " ref=" << expected << " avx2=" << actual;
      }
    }
  }
}

TEST(IqLowbitKernels, ReferenceDotMatchesDoubleDotOfDequantizedOperands) {
  for (GgmlType type : kIqLowbitTypes) {
    for (int n_blocks : {1, 2, 3, 5, 10}) {
      const int64_t n = 256 * int64_t(n_blocks);
      for (uint32_t seed = 0; seed < 12; ++seed) {
        const std::vector<uint8_t> row = random_iq_row(type, n, seed * 31 + uint32_t(n));
        const testing::Activation act =
            make_activation(type, gaussian(n, seed + 7, 0.5f + float(seed)));
        std::vector<float> w(n);
        ref::dequantize_row(type, row.data(), w.data(), n);
        double exact = 0.0;
        for (int64_t i = 0; i < n; ++i) exact += double(w[i]) * double(act.values[i]);
        const double bound = 8 * kUnitRoundoff * magnitude_sum(w, act.values);
        const float got = ref::dot(type, row.data(), act.bytes.data(), n);
        ASSERT_LE(std::fabs(double(got) - exact), bound)
            << type_name(type) << " blocks=" << n_blocks << " seed=" << seed << " got=" << got
            << " exact=" << exact;
      }
    }
  }
}

// Random blocks must decode to finite values of the magnitude the format allows, and the scales
// must matter: catches a kernel that reads the wrong bytes (e.g. all-zero output).
TEST(IqLowbitKernels, RandomBlocksDecodeToFiniteNonTrivialValues) {
  for (GgmlType type : kIqLowbitTypes) {
    const int64_t n = 256 * 8;
    const std::vector<uint8_t> row = random_iq_row(type, n, 4242);
    std::vector<float> w(n);
    ref::dequantize_row(type, row.data(), w.data(), n);
    int nonzero = 0;
    for (float v : w) {
      ASSERT_TRUE(std::isfinite(v)) << type_name(type);
      nonzero += v != 0.0f;
    }
    EXPECT_GT(nonzero, n / 2) << type_name(type);
  }
}

TEST(IqLowbitDispatch, DispatchedKernelsMatchTheirLevel) {
  const bool avx2_active = active_kernel_level() != KernelLevel::Scalar;
  for (GgmlType type : kIqLowbitTypes) {
    EXPECT_TRUE(type_traits(type).has_kernels) << type_name(type);
    EXPECT_EQ(activation_type(type), GgmlType::Q8_K);
    EXPECT_EQ(activation_row_bytes(type, 512), 2u * 292u);
    const int64_t n = 1024;
    const std::vector<uint8_t> row = random_iq_row(type, n, 99);
    const std::vector<float> x = gaussian(n, 5);
    std::vector<uint8_t> act_ref(activation_row_bytes(type, n)), act_fast(act_ref.size());
    ref::quantize_activation(type, x.data(), act_ref.data(), n);
    quantize_activation(type, x.data(), act_fast.data(), n);
    EXPECT_EQ(act_ref, act_fast) << type_name(type);
    std::vector<float> w_ref(n), w_fast(n);
    ref::dequantize_row(type, row.data(), w_ref.data(), n);
    dequantize_row(type, row.data(), w_fast.data(), n);
    EXPECT_EQ(std::memcmp(w_ref.data(), w_fast.data(), size_t(n) * 4), 0) << type_name(type);
    const float fast = dot(type, row.data(), act_ref.data(), n);
    EXPECT_EQ(testing::float_bits(dot_kernel(type)(row.data(), act_ref.data(), n)),
              testing::float_bits(fast));
    float expected = ref::dot(type, row.data(), act_ref.data(), n);
    for (const Avx2Pair& pair : kAvx2Pairs) {
      if (pair.type == type && avx2_active) expected = pair.avx2_dot(row.data(), act_ref.data(), n);
    }
    EXPECT_EQ(testing::float_bits(fast), testing::float_bits(expected)) << type_name(type);
  }
}

TEST(IqLowbitDispatch, QuantizeRowThrowsNamingTheType) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buffer(1024);
  for (GgmlType type : kIqLowbitTypes) {
    for (bool reference : {false, true}) {
      try {
        if (reference) {
          ref::quantize_row(type, x.data(), buffer.data(), 256);
        } else {
          quantize_row(type, x.data(), buffer.data(), 256);
        }
        FAIL() << "expected strata::Error for " << type_name(type);
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(std::string(type_name(type))), std::string::npos) << message;
        EXPECT_NE(message.find("importance matrix"), std::string::npos) << message;
      }
    }
  }
}

TEST(IqLowbitDispatch, TraitsMatchBlockLayouts) {
  EXPECT_EQ(type_traits(GgmlType::IQ2_XXS).block_bytes, sizeof(BlockIQ2_XXS));
  EXPECT_EQ(type_traits(GgmlType::IQ2_S).block_bytes, sizeof(BlockIQ2_S));
  EXPECT_EQ(type_traits(GgmlType::IQ3_XXS).block_bytes, sizeof(BlockIQ3_XXS));
  EXPECT_EQ(type_traits(GgmlType::IQ3_S).block_bytes, sizeof(BlockIQ3_S));
  EXPECT_EQ(type_traits(GgmlType::IQ1_S).block_bytes, sizeof(BlockIQ1_S));
  EXPECT_EQ(type_traits(GgmlType::IQ1_M).block_bytes, sizeof(BlockIQ1_M));
  for (GgmlType type : kIqLowbitTypes) EXPECT_EQ(type_traits(type).block_elems, 256);
}

}  // namespace
}  // namespace strata::quant
