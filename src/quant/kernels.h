// Per-type kernels behind quant.h (internal to quant/ and its tests).
//
// `scalar::` is the specification: plain loops written from the block definitions. `avx2::` are
// the fast versions (compiled with AVX2/FMA/F16C/BMI1 in *_avx2.cpp); call them only when
// cpu_has_avx2() is true. `avx512::` holds the few kernels that gain from AVX-512 (see below).
// Contracts per kind:
// - dequantize_*: bitwise identical between scalar and avx2.
// - quantize_activation_* (Q8_0, Q8_K): bitwise identical between scalar and avx2.
// - dot_*: scalar accumulates in double (so it is the exact dot of the dequantized operands up
//   to one final rounding); avx2 accumulates in f32 lanes in an order fixed by n alone.
// No function allocates; all are pure.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::quant {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);
using DotFn = float (*)(const void* weight_row, const void* activation, int64_t n);
// One weight row against n_acts activation rows (row t at activations + t·act_stride bytes):
// out[t·out_stride] = the DotFn of the same type on (weight_row, row t), bitwise.
using DotManyFn = void (*)(const void* weight_row, const void* activations, size_t act_stride,
                           int64_t n_acts, int64_t n, float* out, size_t out_stride);

namespace scalar {
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q2_K(const void* src, float* dst, int64_t n);
void dequantize_q4_K(const void* src, float* dst, int64_t n);
void dequantize_q6_K(const void* src, float* dst, int64_t n);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);

void quantize_f32(const float* src, void* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);
void quantize_q8_0(const float* src, void* dst, int64_t n);  // also the Q8_0 activation format
void quantize_q4_0(const float* src, void* dst, int64_t n);
void quantize_q2_K(const float* src, void* dst, int64_t n);
void quantize_q4_K(const float* src, void* dst, int64_t n);
void quantize_q6_K(const float* src, void* dst, int64_t n);
void quantize_iq2_xs(const float* src, void* dst, int64_t n);  // no imatrix: lower quality
void quantize_q8_K(const float* src, void* dst, int64_t n);    // activation only

float dot_f32(const void* w, const void* a, int64_t n);     // a: f32
float dot_f16(const void* w, const void* a, int64_t n);     // a: f32
float dot_bf16(const void* w, const void* a, int64_t n);    // a: f32
float dot_q8_0(const void* w, const void* a, int64_t n);    // a: Q8_0
float dot_q4_0(const void* w, const void* a, int64_t n);    // a: Q8_0
float dot_q2_K(const void* w, const void* a, int64_t n);    // a: Q8_K
float dot_q4_K(const void* w, const void* a, int64_t n);    // a: Q8_K
float dot_q6_K(const void* w, const void* a, int64_t n);    // a: Q8_K
float dot_iq2_xs(const void* w, const void* a, int64_t n);  // a: Q8_K

// Low-bit IQ types (scalar_iq_lowbit.cpp): no quantizers (llama.cpp needs an importance matrix).
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);
float dot_iq2_xxs(const void* w, const void* a, int64_t n);  // a: Q8_K (all six)
float dot_iq2_s(const void* w, const void* a, int64_t n);
float dot_iq3_xxs(const void* w, const void* a, int64_t n);
float dot_iq3_s(const void* w, const void* a, int64_t n);
float dot_iq1_s(const void* w, const void* a, int64_t n);
float dot_iq1_m(const void* w, const void* a, int64_t n);
}  // namespace scalar

namespace avx2 {
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q2_K(const void* src, float* dst, int64_t n);
void dequantize_q4_K(const void* src, float* dst, int64_t n);
void dequantize_q6_K(const void* src, float* dst, int64_t n);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);

void quantize_q8_0(const float* src, void* dst, int64_t n);
void quantize_q8_K(const float* src, void* dst, int64_t n);

float dot_f32(const void* w, const void* a, int64_t n);
float dot_f16(const void* w, const void* a, int64_t n);
float dot_bf16(const void* w, const void* a, int64_t n);
float dot_q8_0(const void* w, const void* a, int64_t n);
float dot_q4_0(const void* w, const void* a, int64_t n);
float dot_q2_K(const void* w, const void* a, int64_t n);
float dot_q4_K(const void* w, const void* a, int64_t n);
float dot_q6_K(const void* w, const void* a, int64_t n);
float dot_iq2_xs(const void* w, const void* a, int64_t n);

// Low-bit IQ types (iq_lowbit_avx2.cpp).
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);
float dot_iq2_xxs(const void* w, const void* a, int64_t n);
float dot_iq2_s(const void* w, const void* a, int64_t n);
float dot_iq3_xxs(const void* w, const void* a, int64_t n);
float dot_iq3_s(const void* w, const void* a, int64_t n);
float dot_iq1_s(const void* w, const void* a, int64_t n);
float dot_iq1_m(const void* w, const void* a, int64_t n);
}  // namespace avx2

// AVX-512 kernels (F, BW, VL, VBMI, VNNI, BITALG; *_avx512.cpp): call them only when
// cpu_has_avx512() is true. Bitwise equal to their avx2:: counterparts (same integer lanes, same
// f32 code), so the result does not depend on which of the two a CPU runs.
namespace avx512 {
float dot_q4_0(const void* w, const void* a, int64_t n);
float dot_q4_K(const void* w, const void* a, int64_t n);
// One Q4_K row against n_acts activation rows (row t at a + t·act_stride bytes) into
// out[t·out_stride]; each output bitwise dot_q4_K of its activation row.
void dot_many_q4_K(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                   float* out, size_t out_stride);
float dot_iq2_xs(const void* w, const void* a, int64_t n);
// Decodes each weight block once for up to 8 activation rows (more in further passes); every
// output is bitwise dot_iq2_xs of its activation row (shared per-block code, kernels_test checks).
void dot_many_iq2_xs(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                     float* out, size_t out_stride);
}  // namespace avx512

// Rounds to nearest, ties to even, for |v| ≤ 2^22: adding 1.5·2^23 leaves no fraction bits, so
// the FPU's default rounding does the work (nearbyintf would be a libm call on baseline x86-64).
inline float round_half_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5·2^23
  return (v + kMagic) - kMagic;
}

// Shared by scalar and avx2 activation quantizers so both round identically: clamps v*inverse
// into [-127, 127] (NaN goes to -127) and rounds to nearest even, as _mm256_cvtps_epi32 does.
inline int quantize_activation_value(float v) {
  v = v > -127.0f ? v : -127.0f;
  v = v < 127.0f ? v : 127.0f;
  return static_cast<int>(round_half_even(v));
}

}  // namespace strata::quant
