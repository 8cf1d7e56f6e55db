// AVX-512 (F/BW/VL + VBMI, VNNI, BITALG) dot kernels for IQ2_XS weights with Q8_K activations:
// one weight row against one activation row (dot_iq2_xs) or against up to 8 at once
// (dot_many_iq2_xs, which decodes each weight block once).
//
// The AVX2 kernel spends most of its time on 32 scalar grid loads per block and on assembling
// them into vectors. Here nothing leaves the vector registers, and blocks are decoded two at a
// time so that every byte lane of the lookups does work:
// - Grid: every grid byte is 8, 25 or 43, so a grid point is eight 2-bit codes, a u16. The 512
//   codes (1 KiB) sit in 16 registers as two byte planes. Two vpermt2b repack the two blocks' 64
//   index words into a vector of low bytes and one of high bytes; 8 vpermi2b look up the low and
//   high code bytes of all 64 groups from index bits 0-6, mask blends on bits 7 and 8 pick the
//   quarter, and one vpermt2b per block rebuilds its 16-bit codes.
// - The repacking order puts groups k, k+8, k+16, k+24 in qword k, so for the 64 weights of pair p
//   (groups 8p..8p+7) vpmultishiftqb cuts field p of every qword into bytes and vpermb maps them
//   to 8/25/43; vpshufbitqmb turns the sign bytes into 64 mask bits, and a masked subtract
//   negates those activations. The sub-block scales 2s+1 come from the 8 scale bytes by one
//   vpermb, a variable shift and a ternary-logic op per pair.
// - maddubs(grid, ±a) gives exact i16 pair sums (≤ 2·43·127) and vpdpwssd multiplies by the
//   integer sub-block scale 2s+1 and accumulates in i32.
// Measured in docs/bench-matvec.md: ~7.0 ns per block on Zen 5 for one activation (7.75 with one
// block per decode and a per-pair gather), 2.9 ns per block per activation at 8 activations.
//
// Bitwise equal to avx2::dot_iq2_xs: the integer sums are exact, the two 256-bit halves of the
// 16-lane sum add up to the AVX2 kernel's 8 lanes (bytes 4k..4k+3 of each 32-weight sub-block),
// and the f32 part is the same code, block after block. Both entry points run the same per-pair
// and per-block code, so dot_many's outputs are bitwise those of dot_iq2_xs.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/avx2/common.h"
#include "quant/avx512/common.h"
#include "quant/blocks.h"
#include "quant/iq2xs_tables.h"
#include "quant/kernels.h"
#include "quant/tiles.h"

STRATA_AVX512_IGNORE_GCC12_WARNINGS

