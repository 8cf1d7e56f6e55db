// Small AVX2 helpers shared by the avx2/*.cpp and avx512/*.cpp kernels. Include only from files
// compiled with STRATA_AVX2_FLAGS.
//
// Every helper is always_inline: a plain inline function is also emitted out of line where it is
// not inlined (e.g. unoptimised builds), and the linker keeps one of those copies for the whole
// program; a copy compiled with AVX-512 flags would then run on the AVX2 path and fault on a CPU
// without AVX-512. Forced inlining leaves no shared copy.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/tiles.h"

namespace strata::quant::avx2 {

// Sum of the 8 lanes in a fixed order: (lanes 0-3 + lanes 4-7), then pairs, then the last two.
[[gnu::always_inline]] inline float horizontal_sum(__m256 v) {
  const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
  const __m128 single = _mm_add_ss(pair, _mm_movehdup_ps(pair));
  return _mm_cvtss_f32(single);
}

[[gnu::always_inline]] inline int horizontal_sum_i32(__m256i v) {
  const __m128i quad = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i pair = _mm_add_epi32(quad, _mm_unpackhi_epi64(quad, quad));
  const __m128i single = _mm_add_epi32(pair, _mm_shuffle_epi32(pair, 1));
  return _mm_cvtsi128_si32(single);
}

[[gnu::always_inline]] inline float f16_scalar_to_f32(uint16_t bits) {
  return _cvtsh_ss(bits);
}

// Largest |x| over n floats (n a multiple of 8); exact, so the order does not matter.
[[gnu::always_inline]] inline float max_abs(const float* x, int n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) {
    // max(|x|, acc) returns acc when |x| is NaN, like fmax in the scalar quantizer.
    acc = _mm256_max_ps(_mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + i)), acc);
  }
  const __m128 quad = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
  return _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)));
}

// Quantizes 8 floats as quantize_activation_value does: clamp(x·inverse, ±127), round to even.
[[gnu::always_inline]] inline __m256i quantize_activation_8(const float* x, __m256 inverse) {
  __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inverse);
  v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f));  // NaN -> -127 (second operand)
  v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
  return _mm256_cvtps_epi32(v);  // MXCSR default: round to nearest even
}

// Packs four vectors of 8 int32 (each in [-127, 127]) into 32 int8 in element order.
[[gnu::always_inline]] inline __m256i pack_i32x32_to_i8(__m256i a, __m256i b, __m256i c,
                                                        __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i mixed = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(mixed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

[[gnu::always_inline]] inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
[[gnu::always_inline]] inline __m128i load16(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// y[0..16) = scale·q − offset for 16 unsigned bytes q.
[[gnu::always_inline]] inline void store_affine_u8x16(__m128i q, float scale, float offset,
                                                      float* y) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 m = _mm256_set1_ps(offset);
  const __m256 low = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
  const __m256 high = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(q, q)));
  _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(s, low), m));
  _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(s, high), m));
}

// y[0..16) = scale·q for 16 signed bytes q.
[[gnu::always_inline]] inline void store_scaled_i8x16(__m128i q, float scale, float* y) {
  const __m256 s = _mm256_set1_ps(scale);
  _mm256_storeu_ps(y, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
  _mm256_storeu_ps(
      y + 8, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)))));
}

// Shuffle mask that broadcasts i16 element `index` of each 128-bit lane to the whole lane.
[[gnu::always_inline]] inline __m256i broadcast_i16_mask(int low_lane_index, int high_lane_index) {
  const auto pair = [](int index) { return short((2 * index + 1) << 8 | (2 * index)); };
  return _mm256_set_m128i(_mm_set1_epi16(pair(high_lane_index)),
                          _mm_set1_epi16(pair(low_lane_index)));
}

// Both 128-bit lanes set to lane `half` of v.
[[gnu::always_inline]] inline __m256i half_lanes(__m256i v, int half) {
  return half == 0 ? _mm256_permute2x128_si256(v, v, 0x00) : _mm256_permute2x128_si256(v, v, 0x11);
}

// Q4_K/Q5_K mins term: Σ_j m_j·(bsums[2j] + bsums[2j+1]) via madd with each of the eight 8-bit
// mins (packed in mins_u64) repeated twice; exact in i32.
[[gnu::always_inline]] inline __m256i k4_mins_twice(uint64_t mins_u64) {
  const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(mins_u64)));
  return _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
}
[[gnu::always_inline]] inline __m256i k4_min_sums(const void* bsums, uint64_t mins_u64) {
  return _mm256_madd_epi16(load32(bsums), k4_mins_twice(mins_u64));
}

