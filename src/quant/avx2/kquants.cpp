// AVX2 kernels for the K-quants Q2_K, Q4_K, Q6_K with Q8_K activations.
//
// Dot products: weights are unsigned (Q2_K 0..3, Q4_K 0..15, Q6_K 0..63), activations signed
// in [-127, 127], so maddubs(w, a) forms exact i16 pair sums (≤ 2·63·127); madd with the i16
// sub-block scales widens to i32. Mins (Q2_K, Q4_K) and Q6_K's −32 offset go through the
// activation's bsums. Per block, the integer sums are exact; the f32 part is one FMA per lane
// into an 8-lane accumulator (two for Q2_K/Q4_K: scales and mins), summed in a fixed order.
//
// Dequantization evaluates exactly the scalar expressions (scale·q − min, in that order), so it
// is bitwise identical to quant::scalar.
#include "quant/avx2/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"

namespace strata::quant::avx2 {
namespace {

// The four 6-bit quant vectors of one Q6_K half: vector j holds elements 128h + 32j + (0..31).
inline void unpack_q6_K_half(const BlockQ6_K& block, int half, __m256i q[4]) {
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  const __m256i high_mask = _mm256_set1_epi8(0x30);
  const __m256i ql0 = load32(block.ql + 64 * half);
  const __m256i ql1 = load32(block.ql + 64 * half + 32);
  const __m256i qh = load32(block.qh + 32 * half);
  q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low_mask),
                         _mm256_and_si256(_mm256_slli_epi16(qh, 4), high_mask));
  q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low_mask),
                         _mm256_and_si256(_mm256_slli_epi16(qh, 2), high_mask));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low_mask),
                         _mm256_and_si256(qh, high_mask));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low_mask),
                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), high_mask));
}

}  // namespace

void dequantize_q2_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ2_K& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    const float dmin = f16_scalar_to_f32(block.dmin);
    float* y = dst + b * kBlockK;
    const __m256i two_bits = _mm256_set1_epi8(3);
    for_each_k2_sub_block(
        block.qs,
        [&](__m256i bytes, int, int step) {
          return _mm256_and_si256(_mm256_srli_epi16(bytes, 2 * step), two_bits);
        },
        [&](__m128i q16, int sub) {
          const uint8_t scale = block.scales[sub];
          store_affine_u8x16(q16, d * (scale & 15), dmin * (scale >> 4), y + 16 * sub);
        });
  }
}

void dequantize_q4_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ4_K& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    const float dmin = f16_scalar_to_f32(block.dmin);
    uint8_t scales[8];
    uint8_t mins[8];
    unpack_q4_K_scales(block.scales, scales, mins);
    float* y = dst + b * kBlockK;
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m128i raw0 = load16(block.qs + 32 * chunk);
      const __m128i raw1 = load16(block.qs + 32 * chunk + 16);
      const __m128i mask = _mm_set1_epi8(15);
      const float d_low = d * scales[2 * chunk];
      const float m_low = dmin * mins[2 * chunk];
      const float d_high = d * scales[2 * chunk + 1];
      const float m_high = dmin * mins[2 * chunk + 1];
      store_affine_u8x16(_mm_and_si128(raw0, mask), d_low, m_low, y + 64 * chunk);
      store_affine_u8x16(_mm_and_si128(raw1, mask), d_low, m_low, y + 64 * chunk + 16);
      store_affine_u8x16(_mm_and_si128(_mm_srli_epi16(raw0, 4), mask), d_high, m_high,
                         y + 64 * chunk + 32);
      store_affine_u8x16(_mm_and_si128(_mm_srli_epi16(raw1, 4), mask), d_high, m_high,
                         y + 64 * chunk + 48);
    }
  }
}

void dequantize_q6_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = f16_scalar_to_f32(block.d);
    float* y = dst + b * kBlockK;
    for (int half = 0; half < 2; ++half) {
      __m256i q[4];
      unpack_q6_K_half(block, half, q);
      for (int quarter = 0; quarter < 4; ++quarter) {
        const __m256i centred = _mm256_sub_epi8(q[quarter], _mm256_set1_epi8(32));
        const int sub = 8 * half + 2 * quarter;
        store_scaled_i8x16(_mm256_castsi256_si128(centred), d * block.scales[sub], y + 16 * sub);
        store_scaled_i8x16(_mm256_extracti128_si256(centred, 1), d * block.scales[sub + 1],
                           y + 16 * sub + 16);
      }
    }
  }
}

float dot_q2_K(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  const __m256i two_bits = _mm256_set1_epi8(3);
  const __m128i nibble = _mm_set1_epi8(15);
  __m256 acc = _mm256_setzero_ps();
  __m256 acc_mins = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ2_K& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    const __m128i scale_bytes = load16(block.scales);
    const __m256i mins =
        _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scale_bytes, 4), nibble));
    const __m256i scales = _mm256_cvtepu8_epi16(_mm_and_si128(scale_bytes, nibble));
    const __m256i min_sums = _mm256_madd_epi16(load32(act.bsums), mins);
    __m256i sums = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      // Both lanes hold scales[8h .. 8h+7]; sub-block 8h + 2·step + lane.
      const __m256i half_scales = half_lanes(scales, half);
      const __m256i bytes = load32(block.qs + 32 * half);
      for (int step = 0; step < 4; ++step) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bytes, 2 * step), two_bits);
        sums = _mm256_add_epi32(sums,
                                k_step_sums(q, act.qs + 128 * half + 32 * step, half_scales, step));
      }
    }
    const float d = f16_scalar_to_f32(block.d) * act.d;
    const float dmin = f16_scalar_to_f32(block.dmin) * act.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
    acc_mins = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_sums), acc_mins);
  }
  return horizontal_sum(acc) - horizontal_sum(acc_mins);
}

float dot_q4_K(const void* w, const void* a, int64_t n) {
  const __m256i nibble = _mm256_set1_epi8(15);
  return dot_k4_blocks(static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a),
                       n / kBlockK,
                       [&](const BlockQ4_K& block, int chunk, __m256i& low, __m256i& high) {
                         const __m256i bytes = load32(block.qs + 32 * chunk);
                         low = _mm256_and_si256(bytes, nibble);
                         high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
                       });
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockQ6_K& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    const __m256i scales = _mm256_cvtepi8_epi16(load16(block.scales));
    // Σ sc·(q − 32)·a = Σ sc·q·a − 32·Σ sc·bsum.
    const __m256i offsets = _mm256_madd_epi16(load32(act.bsums), scales);
    __m256i sums = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i half_scales = half_lanes(scales, half);
      __m256i q[4];
      unpack_q6_K_half(block, half, q);
      for (int quarter = 0; quarter < 4; ++quarter) {
        sums = _mm256_add_epi32(sums, k_step_sums(q[quarter], act.qs + 128 * half + 32 * quarter,
                                                  half_scales, quarter));
      }
    }
    sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(offsets, 5));
    const float d = f16_scalar_to_f32(block.d) * act.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
  return horizontal_sum(acc);
}

}  // namespace strata::quant::avx2