namespace strata::quant::avx512 {
namespace {

// Grid point i as 2-bit codes: bits 2j, 2j+1 hold 0, 1 or 2 for byte j = 8, 25 or 43; stored as
// two byte planes (low and high byte of each code) because byte permutes are single uops on Zen 4/5
// while word permutes are not. Built once from kIq2xsGrid (thread-safe static initialisation).
struct GridCodePlanes {
  alignas(64) uint8_t low[kIq2xsGridSize];
  alignas(64) uint8_t high[kIq2xsGridSize];
};

const GridCodePlanes& iq2xs_grid_code_planes() {
  static const GridCodePlanes planes = [] {
    GridCodePlanes table{};
    for (int i = 0; i < kIq2xsGridSize; ++i) {
      unsigned code = 0;
      for (int j = 0; j < 8; ++j) {
        const auto magnitude = static_cast<uint8_t>(kIq2xsGrid[i] >> (8 * j));
        code |= unsigned(magnitude == 8 ? 0 : magnitude == 25 ? 1 : 2) << (2 * j);
      }
      table.low[i] = static_cast<uint8_t>(code);
      table.high[i] = static_cast<uint8_t>(code >> 8);
    }
    return table;
  }();
  return planes;
}

// Two blocks are decoded together so that every byte lane of the lookup does work: their 64 words
// are repacked into one vector of low bytes (grid index bits 0-7) and one of high bytes (bit 8,
// then the 7 sign bits), in "packed" order: byte 8k + 4b + i holds group k + 8i of block b. In that
// order the 4 groups in a block's qword k are k, k + 8, k + 16, k + 24, so pair p (groups 8p ..
// 8p + 7, one per qword) is field p of every qword: no per-pair gather is needed.
constexpr int packed_byte(int block, int group) {
  return 8 * (group % 8) + 4 * block + group / 8;
}

// The permute indices and shift counts of the decode, computed at compile time (building them per
// call costs more than a short row's decode).
struct DecodeIndices {
  // vpermt2b: byte `byte_of_word` (0 low, 1 high) of every word of blocks 0 and 1 (the two table
  // operands) in packed order.
  alignas(64) uint8_t pack_words[2][64];
  // vpermt2b: block b's 16-bit codes from the low-plane and high-plane lookups (packed order):
  // word 4k + i is the code of group k + 8i.
  alignas(64) uint8_t block_codes[2][64];
  // vpermb and vpsrlvw counts that turn a block's 8 scale bytes (broadcast to every qword) into
  // pair p's 32 i16 sub-block scales: words 0-7 and 16-23 take the low nibble of scale byte 2p
  // resp. 2p + 1, words 8-15 and 24-31 the high nibble. A word gets its byte in both halves; a
  // low-nibble word is shifted right by 7 (its high half's bits 0-3 land in bits 1-4), a
  // high-nibble word by 3 (its low half's bits 4-7 land in bits 1-4), so (word & 0x1e) | 1 is then
  // 2s + 1.
  alignas(64) uint8_t scale_bytes[4][64];
  alignas(64) uint16_t scale_shifts[32];
};

constexpr DecodeIndices make_decode_indices() {
  DecodeIndices indices{};
  for (int byte_of_word = 0; byte_of_word < 2; ++byte_of_word) {
    for (int block = 0; block < 2; ++block) {
      for (int group = 0; group < 32; ++group) {
        indices.pack_words[byte_of_word][packed_byte(block, group)] =
            uint8_t(64 * block + 2 * group + byte_of_word);
      }
    }
  }
  for (int block = 0; block < 2; ++block) {
    for (int k = 0; k < 8; ++k) {
      for (int i = 0; i < 4; ++i) {
        const int source = packed_byte(block, k + 8 * i);
        indices.block_codes[block][2 * (4 * k + i)] = uint8_t(source);
        indices.block_codes[block][2 * (4 * k + i) + 1] = uint8_t(64 + source);
      }
    }
  }
  for (int pair = 0; pair < 4; ++pair) {
    for (int word = 0; word < 32; ++word) {
      indices.scale_bytes[pair][2 * word] = uint8_t(2 * pair + word / 16);
      indices.scale_bytes[pair][2 * word + 1] = uint8_t(2 * pair + word / 16);
    }
  }
  for (int word = 0; word < 32; ++word) indices.scale_shifts[word] = word % 16 < 8 ? 7 : 3;
  return indices;
}

constexpr DecodeIndices kDecodeIndices = make_decode_indices();

inline __m512i load_index(const void* index) {
  return _mm512_load_si512(index);
}

// 64 weights (pair p = sub-blocks 2p, 2p+1) of one IQ2_XS block, decoded for any number of
// activation rows: the grid magnitudes, the activations to negate and the integer scales 2s+1.
struct DecodedPair {
  __m512i magnitudes;
  __mmask64 negative;
  __m512i scale;
};

// Everything a block decode needs in registers or L1: the grid code planes, the repacking indices
// and the constants. Built once per kernel call.
class BlockDecoder {
 public:
  BlockDecoder() {
    const GridCodePlanes& planes = iq2xs_grid_code_planes();
    for (int q = 0; q < 4; ++q) {
      for (int h = 0; h < 2; ++h) {
        low_[q][h] = _mm512_load_si512(planes.low + 128 * q + 64 * h);
        high_[q][h] = _mm512_load_si512(planes.high + 128 * q + 64 * h);
      }
    }
    for (int p = 0; p < 4; ++p) scale_bytes_index_[p] = load_index(kDecodeIndices.scale_bytes[p]);
  }

