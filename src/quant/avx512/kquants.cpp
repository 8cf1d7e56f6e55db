// AVX-512 (F/BW/VL + VNNI) dot kernels for Q4_K and Q6_K weights with Q8_K activations: one weight
// row against one activation row (dot_q4_K) or a tile of weight rows against a tile of activation
// rows (dot_tile_q4_K: each block's nibbles and scales unpacked once for up to 16 activation rows;
// a prompt window's rows are staged in pairs for q4_K_paired_tile, below, decode and very long rows
// read in place by q4_K_tile).
//
// One 512-bit vector covers 64 weights: the 32 bytes of a Q4_K chunk, low nibbles in the lower
// half and high nibbles in the upper half, which is exactly the layout of the 64 activations of
// sub-blocks 2c and 2c+1. vpdpbusd forms exact sums of 4 products per i32 lane, two chunks' sums
// share one i32 as two i16 words, and one vpdpwssd multiplies both by their sub-block scales and
// accumulates (3 multiplies per 128 weights; AVX2 needs maddubs, two shuffles, two madds and two
// adds per 32 weights).
//
// Bitwise equal to avx2::dot_q4_K: integer sums are exact, and adding the two 256-bit halves of the
// 16-lane sum gives each of the 8 lanes exactly the elements the AVX2 kernel puts there (bytes
// 4k..4k+3 of every 32-byte activation vector); the f32 part is the same code. So a CPU with or
// without AVX-512 computes the same bits. All entry points run the same per-pair code, so
// dot_tile's outputs are bitwise those of dot_q4_K.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>

#include "quant/avx2/common.h"
#include "quant/avx512/common.h"
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/tiles.h"

STRATA_AVX512_IGNORE_GCC12_WARNINGS

namespace strata::quant::avx512 {
namespace {

// Q4_K tile shape: one weight row × 12 activation rows. Measured on the Xeon (56 rows × 1024, 32
// activations, in cache, best of 15, 3 interleaved runs; ns per block per activation): 1 × 12
// 4.4–4.6, 1 × 16 4.5–4.9, 1 × 8 4.7–5.3, 1 × 4 5.6–6.6, 2 × 4 5.6–6.5, 2 × 3 6.3–7.1, and the
// maddubs 1 × 4 kernel this replaced 5.4–5.6. More weight rows per tile cost more than the
// activation loads they save: the multiplier, not the loads, is the limit.
constexpr int kQ4KTileWeights = 1;
constexpr int kQ4KTileActs = 12;

// vpshufb indices: the low word of every i32 lane into its high word, zeros below.
inline __m512i low_word_to_high_word() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi32(int(0x01008080), int(0x05048080), int(0x09088080), int(0x0d0c8080)));
}

// vpermw indices that spread scale 2c over i16 lanes 0-15 and scale 2c+1 over lanes 16-31.
inline __m512i chunk_scale_index(int chunk) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(short(2 * chunk))),
                            _mm256_set1_epi16(short(2 * chunk + 1)), 1);
}

// vpermw indices for the chunk pair (c, c + 1): i32 lane j < 8 holds sub-blocks 2c (low word) and
// 2c + 2 (high word), lane j ≥ 8 sub-blocks 2c + 1 and 2c + 3.
inline __m512i chunk_pair_scale_index(int chunk) {
  const __m256i low_lanes = _mm256_set1_epi32(int(2 * chunk) | int(2 * chunk + 2) << 16);
  const __m256i high_lanes = _mm256_set1_epi32(int(2 * chunk + 1) | int(2 * chunk + 3) << 16);
  return _mm512_inserti64x4(_mm512_castsi256_si512(low_lanes), high_lanes, 1);
}

// The second and third steps of both final sums, from four quads (per 128-bit lane, element k =
// v[k] + v[k+4] of two rows' lanes): pairs (per lane, elements 0-1 of quads[2i] and of
// quads[2i+1], k = q[k] + q[k+2]), then singles (p[0] + p[1]), avx2::horizontal_sum's additions.
[[gnu::always_inline]] inline __m512 quads_to_singles(const __m512 (&quads)[4]) {
  __m512 pairs[2];
  for (int i = 0; i < 2; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_shuffle_ps(quads[2 * i], quads[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(quads[2 * i], quads[2 * i + 1], 0xee));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88),
                       _mm512_shuffle_ps(pairs[0], pairs[1], 0xdd));
}

