// F32, F16 and BF16 weights against f32 activations (CPU twin: quant/scalar/float.cpp).
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
  static constexpr int kUnroll = 4;
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  struct Decoded {
    float w[8];
  };
  struct Act {
    float4 a, b;
  };

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t*) {
    Decoded out;
    const uint8_t* p = row + size_t(u) * kBlockBytes;
    if constexpr (Type == GgmlType::F32) {
      const float4 a = reinterpret_cast<const float4*>(p)[0];
      const float4 b = reinterpret_cast<const float4*>(p)[1];
      out.w[0] = a.x; out.w[1] = a.y; out.w[2] = a.z; out.w[3] = a.w;
      out.w[4] = b.x; out.w[5] = b.y; out.w[6] = b.z; out.w[7] = b.w;
    } else {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const auto low = uint16_t(words[i] & 0xffffu), high = uint16_t(words[i] >> 16);
        if constexpr (Type == GgmlType::F16) {
          out.w[2 * i] = f16_bits_to_f32(low);
          out.w[2 * i + 1] = f16_bits_to_f32(high);
        } else {
          out.w[2 * i] = bf16_bits_to_f32(low);
          out.w[2 * i + 1] = bf16_bits_to_f32(high);
        }
      }
    }
    return out;
  }

  __device__ static Act load_act(const ActView& act, int row, int u) {
    const float4* x = reinterpret_cast<const float4*>(act.floats(row) + 8 * u);
    return Act{x[0], x[1]};
  }

  __device__ static float dot(const Decoded& d, const Act& x, float acc) {
    float p = __fmul_rn(d.w[0], x.a.x);
    p = __fmaf_rn(d.w[1], x.a.y, p);
    p = __fmaf_rn(d.w[2], x.a.z, p);
    p = __fmaf_rn(d.w[3], x.a.w, p);
    p = __fmaf_rn(d.w[4], x.b.x, p);
    p = __fmaf_rn(d.w[5], x.b.y, p);
    p = __fmaf_rn(d.w[6], x.b.z, p);
    p = __fmaf_rn(d.w[7], x.b.w, p);
    return __fadd_rn(acc, p);
  }
};

}  // namespace strata::compute::cuda::quant_device
