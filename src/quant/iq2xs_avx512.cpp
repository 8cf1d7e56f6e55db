// AVX-512 (F/BW/VL + VBMI, VNNI, BITALG) dot kernels for IQ2_XS weights with Q8_K activations:
// one weight row against one activation row (dot_iq2_xs) or against up to 8 at once
// (dot_many_iq2_xs, which decodes each weight block once).
//
// The AVX2 kernel spends most of its time on 32 scalar grid loads per block and on assembling
// them into vectors. Here nothing leaves the vector registers:
// - Grid: every grid byte is 8, 25 or 43, so a grid point is eight 2-bit codes, a u16. The 512
//   codes (1 KiB) sit in 16 registers as two byte planes; 8 vpermi2b look up a block's 32 codes
//   from the index bits 0-6, and mask blends on bits 7 and 8 pick the quarter: no memory access.
// - Per 8 groups (64 weights) one vpermi2b puts group g's code and sign byte in qword g;
//   vpmultishiftqb cuts the code into bytes and vpermb maps them to 8/25/43; vpshufbitqmb turns
//   the sign byte into 64 mask bits, and a masked subtract negates those activations.
// - maddubs(grid, ±a) gives exact i16 pair sums (≤ 2·43·127) and vpdpwssd multiplies by the
//   integer sub-block scale 2s+1 and accumulates in i32.
// ~106 instructions per block for one activation (vector-throughput-bound, ~7 ns on Zen 5), ~24
// more per extra activation in dot_many (docs/bench-matvec.md).
//
// Bitwise equal to avx2::dot_iq2_xs: the integer sums are exact, the two 256-bit halves of the
// 16-lane sum add up to the AVX2 kernel's 8 lanes (bytes 4k..4k+3 of each 32-weight sub-block),
// and the f32 part is the same code. Both entry points run the same per-pair and per-block code,
// so dot_many's outputs are bitwise those of dot_iq2_xs.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>

#include "quant/avx2_common.h"
#include "quant/avx512_common.h"
#include "quant/blocks.h"
#include "quant/iq2xs_tables.h"
#include "quant/kernels.h"

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

// vpermi2b indices that put, in qword g, the code of group 8·pair + g (bytes 0-1, from the code
// vector) and its sign byte (byte 2, from the second table: index bit 6).
inline __m512i group_gather_index(int pair) {
  alignas(64) uint8_t index[64] = {};
  for (int g = 0; g < 8; ++g) {
    const int word = 8 * pair + g;
    index[8 * g] = uint8_t(2 * word);
    index[8 * g + 1] = uint8_t(2 * word + 1);
    index[8 * g + 2] = uint8_t(64 + 2 * word);
  }
  return _mm512_load_si512(index);
}

// The 32 grid codes of one block (as 32 u16 lanes) from its 32 words (low 9 bits = grid index).
struct GridCodeTable {
  // Entries 128q + 64h .. 128q + 64h + 63 of each plane in [q][h].
  __m512i low[4][2];
  __m512i high[4][2];

  explicit GridCodeTable(const GridCodePlanes& planes) {
    for (int q = 0; q < 4; ++q) {
      for (int h = 0; h < 2; ++h) {
        low[q][h] = _mm512_load_si512(planes.low + 128 * q + 64 * h);
        high[q][h] = _mm512_load_si512(planes.high + 128 * q + 64 * h);
      }
    }
  }

  __m512i lookup(__m512i words) const {
    // vpermi2b reads the low 7 bits of each byte: the index's bits 0-6 sit in byte 2g of word g
    // (for the low plane) and, after a shift, in byte 2g+1 (for the high plane). Bits 7 and 8
    // pick one of the four 128-entry quarters.
    const __m512i shifted = _mm512_slli_epi16(words, 8);
    const __mmask64 high_bytes = 0xaaaaaaaaaaaaaaaaull;
    __m512i quarter[4];
    for (int q = 0; q < 4; ++q) {
      const __m512i low_code = _mm512_permutex2var_epi8(low[q][0], words, low[q][1]);
      const __m512i high_code = _mm512_permutex2var_epi8(high[q][0], shifted, high[q][1]);
      quarter[q] = _mm512_mask_blend_epi8(high_bytes, low_code, high_code);
    }
    const __mmask32 bit7 = _mm512_test_epi16_mask(words, _mm512_set1_epi16(1 << 7));
    const __mmask32 bit8 = _mm512_test_epi16_mask(words, _mm512_set1_epi16(1 << 8));
    const __m512i q01 = _mm512_mask_blend_epi16(bit7, quarter[0], quarter[1]);
    const __m512i q23 = _mm512_mask_blend_epi16(bit7, quarter[2], quarter[3]);
    return _mm512_mask_blend_epi16(bit8, q01, q23);
  }
};

// 64 weights (pair p = sub-blocks 2p, 2p+1) of one IQ2_XS block, decoded for any number of
// activation rows: the grid magnitudes, the activations to negate and the integer scales 2s+1.
struct DecodedPair {
  __m512i magnitudes;
  __mmask64 negative;
  __m512i scale;
};