// The eight Q4_K/Q5_K 8-bit scales (packed in scales_u64) as i16, in both 128-bit lanes.
[[gnu::always_inline]] inline __m256i k4_scales_i16(uint64_t scales_u64) {
  return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(scales_u64))));
}

// Q4_K/Q5_K chunk c: i32 sums of sub-blocks 2c (quants low, activations act_qs[0..32)) and 2c+1
// (quants high, act_qs[32..64)), each times its scale from k4_scales_i16.
[[gnu::always_inline]] inline __m256i k4_chunk_sums(__m256i low, __m256i high, const int8_t* act_qs,
                                                    __m256i scales, int chunk) {
  const __m256i p_low = _mm256_maddubs_epi16(low, load32(act_qs));
  const __m256i p_high = _mm256_maddubs_epi16(high, load32(act_qs + 32));
  const __m256i s_low = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * chunk, 2 * chunk));
  const __m256i s_high =
      _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * chunk + 1, 2 * chunk + 1));
  return _mm256_add_epi32(_mm256_madd_epi16(p_low, s_low), _mm256_madd_epi16(p_high, s_high));
}

// Q4_K/Q5_K dot with Q8_K activations: per block, Σ sc·q·a over the four 64-weight chunks minus
// the mins term, as two f32 accumulators (d and dmin) summed at the end. chunk_quants(block, c,
// low, high) sets the unsigned quants of sub-blocks 2c (low) and 2c+1 (high) of chunk c.
template <typename Block, typename ChunkQuants>
[[gnu::always_inline]] inline float dot_k4_blocks(const Block* blocks, const BlockQ8_K* acts,
                                                  int64_t n_blocks, ChunkQuants chunk_quants) {
  __m256 acc = _mm256_setzero_ps();
  __m256 acc_mins = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const Block& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    uint64_t scales_u64, mins_u64;
    unpack_q4_K_scales_u64(block.scales, &scales_u64, &mins_u64);
    const __m256i min_sums = k4_min_sums(act.bsums, mins_u64);
    const __m256i scales = k4_scales_i16(scales_u64);
    __m256i sums = _mm256_setzero_si256();
    for (int chunk = 0; chunk < 4; ++chunk) {
      __m256i low, high;
      chunk_quants(block, chunk, low, high);
      sums = _mm256_add_epi32(sums, k4_chunk_sums(low, high, act.qs + 64 * chunk, scales, chunk));
    }
    const float d = f16_scalar_to_f32(block.d) * act.d;
    const float dmin = f16_scalar_to_f32(block.dmin) * act.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
    acc_mins = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_sums), acc_mins);
  }
  return horizontal_sum(acc) - horizontal_sum(acc_mins);
}

// Tile form of dot_k4_blocks: one weight row against kA activation rows (row t at acts +
// t·act_stride bytes) into out[t·out_stride]. Each weight chunk's quants and scale vectors are
// decoded once for all kA rows. Bitwise dot_k4_blocks per row: the i32 lane sums are the same
// exact integers (only the order of exact adds differs), d and dmin the same f32 products, and
// every accumulator gets the same FMAs in the same order.
template <int kA, typename Block, typename ChunkQuants>
[[gnu::always_inline]] inline void dot_k4_tile(const Block* blocks, const std::byte* acts,
                                               size_t act_stride, int64_t n_blocks, float* out,
                                               size_t out_stride, ChunkQuants chunk_quants) {
  const auto act = [&](int t) {
    return reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride);
  };
  __m256 acc[kA], acc_mins[kA];
  for (int t = 0; t < kA; ++t) acc[t] = acc_mins[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const Block& block = blocks[b];
    uint64_t scales_u64, mins_u64;
    unpack_q4_K_scales_u64(block.scales, &scales_u64, &mins_u64);
    const __m256i mins_twice = k4_mins_twice(mins_u64);
    const __m256i scales = k4_scales_i16(scales_u64);
    // Chunk outer, rows inner: a chunk's quants and scale vectors stay in registers while the
    // kA rows pass (the rows' i32 sums are the registers that live across chunks).
    __m256i sums[kA];
    for (int t = 0; t < kA; ++t) sums[t] = _mm256_setzero_si256();
    for (int chunk = 0; chunk < 4; ++chunk) {
      __m256i low, high;
      chunk_quants(block, chunk, low, high);
      const __m256i s_low = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * chunk, 2 * chunk));
      const __m256i s_high =
          _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * chunk + 1, 2 * chunk + 1));
      for (int t = 0; t < kA; ++t) {
        const int8_t* x_qs = act(t)[b].qs + 64 * chunk;
        const __m256i p_low = _mm256_maddubs_epi16(low, load32(x_qs));
        const __m256i p_high = _mm256_maddubs_epi16(high, load32(x_qs + 32));
        sums[t] = _mm256_add_epi32(sums[t], _mm256_add_epi32(_mm256_madd_epi16(p_low, s_low),
                                                             _mm256_madd_epi16(p_high, s_high)));
      }
    }
    const float d_w = f16_scalar_to_f32(block.d);
    const float dmin_w = f16_scalar_to_f32(block.dmin);
    for (int t = 0; t < kA; ++t) {
      const BlockQ8_K& x = act(t)[b];
      const __m256i min_sums = _mm256_madd_epi16(load32(x.bsums), mins_twice);
      const float d = d_w * x.d;
      const float dmin = dmin_w * x.d;
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums[t]), acc[t]);
      acc_mins[t] =
          _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_sums), acc_mins[t]);
    }
  }
  for (int t = 0; t < kA; ++t)
    out[size_t(t) * out_stride] = canonical_nan(horizontal_sum(acc[t]) - horizontal_sum(acc_mins[t]));
}