  // Two blocks' 16-bit grid codes (block b: word 4k + i = group k + 8i) and sign bytes (packed
  // order).
  struct Codes {
    __m512i codes[2];
    __m512i sign_bytes;
  };

  [[gnu::always_inline]] Codes codes(const BlockIQ2_XS& block0, const BlockIQ2_XS& block1) const {
    const __m512i words0 = _mm512_loadu_si512(block0.qs);
    const __m512i words1 = _mm512_loadu_si512(block1.qs);
    const __m512i low_bytes = _mm512_permutex2var_epi8(words0, pack_low_, words1);
    const __m512i high_bytes = _mm512_permutex2var_epi8(words0, pack_high_, words1);
    // vpermi2b reads index bits 0-6 (bit 6 picks the table register); bits 7 and 8 pick one of
    // the four 128-entry quarters.
    __m512i low_quarter[4];
    __m512i high_quarter[4];
    for (int q = 0; q < 4; ++q) {
      low_quarter[q] = _mm512_permutex2var_epi8(low_[q][0], low_bytes, low_[q][1]);
      high_quarter[q] = _mm512_permutex2var_epi8(high_[q][0], low_bytes, high_[q][1]);
    }
    const __mmask64 bit7 = _mm512_movepi8_mask(low_bytes);
    const __mmask64 bit8 = _mm512_test_epi8_mask(high_bytes, _mm512_set1_epi8(1));
    const auto select = [&](const __m512i(&quarter)[4]) {
      return _mm512_mask_blend_epi8(bit8, _mm512_mask_blend_epi8(bit7, quarter[0], quarter[1]),
                                    _mm512_mask_blend_epi8(bit7, quarter[2], quarter[3]));
    };
    const __m512i low_code = select(low_quarter);
    const __m512i high_code = select(high_quarter);
    // Sign byte: the 7 stored bits (high byte >> 1; the word shift pulls the next byte's bit 0
    // into bit 7, hence the mask) and their parity in bit 7 (an even count of negatives).
    const __m512i sign_index =
        _mm512_and_si512(_mm512_srli_epi16(high_bytes, 1), _mm512_set1_epi8(0x7f));
    const __m512i parity = _mm512_slli_epi16(_mm512_popcnt_epi8(sign_index), 7);
    // sign_index | (parity & 0x80)
    return {{_mm512_permutex2var_epi8(low_code, codes_index_[0], high_code),
             _mm512_permutex2var_epi8(low_code, codes_index_[1], high_code)},
            _mm512_ternarylogic_epi32(sign_index, parity, _mm512_set1_epi8(char(0x80)), 0xf8)};
  }

  // Pair p of block b (0 or 1) of the two decoded by codes().
  [[gnu::always_inline]] DecodedPair pair(const BlockIQ2_XS& block, const Codes& codes, int b,
                                          int pair) const {
    // vpmultishiftqb: byte j of qword k takes bits 16p + 2j .. 16p + 2j + 7 of the qword, i.e.
    // code j of group k + 8p in its low 2 bits; vpermb (low 6 bits, a table of period 4) maps it
    // to 8, 25 or 43.
    const __m512i code_shifts = _mm512_set1_epi64(0x0e0c0a0806040200 + 0x1010101010101010 * pair);
    // vpshufbitqmb: bit j of qword k's mask byte is bit j of its sign byte 4b + p.
    const __m512i sign_bits =
        _mm512_set1_epi64(0x0706050403020100 + 0x0808080808080808 * (4 * b + pair));
    uint64_t scale_bytes;
    std::memcpy(&scale_bytes, block.scales, sizeof scale_bytes);
    const __m512i scales = _mm512_srlv_epi16(
        _mm512_permutexvar_epi8(scale_bytes_index_[pair], _mm512_set1_epi64(int64_t(scale_bytes))),
        scale_shifts_);
    return {_mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(code_shifts, codes.codes[b]),
                                    magnitude_of_code_),
            _mm512_bitshuffle_epi64_mask(codes.sign_bytes, sign_bits),
            // (scales & 0x1e) | 1
            _mm512_ternarylogic_epi32(scales, _mm512_set1_epi16(0x1e), _mm512_set1_epi16(1), 0xea)};
  }

