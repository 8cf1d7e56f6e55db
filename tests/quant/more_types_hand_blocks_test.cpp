// Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K, Q5_K and IQ4_XS blocks built byte by byte, checked against values
// worked out by hand from the block definitions (ggml-common.h; comments give the arithmetic),
// never from the implementation. Each block goes through ref:: and the dispatched (AVX2) path.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace strata::quant {
namespace {

constexpr uint16_t kHalfOne = 0x3c00;       // 1.0
constexpr uint16_t kHalfTwo = 0x4000;       // 2.0
constexpr uint16_t kHalfHalf = 0x3800;      // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;   // 0.25
constexpr uint16_t kHalfMinusOne = 0xbc00;  // -1.0
// The IQ4_NL codebook typed in again from ggml-common.h, independent of kIq4nlValues.
constexpr int kCodebook[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

template <typename Block>
std::vector<float> dequantize_both(GgmlType type, const Block* blocks, int n_blocks) {
  const int n = n_blocks * int(type_traits(type).block_elems);
  std::vector<float> ref_out(n), fast_out(n);
  ref::dequantize_row(type, blocks, ref_out.data(), n);
  dequantize_row(type, blocks, fast_out.data(), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(ref_out[i], fast_out[i]) << "element " << i;
  return ref_out;
}

TEST(QuantMoreHandBlocks, Q4_1) {
  BlockQ4_1 block;
  block.d = kHalfTwo;
  block.m = kHalfMinusOne;
  for (int j = 0; j < 16; ++j) block.qs[j] = uint8_t(j | ((15 - j) << 4));
  const std::vector<float> y = dequantize_both(GgmlType::Q4_1, &block, 1);
  EXPECT_EQ(y[0], -1.0f);   // 2·0 − 1
  EXPECT_EQ(y[15], 29.0f);  // 2·15 − 1
  EXPECT_EQ(y[16], 29.0f);  // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -1.0f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * j - 1.0f);
    EXPECT_EQ(y[16 + j], 2.0f * (15 - j) - 1.0f);
  }
}

TEST(QuantMoreHandBlocks, Q5_0) {
  BlockQ5_0 blocks[2];
  for (BlockQ5_0& b : blocks) {
    for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  }
  // Block 0: d = 0.5, qh = 0xFFFF0000 (elements 16-31 get +16). Block 1: d = 1, qh = 0x0000FFFF.
  blocks[0].d = kHalfHalf;
  const uint8_t qh0[4] = {0x00, 0x00, 0xff, 0xff};
  std::memcpy(blocks[0].qh, qh0, 4);
  blocks[1].d = kHalfOne;
  const uint8_t qh1[4] = {0xff, 0xff, 0x00, 0x00};
  std::memcpy(blocks[1].qh, qh1, 4);
  const std::vector<float> y = dequantize_both(GgmlType::Q5_0, blocks, 2);
  EXPECT_EQ(y[0], -8.0f);   // 0.5·(0 − 16)
  EXPECT_EQ(y[16], 7.5f);   // 0.5·((15 | 16) − 16)
  EXPECT_EQ(y[32], 0.0f);   // 1·((0 | 16) − 16)
  EXPECT_EQ(y[48], -1.0f);  // 1·(15 − 16)
  EXPECT_EQ(y[63], -16.0f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 16));
    EXPECT_EQ(y[16 + j], 0.5f * (15 - j));
    EXPECT_EQ(y[32 + j], float(j));
    EXPECT_EQ(y[48 + j], float(-1 - j));
  }
}

TEST(QuantMoreHandBlocks, Q5_1) {
  BlockQ5_1 block;
  block.d = kHalfQuarter;
  block.m = kHalfOne;
  std::memset(block.qs, 0xff, 16);
  const uint8_t qh[4] = {0x01, 0x00, 0x00, 0x80};  // bits 0 and 31
  std::memcpy(block.qh, qh, 4);
  const std::vector<float> y = dequantize_both(GgmlType::Q5_1, &block, 1);
  EXPECT_EQ(y[0], 8.75f);  // 0.25·31 + 1
  EXPECT_EQ(y[31], 8.75f);
  for (int j = 1; j < 31; ++j) EXPECT_EQ(y[j], 4.75f) << j;  // 0.25·15 + 1
}