// The DotTileFn driver of the one-weight-row tile kernels above and below: tiles of 1 weight row
// × up to kMaxA activation rows (quant/tiles.h, activation groups outer). kernel(a_rows, weight
// row, first activation row, first output) with a_rows a std::integral_constant.
template <int kMaxA, typename Kernel>
[[gnu::always_inline]] inline void one_row_tiles(const void* w, size_t w_stride, int64_t n_w,
                                                 const void* a, size_t a_stride, int64_t n_acts,
                                                 float* out, size_t out_w_stride,
                                                 size_t out_a_stride, Kernel kernel) {
  const auto* weight_bytes = static_cast<const std::byte*>(w);
  const auto* act_bytes = static_cast<const std::byte*>(a);
  tiles::for_each_tile<1, kMaxA>(n_w, n_acts, [&](auto, auto a_rows, int64_t w_first,
                                                  int64_t a_first) {
    kernel(a_rows, weight_bytes + size_t(w_first) * w_stride,
           act_bytes + size_t(a_first) * a_stride,
           out + size_t(w_first) * out_w_stride + size_t(a_first) * out_a_stride);
  });
}

// Q2_K/Q3_K/Q6_K: i32 sums of the 32 weights of step `step` (sub-blocks 2·step, 2·step + 1) of a
// 128-weight half, each times its i16 scale from half_lanes(scales, half). q holds unsigned quants
// (≤ 63), so maddubs(q, a) is exact.
[[gnu::always_inline]] inline __m256i k_step_sums(__m256i q, const int8_t* act_qs,
                                                  __m256i half_scales, int step) {
  const __m256i products = _mm256_maddubs_epi16(q, load32(act_qs));
  const __m256i scale =
      _mm256_shuffle_epi8(half_scales, broadcast_i16_mask(2 * step, 2 * step + 1));
  return _mm256_madd_epi16(products, scale);
}

// Q2_K/Q3_K dequantization order: byte l of qs[32·half ..] holds in bits 2·step the low bits of
// element 128·half + 32·step + l. levels(bytes, half, step) turns the half's 32 bytes into the
// step's 32 signed or unsigned quants; store(q16, sub) gets the 16 of sub-block
// sub = 8·half + 2·step + part (part 0: the low 128-bit lane).
template <typename Levels, typename Store>
[[gnu::always_inline]] inline void for_each_k2_sub_block(const uint8_t* qs, Levels levels,
                                                         Store store) {
  for (int half = 0; half < 2; ++half) {
    const __m256i bytes = load32(qs + 32 * half);
    for (int step = 0; step < 4; ++step) {
      const __m256i q = levels(bytes, half, step);
      store(_mm256_castsi256_si128(q), 8 * half + 2 * step);
      store(_mm256_extracti128_si256(q, 1), 8 * half + 2 * step + 1);
    }
  }
}

// The 32 nibbles of 16 bytes in element order (low nibbles: elements 0-15, high: 16-31).
[[gnu::always_inline]] inline __m256i unpack_nibbles(const uint8_t qs[16]) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

