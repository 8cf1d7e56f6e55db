// Per-type kernels behind quant.h (internal to quant/ and its tests).
//
// `scalar::` is the specification: plain loops written from the block definitions. `avx2::` are
// the fast versions (compiled with AVX2/FMA/F16C/BMI1 in avx2/*.cpp); call them only when
// cpu_has_avx2() is true. `avx512::` holds the kernels that gain from AVX-512, among them the
// tile kernels (DotTileFn: many weight rows × many activation rows, quant/tiles.h) that prompt
// windows run (see below).
// Files are named by format family, the same name at each instruction level:
//   float     F32, F16, BF16                         (a: f32)
//   blocks32  Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and the Q8_0 / Q8_K activation quantizers (a: Q8_0)
//   kquants   Q2_K, Q3_K, Q4_K, Q5_K, Q6_K           (a: Q8_K; quantizers in kquants_quantize.cpp)
//   iq4       IQ4_NL (a: Q8_0), IQ4_XS (a: Q8_K)
//   iq2xs     IQ2_XS                                 (a: Q8_K)
//   iq_lowbit IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (a: Q8_K; no quantizers)
// Contracts per kind:
// - dequantize_*: bitwise identical between scalar and avx2.
// - quantize_activation_* (Q8_0, Q8_K): bitwise identical between scalar and avx2.
// - dot_*: scalar accumulates in double (so it is the exact dot of the dequantized operands up
//   to one final rounding); avx2 accumulates in f32 lanes in an order fixed by n alone.
// No function allocates; all are pure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/ggml_type.h"

namespace strata::quant {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);
using DotFn = float (*)(const void* weight_row, const void* activation, int64_t n);
// One weight row against n_acts activation rows (row t at activations + t·act_stride bytes):
// out[t·out_stride] = the DotFn of the same type on (weight_row, row t), bitwise.
using DotManyFn = void (*)(const void* weight_row, const void* activations, size_t act_stride,
                           int64_t n_acts, int64_t n, float* out, size_t out_stride);
// n_w weight rows (row r at weights + r·weight_stride bytes) against n_acts activation rows (row t
// at activations + t·act_stride bytes): out[r·out_w_stride + t·out_act_stride] = the DotFn of the
// same type on (row r, activation t), bitwise. Kernels decode each weight block once for a tile of
// activation rows and load each activation once for a tile of weight rows (quant/tiles.h).
using DotTileFn = void (*)(const void* weights, size_t weight_stride, int64_t n_w,
                           const void* activations, size_t act_stride, int64_t n_acts, int64_t n,
                           float* out, size_t out_w_stride, size_t out_act_stride);

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

// Low-bit IQ types (scalar/iq_lowbit.cpp): no quantizers (llama.cpp needs an importance matrix).
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

// Q4_1, Q5_0, Q5_1, IQ4_NL (Q8_0 activations) and Q3_K, Q5_K, IQ4_XS (Q8_K activations): the types
// llama-quantize mixes into Q4_K_M, Q5_K_M, Q3_K_M, IQ4_XS, ... files; dispatched through
// kTableKernels below. Q4_1/Q5_1 (y = d·q + m): llama.cpp pairs them with Q8_1 activations, whose
// stored sum s = d·Σq is f16-rounded. strata uses Q8_0 activations and adds m·d_a·Σq_a from the
// integer quants, which is exact, so the dot is the dot of the dequantized operands (up to the
// final roundings).
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_q3_K(const void* src, float* dst, int64_t n);
void dequantize_q5_K(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);

void quantize_q4_1(const float* src, void* dst, int64_t n);
void quantize_q5_0(const float* src, void* dst, int64_t n);
void quantize_q5_1(const float* src, void* dst, int64_t n);
void quantize_iq4_nl(const float* src, void* dst, int64_t n);
void quantize_q3_K(const float* src, void* dst, int64_t n);
void quantize_q5_K(const float* src, void* dst, int64_t n);
void quantize_iq4_xs(const float* src, void* dst, int64_t n);

float dot_q4_1(const void* w, const void* a, int64_t n);    // a: Q8_0
float dot_q5_0(const void* w, const void* a, int64_t n);    // a: Q8_0
float dot_q5_1(const void* w, const void* a, int64_t n);    // a: Q8_0
float dot_iq4_nl(const void* w, const void* a, int64_t n);  // a: Q8_0
float dot_q3_K(const void* w, const void* a, int64_t n);    // a: Q8_K
float dot_q5_K(const void* w, const void* a, int64_t n);    // a: Q8_K
float dot_iq4_xs(const void* w, const void* a, int64_t n);  // a: Q8_K
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

// Low-bit IQ types (avx2/iq_lowbit.cpp).
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

// Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K, Q5_K, IQ4_XS (avx2/blocks32.cpp, avx2/kquants.cpp, avx2/iq4.cpp).
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_q3_K(const void* src, float* dst, int64_t n);
void dequantize_q5_K(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);

float dot_q4_1(const void* w, const void* a, int64_t n);
float dot_q5_0(const void* w, const void* a, int64_t n);
float dot_q5_1(const void* w, const void* a, int64_t n);
float dot_iq4_nl(const void* w, const void* a, int64_t n);
float dot_q3_K(const void* w, const void* a, int64_t n);
float dot_q5_K(const void* w, const void* a, int64_t n);
float dot_iq4_xs(const void* w, const void* a, int64_t n);