// The last step of both final sums: sums minus mins from the singles of groups of 8 rows, whose
// 128-bit lanes kSumLanes select (vshuff32x4 immediates: of the sums of rows 0, 2, 4, 6 of the
// group, then rows 1, 3, 5, 7, from two groups) and kMinLanes (their mins); NaNs canonicalised,
// stored to out[t·out_a_stride] for t < kA.
template <int kA, int kGroups, int kSumLanes, int kMinLanes>
[[gnu::always_inline]] inline void store_singles(__m512 (&singles)[2 * ((kGroups + 1) / 2)],
                                                 float* out, size_t out_a_stride) {
  if constexpr (kGroups % 2 == 1) singles[kGroups] = singles[kGroups - 1];
  alignas(64) float values[2 * ((kGroups + 1) / 2)][16];
  for (int g = 0; g < kGroups; g += 2) {
    // Sums minus mins of 16 rows: element e is row
    // 16·(g/2) + 8·(e / 8) + [0, 2, 4, 6, 1, 3, 5, 7][e % 8].
    const __m512 results =
        _mm512_sub_ps(_mm512_shuffle_f32x4(singles[g], singles[g + 1], kSumLanes),
                      _mm512_shuffle_f32x4(singles[g], singles[g + 1], kMinLanes));
    // canonical_nan for 16 results at once (a compare and a masked move instead of a compare
    // and a conditional move per output).
    _mm512_store_ps(values[g / 2],
                    _mm512_mask_mov_ps(results, _mm512_cmp_ps_mask(results, results, _CMP_UNORD_Q),
                                       _mm512_set1_ps(__builtin_nanf(""))));
  }
  // Rows in order through one running pointer (out + t·out_a_stride).
  for (int t = 0; t < kA; ++t, out += out_a_stride) {
    const int e = 8 * ((t % 16) / 8) + (t % 2 == 0 ? (t % 8) / 2 : 4 + (t % 8) / 2);
    *out = values[t / 16][e];
  }
}

// The tile's final sums: out[t·out_a_stride] = canonical_nan(horizontal_sum(acc[t] lanes 0-7) −
// horizontal_sum(acc[t] lanes 8-15)) for t < kA, with the additions of avx2::horizontal_sum
// (lane k + lane k+4, then k + k+2, then 0 + 1) done for 8 rows at once: each step adds the same
// pairs of floats, rows moved between vectors by shuffles instead of reduced one at a time
// (≈ 3 instead of ≈ 14 vector ops per output; with rows of 2-4 blocks, as in mid-qwen4exp's
// experts, the one-at-a-time sums were a fifth of the tile's work). Rows past kA are zeros and
// their results are dropped.
template <int kA>
[[gnu::always_inline]] inline void store_q4_K_results(const __m512 (&acc)[kA], float* out,
                                                      size_t out_a_stride) {
  constexpr int kGroups = (kA + 7) / 8;
  __m512 singles[2 * ((kGroups + 1) / 2)];
  for (int g = 0; g < kGroups; ++g) {
    __m512 rows[8];
    for (int i = 0; i < 8; ++i) rows[i] = 8 * g + i < kA ? acc[8 * g + i] : _mm512_setzero_ps();
    // Quads: 128-bit lanes [sum, mins] of row 2i, then of row 2i + 1; element k = v[k] + v[k+4].
    __m512 quads[4];
    for (int i = 0; i < 4; ++i) {
      quads[i] = _mm512_add_ps(_mm512_shuffle_f32x4(rows[2 * i], rows[2 * i + 1], 0x88),
                               _mm512_shuffle_f32x4(rows[2 * i], rows[2 * i + 1], 0xdd));
    }
    // Singles: 128-bit lane 0 holds the sums of rows 0, 2, 4, 6, lane 1 their mins, lane 2 the
    // sums of rows 1, 3, 5, 7, lane 3 their mins.
    singles[g] = quads_to_singles(quads);
  }
  store_singles<kA, kGroups, 0x88, 0xdd>(singles, out, out_a_stride);
}

