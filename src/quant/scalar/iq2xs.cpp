// Scalar dequantization and dot product of IQ2_XS (256 weights, 74 bytes): eight sub-blocks of
// 32 weights, each four groups of 8 weights; a group is one grid point times a sign pattern.
#include <algorithm>
#include <array>
#include <cmath>

#include "quant/blocks.h"
#include "quant/iq2xs_tables.h"
#include "quant/kernels.h"
#include "util/fp16.h"

namespace strata::quant::scalar {
namespace {

// Sub-block scale nibble of group g (0..3) of sub-block `sub`: low nibble for groups 0-1.
int iq2xs_scale_nibble(const BlockIQ2_XS& block, int sub, int group) {
  return group < 2 ? (block.scales[sub] & 15) : (block.scales[sub] >> 4);
}

}  // namespace

void dequantize_iq2_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(src);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    const float d = f16_to_f32(block.d);
    float* y = dst + b * kBlockK;
    for (int sub = 0; sub < 8; ++sub) {
      for (int group = 0; group < 4; ++group) {
        const float db = d * (0.5f + iq2xs_scale_nibble(block, sub, group)) * 0.25f;
        const uint16_t word = block.qs[4 * sub + group];
        const uint64_t grid = kIq2xsGrid[word & 511];
        const uint8_t signs = kIq2xsSigns[word >> 9];
        for (int j = 0; j < 8; ++j) {
          const auto magnitude = static_cast<uint8_t>(grid >> (8 * j));
          y[32 * sub + 8 * group + j] = db * magnitude * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
      }
    }
  }
}

float dot_iq2_xs(const void* w, const void* a, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    const BlockQ8_K& act = acts[b];
    // db = d·(0.5 + s)·0.25 = d·(2s + 1)/8: accumulate (2s + 1)·Σ grid·sign·a exactly.
    int64_t scaled = 0;
    for (int sub = 0; sub < 8; ++sub) {
      for (int group = 0; group < 4; ++group) {
        const uint16_t word = block.qs[4 * sub + group];
        const uint64_t grid = kIq2xsGrid[word & 511];
        const uint8_t signs = kIq2xsSigns[word >> 9];
        int isum = 0;
        for (int j = 0; j < 8; ++j) {
          const int magnitude = static_cast<uint8_t>(grid >> (8 * j));
          const int value = (signs >> j) & 1 ? -magnitude : magnitude;
          isum += value * act.qs[32 * sub + 8 * group + j];
        }
        scaled += int64_t(2 * iq2xs_scale_nibble(block, sub, group) + 1) * isum;
      }
    }
    sum += double(f16_to_f32(block.d)) * act.d * double(scaled) * 0.125;
  }
  return static_cast<float>(sum);
}

