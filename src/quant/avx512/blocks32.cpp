// AVX-512 (F/BW/VL + VNNI) dot kernels for Q4_0, Q8_0, Q5_0 and IQ4_NL weights with Q8_0
// activations: one weight row against one activation row, and tiles of several weight rows ×
// several activation rows (dot_tile_*).
//
// Two 32-weight blocks per 512-bit step: the even block in the lower half, the odd block in the
// upper half, which are exactly the AVX2 kernel's two accumulators (acc_even, acc_odd). The
// nibbles stay unsigned: Σ (q − 8)·a = Σ q·a − Σ 8·a, two vpdpbusd (u8 × s8 → i32, exact) and a
// subtract, where AVX2 needs an offset, two sign ops, maddubs and madd per block.
//
// Bitwise equal to avx2::dot_q4_0: each i32 lane holds the same exact sum of 4 products as the
// AVX2 kernel's lane, the block scale is the same f32 product, and every lane gets the same FMA
// in the same order; the tail block (odd count) and the final sum are the AVX2 code.
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>

#include "quant/avx2/common.h"
#include "quant/avx512/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/tiles.h"

STRATA_AVX512_IGNORE_GCC12_WARNINGS

namespace strata::quant::avx512 {
namespace {

inline __m128i load16(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Tiles of the symmetric 32-weight block types (Q8_0, Q4_0, Q5_0, IQ4_NL: y = d·w, w signed) with
// Q8_0 activations: two blocks per 512-bit step, the even block in the lower half and the odd one
// in the upper half (avx2::dot_blocks32's acc_even and acc_odd). The activations become the
// unsigned operand of vpdpbusd: Σ (a + 128)·w − 128·Σ w = Σ a·w, exact in i32, where 128·Σ w is one
// more vpdpbusd per weight block pair shared by every activation row; lane k holds bytes
// 4k..4k+3 of its block, as avx2::dot_i8x32's lane k. The block scale is the same f32 product
// (the f16 → f32 conversions are exact) and each half gets avx2's FMA in avx2's order; an odd last
// block and the final sum are avx2's code. So every output is bitwise the avx2 dot of its pair.
//
// One tile: kW weight rows × kA activation rows. Weight values, their 128·Σ w and scales are
// decoded once per tile for all kA activations, an activation's biased quants and scales once for
// all kW weight rows. Weights(block, b) gives the signed values of blocks b and b + 1 (64 bytes,
// in element order), Weights::tail(block) those of one block (32 bytes).
//
// With `prepared` (kPrepared), the activations' biased quants and scales of every block pair come
// from there (computed once per group of activation rows for all the weight tiles, see
// blocks32_tiles: the same values), else from the rows themselves.

// Scales of blocks b (lanes 0-7) and b + 1 (lanes 8-15) as f32.
template <typename Blocks>
[[gnu::always_inline]] inline __m512 both_scales(const Blocks* blocks, int64_t b) {
  const __m256i halves =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(short(blocks[b].d))),
                              _mm_set1_epi16(short(blocks[b + 1].d)), 1);
  return _mm512_cvtph_ps(halves);
}

// An activation row's block pair as the tiles consume it: quants + 128 (as unsigned bytes) and
// the two block scales.
struct PreparedPair {
  __m512i biased;
  __m512 scales;
};

template <typename Block, typename Weights, int kW, int kA, bool kPrepared>
void blocks32_tile(const std::byte* w, size_t w_stride, const std::byte* a, size_t a_stride,
                   const PreparedPair* prepared, int64_t n_blocks, float* out, size_t out_w_stride,
                   size_t out_a_stride, const Weights& weights) {
  const auto weight = [&](int r) { return reinterpret_cast<const Block*>(w + r * w_stride); };
  const auto act = [&](int t) { return reinterpret_cast<const BlockQ8_0*>(a + t * a_stride); };
  const int64_t n_pairs = n_blocks / 2;
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  __m512 acc[kW][kA];
  for (auto& row : acc) {
    for (__m512& v : row) v = _mm512_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    // −128·Σ w per lane starts each activation's vpdpbusd, which adds Σ (a + 128)·w to it: the
    // same exact i32 as subtracting afterwards (no sum comes near overflow), one op fewer per
    // (weight row, activation row) pair.
    __m512i values[kW], minus_offsets[kW];
    __m512 scales[kW];
    for (int r = 0; r < kW; ++r) {
      values[r] = weights.pair(weight(r), b);
      minus_offsets[r] = _mm512_sub_epi32(
          _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, values[r]));
      scales[r] = both_scales(weight(r), b);
    }
    for (int t = 0; t < kA; ++t) {
      __m512i biased;
      __m512 act_scales;
      if constexpr (kPrepared) {
        const PreparedPair& pair = prepared[t * n_pairs + b / 2];
        biased = pair.biased;
        act_scales = pair.scales;
      } else {
        const BlockQ8_0* x = act(t);
        const __m512i quants =
            _mm512_inserti64x4(_mm512_castsi256_si512(load32(x[b].qs)), load32(x[b + 1].qs), 1);
        biased = _mm512_xor_si512(quants, bias);
        act_scales = both_scales(x, b);
      }
      for (int r = 0; r < kW; ++r) {
        const __m512i sums = _mm512_dpbusd_epi32(minus_offsets[r], biased, values[r]);
        acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(scales[r], act_scales), _mm512_cvtepi32_ps(sums),
                                    acc[r][t]);
      }
    }
  }
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < kA; ++t) {
      __m256 acc_even = _mm512_castps512_ps256(acc[r][t]);
      const __m256 acc_odd =
          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][t]), 1));
      if (b < n_blocks) {
        // The last, even-numbered block exactly as avx2::dot_blocks32 computes it.
        const Block& wb = weight(r)[b];
        const BlockQ8_0& ab = act(t)[b];
        const float d = avx2::f16_scalar_to_f32(wb.d) * avx2::f16_scalar_to_f32(ab.d);
        const __m256i sums = avx2::dot_i8x32(weights.tail(wb), load32(ab.qs));
        acc_even = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc_even);
      }
      out[r * out_w_stride + t * out_a_stride] =
          canonical_nan(avx2::horizontal_sum(_mm256_add_ps(acc_even, acc_odd)));
    }
  }
}