// The paired tile's final sums: the same additions as store_q4_K_results from its [acc_t | acc_u]
// accumulators (sums of rows 2p and 2p + 1 in acc_sums[p], mins in acc_mins[p]), without first
// regrouping them per row (16 shuffles fewer per 16 rows): the first step's shuffles take both
// rows of a pair at once, its 128-bit lanes come out [sums t, sums u, mins t, mins u], and after
// the same three steps the singles hold the sums of rows 0, 2, 4, 6 of a group in lane 0, of rows
// 1, 3, 5, 7 in lane 1, and their mins in lanes 2-3.
template <int kA>
[[gnu::always_inline]] inline void store_q4_K_pair_results(const __m512 (&acc_sums)[(kA + 1) / 2],
                                                           const __m512 (&acc_mins)[(kA + 1) / 2],
                                                           float* out, size_t out_a_stride) {
  constexpr int kPairs = (kA + 1) / 2;
  constexpr int kGroups = (kPairs + 3) / 4;
  __m512 singles[2 * ((kGroups + 1) / 2)];
  for (int g = 0; g < kGroups; ++g) {
    // Quads: 128-bit lanes [sums 2p, sums 2p + 1, mins 2p, mins 2p + 1]; element k = v[k] + v[k+4].
    __m512 quads[4];
    for (int i = 0; i < 4; ++i) {
      const int p = 4 * g + i;
      const __m512 sums = p < kPairs ? acc_sums[p] : _mm512_setzero_ps();
      const __m512 mins = p < kPairs ? acc_mins[p] : _mm512_setzero_ps();
      quads[i] = _mm512_add_ps(_mm512_shuffle_f32x4(sums, mins, 0x88),
                               _mm512_shuffle_f32x4(sums, mins, 0xdd));
    }
    singles[g] = quads_to_singles(quads);
  }
  store_singles<kA, kGroups, 0x44, 0xee>(singles, out, out_a_stride);
}

