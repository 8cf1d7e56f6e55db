// AVX-512 (F/BW/VL + VNNI) tiles of IQ4_XS weight rows × Q8_K activation rows (dot_tile_iq4_xs;
// one-row dots stay avx2::dot_iq4_xs, which measured as fast). (IQ4_NL, with Q8_0 activations, shares the 32-weight block tiles of
// avx512/blocks32.cpp.)
//
// One 512-bit step covers two 32-weight sub-blocks (ib, ib + 1): their nibbles, placed as IQ4_NL's,
// are looked up in the kIq4nlValues codebook with one vpshufb, and their 64 activations are
// contiguous. The codebook values are signed (|K| ≤ 127), so products use avx2's sign trick
// emulated with masks: maddubs(|K|, ±a) gives exact i16 pair sums (≤ 2·127·127), and vpdpwssd
// multiplies them by the i16 sub-block scale and accumulates in i32 (avx2: madd + add).
//
// Bitwise equal to avx2::dot_iq4_xs: lanes 0-7 of the 16-lane sum hold sub-block ib's bytes
// 4k..4k+3 and lanes 8-15 those of ib + 1, so adding the two 256-bit halves gives each of avx2's
// 8 lanes exactly its integer; the f32 step is avx2's code, block after block.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "quant/avx2/common.h"
#include "quant/avx512/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/tiles.h"

STRATA_AVX512_IGNORE_GCC12_WARNINGS

namespace strata::quant::avx512 {
namespace {

// vpermw indices: step s (sub-blocks 2s, 2s + 1) takes scale 2s in words 0-15, 2s + 1 in 16-31.
struct ScaleIndices {
  alignas(64) uint16_t words[4][32];
};
constexpr ScaleIndices make_scale_indices() {
  ScaleIndices indices{};
  for (int step = 0; step < 4; ++step) {
    for (int word = 0; word < 32; ++word) indices.words[step][word] = uint16_t(2 * step + word / 16);
  }
  return indices;
}
constexpr ScaleIndices kScaleIndices = make_scale_indices();

template <int kW, int kA>
void iq4_xs_tile(const std::byte* w, size_t w_stride, const std::byte* a, size_t a_stride,
                 int64_t n_blocks, float* out, size_t out_w_stride, size_t out_a_stride) {
  const auto block_of = [&](int r, int64_t b) -> const BlockIQ4_XS& {
    return reinterpret_cast<const BlockIQ4_XS*>(w + size_t(r) * w_stride)[b];
  };
  const auto activation = [&](int t, int64_t b) -> const BlockQ8_K& {
    return reinterpret_cast<const BlockQ8_K*>(a + size_t(t) * a_stride)[b];
  };
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  const __m512i nibble = _mm512_set1_epi8(15);
  // 128-bit lanes (ib raw, ib+1 raw, ib >> 4, ib+1 >> 4) -> (ib low, ib high, ib+1 low, ib+1 high).
  const __m512i sub_block_order = _mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7);
  __m256 acc[kW][kA];
  for (auto& row : acc) {
    for (__m256& v : row) v = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m512i scales[kW];
    for (int r = 0; r < kW; ++r) {
      alignas(16) int16_t values[8];
      for (int ib = 0; ib < 8; ++ib) values[ib] = int16_t(iq4_xs_scale(block_of(r, b), ib) - 32);
      scales[r] = _mm512_castsi128_si512(_mm_load_si128(reinterpret_cast<const __m128i*>(values)));
    }
    __m512i sums[kW][kA];
    for (auto& row : sums) {
      for (__m512i& v : row) v = _mm512_setzero_si512();
    }
    for (int step = 0; step < 4; ++step) {
      __m512i magnitudes[kW], step_scales[kW];
      __mmask64 negative[kW];
      for (int r = 0; r < kW; ++r) {
        const __m256i raw = avx2::load32(block_of(r, b).qs + 32 * step);
        const __m512i both =
            _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
        const __m512i values = _mm512_shuffle_epi8(
            table, _mm512_and_si512(_mm512_permutexvar_epi64(sub_block_order, both), nibble));
        magnitudes[r] = _mm512_abs_epi8(values);
        negative[r] = _mm512_movepi8_mask(values);
        step_scales[r] =
            _mm512_permutexvar_epi16(_mm512_load_si512(kScaleIndices.words[step]), scales[r]);
      }
      for (int t = 0; t < kA; ++t) {
        const __m512i x = _mm512_loadu_si512(activation(t, b).qs + 64 * step);
        for (int r = 0; r < kW; ++r) {
          // sign(x, K): negated where K < 0 (where K = 0 the magnitude is 0 anyway).
          const __m512i signed_x = _mm512_mask_sub_epi8(x, negative[r], _mm512_setzero_si512(), x);
          sums[r][t] = _mm512_dpwssd_epi32(
              sums[r][t], _mm512_maddubs_epi16(magnitudes[r], signed_x), step_scales[r]);
        }
      }
    }
    for (int t = 0; t < kA; ++t) {
      const float act_d = activation(t, b).d;
      for (int r = 0; r < kW; ++r) {
        const float d = avx2::f16_scalar_to_f32(block_of(r, b).d) * act_d;
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(add_halves(sums[r][t])),
                                    acc[r][t]);
      }
    }
  }
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < kA; ++t) {
      out[size_t(r) * out_w_stride + size_t(t) * out_a_stride] =
          canonical_nan(avx2::horizontal_sum(acc[r][t]));
    }
  }
}

}  // namespace

void dot_tile_iq4_xs(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride) {
  const auto* weights = static_cast<const std::byte*>(w);
  const auto* acts = static_cast<const std::byte*>(a);
  tiles::for_each_tile<2, 4>(
      n_w, n_acts, [&](auto w_rows, auto a_rows, int64_t w_first, int64_t a_first) {
        iq4_xs_tile<decltype(w_rows)::value, decltype(a_rows)::value>(
            weights + size_t(w_first) * w_stride, w_stride, acts + size_t(a_first) * a_stride,
            a_stride, n / kBlockK,
            out + size_t(w_first) * out_w_stride + size_t(a_first) * out_a_stride, out_w_stride,
            out_a_stride);
      });
}

}  // namespace strata::quant::avx512