 private:
  __m512i low_[4][2];   // entries 128q + 64h .. 128q + 64h + 63 of the low plane in [q][h]
  __m512i high_[4][2];  // the same of the high plane
  __m512i pack_low_ = load_index(kDecodeIndices.pack_words[0]);
  __m512i pack_high_ = load_index(kDecodeIndices.pack_words[1]);
  __m512i codes_index_[2] = {load_index(kDecodeIndices.block_codes[0]),
                             load_index(kDecodeIndices.block_codes[1])};
  __m512i scale_bytes_index_[4];
  __m512i scale_shifts_ = load_index(kDecodeIndices.scale_shifts);
  // vpermb reads the low 6 bits of each byte; entry i is the magnitude of code i & 3.
  __m512i magnitude_of_code_ = _mm512_set1_epi32(0x002b1908);
};

// fn(codes, which, b) for every block b of a row, the codes decoded two blocks at a time
// (which = 0, 1 picks the block of the pair); an odd last block is decoded with itself as the
// (unused) second block: no read past the row.
template <class Fn>
[[gnu::always_inline]] inline void for_each_block_pair(const BlockDecoder& decoder, const BlockIQ2_XS* blocks,
                                                       int64_t n_blocks, Fn&& fn) {
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    const BlockDecoder::Codes codes = decoder.codes(blocks[b], blocks[b + 1]);
    fn(codes, 0, b);
    fn(codes, 1, b + 1);
  }
  if (b < n_blocks) fn(decoder.codes(blocks[b], blocks[b]), 0, b);
}

// sum + (64 weights of `pair`)·(the same 64 activations), in the i32 lanes of avx2::dot_iq2_xs
// (before its two 256-bit halves are added): maddubs(grid, ±a) gives exact i16 pair sums
// (≤ 2·43·127) and vpdpwssd multiplies them by the scale and accumulates.
[[gnu::always_inline]] inline __m512i accumulate_pair(const DecodedPair& pair, const int8_t* acts,
                                                      __m512i sum) {
  const __m512i x = _mm512_loadu_si512(acts);
  const __m512i signed_acts = _mm512_mask_sub_epi8(x, pair.negative, _mm512_setzero_si512(), x);
  return _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(pair.magnitudes, signed_acts), pair.scale);
}

// acc + d·(the block's integer lane sums): the f32 step of avx2::dot_iq2_xs. Every kernel below
// ends a block here and the integer sums are exact, so a (row, activation) pair gets the same
// bits whichever kernel computes it.
[[gnu::always_inline]] inline __m256 accumulate_block(float block_d, const BlockQ8_K& act,
                                                      __m512i sums, __m256 acc) {
  const float d = block_d * act.d * 0.125f;
  return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(add_halves(sums)), acc);
}

// One weight row against kRows activation rows (row t at acts + t·act_stride bytes); each weight
// block is decoded once. out[t·out_stride] = dot of the row with activation t.
template <int kRows>
void dot_rows(const BlockIQ2_XS* blocks, const std::byte* acts, size_t act_stride, int64_t n_blocks,
              float* out, size_t out_stride) {
  const BlockDecoder decoder;
  // One row: two integer sums (even and odd pairs) halve the chain of dependent vpdpwssd; with
  // several rows the rows' chains interleave instead. (Integer sums: the order is free.)
  constexpr int kSums = kRows == 1 ? 2 : 1;
  __m256 acc[kRows];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  // Block b of the pair decoded in `codes`: its integer sums, then the f32 step, row by row.
  const auto accumulate = [&](const BlockDecoder::Codes& codes, int b, int64_t block_index)
      __attribute__((always_inline)) {
    const BlockIQ2_XS& block = blocks[block_index];
    __m512i sums[kRows][kSums];
    for (auto& row_sums : sums) {
      for (__m512i& sum : row_sums) sum = _mm512_setzero_si512();
    }
    for (int p = 0; p < 4; ++p) {
      const DecodedPair pair = decoder.pair(block, codes, b, p);
      for (int t = 0; t < kRows; ++t) {
        const auto* act =
            reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride) + block_index;
        sums[t][p % kSums] = accumulate_pair(pair, act->qs + 64 * p, sums[t][p % kSums]);
      }
    }
    const float block_d = avx2::f16_scalar_to_f32(block.d);
    for (int t = 0; t < kRows; ++t) {
      const auto* act =
          reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride) + block_index;
      const __m512i row_sums =
          kSums == 1 ? sums[t][0] : _mm512_add_epi32(sums[t][0], sums[t][kSums - 1]);
      acc[t] = accumulate_block(block_d, *act, row_sums, acc[t]);
    }
  };
  for_each_block_pair(decoder, blocks, n_blocks, accumulate);
  for (int t = 0; t < kRows; ++t) {
    out[size_t(t) * out_stride] = canonical_nan(avx2::horizontal_sum(acc[t]));
  }
}