// One tile, the activations read in place (decode, and rows too long for the paired tile's
// staging): kW weight rows (row r at w + r·w_stride bytes) × kA activation rows (row t at
// a + t·a_stride); each weight block's nibbles and scales are unpacked once for all kA rows and
// each activation vector is loaded once for all kW weight rows. Every pair runs exactly the
// single-row arithmetic, so out[r·out_w_stride + t·out_a_stride] is bitwise dot_q4_K of the pair.
// avx2::dot_q4_K's two f32 accumulators (acc, acc_mins) share one register here: acc in lanes 0-7,
// acc_mins in lanes 8-15, each lane getting the same FMA as there.
template <int kW, int kA>
void q4_K_tile(const std::byte* w, size_t w_stride, const std::byte* a, size_t a_stride,
               int64_t n_blocks, float* out, size_t out_w_stride, size_t out_a_stride) {
  const __m512i nibble = _mm512_set1_epi8(15);
  const auto block_of = [&](int r, int64_t b) -> const BlockQ4_K& {
    return reinterpret_cast<const BlockQ4_K*>(w + size_t(r) * w_stride)[b];
  };
  const auto activation = [&](int t, int64_t b) -> const BlockQ8_K& {
    return reinterpret_cast<const BlockQ8_K*>(a + size_t(t) * a_stride)[b];
  };
  __m512 acc[kW][kA];
  for (auto& row : acc) {
    for (__m512& v : row) v = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m512i scales[kW];
    __m256i mins_twice[kW];
    __m512 block_scales[kW];  // d in lanes 0-7, dmin in lanes 8-15
    for (int r = 0; r < kW; ++r) {
      const BlockQ4_K& block = block_of(r, b);
      uint64_t scales_u64, mins_u64;
      unpack_q4_K_scales_u64(block.scales, &scales_u64, &mins_u64);
      // The eight scales as i16 in lanes 0-7 (the other lanes are never selected).
      scales[r] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(scales_u64))));
      // Each 8-bit min twice, as avx2::k4_min_sums pairs them with the bsums.
      const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(mins_u64)));
      mins_twice[r] = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
      block_scales[r] = _mm512_castpd_ps(
          _mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(avx2::f16_scalar_to_f32(block.d))),
                             _mm256_castps_pd(_mm256_set1_ps(avx2::f16_scalar_to_f32(block.dmin))), 1));
    }
    __m512i sums[kW][kA];
    for (auto& row : sums) {
      for (__m512i& v : row) v = _mm512_setzero_si512();
    }
    // One row × one activation (decode) keeps the maddubs + vpdpwssd form per chunk that
    // decode was measured with. Tiles take the chunks in pairs (c, c + 1): vpdpbusd forms each
    // chunk's exact 4-product sums P (|P| ≤ 4·15·127, so P fits in i16), the pair's two P of a lane
    // become one i32 of two i16 words, and one vpdpwssd multiplies both by their sub-block scales:
    // 3 multiplies per 128 weights where maddubs + vpdpwssd per chunk take 4 (the multiplier is
    // what bounds this kernel on a Xeon). Either way lane j gets P_c[j]·scale + P_{c+1}[j]·scale'.
    if constexpr (kW == 1 && kA == 1) {
      for (int chunk = 0; chunk < 4; ++chunk) {
        const __m256i bytes = avx2::load32(block_of(0, b).qs + 32 * chunk);
        const __m512i q = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1),
            nibble);
        const __m512i products =
            _mm512_maddubs_epi16(q, _mm512_loadu_si512(activation(0, b).qs + 64 * chunk));
        sums[0][0] = _mm512_dpwssd_epi32(
            sums[0][0], products, _mm512_permutexvar_epi16(chunk_scale_index(chunk), scales[0]));
      }
    } else {
      for (int chunk = 0; chunk < 4; chunk += 2) {
        __m512i q[kW][2], pair_scales[kW];
        for (int r = 0; r < kW; ++r) {
          for (int i = 0; i < 2; ++i) {
            const __m256i bytes = avx2::load32(block_of(r, b).qs + 32 * (chunk + i));
            q[r][i] = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1),
                nibble);
          }
          pair_scales[r] = _mm512_permutexvar_epi16(chunk_pair_scale_index(chunk), scales[r]);
        }
        for (int t = 0; t < kA; ++t) {
          const int8_t* x = activation(t, b).qs + 64 * chunk;
          const __m512i x0 = _mm512_loadu_si512(x);
          const __m512i x1 = _mm512_loadu_si512(x + 64);
          for (int r = 0; r < kW; ++r) {
            const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r][0], x0);
            const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r][1], x1);
            // Even words: P_c; odd words: P_{c+1} (its low word shifted up: a byte shuffle here
            // shares a multiplier pipe on Zen 4, a shift does not).
            const __m512i words =
                _mm512_mask_blend_epi16(0xAAAAAAAA, p0, _mm512_slli_epi32(p1, 16));
            sums[r][t] = _mm512_dpwssd_epi32(sums[r][t], words, pair_scales[r]);
          }
        }
      }
    }
    for (int t = 0; t < kA; ++t) {
      const BlockQ8_K& act = activation(t, b);
      const __m256i bsums = avx2::load32(act.bsums);
      const __m512 act_d = _mm512_set1_ps(act.d);
      for (int r = 0; r < kW; ++r) {
        // Mins exactly as avx2::dot_q4_K (avx2::k4_min_sums).
        const __m256i min_sums = _mm256_madd_epi16(bsums, mins_twice[r]);
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(add_halves(sums[r][t])), min_sums, 1);
        acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(block_scales[r], act_d), _mm512_cvtepi32_ps(both),
                                    acc[r][t]);
      }
    }
  }
  for (int r = 0; r < kW; ++r) {
    if constexpr (kA > 1) {
      store_q4_K_results(acc[r], out + size_t(r) * out_w_stride, out_a_stride);
    } else {
      const __m256 sum = _mm512_castps512_ps256(acc[r][0]);
      const __m256 mins = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][0]), 1));
      out[size_t(r) * out_w_stride] =
          canonical_nan(avx2::horizontal_sum(sum) - avx2::horizontal_sum(mins));
    }
  }
}

