// Dequantization of blocks built byte by byte, checked against values worked out by hand from
// the block definitions in shared/reference/gguf-and-quants.md §4 (not from the implementation).
// Each case runs through ref:: and the dispatched (AVX2 when available) path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace strata::quant {
namespace {

constexpr uint16_t kHalfOne = 0x3c00;        // 1.0
constexpr uint16_t kHalfTwo = 0x4000;        // 2.0
constexpr uint16_t kHalfHalf = 0x3800;       // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;    // 0.25
constexpr uint16_t kHalfTiny = 0x0001;       // 2^-24, the smallest subnormal
constexpr uint16_t kHalfSubnormal = 0x0200;  // 2^-15, a subnormal

template <typename Block>
std::vector<float> dequantize_both(GgmlType type, const Block* blocks, int n_blocks, int block_elems) {
  const int n = n_blocks * block_elems;
  std::vector<float> ref_out(n), fast_out(n);
  ref::dequantize_row(type, blocks, ref_out.data(), n);
  dequantize_row(type, blocks, fast_out.data(), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(&ref_out[i], &fast_out[i], 4), 0) << "element " << i;
  }
  return ref_out;
}

TEST(QuantHandBlocks, Q8_0) {
  BlockQ8_0 blocks[3];
  blocks[0].d = kHalfHalf;
  for (int j = 0; j < 32; ++j) blocks[0].qs[j] = int8_t(j - 16);
  blocks[0].qs[5] = -128;
  blocks[1].d = kHalfTiny;
  for (int j = 0; j < 32; ++j) blocks[1].qs[j] = 127;
  blocks[2].d = 0;
  for (int j = 0; j < 32; ++j) blocks[2].qs[j] = int8_t(3 * j);
  const std::vector<float> y = dequantize_both(GgmlType::Q8_0, blocks, 3, 32);
  EXPECT_EQ(y[0], -8.0f);
  EXPECT_EQ(y[5], -64.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 7.5f);
  for (int j = 0; j < 32; ++j) {
    if (j != 5) {
      EXPECT_EQ(y[j], 0.5f * (j - 16));
    }
    EXPECT_EQ(y[32 + j], std::ldexp(127.0f, -24));
    EXPECT_EQ(y[64 + j], 0.0f);
  }
}

TEST(QuantHandBlocks, Q4_0) {
  BlockQ4_0 blocks[2];
  blocks[0].d = kHalfTwo;
  for (int j = 0; j < 16; ++j) blocks[0].qs[j] = uint8_t(j | ((15 - j) << 4));
  blocks[1].d = kHalfSubnormal;
  for (int j = 0; j < 16; ++j) blocks[1].qs[j] = 0xF0;  // low nibble 0 -> -8, high 15 -> 7
  const std::vector<float> y = dequantize_both(GgmlType::Q4_0, blocks, 2, 32);
  EXPECT_EQ(y[0], -16.0f);   // 2·(0 − 8)
  EXPECT_EQ(y[15], 14.0f);   // 2·(15 − 8)
  EXPECT_EQ(y[16], 14.0f);   // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -16.0f);  // high nibble of qs[15] = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * (j - 8));
    EXPECT_EQ(y[16 + j], 2.0f * (7 - j));
    EXPECT_EQ(y[32 + j], -8.0f * std::ldexp(1.0f, -15));
    EXPECT_EQ(y[48 + j], 7.0f * std::ldexp(1.0f, -15));
  }
}