// Block pairs blocks32_tiles prepares per activation row at most (64 pairs: rows of 4096; 8 rows'
// worth is 64 KiB of stack); longer rows read the activations in every tile.
constexpr int64_t kMaxPreparedPairs = 64;
// Activation rows per prepared group, and per register tile on that path.
constexpr int64_t kPreparedRows = 8;

// The driver: register tiles of 2 × 4 (8 accumulators, 3 registers per weight row and 2 per
// activation fit the 32 registers). For more than one tile of weight rows, each group of 8
// activation rows is prepared once (biased quants and scales per block pair: half the work of a
// 2 × 4 tile's step was redoing that for every pair of weight rows) and every weight tile reads it
// from memory, in tiles of 2 × 8 (16 accumulators; an activation's operands are loads, so the
// weight rows' decoding is shared by twice the rows: bench_matmul_tile BM_ExpertWindow/q8_0
// rows:8 48-56 -> 41-44 µs, rows:32 191-197 -> 162-183 against 2 × 4).
template <typename Block, typename Weights>
void blocks32_tiles(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                    int64_t n_acts, int64_t n, float* out, size_t out_w_stride, size_t out_a_stride,
                    const Weights& weights) {
  const auto* weight_bytes = static_cast<const std::byte*>(w);
  const auto* act_bytes = static_cast<const std::byte*>(a);
  const int64_t n_blocks = n / kBlock32, n_pairs = n_blocks / 2;
  if (n_w > 2 && n_pairs > 0 && n_pairs <= kMaxPreparedPairs) {
    PreparedPair prepared[kPreparedRows * kMaxPreparedPairs];
    const __m512i bias = _mm512_set1_epi8(char(0x80));
    for (int64_t a_first = 0; a_first < n_acts; a_first += kPreparedRows) {
      const int64_t a_count = std::min<int64_t>(kPreparedRows, n_acts - a_first);
      for (int64_t t = 0; t < a_count; ++t) {
        const auto* x =
            reinterpret_cast<const BlockQ8_0*>(act_bytes + size_t(a_first + t) * a_stride);
        for (int64_t p = 0; p < n_pairs; ++p) {
          const __m512i quants = _mm512_inserti64x4(_mm512_castsi256_si512(load32(x[2 * p].qs)),
                                                    load32(x[2 * p + 1].qs), 1);
          prepared[t * n_pairs + p] = {_mm512_xor_si512(quants, bias), both_scales(x, 2 * p)};
        }
      }
      for (int64_t w_first = 0; w_first < n_w; w_first += 2) {
        tiles::with_count<2>(n_w - w_first, [&](auto w_rows) {
          tiles::with_count<kPreparedRows>(a_count, [&](auto a_rows) {
            blocks32_tile<Block, Weights, decltype(w_rows)::value, decltype(a_rows)::value, true>(
                weight_bytes + size_t(w_first) * w_stride, w_stride,
                act_bytes + size_t(a_first) * a_stride, a_stride, prepared, n_blocks,
                out + size_t(w_first) * out_w_stride + size_t(a_first) * out_a_stride, out_w_stride,
                out_a_stride, weights);
          });
        });
      }
    }
    return;
  }
  tiles::for_each_tile<2, 4>(
      n_w, n_acts, [&](auto w_rows, auto a_rows, int64_t w_first, int64_t a_first) {
        blocks32_tile<Block, Weights, decltype(w_rows)::value, decltype(a_rows)::value, false>(
            weight_bytes + size_t(w_first) * w_stride, w_stride,
            act_bytes + size_t(a_first) * a_stride, a_stride, nullptr, n_blocks,
            out + size_t(w_first) * out_w_stride + size_t(a_first) * out_a_stride, out_w_stride,
            out_a_stride, weights);
      });
}

