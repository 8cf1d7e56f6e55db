// The activation quantizers' per-block arithmetic as device functions (internal to compute/cuda/):
// shared by the quantizer kernels (matmul.cu) and the matmul kernel's in-block quantizer
// (matmul_kernels.cuh, MatmulArgs::in_block), so the two give the same bits by construction: the
// same 8 values per lane through the same operations into the same quants, scales and sums.
//
// The stores write through a view's qs_at / scales / sums: ActView (the layout in global memory,
// matmul.h ActivationLayout) or SharedActView (quant/staging.cuh: a block's rows in shared
// memory, padded every 128 bytes). Every store is an 8-byte span at a multiple of 8, inside one
// 128-byte piece of its row, as SharedActView::qs_at requires.
#pragma once

#include <cstdint>

#include "compute/cuda/activation_math.cuh"
#include "compute/cuda/matmul.h"
#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

// Rounds v·inverse as quant::quantize_activation_value: clamp to [-127, 127] (NaN → -127), then
// round half to even (__float2int_rn is exact round-to-nearest-even for these magnitudes).
__device__ __forceinline__ int quantize_value(float x, float inverse) {
  float v = __fmul_rn(x, inverse);
  v = v > -127.0f ? v : -127.0f;
  v = v < 127.0f ? v : 127.0f;
  return __float2int_rn(v);
}

__device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
  return uint32_t(uint8_t(a)) | uint32_t(uint8_t(b)) << 8 | uint32_t(uint8_t(c)) << 16 | uint32_t(uint8_t(d)) << 24;
}

// The quantize step both layouts share: d = amax/127 (amax already reduced over the block), the 8
// values' quants with the unrounded d's inverse, and their sum. Returns d.
__device__ __forceinline__ float quantize8(const float v[8], float amax, int q[8], int& sum) {
  const float d = __fdiv_rn(amax, 127.0f);
  const float inverse = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    q[i] = quantize_value(v[i], inverse);
    sum += q[i];
  }
  return d;
}

// Q8_K: the 32 lanes of a warp each hold 8 consecutive values of one 256-value block b of `row`
// (lane l: values 8l .. 8l + 7). d = amax/127 (f32), 16-quant sums.
template <class View>
__device__ __forceinline__ void store_q8_K_block(const float v[8], int lane, int row, int64_t b, const View& act) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  int q[8], sum;
  const float d = quantize8(v, amax, q, sum);
  int8_t* qs = const_cast<int8_t*>(act.qs_at(row, int(b * 256 + 8 * lane)));
  reinterpret_cast<uint2*>(qs)[0] = make_uint2(pack4(q[0], q[1], q[2], q[3]), pack4(q[4], q[5], q[6], q[7]));
  const int pair = sum + __shfl_down_sync(0xffffffffu, sum, 1);
  if ((lane & 1) == 0) const_cast<int32_t*>(act.sums(row))[b * 16 + lane / 2] = pair;
  if (lane == 0) const_cast<float*>(act.scales(row))[b] = d;
}

// Q8_0: four consecutive lanes (part 0..3, 8 values each) per 32-value block b of `row`; every
// lane of the warp calls it (the shuffles), inactive ones with zeros and nothing stored. d =
// amax/127 stored as f16 (kept here as its f32 value), the quants computed with the unrounded d,
// as quant/scalar/blocks32.cpp does.
template <class View>
__device__ __forceinline__ void store_q8_0_block(const float v[8], int part, bool active, int row, int64_t b,
                                                 const View& act) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  int q[8], sum;
  const float d = quantize8(v, amax, q, sum);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (!active) return;
  int8_t* qs = const_cast<int8_t*>(act.qs_at(row, int(b * 32 + 8 * part)));
  reinterpret_cast<uint2*>(qs)[0] = make_uint2(pack4(q[0], q[1], q[2], q[3]), pack4(q[4], q[5], q[6], q[7]));
  if (part == 0) {
    const_cast<float*>(act.scales(row))[b] = __half2float(__float2half_rn(d));
    const_cast<int32_t*>(act.sums(row))[b] = sum;
  }
}

// The 8 floats at a + offset and b + offset (16-byte aligned) after an elementwise prologue:
// the floats of a themselves (None), silu(a)·b (SiluMul) or silu(a·scale) (ScaledSilu).
__device__ __forceinline__ void load8_elementwise(ActivationPrologue prologue, const float* a, const float* b,
                                                  float scale, int64_t offset, float v[8]) {
  const float4 a0 = reinterpret_cast<const float4*>(a + offset)[0], a1 = reinterpret_cast<const float4*>(a + offset)[1];
  v[0] = a0.x; v[1] = a0.y; v[2] = a0.z; v[3] = a0.w; v[4] = a1.x; v[5] = a1.y; v[6] = a1.z; v[7] = a1.w;
  if (prologue == ActivationPrologue::SiluMul) {
    const float4 b0 = reinterpret_cast<const float4*>(b + offset)[0], b1 = reinterpret_cast<const float4*>(b + offset)[1];
    const float u[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = silu_mul_value(v[i], u[i]);
  } else if (prologue == ActivationPrologue::ScaledSilu) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = scaled_silu_value(v[i], scale);
  }
}

}  // namespace strata::compute::cuda::quant_device
