// AVX2 kernels for Q8_0 and Q4_0 weights (Q8_0 activations) and the activation quantizers.
// Integer products use the sign trick: maddubs(|w|, sign(a, w)) = Σ w·a in i16 pairs without
// overflow because |w| ≤ 128 and |a| ≤ 127 (2·128·127 < 32768).
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

}  // namespace strata::quant::avx2