// Stores 32 signed bytes times d as floats (d·q, as the scalar code).
[[gnu::always_inline]] inline void store_scaled_i8x32(__m256i q, float d, float* y) {
  const __m256 scale = _mm256_set1_ps(d);
  const __m128i low = _mm256_castsi256_si128(q);
  const __m128i high = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {low, _mm_unpackhi_epi64(low, low), high,
                            _mm_unpackhi_epi64(high, high)};
  for (int p = 0; p < 4; ++p) {
    const __m256 values = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p]));
    _mm256_storeu_ps(y + 8 * p, _mm256_mul_ps(scale, values));
  }
}

// Σ w·a of 32 int8 pairs as 8 int32 lanes (lane k holds elements 4k..4k+3); w ≠ −128.
[[gnu::always_inline]] inline __m256i dot_i8x32(__m256i w, __m256i a) {
  const __m256i products = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(products, _mm256_set1_epi16(1));
}
// dot_i8x32 with |w| (= sign_epi8(w, w)) computed once by the caller: the same lanes.
[[gnu::always_inline]] inline __m256i dot_i8x32_abs(__m256i w_abs, __m256i w, __m256i a) {
  const __m256i products = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(products, _mm256_set1_epi16(1));
}

// Block-pair loop of the symmetric 32-weight block types (Q8_0, Q4_0, Q5_0, IQ4_NL) with Q8_0
// activations: Σ_b d_w·d_a·(integer block sum), two accumulators, block b into b % 2. Unpack
// gives the 32 signed weights of a block (pass a lambda: a function pointer is not inlined).
template <typename Block, typename Unpack>
[[gnu::always_inline]] inline float dot_blocks32(const Block* weights, const BlockQ8_0* acts,
                                                 int64_t n_blocks, Unpack unpack) {
  auto block_product = [&](int64_t b, __m256 acc) {
    const float d = f16_scalar_to_f32(weights[b].d) * f16_scalar_to_f32(acts[b].d);
    const __m256i sums = dot_i8x32(unpack(weights[b]), load32(acts[b].qs));
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  };
  __m256 acc_even = _mm256_setzero_ps();
  __m256 acc_odd = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    acc_even = block_product(b, acc_even);
    acc_odd = block_product(b + 1, acc_odd);
  }
  if (b < n_blocks) acc_even = block_product(b, acc_even);
  return horizontal_sum(_mm256_add_ps(acc_even, acc_odd));
}

// Tile form of dot_blocks32: one weight row against kA activation rows (row t at acts +
// t·act_stride bytes) into out[t·out_stride]. Each weight block is unpacked (and |w| formed) once
// for all kA rows. Bitwise dot_blocks32 per row: the same exact i32 lanes, the same f32 block
// scale d_w·d_a, the same FMA into the same (even/odd) accumulator in the same order.
template <int kA, typename Block, typename Unpack>
[[gnu::always_inline]] inline void dot_blocks32_tile(const Block* weights, const std::byte* acts,
                                                     size_t act_stride, int64_t n_blocks,
                                                     float* out, size_t out_stride,
                                                     Unpack unpack) {
  const auto act = [&](int t) {
    return reinterpret_cast<const BlockQ8_0*>(acts + size_t(t) * act_stride);
  };
  __m256 acc_even[kA], acc_odd[kA];
  for (int t = 0; t < kA; ++t) acc_even[t] = acc_odd[t] = _mm256_setzero_ps();
  auto block_products = [&](int64_t b, __m256(&acc)[kA]) {
    const __m256i w = unpack(weights[b]);
    const __m256i w_abs = _mm256_sign_epi8(w, w);
    const float d_w = f16_scalar_to_f32(weights[b].d);
    for (int t = 0; t < kA; ++t) {
      const BlockQ8_0& x = act(t)[b];
      const float d = d_w * f16_scalar_to_f32(x.d);
      const __m256i sums = dot_i8x32_abs(w_abs, w, load32(x.qs));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc[t]);
    }
  };
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    block_products(b, acc_even);
    block_products(b + 1, acc_odd);
  }
  if (b < n_blocks) block_products(b, acc_even);
  for (int t = 0; t < kA; ++t)
    out[size_t(t) * out_stride] = canonical_nan(horizontal_sum(_mm256_add_ps(acc_even[t], acc_odd[t])));
}

}  // namespace strata::quant::avx2