// ---- Windows of many activation rows: blocks decoded once per call into i16 -----------------
//
// dot_rows decodes each weight block again for every group of 8 activation rows, and its per-row
// work is 3 vector ops per 64 weights (negate the activations, maddubs, vpdpwssd) besides the
// decode share. For a window with enough activation rows, the weights are decoded once per call
// into signed i16 values already times their sub-block scale (|w·(2s+1)| <= 43·31 = 1333), and the
// activations are widened to i16 once per call; then a 32-weight step is one vpdpwssd per (weight
// row, activation row): 8 per block, nothing else but the f32 step.
//
// Lane order. vpdpwssd adds i16 pairs, so each 64-weight pair of sub-blocks is stored as two
// vectors: "low" holds bytes 4k, 4k+1 and "high" bytes 4k+2, 4k+3 (k = 0..15) as words 2k, 2k+1
// (weights and activations alike). i32 lane k of either product then belongs to the same 4-byte
// group k as lane k of accumulate_pair's sum, so the 16-lane block sum is the same exact integer
// vector and add_halves gives avx2::dot_iq2_xs's 8 lanes; the f32 step is accumulate_block's
// (d_w·d_a)·0.125 and one FMA per block. The sub-block scale of word 2k + j of either vector is
// word 2k + j of DecodedPair::scale (same sub-block and nibble as bytes 4k..4k+3).

// vpermb index: bytes 4k, 4k+1 to bytes 2k, 2k+1 (low 32), bytes 4k+2, 4k+3 to 32 + 2k, 2k+1.
struct WideIndex {
  alignas(64) uint8_t bytes[64];
};
constexpr WideIndex make_wide_index() {
  WideIndex index{};
  for (int k = 0; k < 16; ++k) {
    for (int j = 0; j < 2; ++j) {
      index.bytes[2 * k + j] = uint8_t(4 * k + j);
      index.bytes[32 + 2 * k + j] = uint8_t(4 * k + 2 + j);
    }
  }
  return index;
}
constexpr WideIndex kWideIndex = make_wide_index();

// i16 words per 256-weight block in the wide layout (8 vectors of 32).
constexpr int64_t kWideWordsPerBlock = 256;

// The 64 signed bytes at `bytes` as the low and high i16 vectors of the wide layout.
[[gnu::always_inline]] inline void widen_pair(__m512i bytes, __m512i index, __m512i& low,
                                              __m512i& high) {
  const __m512i grouped = _mm512_permutexvar_epi8(index, bytes);
  low = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(grouped));
  high = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(grouped, 1));
}

// Activation rows [0, n_rows) (Q8_K, row t at acts + t·act_stride) in the wide layout: row t's
// block b at words + (t·n_blocks + b)·256, its d at d[b·d_stride + t].
void widen_activations(const std::byte* acts, size_t act_stride, int64_t n_rows, int64_t n_blocks,
                       int16_t* words, float* d, int64_t d_stride) {
  const __m512i index = _mm512_load_si512(kWideIndex.bytes);
  for (int64_t t = 0; t < n_rows; ++t) {
    const auto* row = reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride);
    for (int64_t b = 0; b < n_blocks; ++b) {
      int16_t* out = words + (t * n_blocks + b) * kWideWordsPerBlock;
      for (int p = 0; p < 4; ++p) {
        __m512i low, high;
        widen_pair(_mm512_loadu_si512(row[b].qs + 64 * p), index, low, high);
        _mm512_store_si512(out + 64 * p, low);
        _mm512_store_si512(out + 64 * p + 32, high);
      }
      d[b * d_stride + t] = row[b].d;
    }
  }
}

