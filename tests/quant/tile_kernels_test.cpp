// The multi-row (tile) dot kernels against the single-row kernels and the scalar reference.
//
// A tile kernel computes n_w weight rows × n_acts activation rows at once (quant/tiles.h); the
// promise compute::matmul's window identity rests on is that each output is bitwise the
// single-row kernel's dot of its pair (the existing decode path, so a row's logits do not depend
// on the window it is in). The scalar reference accumulates in double, so against it each output
// gets the SIMD error bound of kernels_test.cpp instead.
//
// Awkward sizes: odd and even block counts (Q8_0's kernels take blocks in pairs), every register
// tile shape and the partial tiles after it (n_w 1..7, n_acts 1..17), weight rows at odd 2-byte
// offsets and with padded strides, activation strides that are not multiples of 64, outputs in
// both layouts with gaps that must stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "more_types_util.h"
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace strata::quant {
namespace {

using testing::accumulation_chain;
using testing::gaussian;
using testing::kUnitRoundoff;
using testing::magnitude_sum;
using testing::make_activation;
using testing::random_row;
using testing::weight_magnitudes;

struct TileKernel {
  const char* level;
  GgmlType type;
  DotFn scalar_dot;
  DotFn single_dot;  // the level's one-row kernel: the bits every tile output must have
  DotTileFn tile;
  bool (*available)();
};

const TileKernel kTileKernels[] = {
    {"avx2", GgmlType::Q8_0, scalar::dot_q8_0, avx2::dot_q8_0, avx2::dot_tile_q8_0, cpu_has_avx2},
    {"avx2", GgmlType::Q4_0, scalar::dot_q4_0, avx2::dot_q4_0, avx2::dot_tile_q4_0, cpu_has_avx2},
    {"avx2", GgmlType::Q5_0, scalar::dot_q5_0, avx2::dot_q5_0, avx2::dot_tile_q5_0, cpu_has_avx2},
    {"avx2", GgmlType::IQ4_NL, scalar::dot_iq4_nl, avx2::dot_iq4_nl, avx2::dot_tile_iq4_nl,
     cpu_has_avx2},
    {"avx2", GgmlType::Q4_K, scalar::dot_q4_K, avx2::dot_q4_K, avx2::dot_tile_q4_K, cpu_has_avx2},
    {"avx2", GgmlType::Q5_K, scalar::dot_q5_K, avx2::dot_q5_K, avx2::dot_tile_q5_K, cpu_has_avx2},
    {"avx2", GgmlType::IQ2_XS, scalar::dot_iq2_xs, avx2::dot_iq2_xs, avx2::dot_tile_iq2_xs,
     cpu_has_avx2},
    {"avx512", GgmlType::Q8_0, scalar::dot_q8_0, avx2::dot_q8_0, avx512::dot_tile_q8_0,
     cpu_has_avx512},
    {"avx512", GgmlType::Q4_0, scalar::dot_q4_0, avx2::dot_q4_0, avx512::dot_tile_q4_0,
     cpu_has_avx512},
    {"avx512", GgmlType::Q5_0, scalar::dot_q5_0, avx2::dot_q5_0, avx512::dot_tile_q5_0,
     cpu_has_avx512},
    {"avx512", GgmlType::IQ4_NL, scalar::dot_iq4_nl, avx2::dot_iq4_nl, avx512::dot_tile_iq4_nl,
     cpu_has_avx512},
    {"avx512", GgmlType::Q4_K, scalar::dot_q4_K, avx2::dot_q4_K, avx512::dot_tile_q4_K,
     cpu_has_avx512},
    {"avx512", GgmlType::Q6_K, scalar::dot_q6_K, avx2::dot_q6_K, avx512::dot_tile_q6_K,
     cpu_has_avx512},
    {"avx512", GgmlType::IQ4_XS, scalar::dot_iq4_xs, avx2::dot_iq4_xs, avx512::dot_tile_iq4_xs,
     cpu_has_avx512},
    {"avx512", GgmlType::IQ2_XS, scalar::dot_iq2_xs, avx2::dot_iq2_xs, avx512::dot_tile_iq2_xs,
     cpu_has_avx512},
};

bool is_more_type(GgmlType type) {
  for (GgmlType more : testing::kMoreTypes) {
    if (more == type) return true;
  }
  return false;
}

// A random row with finite scales (the two test helpers cover different type lists).
std::vector<uint8_t> valid_row(GgmlType type, int64_t n, uint32_t seed) {
  return is_more_type(type) ? testing::random_more_row(type, n, seed) : random_row(type, n, seed);
}

std::vector<double> magnitudes_of(GgmlType type, const std::vector<uint8_t>& row, int64_t n) {
  return is_more_type(type) ? testing::more_weight_magnitudes(type, row, n)
                            : weight_magnitudes(type, row, n);
}

// Weight row 6 of the Q4_K runs: every nibble 15 (scales and mins stay random), the largest
// quants, so that against all-±127 activations every 4-product sum is at its bound.
void set_every_q4_K_quant_to_15(uint8_t* row, int64_t n) {
  auto* blocks = reinterpret_cast<BlockQ4_K*>(row);
  for (int64_t b = 0; b < n / kBlockK; ++b) std::memset(blocks[b].qs, 0xff, sizeof(blocks[b].qs));
}

std::vector<int64_t> lengths_for(GgmlType type) {
  // 4128 and 4160: the last length the AVX-512 blocks32 tiles prepare (64 block pairs and a tail)
  // and the first they read in place.
  if (type_traits(type).block_elems == 32) return {32, 64, 96, 160, 1024, 2592, 4128, 4160};
  // 4096: the longest row the IQ2_XS wide paths take (16 rows per activation group at AVX2);
  // 1536 and 1792: the last length the AVX-512 Q4_K tile stages in groups of 16 rows and the
  // first in groups of 12; 2048: the longest it stages (2304 and up read their quants in place).
  return {256, 512, 768, 1536, 1792, 2048, 2304, 2560, 4096, 4352};
}

std::string describe(const TileKernel& k) {
  return std::string(k.level) + " " + std::string(type_name(k.type));
}

void expect_tile_is_bitwise_the_single_dot(const TileKernel& k) {
  constexpr int64_t kMaxWeights = 7;
  // Every n_acts up to 17 (each register tile and partial tile; AVX-512 Q4_K's staged groups of
  // 16 rows (12 for rows of 7-8 blocks) with every odd and even partial group, 16 + 1 and
  // 12 + 1..5, and its 1 × 12 tiles in place; 7 and 8 around the AVX2 IQ2_XS wide path's
  // threshold), then counts around the IQ2_XS wide paths' activation groups
  // (AVX-512: 64 rows of 1024 weights, 25 of 2560; AVX2: 64 of 1024, 25 of 2560, 16 of 4096:
  // group boundaries inside the call, last groups of 1 or 2 rows) and their 4 × 4 and 4 × 2
  // tiles.
  constexpr int64_t kMaxActs = 66;
  std::vector<int64_t> act_counts;
  for (int64_t c = 1; c <= 17; ++c) act_counts.push_back(c);
  for (int64_t c : {25, 31, 32, 33, 38, 63, 64, 65, 66}) act_counts.push_back(c);
  for (int64_t n : lengths_for(k.type)) {
    const size_t row_size = row_bytes(k.type, n);
    const size_t act_bytes = activation_row_bytes(k.type, n);
    for (size_t weight_pad : {size_t(0), size_t(2), size_t(38)}) {
      const size_t w_stride = row_size + weight_pad;
      // Rows start 2 bytes into the buffer: every row sits at an odd multiple of 2 for some
      // strides, which the loads must not care about.
      std::vector<uint8_t> weights(2 + w_stride * kMaxWeights, 0xAB);
      for (int64_t r = 0; r < kMaxWeights; ++r) {
        const std::vector<uint8_t> row =
            valid_row(k.type, n, uint32_t(n * 131 + r * 7 + weight_pad));
        std::memcpy(weights.data() + 2 + size_t(r) * w_stride, row.data(), row_size);
      }
      if (k.type == GgmlType::Q4_K) {
        set_every_q4_K_quant_to_15(weights.data() + 2 + 6 * w_stride, n);
      }
      const uint8_t* w = weights.data() + 2;
      const size_t a_stride = act_bytes + (n % 512 == 0 ? 4 : 64 - act_bytes % 64);
      std::vector<uint8_t> acts(a_stride * kMaxActs);
      std::vector<testing::Activation> act_rows;
      for (int64_t t = 0; t < kMaxActs; ++t) {
        std::vector<float> x = gaussian(n, uint32_t(t * 101 + n), std::ldexp(1.0f, int(t % 5) - 2));
        if (t == 3) {  // exact ±127 quants: the largest products
          for (int64_t i = 0; i < n; ++i) x[size_t(i)] = (i * 5 % 3 == 0) ? -1.0f : 1.0f;
        }
        // All −127 and all +127: with the all-15 Q4_K row, the extreme 4-product sums ±7620 in
        // every lane (the bounds of the AVX-512 Q4_K tile's packed i16 words).
        if (t == 4 || t == 5) std::fill(x.begin(), x.end(), t == 4 ? -1.0f : 1.0f);
        act_rows.push_back(make_activation(k.type, x));
        std::memcpy(acts.data() + size_t(t) * a_stride, act_rows.back().bytes.data(), act_bytes);
      }
      // The single-row bits, and those against the reference once per pair.
      std::vector<float> single(size_t(kMaxWeights * kMaxActs));
      for (int64_t r = 0; r < kMaxWeights; ++r) {
        const uint8_t* row = w + size_t(r) * w_stride;
        const std::vector<uint8_t> row_copy(row, row + row_size);
        const std::vector<double> magnitudes = magnitudes_of(k.type, row_copy, n);
        for (int64_t t = 0; t < kMaxActs; ++t) {
          const float got = k.single_dot(row, acts.data() + size_t(t) * a_stride, n);
          single[size_t(r * kMaxActs + t)] = got;
          const double bound = double(accumulation_chain(k.type, n) + 16) * 2 * kUnitRoundoff *
                               magnitude_sum(magnitudes, act_rows[size_t(t)].values);
          const float expected = k.scalar_dot(row, act_rows[size_t(t)].bytes.data(), n);
          ASSERT_LE(std::fabs(double(expected) - double(got)), bound)
              << describe(k) << " n=" << n << " r=" << r << " t=" << t;
        }
      }
      for (bool weight_major : {false, true}) {
        for (int64_t n_w = 1; n_w <= kMaxWeights; ++n_w) {
          for (int64_t n_acts : act_counts) {
            // Outputs with a gap of one float between neighbours in both directions.
            const size_t out_w_stride = weight_major ? size_t(2 * n_acts + 1) : 2;
            const size_t out_a_stride = weight_major ? 2 : size_t(2 * n_w + 1);
            constexpr float kUntouched = -1234.5f;
            std::vector<float> out(size_t(n_w) * out_w_stride + size_t(n_acts) * out_a_stride,
                                   kUntouched);
            k.tile(w, w_stride, n_w, acts.data(), a_stride, n_acts, n, out.data(), out_w_stride,
                   out_a_stride);
            std::vector<bool> written(out.size(), false);
            for (int64_t r = 0; r < n_w; ++r) {
              for (int64_t t = 0; t < n_acts; ++t) {
                const size_t i = size_t(r) * out_w_stride + size_t(t) * out_a_stride;
                written[i] = true;
                ASSERT_EQ(f32_to_bits(out[i]), f32_to_bits(single[size_t(r * kMaxActs + t)]))
                    << describe(k) << " n=" << n << " weight_pad=" << weight_pad << " n_w=" << n_w
                    << " n_acts=" << n_acts << " r=" << r << " t=" << t << " got=" << out[i]
                    << " want=" << single[size_t(r * kMaxActs + t)];
              }
            }
            for (size_t i = 0; i < out.size(); ++i) {
              if (!written[i]) {
                ASSERT_EQ(out[i], kUntouched) << describe(k) << " wrote outside the tile at " << i;
              }
            }
          }
        }
      }
    }
  }
}

TEST(QuantTiles, EveryTileKernelIsBitwiseTheSingleRowDot) {
  int ran = 0;
  for (const TileKernel& k : kTileKernels) {
    if (!k.available()) continue;
    SCOPED_TRACE(describe(k));
    expect_tile_is_bitwise_the_single_dot(k);
    if (::testing::Test::HasFatalFailure()) return;
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "this CPU runs none of the tile kernels' levels";
}

// One AVX-512 grouped-rows case: `n`-weight rows of `type` (each from `make_row`) at three weight
// paddings, a window of activations (index 3 quantizes to ±127, index 4 is all zeros), and
// every weight-row count × activation-row count in both output layouts. Each output must be
// bitwise the AVX2 single-row dot of its pair, and the gap between two strided outputs untouched.
struct GroupedRowsCase {
  GgmlType type;
  DotFn single_dot;
  DotTileFn tile;
  int64_t n;
  std::vector<uint8_t> (*make_row)(GgmlType, int64_t, uint32_t);
  uint32_t row_seed;  // row r at padding p draws seed row_seed + 7r + p
  uint32_t act_seed;  // activation t draws seed act_seed + 101t
  std::vector<int64_t> weight_rows, act_rows;
};

void expect_grouped_rows_bitwise_the_single_dot(const GroupedRowsCase& c) {
  const int64_t max_weights = *std::max_element(c.weight_rows.begin(), c.weight_rows.end());
  const int64_t max_acts = *std::max_element(c.act_rows.begin(), c.act_rows.end());
  const size_t row_size = row_bytes(c.type, c.n);
  const size_t act_bytes = activation_row_bytes(c.type, c.n);
  for (size_t weight_pad : {size_t(0), size_t(2), size_t(38)}) {
    const size_t w_stride = row_size + weight_pad;
    std::vector<uint8_t> weights(2 + w_stride * size_t(max_weights), 0xAB);
    for (int64_t r = 0; r < max_weights; ++r) {
      const std::vector<uint8_t> row =
          c.make_row(c.type, c.n, c.row_seed + uint32_t(r * 7 + weight_pad));
      std::memcpy(weights.data() + 2 + size_t(r) * w_stride, row.data(), row_size);
    }
    const uint8_t* w = weights.data() + 2;
    const size_t a_stride = act_bytes + 6;
    std::vector<uint8_t> acts(a_stride * size_t(max_acts));
    for (int64_t t = 0; t < max_acts; ++t) {
      std::vector<float> x =
          gaussian(c.n, c.act_seed + uint32_t(t * 101), std::ldexp(1.0f, int(t % 5) - 2));
      if (t == 3) {
        for (int64_t i = 0; i < c.n; ++i) x[size_t(i)] = (i * 5 % 3 == 0) ? -1.0f : 1.0f;
      }
      if (t == 4) std::fill(x.begin(), x.end(), 0.0f);
      const testing::Activation act = make_activation(c.type, x);
      std::memcpy(acts.data() + size_t(t) * a_stride, act.bytes.data(), act_bytes);
    }
    for (int64_t n_w : c.weight_rows) {
      for (int64_t n_acts : c.act_rows) {
        for (bool contiguous : {true, false}) {
          const size_t out_w_stride = contiguous ? 1 : 3;
          const size_t out_a_stride = size_t(n_w) * out_w_stride + 1;
          std::vector<float> out(size_t(n_acts) * out_a_stride, -1234.5f);
          c.tile(w, w_stride, n_w, acts.data(), a_stride, n_acts, c.n, out.data(), out_w_stride,
                 out_a_stride);
          for (int64_t r = 0; r < n_w; ++r) {
            for (int64_t t = 0; t < n_acts; ++t) {
              const float want = canonical_nan(
                  c.single_dot(w + size_t(r) * w_stride, acts.data() + size_t(t) * a_stride, c.n));
              const float got = out[size_t(r) * out_w_stride + size_t(t) * out_a_stride];
              ASSERT_EQ(f32_to_bits(got), f32_to_bits(want))
                  << type_name(c.type) << " n=" << c.n << " weight_pad=" << weight_pad
                  << " n_w=" << n_w << " n_acts=" << n_acts << " r=" << r << " t=" << t
                  << " contiguous=" << contiguous;
            }
          }
          if (!contiguous) {
            EXPECT_EQ(out[1], -1234.5f);  // between two outputs: untouched
          }
        }
      }
    }
  }
}

// AVX-512 Q8_0 rows of one block (n = 32) go 16 weight rows at a time through a transposed path
// (outputs in the lanes); the rows after the last group of 16 through the ordinary tiles. Every
// output is bitwise avx2::dot_q8_0 of its pair: group counts 0-3 with remainders, both output
// layouts (contiguous weight rows, as compute::matmul writes them, and strided), padded weight
// strides, an activation of ±127 quants and one all-zero activation.
TEST(QuantTiles, Avx512Q8_0OneBlockRowsInGroupsOf16AreBitwiseTheSingleRowDot) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "no AVX-512";
  expect_grouped_rows_bitwise_the_single_dot({GgmlType::Q8_0,
                                              avx2::dot_q8_0,
                                              avx512::dot_tile_q8_0,
                                              32,
                                              random_row,
                                              0,
                                              5,
                                              {15, 16, 17, 31, 32, 33, 48, 50},
                                              {1, 2, 5, 17}});
}

// AVX-512 rows of a few blocks (an even count up to 8: 64-256 weights) go 16 weight rows at a
// time through a transposed path when the window has 16 activation rows or more; the rest through
// the ordinary tiles. Every output is bitwise the AVX2 single-row dot of its pair, for each
// 32-weight symmetric type: block counts taken (2, 4, 6, 8) and not (3, 9), windows below and
// above the threshold, group counts 0-3 with remainders, both output layouts, padded weight
// strides, an activation of ±127 quants and an all-zero one.
TEST(QuantTiles, Avx512Blocks32ShortRowsInGroupsOf16AreBitwiseTheSingleRowDot) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "no AVX-512";
  struct Kernel {
    GgmlType type;
    DotFn dot;
    DotTileFn tile;
  };
  const Kernel kernels[] = {{GgmlType::Q8_0, avx2::dot_q8_0, avx512::dot_tile_q8_0},
                            {GgmlType::Q4_0, avx2::dot_q4_0, avx512::dot_tile_q4_0},
                            {GgmlType::Q5_0, avx2::dot_q5_0, avx512::dot_tile_q5_0},
                            {GgmlType::IQ4_NL, avx2::dot_iq4_nl, avx512::dot_tile_iq4_nl}};
  for (const Kernel& k : kernels) {
    for (const int64_t n : {64, 96, 128, 192, 256, 288}) {
      expect_grouped_rows_bitwise_the_single_dot({k.type,
                                                  k.dot,
                                                  k.tile,
                                                  n,
                                                  valid_row,
                                                  uint32_t(n * 17),
                                                  uint32_t(n),
                                                  {15, 16, 17, 33, 50},
                                                  {1, 15, 16, 17, 40}});
    }
  }
}

// quant::dot_tile (the dispatched entry compute::matmul calls) is quant::dot per pair, bitwise,
// for every type with kernels at whatever level this process runs (ctest also runs it capped at
// scalar and avx2).
TEST(QuantDispatch, DotTileIsBitwiseOneDotPerPair) {
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* traits = type_traits_or_null(id);
    if (traits == nullptr || !traits->has_kernels) continue;
    const GgmlType type = traits->type;
    const int64_t n = traits->block_elems == 32 ? 2592 : 2560;
    const size_t w_stride = row_bytes(type, n) + 2;
    constexpr int64_t kRows = 5;
    // A whole AVX-512 Q4_K tile of 16 rows and a partial one of 5.
    constexpr int64_t kActs = 21;
    std::vector<uint8_t> weights(w_stride * kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      const std::vector<uint8_t> row = valid_row(type, n, id * 13 + uint32_t(r));
      std::memcpy(weights.data() + size_t(r) * w_stride, row.data(), row.size());
    }
    const size_t a_stride = (activation_row_bytes(type, n) + 63) / 64 * 64;
    std::vector<uint8_t> acts(a_stride * kActs);
    for (int64_t t = 0; t < kActs; ++t) {
      const testing::Activation act = make_activation(type, gaussian(n, uint32_t(t + 90)));
      std::memcpy(acts.data() + size_t(t) * a_stride, act.bytes.data(), act.bytes.size());
    }
    std::vector<float> out(size_t(kRows * kActs));
    dot_tile(type, weights.data(), w_stride, kRows, acts.data(), a_stride, kActs, n, out.data(), 1,
             kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t t = 0; t < kActs; ++t) {
        const float want =
            dot(type, weights.data() + size_t(r) * w_stride, acts.data() + size_t(t) * a_stride, n);
        ASSERT_EQ(f32_to_bits(out[size_t(t * kRows + r)]), f32_to_bits(want))
            << traits->name << " r=" << r << " t=" << t << " at level "
            << kernel_level_name(active_kernel_level());
      }
    }
  }
}

}  // namespace
}  // namespace strata::quant
