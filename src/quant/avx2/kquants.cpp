// AVX2 kernels for the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K with Q8_K activations (scalar
// specification: scalar/kquants.cpp).
//
// Dot products: weights are unsigned (Q2_K 0..3, Q3_K 0..7 before its −4, Q4_K 0..15, Q5_K 0..31,
// Q6_K 0..63), activations signed in [-127, 127], so maddubs(w, a) forms exact i16 pair sums
// (≤ 2·63·127); madd with the i16 sub-block scales widens to i32. Mins (Q2_K, Q4_K, Q5_K), Q3_K's
// −4 and Q6_K's −32 offset go through the activation's bsums. Per block, the integer sums are exact;
// the f32 part is one FMA per lane into an 8-lane accumulator (two for Q2_K/Q4_K/Q5_K: scales and
// mins), summed in a fixed order.
//
// Dequantization evaluates exactly the scalar expressions (scale·q − min, in that order, with the
// same f32 dl and ml), so it is bitwise identical to quant::scalar.
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

namespace {

// Activation rows per Q4_K/Q5_K register tile: an i32 sum and two f32 accumulators per row.
constexpr int kK4TileActs = 8;

template <typename Block, typename ChunkQuants>
void k4_tiles(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
              int64_t n_acts, int64_t n, float* out, size_t out_w_stride, size_t out_a_stride,
              ChunkQuants chunk_quants) {
  one_row_tiles<kK4TileActs>(
      w, w_stride, n_w, a, a_stride, n_acts, out, out_w_stride, out_a_stride,
      [&](auto a_rows, const std::byte* weight, const std::byte* acts, float* tile_out) {
        dot_k4_tile<decltype(a_rows)::value>(reinterpret_cast<const Block*>(weight), acts,
                                             a_stride, n / kBlockK, tile_out, out_a_stride,
                                             chunk_quants);
      });
}

}  // namespace

void dot_tile_q4_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  const __m256i nibble = _mm256_set1_epi8(15);
  k4_tiles<BlockQ4_K>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride, out_a_stride,
                      [&](const BlockQ4_K& block, int chunk, __m256i& low, __m256i& high) {
                        const __m256i bytes = load32(block.qs + 32 * chunk);
                        low = _mm256_and_si256(bytes, nibble);
                        high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
                      });
}

void dot_tile_q5_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  k4_tiles<BlockQ5_K>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride, out_a_stride,
                      [](const BlockQ5_K& block, int chunk, __m256i& low, __m256i& high) {
                        const __m256i bytes = load32(block.qs + 32 * chunk);
                        const __m256i qh = load32(block.qh);
                        low = q5_K_quants(bytes, qh, chunk, 0);
                        high = q5_K_quants(bytes, qh, chunk, 1);
                      });
}

}  // namespace strata::quant::avx2