TEST(QuantMoreHandBlocks, IQ4_NL) {
  BlockIQ4_NL block;
  block.d = kHalfTwo;
  for (int j = 0; j < 16; ++j) block.qs[j] = uint8_t(j | ((15 - j) << 4));
  const std::vector<float> y = dequantize_both(GgmlType::IQ4_NL, &block, 1);
  EXPECT_EQ(y[0], -254.0f);  // 2·(−127)
  EXPECT_EQ(y[8], 2.0f);     // 2·1
  EXPECT_EQ(y[15], 226.0f);  // 2·113
  EXPECT_EQ(y[16], 226.0f);
  EXPECT_EQ(y[31], -254.0f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * kCodebook[j]);
    EXPECT_EQ(y[16 + j], 2.0f * kCodebook[15 - j]);
  }
}

TEST(QuantMoreHandBlocks, Q3_K) {
  BlockQ3_K block;
  block.d = kHalfOne;
  // Stored 6-bit scales s_k = 33 (scale +1) except s_5 = 0 (scale −32) and s_12 = 63 (+31).
  // Bytes 0-7: low nibble of s_k | low nibble of s_{k+8} << 4: 33 → 1, 0 → 0, 63 → 15.
  // Bytes 8-11: byte 8+i holds the top 2 bits of s_i, s_{i+4}, s_{i+8}, s_{i+12} at bits 0, 2, 4, 6
  // (33 → 2, 0 → 0, 63 → 3): i=0: 2,2,2,3 = 0xEA; i=1: 2,0,2,2 = 0xA2; i=2, 3: 0xAA.
  const uint8_t scales[12] = {0x11, 0x11, 0x11, 0x11, 0xF1, 0x10,
                              0x11, 0x11, 0xEA, 0xA2, 0xAA, 0xAA};
  std::memcpy(block.scales, scales, 12);
  // Element 128h + 32j + 16p + l: low bits (qs[32h + 16p + l] >> 2j) & 3, high bit
  // hmask[16p + l] bit 4h + j (set: no −4).
  std::memset(block.qs, 0xE4, 32);          // half 0: steps 0..3 hold 0, 1, 2, 3
  std::memset(block.qs + 32, 0x1B, 32);     // half 1: steps 0..3 hold 3, 2, 1, 0
  std::memset(block.hmask, 0x0F, 16);       // part 0: high bit set in half 0 only
  std::memset(block.hmask + 16, 0xF0, 16);  // part 1: high bit set in half 1 only
  const std::vector<float> y = dequantize_both(GgmlType::Q3_K, &block, 1);
  for (int j = 0; j < 4; ++j) {
    for (int l = 0; l < 16; ++l) {
      // half 0, part 0: q = j (sub-block 2j, scale 1).
      EXPECT_EQ(y[32 * j + l], float(j)) << j << " " << l;
      // half 0, part 1: q = j − 4, sub-block 2j + 1; sub-block 5 (j = 2) has scale −32.
      EXPECT_EQ(y[32 * j + 16 + l], (j == 2 ? -32.0f : 1.0f) * float(j - 4)) << j << " " << l;
      // half 1, part 0: q = (3 − j) − 4, sub-block 8 + 2j; sub-block 12 (j = 2) has scale 31.
      EXPECT_EQ(y[128 + 32 * j + l], (j == 2 ? 31.0f : 1.0f) * float(-1 - j)) << j << " " << l;
      // half 1, part 1: q = 3 − j, sub-block 9 + 2j, scale 1.
      EXPECT_EQ(y[128 + 32 * j + 16 + l], float(3 - j)) << j << " " << l;
    }
  }
  EXPECT_EQ(y[64 + 16], 64.0f);    // −32·(2 − 4)
  EXPECT_EQ(y[128 + 64], -93.0f);  // 31·(−3)
}

