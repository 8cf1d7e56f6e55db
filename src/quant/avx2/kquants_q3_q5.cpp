// AVX2 kernels of Q3_K, Q5_K and IQ4_XS with Q8_K activations (scalar specification:
// scalar_kquants_more.cpp).
// - Dequantization evaluates the scalar expressions lane by lane (dl·q, dl·q − ml with the same
//   f32 dl and ml), so it is bitwise identical to quant::scalar.
// - Dots: integer sums per block are exact (maddubs pairs ≤ 2·127·127, then madd with the i16
//   sub-block scales); Q3_K's −4 and Q5_K's mins go through the activation's bsums. Each block adds
//   one FMA per lane into an 8-lane accumulator (two for Q5_K: scales and mins), summed in a fixed
//   order, as kquants_avx2.cpp.
#include "quant/avx2/common.h"
#include "quant/blocks.h"
#include "quant/kernels_more.h"

namespace strata::quant::avx2 {
namespace {

// Q3_K levels (q + 4, 0..7) of half h, step j: byte 16·part + l holds element
// 128h + 32j + 16·part + l.
inline __m256i q3_K_levels(__m256i qs_half, __m256i hmask, int half, int step) {
  const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs_half, 2 * step), _mm256_set1_epi8(3));
  const __m256i high =
      _mm256_and_si256(_mm256_srli_epi16(hmask, 4 * half + step), _mm256_set1_epi8(1));
  return _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
}

// The sixteen Q3_K scales (unbiased, −32..31) as i16 lanes, sub-block k in lane k.
inline __m256i q3_K_scales(const BlockQ3_K& block) {
  alignas(32) int16_t scales[16];
  for (int k = 0; k < 16; ++k) scales[k] = int16_t(q3_K_scale(block.scales, k) - 32);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(scales));
}

// Q5_K quants (0..31) of chunk c: low nibbles (upper = 0) or high nibbles (upper = 1) plus the qh
// bit 2c + upper; byte l holds element 64c + 32·upper + l.
inline __m256i q5_K_quants(__m256i qs_chunk, __m256i qh, int chunk, int upper) {
  const __m256i nibble = _mm256_set1_epi8(15);
  const __m256i low = upper == 0 ? _mm256_and_si256(qs_chunk, nibble)
                                 : _mm256_and_si256(_mm256_srli_epi16(qs_chunk, 4), nibble);
  const __m256i high =
      _mm256_and_si256(_mm256_srli_epi16(qh, 2 * chunk + upper), _mm256_set1_epi8(1));
  return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
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

void dequantize_q3_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ3_K& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    const __m256i hmask = load32(block.hmask);
    float* y = dst + b * kBlockK;
    for_each_k2_sub_block(
        block.qs,
        [&](__m256i bytes, int half, int step) {
          return _mm256_sub_epi8(q3_K_levels(bytes, hmask, half, step), _mm256_set1_epi8(4));
        },
        [&](__m128i q16, int sub) {
          store_scaled_i8x16(q16, d * float(q3_K_scale(block.scales, sub) - 32), y + 16 * sub);
        });
  }
}

void dequantize_q5_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ5_K& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    const float dmin = f16_scalar_to_f32(block.dmin);
    uint8_t scales[8];
    uint8_t mins[8];
    unpack_q4_K_scales(block.scales, scales, mins);
    const __m256i qh = load32(block.qh);
    float* y = dst + b * kBlockK;
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m256i bytes = load32(block.qs + 32 * chunk);
      for (int upper = 0; upper < 2; ++upper) {
        const __m256i q = q5_K_quants(bytes, qh, chunk, upper);
        const float dl = d * scales[2 * chunk + upper];
        const float ml = dmin * mins[2 * chunk + upper];
        float* out = y + 64 * chunk + 32 * upper;
        store_affine_u8x16(_mm256_castsi256_si128(q), dl, ml, out);
        store_affine_u8x16(_mm256_extracti128_si256(q, 1), dl, ml, out + 16);
      }
    }
  }
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

float dot_q3_K(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ3_K& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    const __m256i scales = q3_K_scales(block);
    // Σ sc·(L − 4)·a = Σ sc·L·a − 4·Σ sc·bsum.
    const __m256i offsets = _mm256_madd_epi16(load32(act.bsums), scales);
    const __m256i hmask = load32(block.hmask);
    __m256i sums = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i half_scales = half_lanes(scales, half);
      const __m256i bytes = load32(block.qs + 32 * half);
      for (int step = 0; step < 4; ++step) {
        sums =
            _mm256_add_epi32(sums, k_step_sums(q3_K_levels(bytes, hmask, half, step),
                                               act.qs + 128 * half + 32 * step, half_scales, step));
      }
    }
    sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(offsets, 2));
    const float d = f16_scalar_to_f32(block.d) * act.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
  return horizontal_sum(acc);
}

float dot_q5_K(const void* w, const void* a, int64_t n) {
  return dot_k4_blocks(static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(a),
                       n / kBlockK,
                       [](const BlockQ5_K& block, int chunk, __m256i& low, __m256i& high) {
                         const __m256i bytes = load32(block.qs + 32 * chunk);
                         const __m256i qh = load32(block.qh);
                         low = q5_K_quants(bytes, qh, chunk, 0);
                         high = q5_K_quants(bytes, qh, chunk, 1);
                       });
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