// Tiles of one weight row × up to 4 (Q8_0, Q4_0, Q5_0, IQ4_NL) or 8 (Q4_K, Q5_K, IQ2_XS)
// activation rows (quant/tiles.h): each weight block decoded once for the tile's activation rows;
// each output bitwise the avx2 one-row dot of its pair (and the canonical NaN for a NaN).
// IQ2_XS with >= 12 activation rows (12 rows as i16 within 64 KiB) takes a "wide" path: weight rows
// decoded once per call to scaled i16, 3 weight × 2 activation row tiles of madd (iq2xs.cpp).
void dot_tile_q8_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
void dot_tile_q4_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
void dot_tile_q5_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
void dot_tile_iq4_nl(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride);
void dot_tile_q4_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
void dot_tile_q5_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
void dot_tile_iq2_xs(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride);
}  // namespace avx2

// AVX-512 kernels (F, BW, VL, VBMI, VNNI, BITALG; avx512/*.cpp): call them only when
// cpu_has_avx512() is true. Bitwise equal to their avx2:: counterparts (same integer lanes, same
// f32 code), so the result does not depend on which of the two a CPU runs; every tile output is
// bitwise the single-row dot of its pair (tests/quant/tile_kernels_test.cpp).
namespace avx512 {
float dot_q4_0(const void* w, const void* a, int64_t n);
// Tiles of up to 2 weight rows × 4 activation rows of the 32-weight symmetric types (Q8_0 acts):
// each output bitwise the single-row dot of its pair (avx2:: and avx512:: alike).
void dot_tile_q8_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
void dot_tile_q4_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
void dot_tile_iq4_nl(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride);
void dot_tile_q5_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
float dot_q4_K(const void* w, const void* a, int64_t n);
// One Q4_K row against n_acts activation rows (row t at a + t·act_stride bytes) into
// out[t·out_stride]; each output bitwise dot_q4_K of its activation row.
void dot_many_q4_K(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                   float* out, size_t out_stride);
// Tiles of one weight row × up to 12 activation rows; each output bitwise dot_q4_K of its pair.
void dot_tile_q4_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
float dot_q6_K(const void* w, const void* a, int64_t n);
// Tiles of up to 2 weight rows × 4 activation rows; each output bitwise dot_q6_K of its pair.
void dot_tile_q6_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride);
// Tiles of up to 2 weight rows × 4 activation rows; each output bitwise avx2::dot_iq4_xs of its
// pair.
void dot_tile_iq4_xs(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride);
float dot_iq2_xs(const void* w, const void* a, int64_t n);
// Decodes each weight block once for up to 8 activation rows (more in further passes); every
// output is bitwise dot_iq2_xs of its activation row (shared per-block code, kernels_test checks).
void dot_many_iq2_xs(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                     float* out, size_t out_stride);
// dot_many_iq2_xs for n_w weight rows, activation groups of 8 outer (they stay in L1); with >= 8
// activation rows (rows <= 4096 weights) the "wide" path instead: weight rows decoded once per
// call to scaled i16, activations widened to i16 once, 4 × 4 tiles of vpdpwssd (iq2xs.cpp).
void dot_tile_iq2_xs(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride);
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

// One row per type, read by quant.cpp's dispatch tables and activation_type, and by the tests.
struct TableKernels {
  GgmlType type;
  GgmlType activation;  // Q8_0 or Q8_K
  DequantizeFn scalar_dequantize;
  QuantizeFn quantize;
  DotFn scalar_dot;
  DequantizeFn avx2_dequantize;
  DotFn avx2_dot;
};
inline constexpr TableKernels kTableKernels[] = {
    {GgmlType::Q4_1, GgmlType::Q8_0, scalar::dequantize_q4_1, scalar::quantize_q4_1,
     scalar::dot_q4_1, avx2::dequantize_q4_1, avx2::dot_q4_1},
    {GgmlType::Q5_0, GgmlType::Q8_0, scalar::dequantize_q5_0, scalar::quantize_q5_0,
     scalar::dot_q5_0, avx2::dequantize_q5_0, avx2::dot_q5_0},
    {GgmlType::Q5_1, GgmlType::Q8_0, scalar::dequantize_q5_1, scalar::quantize_q5_1,
     scalar::dot_q5_1, avx2::dequantize_q5_1, avx2::dot_q5_1},
    {GgmlType::IQ4_NL, GgmlType::Q8_0, scalar::dequantize_iq4_nl, scalar::quantize_iq4_nl,
     scalar::dot_iq4_nl, avx2::dequantize_iq4_nl, avx2::dot_iq4_nl},
    {GgmlType::Q3_K, GgmlType::Q8_K, scalar::dequantize_q3_K, scalar::quantize_q3_K,
     scalar::dot_q3_K, avx2::dequantize_q3_K, avx2::dot_q3_K},
    {GgmlType::Q5_K, GgmlType::Q8_K, scalar::dequantize_q5_K, scalar::quantize_q5_K,
     scalar::dot_q5_K, avx2::dequantize_q5_K, avx2::dot_q5_K},
    {GgmlType::IQ4_XS, GgmlType::Q8_K, scalar::dequantize_iq4_xs, scalar::quantize_iq4_xs,
     scalar::dot_iq4_xs, avx2::dequantize_iq4_xs, avx2::dot_iq4_xs},
};

}  // namespace strata::quant