// The paired Q4_K tile (windows of ≥ 2 rows whose quants fit the staging buffer): activation rows
// are taken two at a time, t = 2p in the lower 256 bits of every vector and u = 2p + 1 in the
// upper. dot_tile_q4_K stages each pair once per call (stage_q4_K_pairs) as one 64-byte-aligned
// record per block: eight 64-byte vectors [t's sub-block s | u's sub-block s] of quants, then [t's
// bsums | u's bsums], then [t's d ×8 | u's d ×8].
//
// Against such a vector the weight vector is sub-block s's 32 nibbles twice, and i32 lane j of a
// vpdpbusd is bytes 4j..4j+3 of sub-block s for t (j < 8) or u (j ≥ 8): exactly the products that
// avx2::dot_q4_K puts in its lane j, so the rows' i32 sums need no folding (q4_K_tile adds its two
// 256-bit halves per row and block). Sub-blocks 2c and 2c + 1 are packed as the two i16 words of
// each lane and one vpdpwssd applies both scales, as in q4_K_tile. The f32 step is avx2's FMA per
// lane, two rows per instruction: sums and mins in separate accumulators [acc_t | acc_u] (one madd
// forms both rows' min sums), summed at the end by store_q4_K_pair_results with
// store_q4_K_results' additions. Integers are exact and each lane gets the same FMAs in the same
// order, so every output is bitwise dot_q4_K of its pair.
//
// On the Zen 4 build VM every 512-bit multiply (vpdpbusd, vpdpwssd, vpmaddwd, FMA, mul) goes to
// the same two pipes at one per cycle, and byte shuffles and permutes take part of them too. Per
// block and activation row this form has q4_K_tile's multiplies (4 vpdpbusd, 2 vpdpwssd, a mul
// and an FMA) and half a madd, but not its per-row fold, insert, byte shuffles and one of two
// conversions: bench_matmul_tile BM_ExpertWindow/q4_K at 512 rows, 1 thread, ns per block per
// activation row, 4.0 for q4_K_tile 1 × 12 staged, 3.5 for this in its first form (docs/
// bench-cpu-prompt.md, session 54, for the steps after it).
struct Q4KPairRecord {
  alignas(64) int8_t quants[8][64];  // [sub-block][t's 32 bytes, u's 32 bytes]
  int16_t bsums[2][16];              // [t, u]
  float d[2][8];                     // [t, u], each row's d eight times
};
static_assert(sizeof(Q4KPairRecord) == 640);

// One weight row (Q4_K blocks at `blocks`) × kA activation rows staged as (kA + 1) / 2 pair
// records per block (pair p's block b at records[p·n_blocks + b]; an odd kA's last pair repeats
// its row, whose second results are dropped). out[t·out_a_stride] is bitwise dot_q4_K of the pair.
// always_inline: out of line, GCC 12 keeps the accumulator arrays in memory outside the loop and
// zeroes them with `rep stos` per call (per weight row): ~6 % of a 2048-weight row's tile.
template <int kA>
[[gnu::always_inline]] inline void q4_K_paired_tile(const BlockQ4_K* blocks,
                                                    const Q4KPairRecord* records, int64_t n_blocks,
                                                    float* out, size_t out_a_stride) {
  constexpr int kPairs = (kA + 1) / 2;
  const __m512i nibble = _mm512_set1_epi8(15);
  __m512 acc_sums[kPairs], acc_mins[kPairs];
  for (int p = 0; p < kPairs; ++p) acc_sums[p] = acc_mins[p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ4_K& block = blocks[b];
    uint64_t scales_u64, mins_u64;
    unpack_q4_K_scales_u64(block.scales, &scales_u64, &mins_u64);
    // The eight scales as i16: i32 lane c holds sub-block 2c's scale (low word) and 2c + 1's.
    const __m512i scale_words =
        _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(scales_u64))));
    __m512i sums[kPairs];
    for (__m512i& v : sums) v = _mm512_setzero_si512();
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m512i bytes = _mm512_broadcast_i64x4(avx2::load32(block.qs + 32 * chunk));
      const __m512i q_low = _mm512_and_si512(bytes, nibble);
      const __m512i q_high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
      const __m512i pair_scales = _mm512_permutexvar_epi32(_mm512_set1_epi32(chunk), scale_words);
      for (int p = 0; p < kPairs; ++p) {
        const int8_t* x = records[p * n_blocks + b].quants[2 * chunk];
        const __m512i p_low =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), q_low, _mm512_load_si512(x));
        const __m512i p_high =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), q_high, _mm512_load_si512(x + 64));
        // Even words: sub-block 2c; odd words: 2c + 1 (its low word shifted up).
        const __m512i words =
            _mm512_mask_blend_epi16(0xAAAAAAAA, p_low, _mm512_slli_epi32(p_high, 16));
        sums[p] = _mm512_dpwssd_epi32(sums[p], words, pair_scales);
      }
    }
    // Mins exactly as avx2::dot_q4_K (avx2::k4_min_sums), two rows per madd.
    const __m512i mins_twice = _mm512_broadcast_i64x4(avx2::k4_mins_twice(mins_u64));
    const __m512 d = _mm512_set1_ps(avx2::f16_scalar_to_f32(block.d));
    const __m512 dmin = _mm512_set1_ps(avx2::f16_scalar_to_f32(block.dmin));
    for (int p = 0; p < kPairs; ++p) {
      const Q4KPairRecord& record = records[p * n_blocks + b];
      const __m512 act_d = _mm512_load_ps(record.d);
      const __m512i min_sums = _mm512_madd_epi16(_mm512_load_si512(record.bsums), mins_twice);
      acc_sums[p] =
          _mm512_fmadd_ps(_mm512_mul_ps(d, act_d), _mm512_cvtepi32_ps(sums[p]), acc_sums[p]);
      acc_mins[p] =
          _mm512_fmadd_ps(_mm512_mul_ps(dmin, act_d), _mm512_cvtepi32_ps(min_sums), acc_mins[p]);
    }
  }
  store_q4_K_pair_results<kA>(acc_sums, acc_mins, out, out_a_stride);
}

