// The 32-weight block types against Q8_0-style activations (CPU twins: quant/scalar_q8_q4.cpp,
// quant/scalar_blocks32_more.cpp): Q8_0, Q4_0, IQ4_NL here; Q4_1, Q5_0, Q5_1 beside them.
// A unit is one whole block (32 weights, read as aligned words and funnel-shifted: blocks of 34
// and 18 bytes are only 2-byte aligned); smaller units cost more load instructions per byte than
// they save in lane balance (bench_cuda_matvec: quarter-block units ran at 0.35 / 0.20 of HBM).
// Each unit's integer dot is exact (dp4a); the unit adds d_w·d_a·isum to the row (d_w, d_a the
// f16 scales of the weight and activation blocks, the activation's already widened to f32).
#pragma once

#include "compute/cuda/quant/common.cuh"
#include "quant/blocks.h"

namespace strata::compute::cuda::quant_device {

// The activation side of a whole 32-weight block: its 32 quants and its (f16-valued) scale.
struct Q8Act32 {
  int4 a0, a1;
  float d;
  __device__ static Q8Act32 load(const ActView& act, int row, int block) {
    const int8_t* a = act.qs(row) + 32 * block;
    return Q8Act32{ld_i32x4(a), ld_i32x4(a + 16), act.scales(row)[block]};
  }
};

struct Q8_0Weights {
  static constexpr int kBlockElems = 32;
  static constexpr int kBlockBytes = 34;
  static constexpr int kUnitsPerBlock = 1;
  static constexpr GgmlType kActivation = GgmlType::Q8_0;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kUnroll = 2;
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  struct Decoded {
    uint32_t q[8];
    float d;
  };
  using Act = Q8Act32;

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t*) {
    Decoded out;
    const uint8_t* block = row + size_t(u) * kBlockBytes;
    out.d = f16_bits_to_f32(ld_u16(block));
    ld_words_a2<8>(block + 2, out.q);
    return out;
  }
  __device__ static Act load_act(const ActView& act, int row, int u) { return Q8Act32::load(act, row, u); }
  __device__ static float dot(const Decoded& w, const Act& a, float acc) {
    int isum = __dp4a(int(w.q[0]), a.a0.x, 0);
    isum = __dp4a(int(w.q[1]), a.a0.y, isum);
    isum = __dp4a(int(w.q[2]), a.a0.z, isum);
    isum = __dp4a(int(w.q[3]), a.a0.w, isum);
    isum = __dp4a(int(w.q[4]), a.a1.x, isum);
    isum = __dp4a(int(w.q[5]), a.a1.y, isum);
    isum = __dp4a(int(w.q[6]), a.a1.z, isum);
    isum = __dp4a(int(w.q[7]), a.a1.w, isum);
    return __fmaf_rn(__fmul_rn(w.d, a.d), float(isum), acc);
  }
};

// Q4_0 and IQ4_NL share the nibble placement; they differ in how a nibble becomes a value.
template <bool kCodebook>
struct Nibble32Weights {
  static constexpr int kBlockElems = 32;
  static constexpr int kBlockBytes = 18;
  static constexpr int kUnitsPerBlock = 1;
  static constexpr GgmlType kActivation = GgmlType::Q8_0;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kUnroll = 2;
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  struct Decoded {
    int low[4], high[4];  // word i: weights 4i..4i+3 (low nibbles) and 16+4i.. (high nibbles)
    float d;
  };
  using Act = Q8Act32;

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t*) {
    Decoded out;
    const uint8_t* block = row + size_t(u) * kBlockBytes;
    out.d = f16_bits_to_f32(ld_u16(block));
    uint32_t q[4];
    ld_words_a2<4>(block + 2, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kCodebook) {
        const uint32_t table[4] = {pack_codebook(0), pack_codebook(4), pack_codebook(8), pack_codebook(12)};
        out.low[i] = codebook16_lookup4(table, q[i] & 0x0f0f0f0fu);
        out.high[i] = codebook16_lookup4(table, (q[i] >> 4) & 0x0f0f0f0fu);
      } else {
        out.low[i] = int(__vsub4(q[i] & 0x0f0f0f0fu, 0x08080808u));
        out.high[i] = int(__vsub4((q[i] >> 4) & 0x0f0f0f0fu, 0x08080808u));
      }
    }
    return out;
  }
  __device__ static Act load_act(const ActView& act, int row, int u) { return Q8Act32::load(act, row, u); }
  __device__ static float dot(const Decoded& w, const Act& a, float acc) {
    int isum = __dp4a(w.low[0], a.a0.x, 0);
    isum = __dp4a(w.low[1], a.a0.y, isum);
    isum = __dp4a(w.low[2], a.a0.z, isum);
    isum = __dp4a(w.low[3], a.a0.w, isum);
    isum = __dp4a(w.high[0], a.a1.x, isum);
    isum = __dp4a(w.high[1], a.a1.y, isum);
    isum = __dp4a(w.high[2], a.a1.z, isum);
    isum = __dp4a(w.high[3], a.a1.w, isum);
    return __fmaf_rn(__fmul_rn(w.d, a.d), float(isum), acc);
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