TEST(QuantHandBlocks, Q2_K) {
  BlockQ2_K block;
  block.d = kHalfOne;
  block.dmin = kHalfHalf;
  for (int k = 0; k < 16; ++k) block.scales[k] = uint8_t((k % 4 + 1) | ((k % 3) << 4));
  // Element 128n + 32j + 16p + l takes bits 2j of qs[32n + 16p + l]; give it q = (l+j+p+n) % 4.
  std::memset(block.qs, 0, sizeof block.qs);
  for (int n = 0; n < 2; ++n)
    for (int j = 0; j < 4; ++j)
      for (int p = 0; p < 2; ++p)
        for (int l = 0; l < 16; ++l)
          block.qs[32 * n + 16 * p + l] |= uint8_t(((l + j + p + n) % 4) << (2 * j));
  const std::vector<float> y = dequantize_both(GgmlType::Q2_K, &block, 1, 256);
  // e = 0: n=j=p=l=0, q=0, scale byte 0 = (1, 0): 1·1·0 − 0.5·0 = 0.
  EXPECT_EQ(y[0], 0.0f);
  // e = 40: n=0, j=1, p=0, l=8, q=(8+1)%4=1; sub-block 2: scale 3, min 2 -> 3·1 − 0.5·2 = 2.
  EXPECT_EQ(y[40], 2.0f);
  // e = 61: j=1, p=1, l=13, q=(13+1+1)%4=3; sub-block 3: scale 4, min 0 -> 12.
  EXPECT_EQ(y[61], 12.0f);
  // e = 255: n=1, j=3, p=1, l=15, q=(15+3+1+1)%4=0; sub-block 15: scale 4, min 0 -> 0.
  EXPECT_EQ(y[255], 0.0f);
  // e = 164: n=1, j=1, p=0, l=4, q=(4+1+0+1)%4=2; sub-block 10: scale 3, min 1 -> 6 − 0.5 = 5.5.
  EXPECT_EQ(y[164], 5.5f);
  for (int n = 0; n < 2; ++n)
    for (int j = 0; j < 4; ++j)
      for (int p = 0; p < 2; ++p)
        for (int l = 0; l < 16; ++l) {
          const int e = 128 * n + 32 * j + 16 * p + l;
          const int k = e / 16;
          EXPECT_EQ(y[e], float(k % 4 + 1) * ((l + j + p + n) % 4) - 0.5f * (k % 3)) << e;
        }
}

TEST(QuantHandBlocks, Q2_KZeroAndSubnormalScales) {
  BlockQ2_K blocks[2];
  std::memset(blocks, 0, sizeof blocks);
  // Block 0: d = 2^-24, dmin = 0, scale nibble 15, every quant 3 -> 45·2^-24.
  blocks[0].d = kHalfTiny;
  std::memset(blocks[0].scales, 0xAF, 16);  // scale 15, min 10 (times dmin = 0)
  std::memset(blocks[0].qs, 0xFF, 64);
  // Block 1: d = 0, dmin = 2^-15, min nibble 3 -> −3·2^-15 whatever the quants.
  blocks[1].dmin = kHalfSubnormal;
  std::memset(blocks[1].scales, 0x3F, 16);
  std::memset(blocks[1].qs, 0x1B, 64);
  const std::vector<float> y = dequantize_both(GgmlType::Q2_K, blocks, 2, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], std::ldexp(45.0f, -24)) << e;
    EXPECT_EQ(y[256 + e], -3.0f * std::ldexp(1.0f, -15)) << e;
  }
}

TEST(QuantHandBlocks, Q4_KScalePacking) {
  // Scales {1, 2, 3, 63, 17, 33, 48, 5}, mins {0, 7, 63, 1, 45, 16, 2, 60}, packed by hand:
  //   b0..3 = sc0..3 | (sc4..7 >> 4) << 6 = 1|64, 2|128, 3|192, 63|0
  //   b4..7 = m0..3 | (m4..7 >> 4) << 6  = 0|128, 7|64, 63|0, 1|192
  //   b8..11 = (sc4..7 & 15) | (m4..7 & 15) << 4 = 1|208, 1|0, 0|32, 5|192
  const uint8_t packed[12] = {65, 130, 195, 63, 128, 71, 63, 193, 209, 1, 32, 197};
  const uint8_t want_scales[8] = {1, 2, 3, 63, 17, 33, 48, 5};
  const uint8_t want_mins[8] = {0, 7, 63, 1, 45, 16, 2, 60};
  uint8_t scales[8], mins[8], repacked[12];
  unpack_q4_K_scales(packed, scales, mins);
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(scales[p], want_scales[p]) << p;
    EXPECT_EQ(mins[p], want_mins[p]) << p;
  }
  pack_q4_K_scales(want_scales, want_mins, repacked);
  EXPECT_EQ(std::memcmp(repacked, packed, 12), 0);

  BlockQ4_K block;
  block.d = kHalfTwo;
  block.dmin = kHalfOne;
  std::memcpy(block.scales, packed, 12);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) block.qs[32 * c + l] = uint8_t(((l + c) % 16) | (((3 * l + c) % 16) << 4));
  const std::vector<float> y = dequantize_both(GgmlType::Q4_K, &block, 1, 256);
  // e = 165: chunk 2, high nibble, l = 5: q = (15+2)%16 = 1, pair 5 (33, 16): 2·33·1 − 16 = 50.
  EXPECT_EQ(y[165], 50.0f);
  // e = 100 = 64 + 32 + 4: chunk 1, high nibble, l = 4: q = (12+1)%16 = 13, pair 3 (63, 1):
  // 2·63·13 − 1 = 1637.
  EXPECT_EQ(y[100], 1637.0f);
  // e = 200: chunk 3, low nibble, l = 8: q = 11, pair 6 (48, 2): 2·48·11 − 2 = 1054.
  EXPECT_EQ(y[200], 1054.0f);
  // e = 2: chunk 0, low, l = 2: q = 2, pair 0 (1, 0): 4.
  EXPECT_EQ(y[2], 4.0f);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(y[64 * c + l], 2.0f * want_scales[2 * c] * ((l + c) % 16) - want_mins[2 * c]);
      EXPECT_EQ(y[64 * c + 32 + l],
                2.0f * want_scales[2 * c + 1] * ((3 * l + c) % 16) - want_mins[2 * c + 1]);
    }
}

