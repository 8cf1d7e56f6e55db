// Byte layouts of the ggml blocks strata has kernels for (internal to quant/ and its tests).
//
// Each struct mirrors ggml-common.h field for field, so a pointer into a GGUF tensor row can be
// read as an array of blocks; sizes are checked against the traits table's numbers below.
// f16 fields are stored as raw uint16_t bits (convert with strata::f16_to_f32).
// Rows must be at least 2-byte aligned (GGUF data is 32-byte aligned and every block size is
// even); Q8_K activation rows must be 4-byte aligned.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::quant {

inline constexpr int kBlock32 = 32;   // Q8_0, Q4_0
inline constexpr int kBlockK = 256;   // K-quants, IQ2_XS, Q8_K

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];  // low nibbles: elements 0-15, high nibbles: 16-31
};
struct BlockQ2_K {
  uint8_t scales[16];  // low nibble scale, high nibble min, one per 16 weights
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // eight 6-bit (scale, min) pairs, packed (see unpack_q4_K_scales)
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[32];  // 9-bit grid index | 7-bit sign index << 9, one per 8 weights
  uint8_t scales[8];
};
// Activation side of the K-quant / IQ dot products; never stored in files.
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sum of each group of 16 quants
};

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ2_XS) == 74);
static_assert(sizeof(BlockQ8_K) == 292);

// The largest activation quant is ±127 (never -128), so the AVX2 sign tricks cannot overflow.
inline constexpr int kActivationQuantMax = 127;

// The unpackers are used from the scalar, AVX2 and AVX-512 files, each compiled with different
// target flags; always_inline keeps the linker from sharing one copy between them (see
// avx2_common.h).
// Unpacks Q4_K's twelve scale bytes into eight 6-bit scales and eight 6-bit mins.
// Pair p < 4: scale = b[p] & 63, min = b[p+4] & 63.
// Pair p >= 4: scale = (b[p+4] & 15) | (b[p-4] >> 6) << 4, min = (b[p+4] >> 4) | (b[p] >> 6) << 4.
[[gnu::always_inline]] inline void unpack_q4_K_scales(const uint8_t packed[12], uint8_t scales[8],
                                                      uint8_t mins[8]) {
  for (int p = 0; p < 4; ++p) {
    scales[p] = packed[p] & 63;
    mins[p] = packed[p + 4] & 63;
  }
  for (int p = 4; p < 8; ++p) {
    scales[p] = uint8_t((packed[p + 4] & 15) | ((packed[p - 4] >> 6) << 4));
    mins[p] = uint8_t((packed[p + 4] >> 4) | ((packed[p] >> 6) << 4));
  }
}

// unpack_q4_K_scales with 32-bit word operations, for the SIMD kernels: scale p (min p) is byte p
// of *scales (*mins).
[[gnu::always_inline]] inline void unpack_q4_K_scales_u64(const uint8_t packed[12],
                                                          uint64_t* scales, uint64_t* mins) {
  uint32_t s0, s1, s2;
  std::memcpy(&s0, packed, 4);
  std::memcpy(&s1, packed + 4, 4);
  std::memcpy(&s2, packed + 8, 4);
  const uint32_t scales_low = s0 & 0x3f3f3f3fu;
  const uint32_t mins_low = s1 & 0x3f3f3f3fu;
  const uint32_t scales_high = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
  const uint32_t mins_high = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
  *scales = uint64_t(scales_low) | uint64_t(scales_high) << 32;
  *mins = uint64_t(mins_low) | uint64_t(mins_high) << 32;
}

// Inverse of unpack_q4_K_scales; every input must be < 64.
inline void pack_q4_K_scales(const uint8_t scales[8], const uint8_t mins[8], uint8_t packed[12]) {
  for (int p = 0; p < 4; ++p) {
    packed[p] = uint8_t(scales[p] | ((scales[p + 4] >> 4) << 6));
    packed[p + 4] = uint8_t(mins[p] | ((mins[p + 4] >> 4) << 6));
    packed[p + 8] = uint8_t((scales[p + 4] & 15) | ((mins[p + 4] & 15) << 4));
  }
}

// Blocks of the llama-quantize mix types (Q4_1, Q5_0, Q5_1, IQ4_NL; Q3_K, Q5_K, IQ4_XS); kernels in
// kernels.h (kTableKernels). Layouts: shared/reference/gguf-and-quants.md §4 and ggml-common.h.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;      // y = d·q + m
  uint8_t qs[16];  // as Q4_0
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];   // bit j (little-endian u32): 5th bit of element j
  uint8_t qs[16];  // low 4 bits, as Q4_0; y = d·(q − 16)
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];  // y = d·q + m, q 5-bit as Q5_0
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];  // nibbles index kIq4nlValues, placed as Q4_0's
};
struct BlockQ3_K {
  uint8_t hmask[32];   // 3rd bit of each quant (set: no −4)
  uint8_t qs[64];      // low 2 bits, placed as Q2_K's
  uint8_t scales[12];  // sixteen 6-bit scales (biased by 32), packed (see q3_K_scale)
  uint16_t d;
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // as Q4_K
  uint8_t qh[32];      // 5th bits: bit 2c (low nibbles) and 2c+1 (high) of chunk c
  uint8_t qs[128];     // low 4 bits, placed as Q4_K's
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;    // top 2 bits of the eight 6-bit sub-block scales
  uint8_t scales_l[4];  // low 4 bits, two per byte
  uint8_t qs[128];      // 16 bytes per 32-weight sub-block, nibbles placed as IQ4_NL's
};
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockIQ4_XS) == 136);

// Q3_K's 6-bit scale k (k < 16), still biased by 32: low nibble from byte k (k < 8, bits 0-3) or
// byte k − 8 (bits 4-7), top two bits from byte 8 + k % 4 at bit 2·(k / 4).
[[gnu::always_inline]] inline int q3_K_scale(const uint8_t packed[12], int k) {
  const int low = k < 8 ? (packed[k] & 15) : (packed[k - 8] >> 4);
  const int high = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
  return low | (high << 4);
}

// IQ4_XS's 6-bit scale of sub-block ib (ib < 8), biased by 32.
[[gnu::always_inline]] inline int iq4_xs_scale(const BlockIQ4_XS& block, int ib) {
  const int low = (block.scales_l[ib / 2] >> (4 * (ib % 2))) & 15;
  const int high = (block.scales_h >> (2 * ib)) & 3;
  return low | (high << 4);
}

// IQ4_NL / IQ4_XS codebook: kvalues_iq4nl from ggml-common.h (ggml-org/ggml, MIT licence). It is
// part of the format: a nibble n decodes to d·kIq4nlValues[n].
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace strata::quant
