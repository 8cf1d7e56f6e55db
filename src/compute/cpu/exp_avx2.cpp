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

namespace strata::compute::avx2 {
namespace {

constexpr int kTableBits = 5;  // N = 32
// 2^(i/32) rounded to double, as bits, minus i << 47 (i << (52 - kTableBits)).
alignas(32) constexpr uint64_t kExp2Table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
constexpr double kInvLn2N = 0x1.71547652b82fep+5;  // 32 / ln 2
constexpr double kShift = 0x1.8p+52;
constexpr double kC0 = 0x1.c6af84b912394p-20;
constexpr double kC1 = 0x1.ebfce50fac4f3p-13;
constexpr double kC2 = 0x1.62e42ff0c52d6p-6;
// glibc's fast path: bits 20..30 of x at most this (|x| < 2^7 · (1 + 0xaff/0x800), about 88).
constexpr int kFastTop12 = 0x42a;

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