// One weight row (n_blocks blocks) in the wide layout: block b's signed, scaled words at
// words + b·256 and its d at d[b·d_stride].
void widen_weights(const BlockDecoder& decoder, const BlockIQ2_XS* blocks, int64_t n_blocks,
                   int16_t* words, float* d, int64_t d_stride) {
  const __m512i index = _mm512_load_si512(kWideIndex.bytes);
  const auto widen_block = [&](const BlockDecoder::Codes& codes, int which, int64_t b)
      __attribute__((always_inline)) {
    const BlockIQ2_XS& block = blocks[b];
    int16_t* out = words + b * kWideWordsPerBlock;
    for (int p = 0; p < 4; ++p) {
      const DecodedPair pair = decoder.pair(block, codes, which, p);
      const __m512i signed_w = _mm512_mask_sub_epi8(pair.magnitudes, pair.negative,
                                                    _mm512_setzero_si512(), pair.magnitudes);
      __m512i low, high;
      widen_pair(signed_w, index, low, high);
      _mm512_store_si512(out + 64 * p, _mm512_mullo_epi16(low, pair.scale));
      _mm512_store_si512(out + 64 * p + 32, _mm512_mullo_epi16(high, pair.scale));
    }
    d[b * d_stride] = avx2::f16_scalar_to_f32(block.d);
  };
  for_each_block_pair(decoder, blocks, n_blocks, widen_block);
}

// The wide path's register tile: 4 weight rows × 4 activation rows (16 i32 sums; 8 activation
// and weight vectors loaded per 16 vpdpwssd). Measured against 2 × 8, 3 × 4, 2 × 4 and 1 × 16
// in bench_matmul_tile (1024 -> 512, 32 rows): 3.7 ns per block-row, the others 3.8–8.3.
constexpr int kWideW = 4;
constexpr int kWideA = 4;

// vpermps indices that spread the 16 block scales (lane 4r + t) to the f32 accumulator of weight
// row r and activation rows 2q, 2q + 1: [lane 4r + 2q ×8 | lane 4r + 2q + 1 ×8].
struct PackIndices {
  alignas(64) int32_t lanes[8][16];
};
constexpr PackIndices make_pack_indices() {
  PackIndices indices{};
  for (int r = 0; r < 4; ++r) {
    for (int q = 0; q < 2; ++q) {
      for (int i = 0; i < 16; ++i) indices.lanes[2 * r + q][i] = 4 * r + 2 * q + i / 8;
    }
  }
  return indices;
}
constexpr PackIndices kPackIndices = make_pack_indices();

