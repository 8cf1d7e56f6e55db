// AVX-512 (F/BW/VL + VNNI) dot kernel for Q4_0 weights with Q8_0 activations.
//
// Two 32-weight blocks per 512-bit step: the even block in the lower half, the odd block in the
// upper half, which are exactly the AVX2 kernel's two accumulators (acc_even, acc_odd). The
// nibbles stay unsigned: Σ (q − 8)·a = Σ q·a − Σ 8·a, two vpdpbusd (u8 × s8 → i32, exact) and a
// subtract, where AVX2 needs an offset, two sign ops, maddubs and madd per block.
//
// Bitwise equal to avx2::dot_q4_0: each i32 lane holds the same exact sum of 4 products as the
// AVX2 kernel's lane, the block scale is the same f32 product, and every lane gets the same FMA
// in the same order; the tail block (odd count) and the final sum are the AVX2 code.
#include <immintrin.h>

#include "quant/avx2/common.h"
#include "quant/avx512/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"

STRATA_AVX512_IGNORE_GCC12_WARNINGS

namespace strata::quant::avx512 {
namespace {

inline __m128i load16(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

}  // namespace

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  const int64_t n_blocks = n / kBlock32;
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i eight = _mm512_set1_epi8(8);
  // 128-bit lanes (b0 raw, b1 raw, b0 >> 4, b1 >> 4) -> (b0 low, b0 high, b1 low, b1 high).
  const __m512i block_order = _mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7);
  __m512 acc = _mm512_setzero_ps();  // lanes 0-7: even blocks, lanes 8-15: odd blocks
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(load16(blocks[b].qs)),
                                                load16(blocks[b + 1].qs), 1);
    const __m512i both =
        _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    const __m512i q = _mm512_and_si512(_mm512_permutexvar_epi64(block_order, both), nibble);
    const __m512i x =
        _mm512_inserti64x4(_mm512_castsi256_si512(load32(acts[b].qs)), load32(acts[b + 1].qs), 1);
    const __m512i sums = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x),
                                          _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, x));
    const float d_even = avx2::f16_scalar_to_f32(blocks[b].d) * avx2::f16_scalar_to_f32(acts[b].d);
    const float d_odd =
        avx2::f16_scalar_to_f32(blocks[b + 1].d) * avx2::f16_scalar_to_f32(acts[b + 1].d);
    const __m512 d = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castps_pd(_mm512_set1_ps(d_even)), _mm256_castps_pd(_mm256_set1_ps(d_odd)), 1));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc);
  }
  __m256 acc_even = _mm512_castps512_ps256(acc);
  const __m256 acc_odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  if (b < n_blocks) {
    // The last, even-numbered block exactly as avx2::dot_q4_0 computes it.
    const __m128i raw = load16(blocks[b].qs);
    const __m256i q =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
    const __m256i x = load32(acts[b].qs);
    const __m256i sums =
        _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x),
                         _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), x));
    const float d = avx2::f16_scalar_to_f32(blocks[b].d) * avx2::f16_scalar_to_f32(acts[b].d);
    acc_even = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc_even);
  }
  return avx2::horizontal_sum(_mm256_add_ps(acc_even, acc_odd));
}

}  // namespace strata::quant::avx512
