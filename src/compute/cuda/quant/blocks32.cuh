// The 32-weight block types against Q8_0-style activations (CPU twins: quant/scalar_q8_q4.cpp,
// quant/scalar_blocks32_more.cpp): Q8_0, Q4_0, IQ4_NL here; Q4_1, Q5_0, Q5_1 beside them.
// A unit is a quarter block, 8 weights: for Q8_0 quants 8u..8u+7; for the nibble types the four
// bytes qs[4u..4u+3], i.e. weights 4u..4u+3 (low nibbles) and 16+4u..16+4u+3 (high nibbles).
// Each unit's integer dot is exact (dp4a); the unit adds d_w·d_a·isum to the row (d_w, d_a the
// f16 scales of the weight and activation blocks, the activation's already widened to f32).
#pragma once

#include "compute/cuda/quant/common.cuh"
#include "quant/blocks.h"

namespace strata::compute::cuda::quant_device {

struct Q8_0Weights {
  static constexpr int kBlockElems = 32;
  static constexpr int kBlockBytes = 34;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_0;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t*, float (&acc)[NR]) {
    const int b = u >> 2, part = u & 3;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    uint32_t q[2];
    ld_words_a2<2>(block + 2 + 8 * part, q);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const int8_t* a = act.qs(rows[r]) + 32 * b + 8 * part;
        const int2 av = *reinterpret_cast<const int2*>(a);
        const int isum = __dp4a(int(q[1]), av.y, __dp4a(int(q[0]), av.x, 0));
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), float(isum), acc[r]);
      }
    }
  }
};

// Q4_0 and IQ4_NL share the nibble placement; they differ in how a nibble becomes a value.
template <bool kCodebook>
struct Nibble32Weights {
  static constexpr int kBlockElems = 32;
  static constexpr int kBlockBytes = 18;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_0;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t*, float (&acc)[NR]) {
    const int b = u >> 2, part = u & 3;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    const uint32_t q = ld_u32_a2(block + 2 + 4 * part);
    int low, high;
    if constexpr (kCodebook) {
      const uint32_t table[4] = {pack_codebook(0), pack_codebook(4), pack_codebook(8), pack_codebook(12)};
      low = codebook16_lookup4(table, q & 0x0f0f0f0fu);
      high = codebook16_lookup4(table, (q >> 4) & 0x0f0f0f0fu);
    } else {
      low = int(__vsub4(q & 0x0f0f0f0fu, 0x08080808u));
      high = int(__vsub4((q >> 4) & 0x0f0f0f0fu, 0x08080808u));
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const int8_t* a = act.qs(rows[r]) + 32 * b;
        const int isum = __dp4a(high, ld_i32(a + 16 + 4 * part), __dp4a(low, ld_i32(a + 4 * part), 0));
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), float(isum), acc[r]);
      }
    }
  }

  // Codebook entries i..i+3 of IQ4_NL as one little-endian word (constants: no memory load).
  __device__ static constexpr uint32_t pack_codebook(int i) {
    return uint32_t(uint8_t(strata::quant::kIq4nlValues[i])) |
           uint32_t(uint8_t(strata::quant::kIq4nlValues[i + 1])) << 8 |
           uint32_t(uint8_t(strata::quant::kIq4nlValues[i + 2])) << 16 |
           uint32_t(uint8_t(strata::quant::kIq4nlValues[i + 3])) << 24;
  }
};
using Q4_0Weights = Nibble32Weights<false>;
using IQ4_NLWeights = Nibble32Weights<true>;

}  // namespace strata::compute::cuda::quant_device