// kW wide weight rows (row r at w_words + r·n_blocks·256, block b's d at w_d[b·kWideW + r]) ×
// kA wide activation rows (row t at a_words + t·n_blocks·256, d at a_d[b·a_d_stride + t]).
// out[r·out_w_stride + t·out_a_stride]. Activation rows 2q and 2q + 1 of a weight row share one
// f32 accumulator vector (2q in the low half); a last odd row fills both halves.
template <int kW, int kA>
[[gnu::always_inline]] inline void wide_tile(const int16_t* w_words, const float* w_d,
                                             const int16_t* a_words, const float* a_d,
                                             int64_t a_d_stride, int64_t n_blocks, float* out,
                                             size_t out_w_stride, size_t out_a_stride) {
  static_assert(kW <= 4 && kA <= 4, "the block scales of a tile are one 16-lane vector");
  constexpr int kPacks = (kA + 1) / 2;
  const int64_t row_words = n_blocks * kWideWordsPerBlock;
  __m512 acc[kW][kPacks];
  for (auto& row_acc : acc) {
    for (__m512& a : row_acc) a = _mm512_setzero_ps();
  }
  const __m512i weight_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512 eighth = _mm512_set1_ps(0.125f);
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m512i sums[kW][kA];
    for (auto& row_sums : sums) {
      for (__m512i& sum : row_sums) sum = _mm512_setzero_si512();
    }
    const int64_t block_word = b * kWideWordsPerBlock;
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      __m512i w[kW];
      for (int r = 0; r < kW; ++r)
        w[r] = _mm512_load_si512(w_words + r * row_words + block_word + 32 * v);
      for (int t = 0; t < kA; ++t) {
        const __m512i x = _mm512_load_si512(a_words + t * row_words + block_word + 32 * v);
        for (int r = 0; r < kW; ++r) sums[r][t] = _mm512_dpwssd_epi32(sums[r][t], x, w[r]);
      }
    }
    // Lane 4r + t: (d_w[r]·d_a[t])·0.125, accumulate_block's product (lanes past kW or kA
    // multiply padding and are never used).
    const __m512 d_w = _mm512_permutexvar_ps(
        weight_of_lane, _mm512_castps128_ps512(_mm_loadu_ps(w_d + b * kWideW)));
    const __m512 d_a = _mm512_broadcast_f32x4(_mm_loadu_ps(a_d + b * a_d_stride));
    const __m512 d = _mm512_mul_ps(_mm512_mul_ps(d_w, d_a), eighth);
    for (int r = 0; r < kW; ++r) {
      for (int q = 0; q < kPacks; ++q) {
        const __m512i s0 = sums[r][2 * q];
        const __m512i s1 = sums[r][std::min(2 * q + 1, kA - 1)];
        // [low half of s0 | high half of s1] + [high half of s0 | low half of s1]: add_halves
        // of both rows in one vector.
        const __m512i lanes = _mm512_add_epi32(_mm512_mask_blend_epi64(0xf0, s0, s1),
                                               _mm512_shuffle_i64x2(s0, s1, 0x4e));
        const __m512 pack_d =
            _mm512_permutexvar_ps(_mm512_load_si512(kPackIndices.lanes[2 * r + q]), d);
        acc[r][q] = _mm512_fmadd_ps(pack_d, _mm512_cvtepi32_ps(lanes), acc[r][q]);
      }
    }
  }
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < kA; ++t) {
      const __m512 v = acc[r][t / 2];
      const __m256 half = t % 2 == 0
                              ? _mm512_castps512_ps256(v)
                              : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
      out[size_t(r) * out_w_stride + size_t(t) * out_a_stride] =
          canonical_nan(avx2::horizontal_sum(half));
    }
  }
}

// The activation group (widened once per call) is at most kWideActWords words: 128 KiB, in L2;
// each weight panel streams it once. 64 rows of 1024 weights: a routed expert of mid-qwen4exp
// gets ~32 rows of a 512-row window, and with 32-row groups (64 KiB) every expert above that
// decoded its weight rows twice, the second time for a few rows.
constexpr int64_t kWideActWords = 65536;
// The longest row the wide path takes (the weight panel's buffer is sized for it).
constexpr int64_t kWideMaxN = 4096;
// Below this many activation rows per weight row the decode is not worth doing once per call
// (dot_rows decodes once per 8 rows anyway).
constexpr int64_t kWideMinActs = 8;

// Whether the wide path takes a call: enough activation rows, and rows no longer than
// kWideMaxN (at least 16 of them fit the activation buffer).
inline bool wide_path_fits(int64_t n_acts, int64_t n) {
  return n_acts >= kWideMinActs && n <= kWideMaxN;
}