// Q6_K: one 512-bit vector covers two 32-weight quarters of a 128-weight half (quarters 2p and
// 2p + 1 of half h: ql bytes and qh bits exactly as avx2's unpack_q6_K_half, two at a time), which
// are the 64 activations 128h + 64p .. + 63; i32 lane j of its 4-product sums belongs to sub-block
// 8h + 4p + j/4, and one vpermw spreads the scales of both vectors of a half. Adding the two 256-bit halves of the
// 16-lane sum gives avx2::dot_q6_K's 8 lanes (bytes 4k..4k+3 of every quarter), the −32 offset goes
// through the bsums exactly as there, and the f32 step is avx2's: bitwise avx2::dot_q6_K.
// One tile: kW weight rows × kA activation rows; quants and scales unpacked once per weight row,
// activation vectors loaded once per activation row.
// vpermw indices of half h: i32 lane j covers bytes 4j..4j+3 of the quarter pair (0, 1) in its low
// word and of (2, 3) in its high word, i.e. sub-blocks 8h + j/4 and 8h + 4 + j/4.
struct Q6KScaleIndices {
  alignas(64) uint16_t words[2][32];  // [half][word]
};
constexpr Q6KScaleIndices make_q6_K_scale_indices() {
  Q6KScaleIndices indices{};
  for (int half = 0; half < 2; ++half) {
    for (int lane = 0; lane < 16; ++lane) {
      indices.words[half][2 * lane] = uint16_t(8 * half + lane / 4);
      indices.words[half][2 * lane + 1] = uint16_t(8 * half + 4 + lane / 4);
    }
  }
  return indices;
}
constexpr Q6KScaleIndices kQ6KScaleIndices = make_q6_K_scale_indices();

