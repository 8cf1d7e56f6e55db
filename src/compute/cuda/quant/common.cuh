// Device-side building blocks of the CUDA quantized matmul (internal to compute/cuda/).
//
// A weight type is described to the generic kernel (matmul_kernels.cuh) by a struct with:
//   kBlockElems, kBlockBytes     the GGUF block
//   kUnitsPerBlock               how many "units" one block is cut into; one lane decodes one
//                                unit at a time (a unit is one sub-block or a few, chosen so a
//                                lane's loads are contiguous and a warp's loads coalesce)
//   kActivation                  F32, Q8_0 or Q8_K: the activation format (as quant.h's
//                                activation_type)
//   kRowAlign                    the widest aligned load the unit makes (checked on the host)
//   kUnroll (optional, 2)        units a lane decodes per loop trip, loads issued together
//   kTableBytes, load_table()    optional lookup table copied into shared memory per block
//   Decoded decode(row, u, table) the unit's weights in registers (quants as packed signed bytes,
//                                scales as integers, d as f32)
//   Act load_act(act, row, u)    the matching activation quants, scale and sums of one row,
//                                through act.qs_at/scales/sums (a template over the view for the
//                                types the staged kernel takes: ActView or SharedActView)
//   float dot(Decoded, Act, acc) acc + the unit's contribution: exact integer dot products, then
//                                explicitly rounded f32 operations (__fmaf_rn, __fmul_rn, ...) so no
//                                compiler contraction can differ between instantiations
//   (or, instead of the three, unit<NR>(row, u, act, rows, nr, table, acc) doing all three for
//   nr <= NR activation rows). A row's arithmetic must never depend on NR, nr, the number of
//   weight rows a warp takes or any other row: that is window identity.
// The per-type files (float.cuh, blocks32.cuh, kquants.cuh, iq2xs.cuh, iq_lowbit.cuh, iq4.cuh)
// pair by name with the CPU kernels in quant/ and follow their block definitions
// (shared/reference/gguf-and-quants.md §4).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "quant/ggml_type.h"

namespace strata::compute::cuda::quant_device {

// The quantized activations of a window (see ActivationLayout in matmul.h).
struct ActView {
  const uint8_t* base;
  size_t qs_offset, qs_row_bytes;
  size_t scale_offset, scale_row_count;
  size_t sum_offset, sum_row_count;
  __device__ const int8_t* qs(int row) const {
    return reinterpret_cast<const int8_t*>(base + qs_offset + size_t(row) * qs_row_bytes);
  }
  // The quants of `row` from byte `offset` on; load_act reads through this (and scales, sums) so
  // the same code also reads SharedActView (staging.cuh), where a row is padded.
  __device__ const int8_t* qs_at(int row, int offset) const { return qs(row) + offset; }
  __device__ const float* floats(int row) const {
    return reinterpret_cast<const float*>(base + qs_offset + size_t(row) * qs_row_bytes);
  }
  __device__ const float* scales(int row) const {
    return reinterpret_cast<const float*>(base + scale_offset) + size_t(row) * scale_row_count;
  }
  __device__ const int32_t* sums(int row) const {
    return reinterpret_cast<const int32_t*>(base + sum_offset) + size_t(row) * sum_row_count;
  }
};

__device__ __forceinline__ float f16_bits_to_f32(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t bits) {
  return __uint_as_float(uint32_t(bits) << 16);
}
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
// A 32-bit little-endian word at a 2-byte-aligned address.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// N consecutive 32-bit words starting at a 2-byte-aligned address, read as N+1 aligned words
// and funnel-shifted (the one extra word stays inside the same 4-byte-aligned word of the
// allocation, which DeviceBuffer pads).
template <int N>
__device__ __forceinline__ void ld_words_a2(const uint8_t* p, uint32_t (&out)[N]) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const auto* aligned = reinterpret_cast<const uint32_t*>(address & ~uintptr_t(3));
  const unsigned shift = unsigned(address & 3) * 8;
  uint32_t words[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) words[i] = aligned[i];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(words[i], words[i + 1], shift);
}
__device__ __forceinline__ int ld_i32(const int8_t* p) { return *reinterpret_cast<const int*>(p); }
__device__ __forceinline__ int4 ld_i32x4(const int8_t* p) { return *reinterpret_cast<const int4*>(p); }

// Four signed bytes from a 16-entry int8 codebook (as 4 little-endian words), indexed by the
// nibbles n0..n3 packed as bits 0-3, 8-11, 16-19, 24-27 of `indices` (other bits zero).
__device__ __forceinline__ int codebook16_lookup4(const uint32_t (&table)[4], uint32_t indices) {
  const uint32_t packed = (indices | (indices >> 4)) & 0x00ff00ffu;  // n0 | n1<<4 | n2<<16 | n3<<20
  const uint32_t selector = (packed & 0xffu) | ((packed >> 8) & 0xff00u);  // nibbles n0 n1 n2 n3
  const uint32_t low = __byte_perm(table[0], table[1], selector & 0x7777u);
  const uint32_t high = __byte_perm(table[2], table[3], selector & 0x7777u);
  // byte i from `high` when bit 3 of n_i is set
  const uint32_t pick = 0x3210u | ((selector >> 1) & 0x4444u);
  return int(__byte_perm(low, high, pick));
}

// Per-byte 0xff where bit i of `bits` (< 16) is set (byte i), else 0. The multiply puts copies of
// the 4 bits at shifts 0, 7, 14 and 21 (disjoint, so no carries): bit i lands on bit 8i; the
// second multiply widens each 0/1 byte to 0x00/0xff. Three integer instructions, where
// __vcmpne4 is emulated on sm_90.
__device__ __forceinline__ uint32_t sign_mask4(uint32_t bits) {
  return ((bits * 0x00204081u) & 0x01010101u) * 0xffu;
}
// Negates the bytes of v where mask is 0xff. Precondition: those bytes are 1..127 (grid
// magnitudes: every grid byte of the IQ2/IQ3 types is; IqLowbitTables.GridBytesAreLatticeLevels
// pins them), so ~b + 1 never carries into the next byte and the add is __vsub4's per-byte two's
// complement (emulated on sm_90) in two instructions.
__device__ __forceinline__ int apply_signs4(uint32_t v, uint32_t mask) {
  return int((v ^ mask) + (mask & 0x01010101u));
}

}  // namespace strata::compute::cuda::quant_device