// Everything a block decode needs in registers: the grid codes, the group gather indices and the
// constants. Built once per kernel call.
class BlockDecoder {
 public:
  BlockDecoder()
      : grid_(iq2xs_grid_code_planes()),
        gather_index_{group_gather_index(0), group_gather_index(1), group_gather_index(2),
                      group_gather_index(3)} {}

  // The block's 32 grid codes (u16 lanes) and sign bytes (low byte of each u16 lane).
  struct Codes {
    __m512i codes;
    __m512i sign_bytes;
  };

  [[gnu::always_inline]] Codes codes(const BlockIQ2_XS& block) const {
    const __m512i words = _mm512_loadu_si512(block.qs);
    // Sign byte: the 7 stored bits and their parity in bit 7 (an even count of negatives).
    const __m512i sign_index = _mm512_srli_epi16(words, 9);
    const __m512i parity = _mm512_slli_epi16(_mm512_popcnt_epi16(sign_index), 7);
    // sign_index | (parity & 0x80)
    return {grid_.lookup(words),
            _mm512_ternarylogic_epi32(sign_index, parity, _mm512_set1_epi16(0x80), 0xf8)};
  }

  [[gnu::always_inline]] DecodedPair pair(const BlockIQ2_XS& block, const Codes& codes,
                                          int pair) const {
    const __m512i groups =
        _mm512_permutex2var_epi8(codes.codes, gather_index_[pair], codes.sign_bytes);
    return {_mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(code_shifts_, groups),
                                    magnitude_of_code_),
            _mm512_bitshuffle_epi64_mask(groups, sign_bits_),
            _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_load_si256(
                    reinterpret_cast<const __m256i*>(iq2xs_scale_vector(block.scales[2 * pair])))),
                _mm256_load_si256(reinterpret_cast<const __m256i*>(
                    iq2xs_scale_vector(block.scales[2 * pair + 1]))),
                1)};
  }

 private:
  GridCodeTable grid_;
  __m512i gather_index_[4];
  // vpmultishiftqb: byte j of each qword takes bits 2j .. 2j+7 (code j in its low 2 bits).
  __m512i code_shifts_ = _mm512_set1_epi64(0x0e0c0a0806040200);
  // vpermb reads the low 6 bits of each byte; entry i is the magnitude of code i & 3.
  __m512i magnitude_of_code_ = _mm512_set1_epi32(0x002b1908);
  // vpshufbitqmb: bit j of a qword's mask byte is bit 16 + j of the qword (the sign byte).
  __m512i sign_bits_ = _mm512_set1_epi64(0x1716151413121110);
};

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
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    const BlockDecoder::Codes codes = decoder.codes(block);
    __m512i sums[kRows][kSums];
    for (auto& row_sums : sums) {
      for (__m512i& sum : row_sums) sum = _mm512_setzero_si512();
    }
    for (int p = 0; p < 4; ++p) {
      const DecodedPair pair = decoder.pair(block, codes, p);
      for (int t = 0; t < kRows; ++t) {
        const auto* act = reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride) + b;
        sums[t][p % kSums] = accumulate_pair(pair, act->qs + 64 * p, sums[t][p % kSums]);
      }
    }
    const float block_d = avx2::f16_scalar_to_f32(block.d);
    for (int t = 0; t < kRows; ++t) {
      const auto* act = reinterpret_cast<const BlockQ8_K*>(acts + size_t(t) * act_stride) + b;
      const __m512i row_sums =
          kSums == 1 ? sums[t][0] : _mm512_add_epi32(sums[t][0], sums[t][kSums - 1]);
      acc[t] = accumulate_block(block_d, *act, row_sums, acc[t]);
    }
  }
  for (int t = 0; t < kRows; ++t) out[size_t(t) * out_stride] = avx2::horizontal_sum(acc[t]);
}

}  // namespace

float dot_iq2_xs(const void* w, const void* a, int64_t n) {
  float result = 0.0f;
  dot_rows<1>(static_cast<const BlockIQ2_XS*>(w), static_cast<const std::byte*>(a), 0, n / kBlockK,
              &result, 0);
  return result;
}

void dot_many_iq2_xs(const void* w, const void* a, size_t act_stride, int64_t n_acts, int64_t n,
                     float* out, size_t out_stride) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(w);
  const auto* acts = static_cast<const std::byte*>(a);
  const int64_t n_blocks = n / kBlockK;
  // Up to kMaxRows activations share one decode; more go in further passes over the row (it
  // stays in L1: a 4096-wide row is 1.2 KiB).
  constexpr int64_t kMaxRows = 8;
  for (int64_t t = 0; t < n_acts; t += kMaxRows) {
    const std::byte* chunk = acts + size_t(t) * act_stride;
    float* chunk_out = out + size_t(t) * out_stride;
    switch (std::min(kMaxRows, n_acts - t)) {
      case 1:
        dot_rows<1>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
      case 2:
        dot_rows<2>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
      case 3:
        dot_rows<3>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
      case 4:
        dot_rows<4>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
      case 5:
        dot_rows<5>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
      case 6:
        dot_rows<6>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
      case 7:
        dot_rows<7>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
      default:
        dot_rows<8>(blocks, chunk, act_stride, n_blocks, chunk_out, out_stride);
        break;
    }
  }
}

}  // namespace strata::quant::avx512
