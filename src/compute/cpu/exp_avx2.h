// AVX2 + FMA forms of the exp-based activations of ops.h (internal to compute/cpu): every output
// bitwise what the scalar std::exp formula gives (exp_avx2.cpp says how). Call only when
// quant::cpu_has_avx2() is true; ops.cpp dispatches. out may alias x.
#pragma once

#include <cstdint>

namespace strata::compute::avx2 {

void exp_f32(const float* x, int64_t n, float* out);                     // std::exp(x)
void exp_minus_f32(const float* x, float shift, int64_t n, float* out);  // std::exp(x - shift)
void sigmoid_f32(const float* x, int64_t n, float* out);  // 1.0f / (1.0f + std::exp(-x))
void silu_f32(const float* x, int64_t n, float* out);     // x / (1.0f + std::exp(-x))
void silu_mul_f32(float* g, const float* u, int64_t n);   // g = (g / (1 + std::exp(-g))) * u
void mul_sigmoid_f32(float* o, const float* gate, int64_t n);  // o *= sigmoid(gate)
void mul_silu_f32(float* o, const float* gate, int64_t n);     // o *= silu(gate)

}  // namespace strata::compute::avx2
