// AVX2/FMA/F16C kernels for the float weight types (F32, F16, BF16) with f32 activations.
// Reduction order: four 8-lane FMA accumulators over 32-element steps, then one 8-lane step
// for the remaining multiples of 8, then a scalar tail; fixed by n alone.
#include "quant/avx2/common.h"
#include "quant/kernels.h"
#include "util/fp16.h"

namespace strata::quant::avx2 {
namespace {

inline __m256 load_f16x8(const uint16_t* src) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
}

inline __m256 load_bf16x8(const uint16_t* src) {
  const __m256i wide =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Shared dot loop; `load8` converts 8 weights at an element index to f32 lanes, `load1` one.
template <typename Load8, typename Load1>
float dot_generic(const float* x, int64_t n, Load8 load8, Load1 load1) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps();
  __m256 acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(load8(i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(load8(i + 16), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(load8(i + 24), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(x + i), acc0);
  float tail = 0.0f;
  for (; i < n; ++i) tail += load1(i) * x[i];
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
  return horizontal_sum(sum) + tail;
}

}  // namespace

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* halves = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(halves + i));
  for (; i < n; ++i) dst[i] = f16_scalar_to_f32(halves[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* halves = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(halves + i));
  for (; i < n; ++i) dst[i] = bf16_to_f32(halves[i]);
}

float dot_f32(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const float*>(w);
  return dot_generic(
      static_cast<const float*>(a), n, [&](int64_t i) { return _mm256_loadu_ps(weights + i); },
      [&](int64_t i) { return weights[i]; });
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const uint16_t*>(w);
  return dot_generic(
      static_cast<const float*>(a), n, [&](int64_t i) { return load_f16x8(weights + i); },
      [&](int64_t i) { return f16_scalar_to_f32(weights[i]); });
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const uint16_t*>(w);
  return dot_generic(
      static_cast<const float*>(a), n, [&](int64_t i) { return load_bf16x8(weights + i); },
      [&](int64_t i) { return bf16_to_f32(weights[i]); });
}

}  // namespace strata::quant::avx2
