// expf over 8 floats at a time (AVX2 + FMA), bitwise equal to glibc's expf for every float.
//
// Why: the prompt path evaluates expf once per element of every SwiGLU, gate and softmax (a
// 512-token prompt of mid-qwen4exp calls it ~10^8 times, ~10 % of the time through libm's scalar
// entry). The engine's results are specified through std::exp (ops.h), so a faster exp must give
// exactly those bits: this one evaluates, lane by lane in double precision, the same steps as
// glibc 2.36's expf (the FMA variant its ifunc picks on AVX2 machines, __expf_fma), written from
// the algorithm's description: x·N/ln2 rounded to an integer k by adding 1.5·2^52, r = x·N/ln2 − k
// (both fused), 2^(k/N) from a 32-entry table of 2^(i/32) with k/N's integer part added to the
// exponent bits, and a degree-3 polynomial in r evaluated as fma(fma(C0, r, C1), r², fma(C2, r, 1)),
// times the table value, rounded once to float. The polynomial coefficients and the table are the
// values glibc uses (the only way to get its bits; the table entries are 2^(i/32) rounded to
// double, minus i·2^47 so the exponent add is one integer add). Inputs outside glibc's fast path
// (|x| ≥ 88 in the exponent test below, NaN, ±inf) go to std::exp itself, lane by lane.
// tests/compute/exp_test.cpp compares against std::exp: sampled in the default suite, all 2^32
// floats under the `slow` label.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "compute/cpu/exp_avx2.h"
#include "compute/cpu/exp_constants.h"

namespace strata::compute::avx2 {
namespace {

using namespace exp_constants;  // the table and coefficients, one copy for both levels

[[gnu::always_inline]] inline __m128 exp_fast4(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(kInvLn2N), xd, _mm256_set1_pd(kShift));
  const __m256i ki = _mm256_castpd_si256(z);
  const __m256d kd = _mm256_sub_pd(z, _mm256_set1_pd(kShift));
  const __m256d r = _mm256_fmsub_pd(_mm256_set1_pd(kInvLn2N), xd, kd);
  const __m256i index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  const __m256i table = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExp2Table),
                                               index, 8);
  const __m256d s = _mm256_castsi256_pd(
      _mm256_add_epi64(table, _mm256_slli_epi64(ki, 52 - kTableBits)));
  const __m256d p = _mm256_fmadd_pd(_mm256_set1_pd(kC0), r, _mm256_set1_pd(kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(kC2), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(p, r2, y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

// expf of 8 lanes: the vector steps, and std::exp for the lanes outside the fast path.
[[gnu::always_inline]] inline __m256 exp8(__m256 x) {
  const __m256i top12 =
      _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
  const __m256i slow = _mm256_cmpgt_epi32(top12, _mm256_set1_epi32(kFastTop12));
  __m256 y = _mm256_set_m128(exp_fast4(_mm256_extractf128_ps(x, 1)),
                             exp_fast4(_mm256_castps256_ps128(x)));
  if (!_mm256_testz_si256(slow, slow)) [[unlikely]] {
    alignas(32) float xs[8], ys[8];
    alignas(32) int32_t mask[8];
    _mm256_store_ps(xs, x);
    _mm256_store_ps(ys, y);
    _mm256_store_si256(reinterpret_cast<__m256i*>(mask), slow);
    for (int i = 0; i < 8; ++i)
      if (mask[i] != 0) ys[i] = std::exp(xs[i]);
    y = _mm256_load_ps(ys);
  }
  return y;
}

// out[i] = f(x[i]) for n values: f8 on 8-value groups, scalar f (std::exp-based, the same bits)
// on the tail.
template <typename F8, typename F1>
[[gnu::always_inline]] inline void map(const float* x, int64_t n, float* out, F8 f8, F1 f1) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) out[i] = f1(x[i]);
}

// -0.0f in every lane (a function: a namespace-scope vector would be built at start-up, with an
// AVX instruction, on every CPU).
[[gnu::always_inline]] inline __m256 sign_bit() { return _mm256_set1_ps(-0.0f); }

}  // namespace

void exp_f32(const float* x, int64_t n, float* out) {
  map(x, n, out, [](__m256 v) { return exp8(v); }, [](float v) { return std::exp(v); });
}

void exp_minus_f32(const float* x, float shift, int64_t n, float* out) {
  const __m256 m = _mm256_set1_ps(shift);
  map(x, n, out, [&](__m256 v) { return exp8(_mm256_sub_ps(v, m)); },
      [&](float v) { return std::exp(v - shift); });
}

void sigmoid_f32(const float* x, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  map(x, n, out,
      [&](__m256 v) { return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_xor_ps(v, sign_bit())))); },
      [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
}

void silu_f32(const float* x, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  map(x, n, out,
      [&](__m256 v) { return _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_xor_ps(v, sign_bit())))); },
      [](float v) { return v / (1.0f + std::exp(-v)); });
}

void silu_mul_f32(float* g, const float* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(g + i);
    const __m256 silu =
        _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_xor_ps(v, sign_bit()))));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
}

void mul_sigmoid_f32(float* o, const float* gate, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, sign_bit()))));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), s));
  }
  for (; i < n; ++i) o[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void mul_silu_f32(float* o, const float* gate, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, sign_bit()))));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), s));
  }
  for (; i < n; ++i) o[i] *= gate[i] / (1.0f + std::exp(-gate[i]));
}

}  // namespace strata::compute::avx2
