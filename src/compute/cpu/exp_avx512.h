// AVX-512 forms of exp_avx2.h's functions (internal to compute/cpu): the same contract, every
// output bitwise the scalar std::exp formula's. Call only when quant::active_kernel_level() is
// Avx512 (AVX-512 F is all they use); ops.cpp dispatches. out may alias x.
#pragma once

#include <cstdint>

namespace strata::compute::avx512 {

void exp_f32(const float* x, int64_t n, float* out);
void exp_minus_f32(const float* x, float shift, int64_t n, float* out);
void sigmoid_f32(const float* x, int64_t n, float* out);
void silu_f32(const float* x, int64_t n, float* out);
void silu_mul_f32(float* g, const float* u, int64_t n);
void mul_sigmoid_f32(float* o, const float* gate, int64_t n);
void mul_silu_f32(float* o, const float* gate, int64_t n);

}  // namespace strata::compute::avx512
