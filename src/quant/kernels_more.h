// Kernels of the types llama-quantize mixes into Q4_K_M, Q5_K_M, Q3_K_M, IQ4_XS, ... files:
// Q4_1, Q5_0, Q5_1, IQ4_NL (32-weight blocks, Q8_0 activations) and Q3_K, Q5_K, IQ4_XS (256-weight
// blocks, Q8_K activations). Same contracts as kernels.h (scalar:: is the specification, avx2::
// dequantizes bitwise equal to it, dots accumulate per kernels.h). Kept apart from kernels.h so
// additions to the two lists merge independently.
//
// Q4_1/Q5_1 (y = d·q + m): llama.cpp pairs them with Q8_1 activations, whose stored sum s = d·Σq is
// f16-rounded. strata uses Q8_0 activations and adds m·d_a·Σq_a from the integer quants, which is
// exact, so the dot is the dot of the dequantized operands (up to the final roundings).
#pragma once

#include <cstdint>

#include "quant/ggml_type.h"
#include "quant/kernels.h"

namespace strata::quant {

namespace scalar {
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
}  // namespace avx2

// One row per type, read by quant.cpp's dispatch tables and activation_type, and by the tests.
struct MoreTypeKernels {
  GgmlType type;
  GgmlType activation;  // Q8_0 or Q8_K
  DequantizeFn scalar_dequantize;
  QuantizeFn quantize;
  DotFn scalar_dot;
  DequantizeFn avx2_dequantize;
  DotFn avx2_dot;
};
inline constexpr MoreTypeKernels kMoreTypeKernels[] = {
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