template <int kW, int kA>
void q6_K_tile(const std::byte* w, size_t w_stride, const std::byte* a, size_t a_stride,
               int64_t n_blocks, float* out, size_t out_w_stride, size_t out_a_stride) {
  const auto block_of = [&](int r, int64_t b) -> const BlockQ6_K& {
    return reinterpret_cast<const BlockQ6_K*>(w + size_t(r) * w_stride)[b];
  };
  const auto activation = [&](int t, int64_t b) -> const BlockQ8_K& {
    return reinterpret_cast<const BlockQ8_K*>(a + size_t(t) * a_stride)[b];
  };
  const __m512i low_mask = _mm512_set1_epi8(0x0f);
  const __m512i high_mask = _mm512_set1_epi8(0x30);
  const __m512i low_word_up = low_word_to_high_word();
  __m256 acc[kW][kA];
  for (auto& row : acc) {
    for (__m256& v : row) v = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m256i scales[kW];
    for (int r = 0; r < kW; ++r) scales[r] = _mm256_cvtepi8_epi16(avx2::load16(block_of(r, b).scales));
    __m512i sums[kW][kA];
    for (auto& row : sums) {
      for (__m512i& v : row) v = _mm512_setzero_si512();
    }
    for (int half = 0; half < 2; ++half) {
      __m512i q[kW][2], half_scales[kW];
      for (int r = 0; r < kW; ++r) {
        const BlockQ6_K& block = block_of(r, b);
        const __m512i ql = _mm512_loadu_si512(block.ql + 64 * half);
        const __m256i qh = avx2::load32(block.qh + 32 * half);
        const __m512i qh_01 = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_slli_epi16(qh, 4)), _mm256_slli_epi16(qh, 2), 1);
        const __m512i qh_23 =
            _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        q[r][0] = _mm512_or_si512(_mm512_and_si512(ql, low_mask), _mm512_and_si512(qh_01, high_mask));
        q[r][1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low_mask),
                                  _mm512_and_si512(qh_23, high_mask));
        half_scales[r] = _mm512_permutexvar_epi16(
            _mm512_load_si512(kQ6KScaleIndices.words[half]), _mm512_castsi256_si512(scales[r]));
      }
      // As Q4_K's chunk pairs: vpdpbusd gives each step's exact 4-product sums (|P| ≤ 4·63·127
      // fits in i16), the two steps' sums of a lane share one i32 as two words, and one vpdpwssd
      // applies both sub-block scales.
      for (int t = 0; t < kA; ++t) {
        const int8_t* x = activation(t, b).qs + 128 * half;
        const __m512i x0 = _mm512_loadu_si512(x);
        const __m512i x1 = _mm512_loadu_si512(x + 64);
        for (int r = 0; r < kW; ++r) {
          const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r][0], x0);
          const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r][1], x1);
          const __m512i words =
              _mm512_mask_blend_epi16(0xAAAAAAAA, p0, _mm512_shuffle_epi8(p1, low_word_up));
          sums[r][t] = _mm512_dpwssd_epi32(sums[r][t], words, half_scales[r]);
        }
      }
    }
    for (int t = 0; t < kA; ++t) {
      const BlockQ8_K& act = activation(t, b);
      const __m256i bsums = avx2::load32(act.bsums);
      for (int r = 0; r < kW; ++r) {
        // Σ sc·(q − 32)·a = Σ sc·q·a − 32·Σ sc·bsum, as avx2::dot_q6_K.
        const __m256i offsets = _mm256_madd_epi16(bsums, scales[r]);
        const __m256i total = _mm256_sub_epi32(add_halves(sums[r][t]), _mm256_slli_epi32(offsets, 5));
        const float d = avx2::f16_scalar_to_f32(block_of(r, b).d) * act.d;
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(total), acc[r][t]);
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

float dot_q4_K(const void* w, const void* a, int64_t n) {
  float result = 0.0f;
  const auto* acts = static_cast<const std::byte*>(a);
  q4_K_tile<1, 1>(static_cast<const std::byte*>(w), 0, acts, 0, n / kBlockK, &result, 0, 0);
  return result;
}

// The paired tile's activation groups and staging buffer. A group is staged once per call as
// (rows + 1) / 2 pair records per block, 640 bytes each, and every weight row of the call passes
// over it: 16 rows (8 pairs: 16 f32 and 8 i32 accumulators, no spills) for rows of up to
// kQ4KMaxBlocksIn16 blocks, 12 rows up to kQ4KMaxStagedBlocks (2048 weights); both fill at most
// 30 KiB, so the group stays in a 32 KiB L1 with the weight row being decoded. Longer rows read
// their quants in place (q4_K_tile 1 × 12): a group of 16-block rows staged would be 48 KiB or
// more, and the copy of the older in-place staging then cost more than the split loads it saves
// (bench_matmul_tile BM_PromptShape/q4_K/4096x128, the mid file's hyper-connection down, on the
// Zen 4 build VM, 3 alternated rounds, medians: 1 thread 33.1 -> 49.2 GMAC/s, 2 threads 64.8 ->
// 77.6). 16 against 12 rows (Zen 4 build VM, BM_ExpertWindow/q4_K, 1 × 1024 → 512, ns per block
// per activation row, 3 alternated runs): 3.12-3.15 vs 3.34-3.36 at 32 rows, 3.19-3.25 vs
// 3.26-3.57 at 512.
constexpr int kQ4KPairGroupActs = 16;
constexpr int64_t kQ4KMaxBlocksIn16 = 6;
constexpr int kQ4KLongPairGroupActs = 12;
constexpr int64_t kQ4KMaxStagedBlocks = 8;
constexpr int64_t kQ4KStagedRecords = 48;
static_assert(kQ4KPairGroupActs / 2 * kQ4KMaxBlocksIn16 <= kQ4KStagedRecords);
static_assert(kQ4KLongPairGroupActs / 2 * kQ4KMaxStagedBlocks <= kQ4KStagedRecords);

// Stages activations [0, n_acts) (n_acts ≤ kQ4KPairGroupActs) of n_blocks blocks as the pair
// records of q4_K_paired_tile: pair p's block b at records[p·n_blocks + b].
void stage_q4_K_pairs(const std::byte* a, size_t a_stride, int64_t n_acts, int64_t n_blocks,
                      Q4KPairRecord* records) {
  for (int64_t p = 0; p < (n_acts + 1) / 2; ++p) {
    for (int half = 0; half < 2; ++half) {
      const int64_t t = std::min(2 * p + half, n_acts - 1);
      const auto* blocks = reinterpret_cast<const BlockQ8_K*>(a + size_t(t) * a_stride);
      for (int64_t b = 0; b < n_blocks; ++b) {
        Q4KPairRecord& record = records[p * n_blocks + b];
        for (int s = 0; s < 8; ++s) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(record.quants[s] + 32 * half),
                             avx2::load32(blocks[b].qs + 32 * s));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(record.bsums[half]),
                            avx2::load32(blocks[b].bsums));
        _mm256_storeu_ps(record.d[half], _mm256_set1_ps(blocks[b].d));
      }
    }
  }
}