void wide_tiles(const std::byte* weights, size_t w_stride, int64_t n_w, const std::byte* acts,
                size_t a_stride, int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                size_t out_a_stride) {
  const int64_t n_blocks = n / kBlockK;
  const int64_t group_rows = std::min<int64_t>(n_acts, kWideActWords / n);
  // d of the group's rows, block-major; 4 floats of padding so a tile's 4-lane load stays inside.
  const int64_t a_d_stride = group_rows;
  alignas(64) int16_t act_words[kWideActWords];
  float a_d[kWideActWords / kBlockK + 4] = {};
  alignas(64) int16_t w_words[kWideW * kWideMaxN];
  float w_d[kWideW * kWideMaxN / kBlockK] = {};
  const BlockDecoder decoder;
  for (int64_t a_first = 0; a_first < n_acts; a_first += group_rows) {
    const int64_t a_count = std::min(group_rows, n_acts - a_first);
    widen_activations(acts + size_t(a_first) * a_stride, a_stride, a_count, n_blocks, act_words,
                      a_d, a_d_stride);
    for (int64_t w_first = 0; w_first < n_w; w_first += kWideW) {
      const int64_t w_count = std::min<int64_t>(kWideW, n_w - w_first);
      for (int64_t r = 0; r < w_count; ++r) {
        widen_weights(
            decoder, reinterpret_cast<const BlockIQ2_XS*>(weights + size_t(w_first + r) * w_stride),
            n_blocks, w_words + r * n_blocks * kWideWordsPerBlock, w_d + r, kWideW);
      }
      for (int64_t t_first = 0; t_first < a_count; t_first += kWideA) {
        const int64_t t_count = std::min<int64_t>(kWideA, a_count - t_first);
        float* tile_out =
            out + size_t(w_first) * out_w_stride + size_t(a_first + t_first) * out_a_stride;
        tiles::with_count<kWideW>(w_count, [&](auto w_rows) {
          tiles::with_count<kWideA>(t_count, [&](auto a_rows) {
            wide_tile<decltype(w_rows)::value, decltype(a_rows)::value>(
                w_words, w_d, act_words + t_first * n_blocks * kWideWordsPerBlock, a_d + t_first,
                a_d_stride, n_blocks, tile_out, out_w_stride, out_a_stride);
          });
        });
      }
    }
  }
}

}  // namespace

float dot_iq2_xs(const void* w, const void* a, int64_t n) {
  float result = 0.0f;
  dot_rows<1>(static_cast<const BlockIQ2_XS*>(w), static_cast<const std::byte*>(a), 0, n / kBlockK,
              &result, 0);
  return result;
}

void dot_tile_iq2_xs(const void* w, size_t w_stride, int64_t n_w, const void* a, size_t a_stride,
                     int64_t n_acts, int64_t n, float* out, size_t out_w_stride,
                     size_t out_a_stride) {
  const auto* weights = static_cast<const std::byte*>(w);
  const auto* acts = static_cast<const std::byte*>(a);
  if (wide_path_fits(n_acts, n)) {
    wide_tiles(weights, w_stride, n_w, acts, a_stride, n_acts, n, out, out_w_stride, out_a_stride);
    return;
  }
  // One weight row per tile: the decoder's tables and the 8 rows' accumulators fill the registers.
  // The driver's order (activation groups outer) keeps a group of 8 activation rows in L1 while
  // the weight rows pass.
  tiles::for_each_tile<1, 8>(n_w, n_acts, [&](auto, auto a_rows, int64_t w_first, int64_t a_first) {
    dot_rows<decltype(a_rows)::value>(
        reinterpret_cast<const BlockIQ2_XS*>(weights + size_t(w_first) * w_stride),
        acts + size_t(a_first) * a_stride, a_stride, n / kBlockK,
        out + size_t(w_first) * out_w_stride + size_t(a_first) * out_a_stride, out_a_stride);
  });
}

void dot_many_iq2_xs(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                     float* out, size_t out_stride) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(w);
  const auto* acts = static_cast<const std::byte*>(a);
  const int64_t n_blocks = n / kBlockK;
  // Up to kMaxRows activations share one decode; more go in further passes over the row (it
  // stays in L1: a 4096-wide row is 1.2 KiB).
  constexpr int64_t kMaxRows = 8;
  in_row_passes<kMaxRows>(n_acts, [&](auto rows, int64_t first) {
    dot_rows<decltype(rows)::value>(blocks, acts + size_t(first) * act_stride, act_stride, n_blocks,
                                    out + size_t(first) * out_stride, out_stride);
  });
}

}  // namespace strata::quant::avx512
