// The 32-weight block types against Q8_0-style activations (CPU twin: quant/scalar/blocks32.cpp):
// Q8_0, Q4_0, IQ4_NL, and Q4_1, Q5_0, Q5_1 below them.
// A unit is one whole block (32 weights, read as aligned words and funnel-shifted: blocks of 34
// and 18 bytes are only 2-byte aligned); smaller units cost more load instructions per byte than
// they save in lane balance (bench_cuda_matvec: quarter-block units ran at 0.35 / 0.20 of HBM).
// Each unit's integer dot is exact (dp4a); the unit adds d_w·d_a·isum to the row (d_w, d_a the
// f16 scales of the weight and activation blocks, the activation's already widened to f32), and
// for Q4_1/Q5_1 then m·d_a·Σa over its 8 activations.
#pragma once

#include "compute/cuda/quant/common.cuh"
#include "quant/blocks.h"

namespace strata::compute::cuda::quant_device {

// The activation side of a whole 32-weight block: its 32 quants and its (f16-valued) scale.
struct Q8Act32 {
  int4 a0, a1;
  float d;
  template <class View>
  __device__ static Q8Act32 load(const View& act, int row, int block) {
    const int8_t* a = act.qs_at(row, 32 * block);
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
  template <class View>
  __device__ static Act load_act(const View& act, int row, int u) { return Q8Act32::load(act, row, u); }
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
  template <class View>
  __device__ static Act load_act(const View& act, int row, int u) { return Q8Act32::load(act, row, u); }
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

// Q4_1, Q5_0, Q5_1 (quant/scalar/blocks32.cpp): nibbles placed as Q4_0's; the 5-bit types add
// bit j of the little-endian word qh as bit 4 of element j; Q5_0 decodes to d·(q − 16), the
// affine types to d·q + m, whose dot adds m·d_a·Σa (here per unit: the unit's own 8 activation
// quants, summed exactly by dp4a against ones, so no unit depends on another).
// Block layouts: Q4_1 {d, m, qs[16]} (20 bytes), Q5_0 {d, qh[4], qs[16]} (22), Q5_1 {d, m, qh[4],
// qs[16]} (24). Q4_1 and Q5_1 blocks keep a 4-byte-aligned row 4-byte aligned (every field is
// read with aligned 32-bit loads); Q5_0 rows are only 2-byte aligned (32-bit words read as two
// halves).
template <bool kFifthBit, bool kMin>
struct Affine32Weights {
  static constexpr int kBlockElems = 32;
  static constexpr int kQhOffset = kMin ? 4 : 2;  // used only when kFifthBit
  static constexpr int kQsOffset = (kMin ? 4 : 2) + (kFifthBit ? 4 : 0);
  static constexpr int kBlockBytes = kQsOffset + 16;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_0;
  static constexpr int kRowAlign = kBlockBytes % 4 == 0 ? 4 : 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  __device__ static uint32_t load_word(const uint8_t* p) {
    if constexpr (kRowAlign == 4) return ld_u32(p);
    else return ld_u32_a2(p);
  }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t*, float (&acc)[NR]) {
    const int b = u >> 2, part = u & 3;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    float d;
    [[maybe_unused]] float m = 0.0f;
    if constexpr (kMin) {
      const uint32_t dm = ld_u32(block);
      d = f16_bits_to_f32(uint16_t(dm & 0xffffu));
      m = f16_bits_to_f32(uint16_t(dm >> 16));
    } else {
      d = f16_bits_to_f32(ld_u16(block));
    }
    const uint32_t q = load_word(block + kQsOffset + 4 * part);
    uint32_t low = q & 0x0f0f0f0fu, high = (q >> 4) & 0x0f0f0f0fu;  // elements 4p.., 16+4p..
    if constexpr (kFifthBit) {
      const uint32_t qh = load_word(block + kQhOffset);
      low |= sign_mask4((qh >> (4 * part)) & 15u) & 0x10101010u;
      high |= sign_mask4((qh >> (16 + 4 * part)) & 15u) & 0x10101010u;
      if constexpr (!kMin) {  // Q5_0: q − 16
        low = __vsub4(low, 0x10101010u);
        high = __vsub4(high, 0x10101010u);
      }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const int8_t* a = act.qs(rows[r]) + 32 * b;
        const int al = ld_i32(a + 4 * part), ah = ld_i32(a + 16 + 4 * part);
        const int isum = __dp4a(int(high), ah, __dp4a(int(low), al, 0));
        const float da = act.scales(rows[r])[b];
        if constexpr (kMin) {
          const int asum = __dp4a(0x01010101, ah, __dp4a(0x01010101, al, 0));
          const float t = __fmaf_rn(__fmul_rn(d, da), float(isum), acc[r]);
          acc[r] = __fmaf_rn(__fmul_rn(m, da), float(asum), t);
        } else {
          acc[r] = __fmaf_rn(__fmul_rn(d, da), float(isum), acc[r]);
        }
      }
    }
  }
};
using Q4_1Weights = Affine32Weights<false, true>;
using Q5_0Weights = Affine32Weights<true, false>;
using Q5_1Weights = Affine32Weights<true, true>;
static_assert(Q4_1Weights::kBlockBytes == 20 && Q5_0Weights::kBlockBytes == 22 && Q5_1Weights::kBlockBytes == 24);
static_assert(Q4_1Weights::kRowAlign == 4 && Q5_0Weights::kRowAlign == 2 && Q5_1Weights::kRowAlign == 4);

}  // namespace strata::compute::cuda::quant_device