struct Q8_0Weights {
  [[gnu::always_inline]] __m512i pair(const BlockQ8_0* blocks, int64_t b) const {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load32(blocks[b].qs)),
                              load32(blocks[b + 1].qs), 1);
  }
  [[gnu::always_inline]] __m256i tail(const BlockQ8_0& block) const { return load32(block.qs); }
};

// Q4_0 and IQ4_NL: nibbles placed as Q4_0's (low nibbles elements 0-15, high ones 16-31), as
// indices into a 16-entry byte table (Q4_0: n − 8, IQ4_NL: kIq4nlValues).
template <typename Block>
struct NibbleWeights {
  __m512i table;  // the 16 values in every 128-bit lane
  [[gnu::always_inline]] __m512i pair(const Block* blocks, int64_t b) const {
    // 128-bit lanes (b0 raw, b1 raw, b0 >> 4, b1 >> 4) -> (b0 low, b0 high, b1 low, b1 high).
    const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(load16(blocks[b].qs)),
                                                load16(blocks[b + 1].qs), 1);
    const __m512i both =
        _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    const __m512i nibbles =
        _mm512_and_si512(_mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), both),
                         _mm512_set1_epi8(15));
    return _mm512_shuffle_epi8(table, nibbles);
  }
  [[gnu::always_inline]] __m256i tail(const Block& block) const {
    const __m128i raw = load16(block.qs);
    const __m256i nibbles =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
    return _mm256_shuffle_epi8(_mm512_castsi512_si256(table), nibbles);
  }
};