TEST(QuantHandBlocks, Q4_KZeroAndSubnormalScales) {
  BlockQ4_K blocks[2];
  std::memset(blocks, 0, sizeof blocks);
  // Block 0: d = 0, dmin = 2^-24, all scales/mins 1 -> y = −2^-24 whatever the quants.
  blocks[0].d = 0;
  blocks[0].dmin = kHalfTiny;
  const uint8_t ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  pack_q4_K_scales(ones, ones, blocks[0].scales);
  std::memset(blocks[0].qs, 0xAB, 128);
  // Block 1: d = 2^-15 (subnormal), dmin = 0, scale 63 for every pair, quants 15 -> 945·2^-15.
  blocks[1].d = kHalfSubnormal;
  const uint8_t sixty_three[8] = {63, 63, 63, 63, 63, 63, 63, 63};
  const uint8_t zeros[8] = {};
  pack_q4_K_scales(sixty_three, zeros, blocks[1].scales);
  std::memset(blocks[1].qs, 0xFF, 128);
  const std::vector<float> y = dequantize_both(GgmlType::Q4_K, blocks, 2, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], -std::ldexp(1.0f, -24)) << e;
    EXPECT_EQ(y[256 + e], std::ldexp(945.0f, -15)) << e;
  }
}

// q(e) = 7e mod 64, packed by the Q6_K layout: for half n and l < 32,
// ql[64n+l] = q(128n+l) & 15 | (q(128n+64+l) & 15) << 4, ql[64n+32+l] likewise for +32 / +96,
// qh[32n+l] = q(128n+l)>>4 | q(128n+32+l)>>4 << 2 | q(128n+64+l)>>4 << 4 | q(128n+96+l)>>4 << 6.
int q6_pattern(int e) { return (7 * e) % 64; }

TEST(QuantHandBlocks, Q6_K) {
  BlockQ6_K block;
  block.d = kHalfQuarter;
  const int8_t scales[16] = {-128, 127, 1, -1, 2, -2, 3, -3, 0, 5, -7, 11, -13, 64, -64, 100};
  std::memcpy(block.scales, scales, 16);
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const int q0 = q6_pattern(128 * n + l), q1 = q6_pattern(128 * n + 32 + l);
      const int q2 = q6_pattern(128 * n + 64 + l), q3 = q6_pattern(128 * n + 96 + l);
      block.ql[64 * n + l] = uint8_t((q0 & 15) | ((q2 & 15) << 4));
      block.ql[64 * n + 32 + l] = uint8_t((q1 & 15) | ((q3 & 15) << 4));
      block.qh[32 * n + l] = uint8_t((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6));
    }
  const std::vector<float> y = dequantize_both(GgmlType::Q6_K, &block, 1, 256);
  EXPECT_EQ(y[0], 1024.0f);     // q = 0: 0.25·(−128)·(0 − 32)
  EXPECT_EQ(y[17], 730.25f);    // q = 119 % 64 = 55: 0.25·127·23
  EXPECT_EQ(y[130], 0.0f);      // sub-block 8 has scale 0
  EXPECT_EQ(y[250], -250.0f);   // q = 1750 % 64 = 22, sub-block 15: 0.25·100·(22 − 32)
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.25f * scales[e / 16] * (q6_pattern(e) - 32)) << e;
  }
}

