// AVX2 kernels of the 32-weight block types Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 (Q8_0 activations) and
// the activation quantizers (scalar specification: scalar/blocks32.cpp).
// - Dequantization evaluates the scalar expressions lane by lane (d·q, d·q + m), so it is bitwise
//   identical to quant::scalar.
// - Dots: signed weights (Q8_0, Q4_0: nibble − 8, Q5_0: q − 16) use the sign trick:
//   maddubs(|w|, sign(a, w)) = Σ w·a in i16 pairs without overflow because |w| ≤ 128 and |a| ≤ 127
//   (2·128·127 < 32768); unsigned ones (Q4_1, Q5_1: 0..31) go straight into maddubs. Integer block
//   sums are exact; for Q4_1/Q5_1 each block adds one FMA per lane into one of two accumulators
//   (block b into b % 2), plus one FMA of m·d_a times the activation sum into a second pair.
#include <cstring>

#include "quant/avx2/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "util/fp16.h"

namespace strata::quant::avx2 {
namespace {

// 32 signed Q4_0 values (nibble − 8) in element order.
inline __m256i unpack_q4_0(const BlockQ4_0& block) {
  return _mm256_sub_epi8(unpack_nibbles(block.qs), _mm256_set1_epi8(8));
}

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

}  // namespace

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    store_scaled_i8x32(load32(blocks[b].qs), f16_scalar_to_f32(blocks[b].d), dst + 32 * b);
  }
}

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    store_scaled_i8x32(unpack_q4_0(blocks[b]), f16_scalar_to_f32(blocks[b].d), dst + 32 * b);
  }
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float* x = src + 32 * b;
    const float d = max_abs(x, 32) / 127.0f;
    const __m256 inverse = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    blocks[b].d = f32_to_f16(d);
    const __m256i q = pack_i32x32_to_i8(
        quantize_activation_8(x, inverse), quantize_activation_8(x + 8, inverse),
        quantize_activation_8(x + 16, inverse), quantize_activation_8(x + 24, inverse));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blocks[b].qs), q);
  }
}

void quantize_q8_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + kBlockK * b;
    const float d = max_abs(x, kBlockK) / 127.0f;
    const __m256 inverse = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    blocks[b].d = d;
    for (int chunk = 0; chunk < 8; ++chunk) {
      const float* xc = x + 32 * chunk;
      const __m256i q0 = quantize_activation_8(xc, inverse);
      const __m256i q1 = quantize_activation_8(xc + 8, inverse);
      const __m256i q2 = quantize_activation_8(xc + 16, inverse);
      const __m256i q3 = quantize_activation_8(xc + 24, inverse);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(blocks[b].qs + 32 * chunk),
                          pack_i32x32_to_i8(q0, q1, q2, q3));
      blocks[b].bsums[2 * chunk] = static_cast<int16_t>(horizontal_sum_i32(_mm256_add_epi32(q0, q1)));
      blocks[b].bsums[2 * chunk + 1] =
          static_cast<int16_t>(horizontal_sum_i32(_mm256_add_epi32(q2, q3)));
    }
  }
}

float dot_q8_0(const void* w, const void* a, int64_t n) {
  return dot_blocks32(static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a),
                      n / kBlock32, [](const BlockQ8_0& block) { return load32(block.qs); });
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  // A lambda, not the function name: GCC kept a function pointer argument as an out-of-line call
  // per 32-weight block (3.5x slower than Q8_0); a lambda's type names the callee, so it inlines.
  return dot_blocks32(static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a),
                      n / kBlock32, [](const BlockQ4_0& block) { return unpack_q4_0(block); });
}

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

namespace {

// Activation rows per register tile of the 32-weight symmetric types: 2 accumulators per row
// (even and odd blocks) plus w, |w|, the activation and the products fit the 16 ymm registers.
constexpr int kBlocks32TileActs = 4;

template <typename Block, typename Unpack>
void blocks32_tiles(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                    int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                    size_t out_a_stride, Unpack unpack) {
  one_row_tiles<kBlocks32TileActs>(
      w, w_stride, n_w, a, a_stride, n_acts, out, out_w_stride, out_a_stride,
      [&](auto a_rows, const std::byte* weight, const std::byte* acts, float* tile_out) {
        dot_blocks32_tile<decltype(a_rows)::value>(reinterpret_cast<const Block*>(weight), acts,
                                                   a_stride, n / kBlock32, tile_out,
                                                   out_a_stride, unpack);
      });
}

}  // namespace

void dot_tile_q8_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  blocks32_tiles<BlockQ8_0>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride,
                            out_a_stride, [](const BlockQ8_0& block) { return load32(block.qs); });
}

void dot_tile_q4_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  blocks32_tiles<BlockQ4_0>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride,
                            out_a_stride,
                            [](const BlockQ4_0& block) { return unpack_q4_0(block); });
}

void dot_tile_q5_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  blocks32_tiles<BlockQ5_0>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride,
                            out_a_stride,
                            [](const BlockQ5_0& block) { return unpack_q5_0(block); });
}

}  // namespace strata::quant::avx2