TEST(QuantMoreHandBlocks, Q5_K) {
  BlockQ5_K block;
  block.d = kHalfOne;
  block.dmin = kHalfHalf;
  // Q4_K packing of scales {1..8} and mins {0, 1, 0, 1, 0, 1, 0, 1}: bytes 0-3 = sc0..3, bytes
  // 4-7 = m0..3 (no top bits: all < 16), bytes 8-11 = sc4..7 | m4..7 << 4.
  const uint8_t scales[12] = {1, 2, 3, 4, 0, 1, 0, 1, 0x05, 0x16, 0x07, 0x18};
  std::memcpy(block.scales, scales, 12);
  std::memset(block.qs, 0x21, 128);      // low nibble 1, high nibble 2
  std::memset(block.qh, 0x55, 16);       // l < 16: bits 0, 2, 4, 6 (low nibbles +16)
  std::memset(block.qh + 16, 0xAA, 16);  // l ≥ 16: bits 1, 3, 5, 7 (high nibbles +16)
  const std::vector<float> y = dequantize_both(GgmlType::Q5_K, &block, 1);
  // Element 64c + 32u + l: q = (u ? 2 : 1) + 16·[bit 2c+u of qh[l]], y = sc·q − 0.5·min.
  EXPECT_EQ(y[0], 17.0f);               // c=0, u=0, l=0: 1·17 − 0
  EXPECT_EQ(y[32], 3.5f);               // c=0, u=1, l=0: 2·2 − 0.5
  EXPECT_EQ(y[192 + 32 + 20], 143.5f);  // c=3, u=1, l=20: 8·18 − 0.5
  for (int c = 0; c < 4; ++c) {
    for (int u = 0; u < 2; ++u) {
      for (int l = 0; l < 32; ++l) {
        const bool high = (u == 0) == (l < 16);
        const int q = (u ? 2 : 1) + (high ? 16 : 0);
        const float sc = float(2 * c + u + 1);
        EXPECT_EQ(y[64 * c + 32 * u + l], sc * float(q) - 0.5f * float(u)) << c << u << l;
      }
    }
  }
}

TEST(QuantMoreHandBlocks, IQ4_XS) {
  BlockIQ4_XS block;
  block.d = kHalfHalf;
  // Stored scales ls = {33, 31, 0, 63, 32, 40, 34, 35} → dl = 0.5·(ls − 32) =
  // {0.5, −0.5, −16, 15.5, 0, 4, 1, 1.5}. Low nibbles {1, 15, 0, 15, 0, 8, 2, 3}, two per byte;
  // top bits {2, 1, 0, 3, 2, 2, 2, 2} at bits 2·ib: 2 + 4 + 0 + 192 + 512 + 2048 + 8192 + 32768.
  const uint8_t scales_l[4] = {0xF1, 0xF0, 0x80, 0x32};
  std::memcpy(block.scales_l, scales_l, 4);
  block.scales_h = 43718;
  for (int ib = 0; ib < 8; ++ib) {
    for (int j = 0; j < 16; ++j) block.qs[16 * ib + j] = uint8_t(j | ((15 - j) << 4));
  }
  const std::vector<float> y = dequantize_both(GgmlType::IQ4_XS, &block, 1);
  const float dl[8] = {0.5f, -0.5f, -16.0f, 15.5f, 0.0f, 4.0f, 1.0f, 1.5f};
  for (int ib = 0; ib < 8; ++ib) {
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[32 * ib + j], dl[ib] * float(kCodebook[j])) << ib << " " << j;
      EXPECT_EQ(y[32 * ib + 16 + j], dl[ib] * float(kCodebook[15 - j])) << ib << " " << j;
    }
  }
  EXPECT_EQ(y[64], 2032.0f);       // −16·(−127)
  EXPECT_EQ(y[96 + 15], 1751.5f);  // 15.5·113
}

// A dot of a hand block with a hand activation: Q5_1 weights 0.25·q + 1 against Q8_0 activations
// d = 0.5, all quants 2 (x = 1): Σ (0.25·q + 1)·1 with q = 31 twice and 15 thirty times.
TEST(QuantMoreHandBlocks, Q5_1DotAddsTheMinTimesTheActivationSum) {
  BlockQ5_1 block;
  block.d = kHalfQuarter;
  block.m = kHalfOne;
  std::memset(block.qs, 0xff, 16);
  const uint8_t qh[4] = {0x01, 0x00, 0x00, 0x80};
  std::memcpy(block.qh, qh, 4);
  BlockQ8_0 act;
  act.d = kHalfHalf;
  std::memset(act.qs, 2, 32);
  const float expected = 2 * 8.75f + 30 * 4.75f;  // 160
  EXPECT_EQ(ref::dot(GgmlType::Q5_1, &block, &act, 32), expected);
  EXPECT_EQ(dot(GgmlType::Q5_1, &block, &act, 32), expected);
}

}  // namespace
}  // namespace strata::quant