TEST(QuantHandBlocks, Q6_KZeroAndSubnormalScales) {
  BlockQ6_K blocks[2];
  std::memset(blocks, 0, sizeof blocks);
  // Block 0: d = 0 -> all zero, whatever the quants and scales.
  std::memset(blocks[0].ql, 0x5A, 128);
  std::memset(blocks[0].scales, 0x7F, 16);
  // Block 1: d = 2^-24, scale 1, every quant 63 (ql nibbles 15, qh pairs 3) -> 31·2^-24.
  blocks[1].d = kHalfTiny;
  std::memset(blocks[1].ql, 0xFF, 128);
  std::memset(blocks[1].qh, 0xFF, 64);
  std::memset(blocks[1].scales, 1, 16);
  const std::vector<float> y = dequantize_both(GgmlType::Q6_K, blocks, 2, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.0f) << e;
    EXPECT_EQ(y[256 + e], std::ldexp(31.0f, -24)) << e;
  }
}

TEST(QuantHandBlocks, IQ2_XS) {
  BlockIQ2_XS blocks[2];
  std::memset(blocks, 0, sizeof blocks);
  blocks[0].d = kHalfOne;
  blocks[0].scales[0] = 0x53;  // groups 0-1: s = 3 -> db = 0.875; groups 2-3: s = 5 -> 1.375
  // Group 0: grid 1 = 0x080808080808082b (byte 0 = 43, others 8), sign index 1 -> sign byte
  // 0b10000001 (bit 0 and the parity bit 7 negative).
  blocks[0].qs[0] = uint16_t(1 | (1 << 9));
  // Group 1: grid 2 = 0x0808080808081919 (bytes 0, 1 = 25), sign index 0 -> all positive.
  blocks[0].qs[1] = 2;
  // Group 2: grid 511 = all 43, sign index 127 -> sign byte 0xFF, all negative.
  blocks[0].qs[2] = uint16_t(511 | (127 << 9));
  // Group 3: grid 0 = all 8, sign index 3 -> 0b00000011 (even parity).
  blocks[0].qs[3] = uint16_t(3 << 9);
  // Other sub-blocks: scale nibble 0 (db = 0.125), grid 0, no signs -> 1.0 everywhere.
  // Block 1: d = 2^-24 (subnormal) -> 2^-24·0.125·8 = 2^-24.
  blocks[1].d = kHalfTiny;
  const std::vector<float> y = dequantize_both(GgmlType::IQ2_XS, blocks, 2, 256);
  EXPECT_EQ(y[0], -37.625f);  // −0.875·43
  for (int j = 1; j < 7; ++j) EXPECT_EQ(y[j], 7.0f);
  EXPECT_EQ(y[7], -7.0f);
  EXPECT_EQ(y[8], 21.875f);
  EXPECT_EQ(y[9], 21.875f);
  for (int j = 10; j < 16; ++j) EXPECT_EQ(y[j], 7.0f);
  for (int j = 16; j < 24; ++j) EXPECT_EQ(y[j], -59.125f);  // −1.375·43
  EXPECT_EQ(y[24], -11.0f);
  EXPECT_EQ(y[25], -11.0f);
  for (int j = 26; j < 32; ++j) EXPECT_EQ(y[j], 11.0f);
  for (int j = 32; j < 256; ++j) EXPECT_EQ(y[j], 1.0f) << j;
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[256 + j], std::ldexp(1.0f, -24)) << j;
}

TEST(QuantHandBlocks, FloatTypes) {
  const uint16_t halves[4] = {0x3c00, 0xc100, 0x0001, 0x7bff};  // 1, −2.5, 2^-24, 65504
  std::vector<float> y = dequantize_both(GgmlType::F16, halves, 4, 1);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.5f);
  EXPECT_EQ(y[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(y[3], 65504.0f);
  const uint16_t brains[3] = {0x3f80, 0xc020, 0x4b80};  // 1, −2.5, 2^24
  y = dequantize_both(GgmlType::BF16, brains, 3, 1);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.5f);
  EXPECT_EQ(y[2], 16777216.0f);
}

}  // namespace
}  // namespace strata::quant