// Q5_0: Q4_0's nibbles plus a fifth bit per element from the u32 qh (bit j: element j), minus 16.
struct Q5_0Weights {
  NibbleWeights<BlockQ5_0> nibbles;
  [[gnu::always_inline]] static uint32_t high_bits(const BlockQ5_0& block) {
    uint32_t bits;
    std::memcpy(&bits, block.qh, sizeof bits);
    return bits;
  }
  [[gnu::always_inline]] __m512i pair(const BlockQ5_0* blocks, int64_t b) const {
    const __mmask64 high =
        _cvtu64_mask64(uint64_t(high_bits(blocks[b])) | uint64_t(high_bits(blocks[b + 1])) << 32);
    const __m512i sixteen = _mm512_set1_epi8(16);
    const __m512i low = nibbles.pair(blocks, b);
    return _mm512_sub_epi8(_mm512_mask_add_epi8(low, high, low, sixteen), sixteen);
  }
  [[gnu::always_inline]] __m256i tail(const BlockQ5_0& block) const {
    const __m256i sixteen = _mm256_set1_epi8(16);
    const __m256i low = nibbles.tail(block);
    return _mm256_sub_epi8(
        _mm256_mask_add_epi8(low, _cvtu32_mask32(high_bits(block)), low, sixteen), sixteen);
  }
};

__m512i table_of(const int8_t (&values)[16]) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
}

// The last step of the transposed kernels below (16 weight rows in the lanes): avx2::
// horizontal_sum's tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) on the 8 lane vectors,
// canonical_nan per lane, and the 16 outputs stored out_w_stride apart.
[[gnu::always_inline]] inline void store_lane_sums16(const __m512 (&lane)[8], float* o,
                                                     size_t out_w_stride) {
  const __m512 sum = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(lane[0], lane[4]), _mm512_add_ps(lane[2], lane[6])),
      _mm512_add_ps(_mm512_add_ps(lane[1], lane[5]), _mm512_add_ps(lane[3], lane[7])));
  const __m512 result = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q), sum,
                                             _mm512_set1_ps(__builtin_nanf("")));
  if (out_w_stride == 1) {
    _mm512_storeu_ps(o, result);
  } else {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, result);
    for (int r = 0; r < 16; ++r) o[size_t(r) * out_w_stride] = lanes[r];
  }
}

