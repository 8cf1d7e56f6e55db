// expf over 16 floats at a time (AVX-512 F), bitwise equal to glibc's expf for every float: the
// steps of exp_avx2.cpp (which says where they come from) on 8 doubles a register instead of 4,
// with the 32-entry table of 2^(i/32) held in four registers and read by two permutes and a
// blend instead of a gather (the AVX2 form's gather of 4 doubles was most of its cost on the
// Zen 5 build VM: sigmoid, SiLU and softmax were ~7 % of a batched decode step, session 44).
// Every lane gets the same IEEE operations in the same order as exp_avx2.cpp's, so the same bits;
// tests/compute/exp_test.cpp checks both levels against std::exp.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "compute/cpu/exp_avx512.h"
#include "compute/cpu/exp_constants.h"
#include "quant/avx512/common.h"

STRATA_AVX512_IGNORE_GCC12_WARNINGS

namespace strata::compute::avx512 {
namespace {

using namespace exp_constants;  // the table and coefficients, one copy for both levels

struct Table {
  __m512i t0, t1, t2, t3;  // entries 0-7, 8-15, 16-23, 24-31
};

[[gnu::always_inline]] inline Table load_table() {
  return {_mm512_load_si512(kExp2Table), _mm512_load_si512(kExp2Table + 8),
          _mm512_load_si512(kExp2Table + 16), _mm512_load_si512(kExp2Table + 24)};
}

// exp_avx2.cpp's exp_fast4 on 8 lanes.
[[gnu::always_inline]] inline __m256 exp_fast8(const Table& table, __m256 x) {
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(kInvLn2N), xd, _mm512_set1_pd(kShift));
  const __m512i ki = _mm512_castpd_si512(z);
  const __m512d kd = _mm512_sub_pd(z, _mm512_set1_pd(kShift));
  const __m512d r = _mm512_fmsub_pd(_mm512_set1_pd(kInvLn2N), xd, kd);
  const __m512i index = _mm512_and_si512(ki, _mm512_set1_epi64(31));
  // Entry index & 15 of the low or the high 16, by bit 4: the gather's value.
  const __m512i low = _mm512_permutex2var_epi64(table.t0, index, table.t1);
  const __m512i high = _mm512_permutex2var_epi64(table.t2, index, table.t3);
  const __mmask8 upper = _mm512_test_epi64_mask(index, _mm512_set1_epi64(16));
  const __m512i entry = _mm512_mask_blend_epi64(upper, low, high);
  const __m512d s =
      _mm512_castsi512_pd(_mm512_add_epi64(entry, _mm512_slli_epi64(ki, 52 - kTableBits)));
  const __m512d p = _mm512_fmadd_pd(_mm512_set1_pd(kC0), r, _mm512_set1_pd(kC1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(kC2), r, _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(p, r2, y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

// expf of 16 lanes: the vector steps, and std::exp for the lanes outside the fast path.
[[gnu::always_inline]] inline __m512 exp16(const Table& table, __m512 x) {
  const __m512i top12 =
      _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7ff));
  const __mmask16 slow = _mm512_cmpgt_epi32_mask(top12, _mm512_set1_epi32(kFastTop12));
  const __m256 lo = exp_fast8(table, _mm512_castps512_ps256(x));
  const __m256 hi =
      exp_fast8(table, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  __m512 y = _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
  if (slow != 0) [[unlikely]] {
    alignas(64) float xs[16], ys[16];
    _mm512_store_ps(xs, x);
    _mm512_store_ps(ys, y);
    for (int i = 0; i < 16; ++i)
      if (slow & (1u << i)) ys[i] = std::exp(xs[i]);
    y = _mm512_load_ps(ys);
  }
  return y;
}

[[gnu::always_inline]] inline __m512 negate(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(int(0x80000000u))));
}

// out[i] = f16(x[i..i+16)) on 16-value groups, the scalar std::exp formula f1 on the tail.
template <typename F16, typename F1>
[[gnu::always_inline]] inline void map(const float* x, int64_t n, float* out, F16 f16, F1 f1) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, f16(_mm512_loadu_ps(x + i)));
  for (; i < n; ++i) out[i] = f1(x[i]);
}

}  // namespace

void exp_f32(const float* x, int64_t n, float* out) {
  const Table table = load_table();
  map(
      x, n, out, [&](__m512 v) { return exp16(table, v); }, [](float v) { return std::exp(v); });
}

void exp_minus_f32(const float* x, float shift, int64_t n, float* out) {
  const Table table = load_table();
  const __m512 m = _mm512_set1_ps(shift);
  map(
      x, n, out, [&](__m512 v) { return exp16(table, _mm512_sub_ps(v, m)); },
      [&](float v) { return std::exp(v - shift); });
}

void sigmoid_f32(const float* x, int64_t n, float* out) {
  const Table table = load_table();
  const __m512 one = _mm512_set1_ps(1.0f);
  map(
      x, n, out,
      [&](__m512 v) { return _mm512_div_ps(one, _mm512_add_ps(one, exp16(table, negate(v)))); },
      [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
}

void silu_f32(const float* x, int64_t n, float* out) {
  const Table table = load_table();
  const __m512 one = _mm512_set1_ps(1.0f);
  map(
      x, n, out,
      [&](__m512 v) { return _mm512_div_ps(v, _mm512_add_ps(one, exp16(table, negate(v)))); },
      [](float v) { return v / (1.0f + std::exp(-v)); });
}

void silu_mul_f32(float* g, const float* u, int64_t n) {
  const Table table = load_table();
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(g + i);
    const __m512 silu = _mm512_div_ps(v, _mm512_add_ps(one, exp16(table, negate(v))));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
}

void mul_sigmoid_f32(float* o, const float* gate, int64_t n) {
  const Table table = load_table();
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp16(table, negate(g))));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), s));
  }
  for (; i < n; ++i) o[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void mul_silu_f32(float* o, const float* gate, int64_t n) {
  const Table table = load_table();
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(table, negate(g))));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), s));
  }
  for (; i < n; ++i) o[i] *= gate[i] / (1.0f + std::exp(-gate[i]));
}

}  // namespace strata::compute::avx512
