// AVX2 kernels of IQ4_NL (Q8_0 activations) and IQ4_XS (Q8_K activations) (scalar specification:
// scalar/iq4.cpp). Both look their nibbles up in the kIq4nlValues codebook with one byte shuffle.
// - Dequantization evaluates the scalar expressions lane by lane (d·K[q], dl·K[q]), so it is bitwise
//   identical to quant::scalar.
// - Dots: the codebook values are signed (|K| ≤ 127), so products use the sign trick of
//   avx2/blocks32.cpp; integer sums per block (IQ4_XS: madd with the i16 sub-block scales) are
//   exact, and each block adds one FMA per lane.
#include "quant/avx2/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"

namespace strata::quant::avx2 {
namespace {

inline __m256i iq4nl_table() {
  return _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
}

inline __m256i unpack_iq4_nl(const BlockIQ4_NL& block, __m256i table) {
  return _mm256_shuffle_epi8(table, unpack_nibbles(block.qs));
}

// The 32 codebook values of IQ4_XS sub-block ib in element order.
inline __m256i iq4_xs_values(const BlockIQ4_XS& block, int ib, __m128i table) {
  const __m128i raw = load16(block.qs + 16 * ib);
  const __m128i mask = _mm_set1_epi8(15);
  const __m128i low = _mm_shuffle_epi8(table, _mm_and_si128(raw, mask));
  const __m128i high = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(raw, 4), mask));
  return _mm256_set_m128i(high, low);
}

inline __m128i iq4nl_table128() {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
}

}  // namespace

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
  const __m256i table = iq4nl_table();
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    store_scaled_i8x32(unpack_iq4_nl(blocks[b], table), f16_scalar_to_f32(blocks[b].d),
                       dst + 32 * b);
  }
}

void dot_tile_iq4_nl(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride) {
  const __m256i table = iq4nl_table();
  one_row_tiles<4>(
      w, w_stride, n_w, a, a_stride, n_acts, out, out_w_stride, out_a_stride,
      [&](auto a_rows, const std::byte* weight, const std::byte* acts, float* tile_out) {
        dot_blocks32_tile<decltype(a_rows)::value>(
            reinterpret_cast<const BlockIQ4_NL*>(weight), acts, a_stride, n / kBlock32, tile_out,
            out_a_stride,
            [table](const BlockIQ4_NL& block) { return unpack_iq4_nl(block, table); });
      });
}

float dot_iq4_nl(const void* w, const void* a, int64_t n) {
  const __m256i table = iq4nl_table();
  return dot_blocks32(static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(a),
                      n / kBlock32,
                      [table](const BlockIQ4_NL& block) { return unpack_iq4_nl(block, table); });
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(src);
  const __m128i table = iq4nl_table128();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ4_XS& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    float* y = dst + b * kBlockK;
    for (int ib = 0; ib < 8; ++ib) {
      const float dl = d * float(iq4_xs_scale(block, ib) - 32);
      const __m256i values = iq4_xs_values(block, ib, table);
      store_scaled_i8x16(_mm256_castsi256_si128(values), dl, y + 32 * ib);
      store_scaled_i8x16(_mm256_extracti128_si256(values, 1), dl, y + 32 * ib + 16);
    }
  }
}

float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  const __m128i table = iq4nl_table128();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ4_XS& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    __m256i sums = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const __m256i values = iq4_xs_values(block, ib, table);
      const __m256i x = load32(act.qs + 32 * ib);
      // Sign trick: |K| ≤ 127 and |a| ≤ 127, so the i16 pair sums cannot saturate.
      const __m256i products =
          _mm256_maddubs_epi16(_mm256_sign_epi8(values, values), _mm256_sign_epi8(x, values));
      const __m256i scale = _mm256_set1_epi16(int16_t(iq4_xs_scale(block, ib) - 32));
      sums = _mm256_add_epi32(sums, _mm256_madd_epi16(products, scale));
    }
    const float d = f16_scalar_to_f32(block.d) * act.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
  return horizontal_sum(acc);
}

}  // namespace strata::quant::avx2
