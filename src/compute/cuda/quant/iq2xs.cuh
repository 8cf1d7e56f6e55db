// IQ2_XS against Q8_K-style activations (CPU twin: quant/scalar/iq2xs.cpp). A sub-block of 32
// weights is four 16-bit words (9-bit grid index | 7-bit sign index << 9) and one
// scale nibble per 16 weights, db = d·(2s+1)/8. Every grid byte is 8, 25 or 43, so a point is
// kept as eight 4-bit codes (0, 1, 2) in one 32-bit word, expanded to bytes by two __byte_perm
// from the word 0x002B1908: a 2 KiB table in shared memory, one 4-byte lookup per 8 weights
// instead of an 8-byte one from 4 KiB (the kernel is bound by shared-memory/L1 wavefronts, and
// random 8-byte lookups conflict about twice as much; docs/bench-cuda.md). The sign byte is the
// 7 stored bits plus their parity.
#pragma once

#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

// Filled from quant/iq2xs_tables.cpp's kIq2xsGrid, converted to codes by iq2xs_codes() below
// (upload_tables<IQ2_XSWeights> in matmul/iq2_xs.cu). Defined here, not declared: without
// relocatable device code a __device__ variable lives in the translation unit that defines it, so
// every one that includes this header (matmul.cu and each matmul/*.cu, through matmul_plan.cuh)
// has its own copy, and matmul/iq2_xs.cu, whose kernels read it, uploads its own.
__device__ uint32_t g_iq2xs_codes[512];

// The code word of one grid point: nibble j = 0, 1, 2 for byte j = 8, 25, 43 (host side).
inline uint32_t iq2xs_codes(uint64_t point) {
  uint32_t codes = 0;
  for (int j = 0; j < 8; ++j) {
    const auto byte = uint8_t(point >> (8 * j));
    codes |= uint32_t(byte == 8 ? 0 : byte == 25 ? 1 : 2) << (4 * j);
  }
  return codes;
}
// The byte magnitudes, from the code nibbles as __byte_perm selectors.
inline constexpr uint32_t kIq2xsMagnitudes = 0x002b1908u;

struct IQ2_XSWeights {
  static constexpr int kRowsPerWarp = 4;  // at T = 1 (bench_cuda_matvec: 0.21 -> 0.23 of HBM)
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 74;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 512 * 4;
  __device__ static void load_table(uint8_t* shared) {
    auto* codes = reinterpret_cast<uint32_t*>(shared);
    for (int i = threadIdx.x; i < 512; i += blockDim.x) codes[i] = g_iq2xs_codes[i];
  }

  // The 32 signed values of one sub-block from its four 16-bit words, four per int.
  __device__ static void decode_sub_block(const uint32_t w0, const uint32_t w1, const uint32_t* codes, int (&v)[8]) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint32_t word = ((g < 2 ? w0 : w1) >> (16 * (g & 1))) & 0xffffu;
      const uint32_t code = codes[word & 511];
      const uint32_t low = __byte_perm(kIq2xsMagnitudes, 0, code & 0xffffu);
      const uint32_t high = __byte_perm(kIq2xsMagnitudes, 0, code >> 16);
      const uint32_t sign7 = word >> 9;
      const uint32_t signs = sign7 | ((__popc(sign7) & 1) << 7);
      v[2 * g] = apply_signs4(low, sign_mask4(signs & 15));
      v[2 * g + 1] = apply_signs4(high, sign_mask4(signs >> 4));
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
