// IQ2_XS against Q8_K-style activations (CPU twin: quant/scalar/iq2xs.cpp). A sub-block of 32
// weights is four 16-bit words (9-bit grid index | 7-bit sign index << 9) and one
// scale nibble per 16 weights, db = d·(2s+1)/8. Every grid byte is 8, 25 or 43, so a point is
// kept as eight 4-bit codes (0, 1, 2) in one 32-bit word, and the sign index as eight nibbles
// with bit 2 set where element j is negative (the 7 stored bits plus their parity as bit 7).
// Their OR is, per 4 elements, a __byte_perm selector into the 8 bytes {8, 25, 43, 0, -8, -25,
// -43, 0}: four signed bytes in one instruction, where masking magnitudes with emulated
// __vcmpne4/__vsub4 took ~30 instructions per 8 weights (the kernel is instruction-bound:
// docs/bench-cuda.md, sessions 38 and 40; Iq2xsTables.GridBytesAreLatticeLevels pins the three
// magnitudes). Both tables live in shared memory (2 KiB of codes, 512 B of sign selectors).
#pragma once

#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

// Filled from quant/iq2xs_tables.cpp's kIq2xsGrid, converted to codes by iq2xs_codes() below,
// then the 128 sign selectors of iq2xs_sign_selector() (upload_tables<IQ2_XSWeights> in
// matmul/iq2_xs.cu): the decode table each block copies whole. Defined here, not declared: without
// relocatable device code a __device__ variable lives in the translation unit that defines it, so
// every one that includes this header (matmul.cu and each matmul/*.cu, through matmul_plan.cuh)
// has its own copy, and matmul/iq2_xs.cu, whose kernels read it, uploads its own.
__device__ uint32_t g_iq2xs_codes[512 + 128];

// The code word of one grid point: nibble j = 0, 1, 2 for byte j = 8, 25, 43 (host side).
inline uint32_t iq2xs_codes(uint64_t point) {
  uint32_t codes = 0;
  for (int j = 0; j < 8; ++j) {
    const auto byte = uint8_t(point >> (8 * j));
    codes |= uint32_t(byte == 8 ? 0 : byte == 25 ? 1 : 2) << (4 * j);
  }
  return codes;
}
// Sign index s7 -> bit 4j + 2 set for each negative element j (elements 0-3 in bits 0-15, 4-7
// in bits 16-31): the 7 stored bits and their parity as element 7 (host side).
inline uint32_t iq2xs_sign_selector(uint32_t s7) {
  const uint32_t signs = s7 | ((uint32_t(__builtin_popcount(s7)) & 1u) << 7);
  uint32_t selector = 0;
  for (int j = 0; j < 8; ++j) selector |= ((signs >> j) & 1u) << (4 * j + 2);
  return selector;
}
// The byte magnitudes and their negations, selected by (code | sign << 2) nibbles: bytes 0-3 of
// __byte_perm's first word are 8, 25, 43, 0; bytes 4-7 (its second word) -8, -25, -43, 0.
inline constexpr uint32_t kIq2xsMagnitudes = 0x002b1908u;
inline constexpr uint32_t kIq2xsNegated = 0x00d5e7f8u;

struct IQ2_XSWeights {
  static constexpr int kRowsPerWarp = 4;  // at T = 1 (bench_cuda_matvec: 0.21 -> 0.23 of HBM)
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 74;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 512 * 4 + 128 * 4;  // the codes, then the sign selectors
  __device__ static void load_table(uint8_t* shared) {
    auto* codes = reinterpret_cast<uint32_t*>(shared);
    for (int i = threadIdx.x; i < 512 + 128; i += blockDim.x) codes[i] = g_iq2xs_codes[i];
  }

