// Small AVX2 helpers shared by the *_avx2.cpp and *_avx512.cpp kernels. Include only from files
// compiled with STRATA_AVX2_FLAGS.
//
// Every helper is always_inline: a plain inline function is also emitted out of line where it is
// not inlined (e.g. unoptimised builds), and the linker keeps one of those copies for the whole
// program; a copy compiled with AVX-512 flags would then run on the AVX2 path and fault on a CPU
// without AVX-512. Forced inlining leaves no shared copy.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace strata::quant::avx2 {

// Sum of the 8 lanes in a fixed order: (lanes 0-3 + lanes 4-7), then pairs, then the last two.
[[gnu::always_inline]] inline float horizontal_sum(__m256 v) {
  const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
  const __m128 single = _mm_add_ss(pair, _mm_movehdup_ps(pair));
  return _mm_cvtss_f32(single);
}

[[gnu::always_inline]] inline int horizontal_sum_i32(__m256i v) {
  const __m128i quad = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i pair = _mm_add_epi32(quad, _mm_unpackhi_epi64(quad, quad));
  const __m128i single = _mm_add_epi32(pair, _mm_shuffle_epi32(pair, 1));
  return _mm_cvtsi128_si32(single);
}

[[gnu::always_inline]] inline float f16_scalar_to_f32(uint16_t bits) {
  return _cvtsh_ss(bits);
}

// Largest |x| over n floats (n a multiple of 8); exact, so the order does not matter.
[[gnu::always_inline]] inline float max_abs(const float* x, int n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) {
    // max(|x|, acc) returns acc when |x| is NaN, like fmax in the scalar quantizer.
    acc = _mm256_max_ps(_mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + i)), acc);
  }
  const __m128 quad = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
  return _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)));
}

// Quantizes 8 floats as quantize_activation_value does: clamp(x·inverse, ±127), round to even.
[[gnu::always_inline]] inline __m256i quantize_activation_8(const float* x, __m256 inverse) {
  __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inverse);
  v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f));  // NaN -> -127 (second operand)
  v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
  return _mm256_cvtps_epi32(v);  // MXCSR default: round to nearest even
}

// Packs four vectors of 8 int32 (each in [-127, 127]) into 32 int8 in element order.
[[gnu::always_inline]] inline __m256i pack_i32x32_to_i8(__m256i a, __m256i b, __m256i c,
                                                        __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i mixed = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(mixed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace strata::quant::avx2
