// Scalar dequantization and dot product of IQ2_XS (256 weights, 74 bytes): eight sub-blocks of
// 32 weights, each four groups of 8 weights; a group is one grid point times a sign pattern.
#include "quant/blocks.h"
#include "quant/iq2xs_tables.h"
#include "quant/kernels.h"
#include "util/error.h"
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

void quantize_iq2_xs(const float*, void*, int64_t) {
  fail("quantize iq2_xs: producing IQ2_XS needs an importance matrix (llama.cpp --imatrix), "
       "which strata does not implement; expected a type such as q2_K or q4_K");
}

}  // namespace strata::quant::scalar