  // The 32 signed values of one sub-block from its four 16-bit words, four per int. `codes` is
  // the shared table: 512 code words, then 128 sign selectors.
  __device__ static void decode_sub_block(const uint32_t w0, const uint32_t w1, const uint32_t* codes, int (&v)[8]) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint32_t word = ((g < 2 ? w0 : w1) >> (16 * (g & 1))) & 0xffffu;
      // Nibble j: code_j (0-2) | sign_j << 2, a byte index 0-2 or 4-6 (bit 3 never set: no
      // sign-replicate mode); __byte_perm reads only the selector's low 16 bits.
      const uint32_t selector = codes[word & 511] | codes[512 + (word >> 9)];
      v[2 * g] = int(__byte_perm(kIq2xsMagnitudes, kIq2xsNegated, selector));
      v[2 * g + 1] = int(__byte_perm(kIq2xsMagnitudes, kIq2xsNegated, selector >> 16));
    }
  }

  // A unit is two sub-blocks (64 weights, 16 bytes of words and 2 scale bytes): fewer, wider loads
  // than one sub-block per unit.
  struct Decoded {
    int v0[8], v1[8];
    int s0_low, s0_high, s1_low, s1_high;  // 2s + 1 per 16 weights
    float d;
  };
  struct Act {
    int4 a0, a1, a2, a3;
    float d;
  };

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t* table) {
    Decoded out;
    const int b = u >> 2, pair = u & 3;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    out.d = f16_bits_to_f32(ld_u16(block));
    uint32_t words[4];
    ld_words_a2<4>(block + 2 + 16 * pair, words);
    const uint16_t scale_bytes = ld_u16(block + 66 + 2 * pair);
    const auto* codes = reinterpret_cast<const uint32_t*>(table);
    decode_sub_block(words[0], words[1], codes, out.v0);
    decode_sub_block(words[2], words[3], codes, out.v1);
    out.s0_low = 2 * (scale_bytes & 15) + 1;
    out.s0_high = 2 * ((scale_bytes >> 4) & 15) + 1;
    out.s1_low = 2 * ((scale_bytes >> 8) & 15) + 1;
    out.s1_high = 2 * (scale_bytes >> 12) + 1;
    return out;
  }
  template <class View>
  __device__ static Act load_act(const View& act, int row, int u) {
    const int b = u >> 2;
    const int8_t* a = act.qs_at(row, 256 * b + 64 * (u & 3));
    return Act{ld_i32x4(a), ld_i32x4(a + 16), ld_i32x4(a + 32), ld_i32x4(a + 48), act.scales(row)[b]};
  }
  __device__ static float dot(const Decoded& w, const Act& a, float acc) {
    const int g0 = __dp4a(w.v0[1], a.a0.y, __dp4a(w.v0[0], a.a0.x, 0));
    const int g1 = __dp4a(w.v0[3], a.a0.w, __dp4a(w.v0[2], a.a0.z, 0));
    const int g2 = __dp4a(w.v0[5], a.a1.y, __dp4a(w.v0[4], a.a1.x, 0));
    const int g3 = __dp4a(w.v0[7], a.a1.w, __dp4a(w.v0[6], a.a1.z, 0));
    const int h0 = __dp4a(w.v1[1], a.a2.y, __dp4a(w.v1[0], a.a2.x, 0));
    const int h1 = __dp4a(w.v1[3], a.a2.w, __dp4a(w.v1[2], a.a2.z, 0));
    const int h2 = __dp4a(w.v1[5], a.a3.y, __dp4a(w.v1[4], a.a3.x, 0));
    const int h3 = __dp4a(w.v1[7], a.a3.w, __dp4a(w.v1[6], a.a3.z, 0));
    const int scaled = w.s0_low * (g0 + g1) + w.s0_high * (g2 + g3) + w.s1_low * (h0 + h1) + w.s1_high * (h2 + h3);
    // d·d_a·scaled/8: the /8 is exact, folded into the integer's conversion.
    return __fmaf_rn(__fmul_rn(w.d, a.d), __fmul_rn(float(scaled), 0.125f), acc);
  }
};

}  // namespace strata::compute::cuda::quant_device