// IQ2_XS without an importance matrix (ggml requires one; this is the plain least-squares
// version, good enough for synthetic and test models, see the round-trip test for its error).
// Per group of 8: signs are taken from x; a group needs an even number of negatives, so when
// the count is odd the element of smallest magnitude gets the wrong sign (its target becomes
// −|x|, which the grid search then treats honestly). Per 16 weights (one scale nibble): a few
// candidate steps are tried, each with the best grid point per group, and the least-squares
// step of the best candidate is kept. The 16 steps are then quantized against one f16 d
// (step = d·(2s+1)/8) and the grid points are chosen again for the steps as decoded.
namespace {

struct GridPoint {
  float value[8];
  float norm;  // Σ value²
};

// The grid as floats, built once (thread-safe static initialisation), never modified.
const GridPoint* iq2xs_grid_points() {
  static const std::array<GridPoint, kIq2xsGridSize> points = [] {
    std::array<GridPoint, kIq2xsGridSize> table{};
    for (int i = 0; i < kIq2xsGridSize; ++i) {
      for (int j = 0; j < 8; ++j) {
        table[size_t(i)].value[j] = static_cast<float>(static_cast<uint8_t>(kIq2xsGrid[i] >> (8 * j)));
        table[size_t(i)].norm += table[size_t(i)].value[j] * table[size_t(i)].value[j];
      }
    }
    return table;
  }();
  return points.data();
}

// The grid point minimising Σ (step·g − target)² for one group; returns its index.
int nearest_grid_point(const float target[8], float step) {
  const GridPoint* points = iq2xs_grid_points();
  int best = 0;
  float best_score = 0.0f;
  for (int i = 0; i < kIq2xsGridSize; ++i) {
    float dot = 0.0f;
    for (int j = 0; j < 8; ++j) dot += points[i].value[j] * target[j];
    // Σ (s·g − t)² = s²·Σg² − 2s·Σg·t + Σt²; the last term is the same for every point.
    const float score = step * step * points[i].norm - 2.0f * step * dot;
    if (i == 0 || score < best_score) {
      best_score = score;
      best = i;
    }
  }
  return best;
}

// Targets (signed so that the sign pattern has even parity) and the 7-bit sign index of a group.
int group_targets(const float* x, float target[8]) {
  int signs = 0;
  int smallest = 0;
  for (int j = 0; j < 8; ++j) {
    target[j] = std::fabs(x[j]);
    if (x[j] < 0.0f) signs |= 1 << j;
    if (std::fabs(x[j]) < std::fabs(x[smallest])) smallest = j;
  }
  if (__builtin_popcount(static_cast<unsigned>(signs)) % 2 != 0) {
    signs ^= 1 << smallest;
    target[smallest] = -target[smallest];
  }
  return signs & 127;  // bit 7 is the parity of bits 0-6 by construction
}

// Best step for 16 weights (two groups): tries steps max|t| / level for levels around the
// largest grid value, each with the best grid points, then refits the step by least squares.
float fit_step(const float target[16]) {
  float max_target = 0.0f;
  for (int j = 0; j < 16; ++j) max_target = std::max(max_target, target[j]);
  if (max_target <= 0.0f) return 0.0f;
  const GridPoint* points = iq2xs_grid_points();
  float best_step = max_target / 43.0f;
  float best_error = -1.0f;
  for (float level = 20.0f; level <= 52.0f; level += 2.0f) {
    const float step = max_target / level;
    float sum_gt = 0.0f, sum_gg = 0.0f;
    for (int group = 0; group < 2; ++group) {
      const GridPoint& p = points[nearest_grid_point(target + 8 * group, step)];
      for (int j = 0; j < 8; ++j) sum_gt += p.value[j] * target[8 * group + j];
      sum_gg += p.norm;
    }
    const float refit = sum_gt > 0.0f ? sum_gt / sum_gg : step;
    // Error of the refit step up to the constant Σt²: −(Σgt)²/Σgg.
    const float error = -(sum_gt * sum_gt) / sum_gg;
    if (best_error < 0.0f || error < best_error) {
      best_error = error;
      best_step = refit;
    }
  }
  return best_step;
}

}  // namespace

void quantize_iq2_xs(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ2_XS*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + b * kBlockK;
    BlockIQ2_XS& block = blocks[b];
    float targets[kBlockK];
    int sign_index[32];
    for (int group = 0; group < 32; ++group) sign_index[group] = group_targets(x + 8 * group, targets + 8 * group);
    float steps[16];
    float max_step = 0.0f;
    for (int half = 0; half < 16; ++half) {
      steps[half] = fit_step(targets + 16 * half);
      max_step = std::max(max_step, steps[half]);
    }
    // step = d·(2s + 1)/8 with s ≤ 15: the largest step uses s = 15.
    block.d = f32_to_f16(max_step * 8.0f / 31.0f);
    const float d = f16_to_f32(block.d);
    int nibbles[16];
    for (int half = 0; half < 16; ++half) {
      const float level = d > 0.0f ? (steps[half] * 8.0f / d - 1.0f) * 0.5f : 0.0f;
      nibbles[half] = std::clamp(static_cast<int>(std::lround(level)), 0, 15);
    }
    for (int sub = 0; sub < 8; ++sub) {
      block.scales[sub] = static_cast<uint8_t>(nibbles[2 * sub] | (nibbles[2 * sub + 1] << 4));
    }
    for (int group = 0; group < 32; ++group) {
      const float step = d * (0.5f + nibbles[group / 2]) * 0.25f;  // exactly what the decoder uses
      const int grid = nearest_grid_point(targets + 8 * group, step);
      block.qs[group] = static_cast<uint16_t>(grid | (sign_index[group] << 9));
    }
  }
}

}  // namespace strata::quant::scalar