void dot_tile_q4_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  const auto* weights = static_cast<const std::byte*>(w);
  const auto* acts = static_cast<const std::byte*>(a);
  const int64_t n_blocks = n / kBlockK;
  // One activation row (or rows too long to stage): the quants in place.
  if (n_acts == 1 || n_blocks > kQ4KMaxStagedBlocks) {
    tiles::for_each_tile<kQ4KTileWeights, kQ4KTileActs>(
        n_w, n_acts, [&](auto w_rows, auto a_rows, int64_t w_first, int64_t a_first) {
          q4_K_tile<decltype(w_rows)::value, decltype(a_rows)::value>(
              weights + size_t(w_first) * w_stride, w_stride, acts + size_t(a_first) * a_stride,
              a_stride, n_blocks,
              out + size_t(w_first) * out_w_stride + size_t(a_first) * out_a_stride, out_w_stride,
              out_a_stride);
        });
    return;
  }
  // Activation groups outer (as tiles::for_each_tile): each group is staged once and every weight
  // row of the call passes over it.
  const int64_t group_acts =
      n_blocks <= kQ4KMaxBlocksIn16 ? kQ4KPairGroupActs : kQ4KLongPairGroupActs;
  Q4KPairRecord records[kQ4KStagedRecords];
  for (int64_t a_first = 0; a_first < n_acts; a_first += group_acts) {
    const int64_t a_count = std::min<int64_t>(group_acts, n_acts - a_first);
    stage_q4_K_pairs(acts + size_t(a_first) * a_stride, a_stride, a_count, n_blocks, records);
    tiles::with_count<kQ4KPairGroupActs>(a_count, [&](auto a_rows) {
      for (int64_t r = 0; r < n_w; ++r) {
        q4_K_paired_tile<decltype(a_rows)::value>(
            reinterpret_cast<const BlockQ4_K*>(weights + size_t(r) * w_stride), records, n_blocks,
            out + size_t(r) * out_w_stride + size_t(a_first) * out_a_stride, out_a_stride);
      }
    });
  }
}

void dot_many_q4_K(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                   float* out, size_t out_stride) {
  dot_tile_q4_K(w, 0, 1, a, act_stride, n_acts, n, out, 0, out_stride);
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  float result = 0.0f;
  q6_K_tile<1, 1>(static_cast<const std::byte*>(w), 0, static_cast<const std::byte*>(a), 0,
                  n / kBlockK, &result, 0, 0);
  return result;
}

void dot_tile_q6_K(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                   int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                   size_t out_a_stride) {
  const auto* weights = static_cast<const std::byte*>(w);
  const auto* acts = static_cast<const std::byte*>(a);
  tiles::for_each_tile<2, 4>(
      n_w, n_acts, [&](auto w_rows, auto a_rows, int64_t w_first, int64_t a_first) {
        q6_K_tile<decltype(w_rows)::value, decltype(a_rows)::value>(
            weights + size_t(w_first) * w_stride, w_stride, acts + size_t(a_first) * a_stride,
            a_stride, n / kBlockK,
            out + size_t(w_first) * out_w_stride + size_t(a_first) * out_a_stride, out_w_stride,
            out_a_stride);
      });
}

}  // namespace strata::quant::avx512