// Q8_0 rows of ONE block (32 weights: the default model's hyper-connection up projections and
// routed-expert down projections, rank 32 -> width): blocks32_tile spends its time on each
// output's tail block and horizontal sum there. This path computes 16 weight rows at once with
// the 16 outputs in the lanes instead (a transposed blocks32_tile), bitwise the same: lane k of
// avx2::dot_blocks32's accumulator is the exact i32 Σ of bytes 4k..4k+3 (transposed here: lane r
// holds row r's bytes 4k..4k+3), the block scale is the same f32 product, each lane gets the
// same FMA onto +0, the + acc_odd (+0), and avx2::horizontal_sum's tree
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) runs on the 8 lane vectors.
void q8_0_one_block_rows16(const std::byte* w, size_t w_stride, const std::byte* a, size_t a_stride,
                           int64_t n_acts, float* out, size_t out_w_stride, size_t out_a_stride) {
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(int(w_stride)));
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const std::byte* qs = w + offsetof(BlockQ8_0, qs);
  // values[k], lane r: bytes 4k..4k+3 of row r. A 16 x 8 transpose of 4-byte groups: rows r and
  // r + 8 loaded into the two 256-bit halves of one register, then the 8 x 8 transpose of each
  // half at once (unpacks within 128-bit lanes, then 128-bit lanes paired across registers). Same
  // values as one gather per k (the gathers cost 9 of them per 16 rows, more than the dots of a
  // window of a few rows).
  __m512i pairs[8];
  for (int r = 0; r < 8; ++r)
    pairs[r] = _mm512_inserti64x4(_mm512_castsi256_si512(load32(qs + size_t(r) * w_stride)),
                                  load32(qs + size_t(r + 8) * w_stride), 1);
  __m512i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(pairs[2 * i], pairs[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(pairs[2 * i], pairs[2 * i + 1]);
  }
  // u[4h + j]: in 128-bit lanes 0 and 1 group j and j + 4 of rows 4h..4h+3, in lanes 2 and 3 the
  // same groups of rows 8 + 4h..8 + 4h+3 (one row per 4-byte slot).
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  // Group j: 128-bit lane 0 of u[j] (rows 0-3) and of u[4 + j] (rows 4-7), lane 2 of each (rows
  // 8-11, 12-15); group j + 4: lanes 1 and 3.
  const __m512i low_lanes = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i high_lanes = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  __m512i values[8], minus_offsets[8];
  for (int j = 0; j < 4; ++j) {
    values[j] = _mm512_permutex2var_epi64(u[j], low_lanes, u[4 + j]);
    values[j + 4] = _mm512_permutex2var_epi64(u[j], high_lanes, u[4 + j]);
  }
  for (int k = 0; k < 8; ++k)
    minus_offsets[k] = _mm512_sub_epi32(
        _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, values[k]));
  // The 16 scales: the low 16 bits of 4 bytes gathered at each row's start.
  const __m512 weight_scales =
      _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(rows, w, 1)));
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t t = 0; t < n_acts; ++t) {
    const auto* x = reinterpret_cast<const BlockQ8_0*>(a + size_t(t) * a_stride);
    const __m512 d = _mm512_mul_ps(weight_scales, _mm512_set1_ps(avx2::f16_scalar_to_f32(x->d)));
    __m512 lane[8];
    for (int k = 0; k < 8; ++k) {
      int32_t group;
      std::memcpy(&group, x->qs + 4 * k, sizeof group);
      const __m512i biased = _mm512_xor_si512(_mm512_set1_epi32(group), bias);
      const __m512i sums = _mm512_dpbusd_epi32(minus_offsets[k], biased, values[k]);
      lane[k] = _mm512_add_ps(_mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), zero), zero);
    }
    store_lane_sums16(lane, out + size_t(t) * out_a_stride, out_w_stride);
  }
}

// Rows of a few blocks (an even count from 2 to kShortRowsMaxBlocks: mid-qwen4exp's
// hyper-connection up projection, 128 wide, 4 blocks) over a prompt window: blocks32_tile spends
// each output on two or so dot steps and then a horizontal sum (bench_matmul_tile BM_PromptShape:
// q5_0 128 -> 4096 at a third of a 1024-wide matrix's rate per multiply-add). This path computes
// 16 weight rows at once with the 16 outputs in the lanes (the one-block kernel above, for any
// even count of blocks): each row's blocks are decoded once (Weights::pair) and transposed, lane
// r of values[8b + k] holding bytes 4k..4k+3 of row r's block b, then reused by every activation
// row. Bitwise blocks32_tile's output: lane r of even[k] (odd[k]) is lane k of its even (odd)
// half, the same exact i32 sum of 4 products from the same −128·Σw start, the same f32 scale
// product d_w·d_a, the same FMA chain over the even (odd) blocks in order from +0; then
// even[k] + odd[k] and avx2::horizontal_sum's tree
// ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
constexpr int64_t kShortRowsMaxBlocks = 8;
// Activation rows from which the transposition (one gather per 4-byte group of a 16-row tile)
// pays: prompt windows, not decode or short verify windows.
constexpr int64_t kShortRowsMinActs = 16;

