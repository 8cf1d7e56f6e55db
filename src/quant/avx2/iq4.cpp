// AVX2 kernels of Q4_1, Q5_0, Q5_1 and IQ4_NL with Q8_0 activations (scalar specification:
// scalar_blocks32_more.cpp).
// - Dequantization evaluates the scalar expressions lane by lane (d·q, d·q + m, d·K[q]), so it is
//   bitwise identical to quant::scalar.
// - Dots: signed weights (Q5_0: q − 16, IQ4_NL: codebook values, |w| ≤ 127) use the sign trick of
//   q8_q4_avx2.cpp; unsigned ones (Q4_1, Q5_1: 0..31) go straight into maddubs. Integer block sums
//   are exact; each block adds one FMA per lane into one of two accumulators (block b into b % 2),
//   plus for Q4_1/Q5_1 one FMA of m·d_a times the activation sum into a second pair.
#include <cstring>

#include "quant/avx2/common.h"
#include "quant/blocks.h"
#include "quant/kernels_more.h"

namespace strata::quant::avx2 {
namespace {

// 0x10 in byte j where bit j of the little-endian u32 at qh is set, else 0.
inline __m256i q5_high_bits(const uint8_t qh[4]) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  // Byte j keeps bit j % 8 after or-ing all other bits on; it equals 0xff exactly when that bit
  // was set.
  const __m256i all_but_own = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, all_but_own), _mm256_set1_epi8(-1));
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

inline __m256i iq4nl_table() {
  return _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
}

// Stores d·q + m for 32 unsigned bytes q (multiply, then add: the scalar order).
inline void store_affine_u8x32(__m256i q, float d, float m, float* y) {
  const __m256 scale = _mm256_set1_ps(d);
  const __m256 offset = _mm256_set1_ps(m);
  const __m128i low = _mm256_castsi256_si128(q);
  const __m128i high = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {low, _mm_unpackhi_epi64(low, low), high,
                            _mm_unpackhi_epi64(high, high)};
  for (int p = 0; p < 4; ++p) {
    const __m256 values = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
    _mm256_storeu_ps(y + 8 * p, _mm256_add_ps(_mm256_mul_ps(scale, values), offset));
  }
}

// Σ q·a of 32 unsigned (q < 128) × signed pairs as 8 i32 lanes.
inline __m256i dot_unsigned(__m256i q, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1));
}

// Two-accumulator block loop of the affine types (y = d·q + m): Σ_b d_w·d_a·Σq·a + m·d_a·Σa.
template <typename Block, typename Unpack>
float dot_affine(const Block* weights, const BlockQ8_0* acts, int64_t n_blocks, Unpack unpack) {
  const __m256i ones = _mm256_set1_epi8(1);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 acc_min[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d_act = f16_scalar_to_f32(acts[b].d);
    const __m256i a = load32(acts[b].qs);
    const __m256i sums = dot_unsigned(unpack(weights[b]), a);
    const __m256i act_sums = dot_unsigned(ones, a);
    const int k = int(b & 1);
    acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar_to_f32(weights[b].d) * d_act),
                             _mm256_cvtepi32_ps(sums), acc[k]);
    acc_min[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar_to_f32(weights[b].m) * d_act),
                                 _mm256_cvtepi32_ps(act_sums), acc_min[k]);
  }
  return horizontal_sum(_mm256_add_ps(acc[0], acc[1])) +
         horizontal_sum(_mm256_add_ps(acc_min[0], acc_min[1]));
}

inline __m256i unpack_q5_0(const BlockQ5_0& block) {
  return _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(block.qs), q5_high_bits(block.qh)),
                         _mm256_set1_epi8(16));
}
inline __m256i unpack_q5_1(const BlockQ5_1& block) {
  return _mm256_or_si256(unpack_nibbles(block.qs), q5_high_bits(block.qh));
}
inline __m256i unpack_iq4_nl(const BlockIQ4_NL& block, __m256i table) {
  return _mm256_shuffle_epi8(table, unpack_nibbles(block.qs));
}

}  // namespace

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_1*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    store_affine_u8x32(unpack_nibbles(blocks[b].qs), f16_scalar_to_f32(blocks[b].d),
                       f16_scalar_to_f32(blocks[b].m), dst + 32 * b);
  }
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_0*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    store_scaled_i8x32(unpack_q5_0(blocks[b]), f16_scalar_to_f32(blocks[b].d), dst + 32 * b);
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_1*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    store_affine_u8x32(unpack_q5_1(blocks[b]), f16_scalar_to_f32(blocks[b].d),
                       f16_scalar_to_f32(blocks[b].m), dst + 32 * b);
  }
}

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
  const __m256i table = iq4nl_table();
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    store_scaled_i8x32(unpack_iq4_nl(blocks[b], table), f16_scalar_to_f32(blocks[b].d),
                       dst + 32 * b);
  }
}

float dot_q4_1(const void* w, const void* a, int64_t n) {
  return dot_affine(static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_0*>(a),
                    n / kBlock32, [](const BlockQ4_1& block) { return unpack_nibbles(block.qs); });
}

float dot_q5_0(const void* w, const void* a, int64_t n) {
  return dot_blocks32(static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a),
                      n / kBlock32, [](const BlockQ5_0& block) { return unpack_q5_0(block); });
}

float dot_q5_1(const void* w, const void* a, int64_t n) {
  return dot_affine(static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_0*>(a),
                    n / kBlock32, [](const BlockQ5_1& block) { return unpack_q5_1(block); });
}

float dot_iq4_nl(const void* w, const void* a, int64_t n) {
  const __m256i table = iq4nl_table();
  return dot_blocks32(static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(a),
                      n / kBlock32,
                      [table](const BlockIQ4_NL& block) { return unpack_iq4_nl(block, table); });
}

}  // namespace strata::quant::avx2
