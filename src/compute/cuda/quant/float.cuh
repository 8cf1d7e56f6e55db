// F32, F16 and BF16 weights against f32 activations (CPU twin: quant/scalar_float.cpp).
// A unit is 8 consecutive weights: one 16-byte load (two for F32); its products are chained
// with fused multiply-adds in index order, then added to the row's accumulator.
#pragma once

#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

template <GgmlType Type>
struct FloatWeights {
  static constexpr int kBlockElems = 8;  // a "block" here is just the unit
  static constexpr int kBytesPerWeight = Type == GgmlType::F32 ? 4 : 2;
  static constexpr int kBlockBytes = 8 * kBytesPerWeight;
  static constexpr int kUnitsPerBlock = 1;
  static constexpr GgmlType kActivation = GgmlType::F32;
  static constexpr int kRowAlign = 16;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  __device__ static void weights(const uint8_t* p, float (&w)[8]) {
    if constexpr (Type == GgmlType::F32) {
      const float4 a = reinterpret_cast<const float4*>(p)[0];
      const float4 b = reinterpret_cast<const float4*>(p)[1];
      w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
      w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const auto low = uint16_t(words[i] & 0xffffu), high = uint16_t(words[i] >> 16);
        if constexpr (Type == GgmlType::F16) {
          w[2 * i] = f16_bits_to_f32(low);
          w[2 * i + 1] = f16_bits_to_f32(high);
        } else {
          w[2 * i] = bf16_bits_to_f32(low);
          w[2 * i + 1] = bf16_bits_to_f32(high);
        }
      }
    }
  }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t*, float (&acc)[NR]) {
    float w[8];
    weights(row + size_t(u) * kBlockBytes, w);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const float4* x = reinterpret_cast<const float4*>(act.floats(rows[r]) + 8 * u);
        const float4 a = x[0], b = x[1];
        float p = __fmul_rn(w[0], a.x);
        p = __fmaf_rn(w[1], a.y, p);
        p = __fmaf_rn(w[2], a.z, p);
        p = __fmaf_rn(w[3], a.w, p);
        p = __fmaf_rn(w[4], b.x, p);
        p = __fmaf_rn(w[5], b.y, p);
        p = __fmaf_rn(w[6], b.z, p);
        p = __fmaf_rn(w[7], b.w, p);
        acc[r] = __fadd_rn(acc[r], p);
      }
    }
  }
};

}  // namespace strata::compute::cuda::quant_device
