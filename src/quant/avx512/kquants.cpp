// AVX-512 (F/BW/VL + VNNI) dot kernels for Q4_K weights with Q8_K activations: one weight row
// against one activation row (dot_q4_K) or against several at once (dot_many_q4_K, which unpacks
// each block's nibbles and scales once for up to 4 activation rows).
//
// One 512-bit step covers 64 weights: the 32 bytes of a Q4_K chunk, low nibbles in the lower
// half and high nibbles in the upper half, which is exactly the layout of the 64 activations of
// sub-blocks 2c and 2c+1. maddubs forms exact i16 pair sums (≤ 2·15·127) and vpdpwssd multiplies
// them by the sub-block scale and accumulates in i32, where AVX2 needs maddubs, two shuffles, two
// madds and two adds per 32 weights.
//
// Bitwise equal to avx2::dot_q4_K: integer sums are exact, and adding the two 256-bit halves of the
// 16-lane sum gives each of the 8 lanes exactly the elements the AVX2 kernel puts there (bytes
// 4k..4k+3 of every 32-byte activation vector); the f32 part is the same code. So a CPU with or
// without AVX-512 computes the same bits. Both entry points run the same per-row code, so
// dot_many's outputs are bitwise those of dot_q4_K.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>

#include "quant/avx2/common.h"
#include "quant/avx512/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"

STRATA_AVX512_IGNORE_GCC12_WARNINGS

namespace strata::quant::avx512 {
namespace {

// vpermw indices that spread scale 2c over i16 lanes 0-15 and scale 2c+1 over lanes 16-31.
inline __m512i chunk_scale_index(int chunk) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(short(2 * chunk))),
                            _mm256_set1_epi16(short(2 * chunk + 1)), 1);
}

// One weight row against kRows activation rows (row t at acts + t·act_stride bytes); each block's
// nibbles and scales are unpacked once. Every row runs exactly the single-row arithmetic, so
// out[t·out_stride] is bitwise dot_q4_K of the row with activation t.
template <int kRows>
void dot_rows(const BlockQ4_K* blocks, const std::byte* acts, size_t act_stride, int64_t n_blocks,
              float* out, size_t out_stride) {
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i scale_index[4] = {chunk_scale_index(0), chunk_scale_index(1), chunk_scale_index(2),
                                  chunk_scale_index(3)};
  const auto activation = [&](int t, int64_t b) -> const BlockQ8_K& {
    return reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride)[b];
  };
  __m256 acc[kRows];
  __m256 acc_mins[kRows];
  for (int t = 0; t < kRows; ++t) acc[t] = acc_mins[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ4_K& block = blocks[b];
    uint64_t scales_u64, mins_u64;
    unpack_q4_K_scales_u64(block.scales, &scales_u64, &mins_u64);
    // The eight scales as i16 in lanes 0-7 (the other lanes are never selected).
    const __m512i scales =
        _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(scales_u64))));
    __m512i sums[kRows];
    for (__m512i& sum : sums) sum = _mm512_setzero_si512();
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m256i bytes = avx2::load32(block.qs + 32 * chunk);
      const __m512i q = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1),
          nibble);
      const __m512i chunk_scales = _mm512_permutexvar_epi16(scale_index[chunk], scales);
      for (int t = 0; t < kRows; ++t) {
        const __m512i products =
            _mm512_maddubs_epi16(q, _mm512_loadu_si512(activation(t, b).qs + 64 * chunk));
        sums[t] = _mm512_dpwssd_epi32(sums[t], products, chunk_scales);
      }
    }
    const float block_d = avx2::f16_scalar_to_f32(block.d);
    const float block_dmin = avx2::f16_scalar_to_f32(block.dmin);
    for (int t = 0; t < kRows; ++t) {
      const BlockQ8_K& act = activation(t, b);
      // Mins exactly as avx2::dot_q4_K.
      const __m256i min_sums = avx2::k4_min_sums(act.bsums, mins_u64);
      const float d = block_d * act.d;
      const float dmin = block_dmin * act.d;
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(add_halves(sums[t])), acc[t]);
      acc_mins[t] =
          _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_sums), acc_mins[t]);
    }
  }
  for (int t = 0; t < kRows; ++t) {
    out[size_t(t) * out_stride] = avx2::horizontal_sum(acc[t]) - avx2::horizontal_sum(acc_mins[t]);
  }
}

}  // namespace

float dot_q4_K(const void* w, const void* a, int64_t n) {
  float result = 0.0f;
  dot_rows<1>(static_cast<const BlockQ4_K*>(w), static_cast<const std::byte*>(a), 0, n / kBlockK,
              &result, 0);
  return result;
}

void dot_many_q4_K(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                   float* out, size_t out_stride) {
  const auto* blocks = static_cast<const BlockQ4_K*>(w);
  const auto* acts = static_cast<const std::byte*>(a);
  const int64_t n_blocks = n / kBlockK;
  // Up to kMaxRows activations share one unpack; more go in further passes over the row (it stays
  // in L1: a 4096-wide row is 2.3 KiB).
  constexpr int64_t kMaxRows = 4;
  in_row_passes<kMaxRows>(n_acts, [&](auto rows, int64_t first) {
    dot_rows<decltype(rows)::value>(blocks, acts + size_t(first) * act_stride, act_stride, n_blocks,
                                    out + size_t(first) * out_stride, out_stride);
  });
}

}  // namespace strata::quant::avx512