template <typename Block, typename Weights>
void blocks32_short_rows16(const std::byte* w, size_t w_stride, int64_t n_blocks,
                           const std::byte* a, size_t a_stride, int64_t n_acts, float* out,
                           size_t out_w_stride, size_t out_a_stride, const Weights& weights) {
  constexpr int64_t kRowBytes = kShortRowsMaxBlocks * kBlock32;
  alignas(64) int8_t decoded[16 * kRowBytes];
  alignas(64) float weight_scales[kShortRowsMaxBlocks][16];
  for (int r = 0; r < 16; ++r) {
    const auto* blocks = reinterpret_cast<const Block*>(w + size_t(r) * w_stride);
    for (int64_t b = 0; b < n_blocks; b += 2)
      _mm512_storeu_si512(decoded + r * kRowBytes + b * kBlock32, weights.pair(blocks, b));
    for (int64_t b = 0; b < n_blocks; ++b)
      weight_scales[b][r] = avx2::f16_scalar_to_f32(blocks[b].d);
  }
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const __m512i zero_i = _mm512_setzero_si512();
  const __m512i row_offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(int(kRowBytes)));
  __m512i values[kShortRowsMaxBlocks * 8], minus_offsets[kShortRowsMaxBlocks * 8];
  for (int64_t g = 0; g < n_blocks * 8; ++g) {
    values[g] = _mm512_i32gather_epi32(row_offsets, decoded + 4 * g, 1);
    minus_offsets[g] = _mm512_sub_epi32(zero_i, _mm512_dpbusd_epi32(zero_i, bias, values[g]));
  }
  __m512 scales[kShortRowsMaxBlocks];
  for (int64_t b = 0; b < n_blocks; ++b) scales[b] = _mm512_load_ps(weight_scales[b]);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t t = 0; t < n_acts; ++t) {
    const auto* x = reinterpret_cast<const BlockQ8_0*>(a + size_t(t) * a_stride);
    __m512 even[8], odd[8];
    for (int k = 0; k < 8; ++k) even[k] = odd[k] = zero;
    // Block b into acc (even or odd, named at compile time below: a pointer chosen per block kept
    // both arrays on the stack, every FMA a store and a reload, ~20 % slower on Zen 4).
    const auto add_block = [&](int64_t b, __m512(&acc)[8]) {
      const __m512 d = _mm512_mul_ps(scales[b], _mm512_set1_ps(avx2::f16_scalar_to_f32(x[b].d)));
      for (int k = 0; k < 8; ++k) {
        int32_t group;
        std::memcpy(&group, x[b].qs + 4 * k, sizeof group);
        const __m512i biased = _mm512_xor_si512(_mm512_set1_epi32(group), bias);
        const __m512i sums =
            _mm512_dpbusd_epi32(minus_offsets[8 * b + k], biased, values[8 * b + k]);
        acc[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc[k]);
      }
    };
    for (int64_t b = 0; b < n_blocks; b += 2) {  // n_blocks is even
      add_block(b, even);
      add_block(b + 1, odd);
    }
    __m512 lane[8];
    for (int k = 0; k < 8; ++k) lane[k] = _mm512_add_ps(even[k], odd[k]);
    store_lane_sums16(lane, out + size_t(t) * out_a_stride, out_w_stride);
  }
}

// dot_tile of the 32-weight symmetric types: rows of a few blocks in groups of 16 through
// blocks32_short_rows16 when the window is long enough, the rest through blocks32_tiles.
template <typename Block, typename Weights>
void blocks32_dot_tile(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                       int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                       size_t out_a_stride, const Weights& weights) {
  const int64_t n_blocks = n / kBlock32;
  int64_t first = 0;
  if (n_blocks >= 2 && n_blocks <= kShortRowsMaxBlocks && n_blocks % 2 == 0 &&
      n_acts >= kShortRowsMinActs) {
    for (; first + 16 <= n_w; first += 16)
      blocks32_short_rows16<Block>(static_cast<const std::byte*>(w) + size_t(first) * w_stride,
                                   w_stride, n_blocks, static_cast<const std::byte*>(a), a_stride,
                                   n_acts, out + size_t(first) * out_w_stride, out_w_stride,
                                   out_a_stride, weights);
  }
  if (first < n_w)
    blocks32_tiles<Block>(static_cast<const std::byte*>(w) + size_t(first) * w_stride, w_stride,
                          n_w - first, a, a_stride, n_acts, n, out + size_t(first) * out_w_stride,
                          out_w_stride, out_a_stride, weights);
}

