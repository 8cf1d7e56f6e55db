// IQ4_XS against Q8_K-style activations (CPU twin: quant/scalar/iq4.cpp; IQ4_NL, its
// 32-weight sibling, stays with the Q8_0-activation types in blocks32.cuh). A unit is one 32-weight
// sub-block ib: the 16 bytes qs[16ib ..] with nibbles placed as IQ4_NL's (low nibble of byte j:
// element j, high nibble: element 16 + j), decoded through the IQ4_NL codebook, and a signed 6-bit
// scale biased by 32 (iq4_xs_scale in quant/blocks.h). Block {d, scales_h, scales_l[4], qs[128]}:
// 136 bytes, so an 8-byte-aligned row stays 8-byte aligned: the quants are two 8-byte loads.
#pragma once

#include "compute/cuda/quant/blocks32.cuh"
#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

struct IQ4_XSWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 136;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 8;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t*, float (&acc)[NR]) {
    const int b = u >> 3, ib = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const uint32_t head = ld_u32(block);  // d | scales_h << 16
    const uint32_t scales_l = ld_u32(block + 4);
    const float d = f16_bits_to_f32(uint16_t(head & 0xffffu));
    // low 4 bits: nibble ib % 2 of scales_l[ib / 2], i.e. bits 4ib..4ib+3 of the word
    const int scale = int(((scales_l >> (4 * ib)) & 15u) | (((head >> (16 + 2 * ib)) & 3u) << 4)) - 32;
    const uint2* qp = reinterpret_cast<const uint2*>(block + 8 + 16 * ib);
    const uint2 qa = qp[0], qb = qp[1];
    const uint32_t q[4] = {qa.x, qa.y, qb.x, qb.y};
    const uint32_t table[4] = {IQ4_NLWeights::pack_codebook(0), IQ4_NLWeights::pack_codebook(4),
                               IQ4_NLWeights::pack_codebook(8), IQ4_NLWeights::pack_codebook(12)};
    int low[4], high[4];  // codebook values of elements 4i.. and 16 + 4i..
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      low[i] = codebook16_lookup4(table, q[i] & 0x0f0f0f0fu);
      high[i] = codebook16_lookup4(table, (q[i] >> 4) & 0x0f0f0f0fu);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const int8_t* a = act.qs(rows[r]) + 256 * b + 32 * ib;
        const int4 a0 = ld_i32x4(a), a1 = ld_i32x4(a + 16);
        int isum = __dp4a(low[0], a0.x, 0);
        isum = __dp4a(low[1], a0.y, isum);
        isum = __dp4a(low[2], a0.z, isum);
        isum = __dp4a(low[3], a0.w, isum);
        isum = __dp4a(high[0], a1.x, isum);
        isum = __dp4a(high[1], a1.y, isum);
        isum = __dp4a(high[2], a1.z, isum);
        isum = __dp4a(high[3], a1.w, isum);
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), float(scale * isum), acc[r]);
      }
    }
  }
};

}  // namespace strata::compute::cuda::quant_device