constexpr int8_t kQ4_0Values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
constexpr int8_t kNibbleValues[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

}  // namespace

void dot_tile_q8_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  int64_t first = 0;
  if (n == kBlock32 && w_stride <= size_t(INT32_MAX / 16)) {
    for (; first + 16 <= n_w; first += 16)
      q8_0_one_block_rows16(static_cast<const std::byte*>(w) + size_t(first) * w_stride, w_stride,
                            static_cast<const std::byte*>(a), a_stride, n_acts,
                            out + size_t(first) * out_w_stride, out_w_stride, out_a_stride);
  }
  if (first < n_w)
    blocks32_dot_tile<BlockQ8_0>(static_cast<const std::byte*>(w) + size_t(first) * w_stride,
                                 w_stride, n_w - first, a, a_stride, n_acts, n,
                                 out + size_t(first) * out_w_stride, out_w_stride, out_a_stride,
                                 Q8_0Weights{});
}

void dot_tile_q4_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  blocks32_dot_tile<BlockQ4_0>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride,
                               out_a_stride, NibbleWeights<BlockQ4_0>{table_of(kQ4_0Values)});
}

void dot_tile_q5_0(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  blocks32_dot_tile<BlockQ5_0>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride,
                               out_a_stride, Q5_0Weights{{table_of(kNibbleValues)}});
}

void dot_tile_iq4_nl(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride) {
  blocks32_dot_tile<BlockIQ4_NL>(w, w_stride, n_w, a, a_stride, n_acts, n, out, out_w_stride,
                                 out_a_stride, NibbleWeights<BlockIQ4_NL>{table_of(kIq4nlValues)});
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  const int64_t n_blocks = n / kBlock32;
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i eight = _mm512_set1_epi8(8);
  // 128-bit lanes (b0 raw, b1 raw, b0 >> 4, b1 >> 4) -> (b0 low, b0 high, b1 low, b1 high).
  const __m512i block_order = _mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7);
  __m512 acc = _mm512_setzero_ps();  // lanes 0-7: even blocks, lanes 8-15: odd blocks
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(load16(blocks[b].qs)),
                                                load16(blocks[b + 1].qs), 1);
    const __m512i both =
        _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    const __m512i q = _mm512_and_si512(_mm512_permutexvar_epi64(block_order, both), nibble);
    const __m512i x =
        _mm512_inserti64x4(_mm512_castsi256_si512(load32(acts[b].qs)), load32(acts[b + 1].qs), 1);
    const __m512i sums = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x),
                                          _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, x));
    const float d_even = avx2::f16_scalar_to_f32(blocks[b].d) * avx2::f16_scalar_to_f32(acts[b].d);
    const float d_odd =
        avx2::f16_scalar_to_f32(blocks[b + 1].d) * avx2::f16_scalar_to_f32(acts[b + 1].d);
    const __m512 d = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castps_pd(_mm512_set1_ps(d_even)), _mm256_castps_pd(_mm256_set1_ps(d_odd)), 1));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc);
  }
  __m256 acc_even = _mm512_castps512_ps256(acc);
  const __m256 acc_odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  if (b < n_blocks) {
    // The last, even-numbered block exactly as avx2::dot_q4_0 computes it.
    const __m128i raw = load16(blocks[b].qs);
    const __m256i q =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
    const __m256i x = load32(acts[b].qs);
    const __m256i sums =
        _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x),
                         _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), x));
    const float d = avx2::f16_scalar_to_f32(blocks[b].d) * avx2::f16_scalar_to_f32(acts[b].d);
    acc_even = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc_even);
  }
  return avx2::horizontal_sum(_mm256_add_ps(acc_even, acc_odd));
}

}  // namespace strata::quant::avx512
