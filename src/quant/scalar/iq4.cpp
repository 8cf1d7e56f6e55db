// Scalar kernels (the specification) of the non-linear 4-bit types IQ4_NL (32-weight blocks, Q8_0
// activations) and IQ4_XS (256-weight blocks of eight IQ4_NL-placed sub-blocks with 6-bit scales,
// Q8_K activations), written from the block definitions (ggml-common.h; element placement as in
// dequantize_row_iq4_nl/iq4_xs of ggml-quants.c), and their reference quantizers. Both decode
// through the kIq4nlValues codebook.
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/scalar/blocks32_loops.h"
#include "quant/scalar/kquant_scales.h"
#include "util/fp16.h"

namespace strata::quant::scalar {
namespace {

// Index of the codebook value nearest to v (the codebook is sorted; ties go to the lower one),
// by scanning the errors |v − K[k]| in float: the definition.
int nearest_iq4nl_index_scan(float v) {
  int best = 0;
  float best_error = std::fabs(v - float(kIq4nlValues[0]));
  for (int k = 1; k < 16; ++k) {
    const float error = std::fabs(v - float(kIq4nlValues[k]));
    if (error < best_error) {
      best_error = error;
      best = k;
    }
  }
  return best;
}

// The index as the number of codebook midpoints m_k = (K[k] + K[k+1])/2 strictly below v, read
// from tables over f = ⌊2v⌋ (the doubled midpoints are integers): #{k : 2m_k ≤ f}, less one when
// 2v is itself a doubled midpoint (then v = m_k is not above it). Equal to the scan for
// |v| < 2^20: there the float errors of two neighbours a < b near their midpoint m are exact (v
// lies in m's binade or a coarser one, and the errors are ≤ 12 with ulp ≤ ulp(v)), so the scan's
// strict comparison picks b exactly when v > m; away from m, rounding cannot reorder errors that
// differ by more than an ulp. Beyond (huge or non-finite v) float rounding can tie neighbours, and
// the scan decides. This is the quantizer's hot spot: 16·32 calls per block.
constexpr int kMidpointTableHalf = 240;  // |2m_k| ≤ 231
struct Iq4nlMidpointTables {
  uint8_t at_or_below[2 * kMidpointTableHalf + 1] = {};  // #{k : 2m_k ≤ f}
  uint8_t is_midpoint[2 * kMidpointTableHalf + 1] = {};  // f = 2m_k for some k
};
constexpr Iq4nlMidpointTables make_iq4nl_midpoint_tables() {
  Iq4nlMidpointTables tables;
  for (int f = -kMidpointTableHalf; f <= kMidpointTableHalf; ++f) {
    for (int k = 0; k < 15; ++k) {
      const int doubled = kIq4nlValues[k] + kIq4nlValues[k + 1];
      if (doubled <= f) ++tables.at_or_below[f + kMidpointTableHalf];
      if (doubled == f) tables.is_midpoint[f + kMidpointTableHalf] = 1;
    }
  }
  return tables;
}
constexpr Iq4nlMidpointTables kIq4nlMidpointTables = make_iq4nl_midpoint_tables();

int nearest_iq4nl_index(float v) {
  if (!(std::fabs(v) < 1048576.0f)) return nearest_iq4nl_index_scan(v);
  const float doubled = 2.0f * v;  // exact
  int f = static_cast<int>(doubled);
  f -= float(f) > doubled ? 1 : 0;  // ⌊2v⌋
  const bool on_integer = float(f) == doubled;
  f = f < -kMidpointTableHalf ? -kMidpointTableHalf
                              : (f > kMidpointTableHalf ? kMidpointTableHalf : f);
  const int i = f + kMidpointTableHalf;
  return kIq4nlMidpointTables.at_or_below[i] -
         (on_integer ? kIq4nlMidpointTables.is_midpoint[i] : 0);
}

// Fits x[0..n) ≈ s·K[idx] (K the IQ4_NL codebook), minimising Σ x²·err² (ggml's weighting when
// there is no importance matrix). As ggml's reference: the extreme value maps to K[0] + t for
// t = −7..7 candidate stretches; for each, indices are the nearest codebook entries and s the
// weighted least-squares scale; the candidate with the largest gain (Σwqx)²/Σwqq wins. Returns s.
float fit_iq4(const float* x, int n) {
  const float extreme = extreme_value(x, n);
  if (extreme == 0.0f) return 0.0f;
  // All candidates advance together over j (each one's sums still accumulate in j order, so the
  // bits are those of one candidate at a time): independent chains instead of one long one.
  constexpr int kCandidates = 15;  // t = −7..7
  float inverse[kCandidates];
  double sum_qx[kCandidates] = {}, sum_qq[kCandidates] = {};
  for (int c = 0; c < kCandidates; ++c)
    inverse[c] = (float(kIq4nlValues[0]) + float(c - 7)) / extreme;
  for (int j = 0; j < n; ++j) {
    const double weight = double(x[j]) * x[j];
    for (int c = 0; c < kCandidates; ++c) {
      const double q = kIq4nlValues[nearest_iq4nl_index(inverse[c] * x[j])];
      sum_qx[c] += weight * q * x[j];
      sum_qq[c] += weight * q * q;
    }
  }
  float best_scale = extreme / float(kIq4nlValues[0]);
  double best_gain = -1.0;
  for (int c = 0; c < kCandidates; ++c) {
    if (sum_qq[c] > 0.0 && sum_qx[c] * sum_qx[c] / sum_qq[c] > best_gain) {
      best_gain = sum_qx[c] * sum_qx[c] / sum_qq[c];
      best_scale = float(sum_qx[c] / sum_qq[c]);
    }
  }
  return best_scale;
}

// Encodes x[0..32) with the decoded scale `step` as IQ4_NL nibbles (nearest codebook entry).
void encode_iq4(const float* x, float step, uint8_t qs[16]) {
  const float inverse = step != 0.0f ? 1.0f / step : 0.0f;
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(nearest_iq4nl_index(inverse * x[j]));
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
}

const auto iq4_nl_value = [](const BlockIQ4_NL& block, int j) {
  return int(kIq4nlValues[q4_quant(block.qs, j)]);
};

// Nibble j (j < 32) of IQ4_XS sub-block ib: placed as IQ4_NL's within 16 bytes.
int iq4_xs_index(const BlockIQ4_XS& block, int ib, int j) {
  const uint8_t byte = block.qs[16 * ib + (j % 16)];
  return j < 16 ? (byte & 15) : (byte >> 4);
}

}  // namespace

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  dequantize_symmetric32<BlockIQ4_NL>(src, dst, n, iq4_nl_value);
}

float dot_iq4_nl(const void* w, const void* a, int64_t n) {
  return dot_symmetric32<BlockIQ4_NL>(w, a, n, iq4_nl_value);
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  dequantize_k_blocks<BlockIQ4_XS>(src, dst, n, [](const BlockIQ4_XS& block, float* y) {
    const float d = f16_to_f32(block.d);
    for (int ib = 0; ib < 8; ++ib) {
      const float dl = d * float(iq4_xs_scale(block, ib) - 32);
      for (int j = 0; j < 32; ++j) {
        y[32 * ib + j] = dl * float(kIq4nlValues[iq4_xs_index(block, ib, j)]);
      }
    }
  });
}

float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  return dot_k_blocks<BlockIQ4_XS>(w, a, n, [](const BlockIQ4_XS& block, const BlockQ8_K& act) {
    int64_t scaled = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int isum = 0;
      for (int j = 0; j < 32; ++j) {
        isum += kIq4nlValues[iq4_xs_index(block, ib, j)] * act.qs[32 * ib + j];
      }
      scaled += int64_t(iq4_xs_scale(block, ib) - 32) * isum;
    }
    return double(f16_to_f32(block.d)) * act.d * double(scaled);
  });
}

// IQ4_NL: scale from fit_iq4, then indices re-picked against the f16-rounded scale the decoder
// will use. Inputs must be finite.
void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float* x = src + 32 * b;
    blocks[b].d = f32_to_f16(fit_iq4(x, 32));
    encode_iq4(x, f16_to_f32(blocks[b].d), blocks[b].qs);
  }
}

// IQ4_XS: each 32-weight sub-block gets its scale from fit_iq4; the scale of largest magnitude
// maps to −32 (d = s/−32, as ggml's reference), the others to round(s/d) in [−32, 31] (stored
// +32), and indices are re-picked against each decoded sub-block scale d·(ls − 32).
void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + kBlockK * b;
    BlockIQ4_XS& block = blocks[b];
    float scales[8];
    float extreme = 0.0f;
    for (int ib = 0; ib < 8; ++ib) {
      scales[ib] = fit_iq4(x + 32 * ib, 32);
      if (std::fabs(scales[ib]) > std::fabs(extreme)) extreme = scales[ib];
    }
    block.d = f32_to_f16(extreme / -32.0f);
    const float d = f16_to_f32(block.d);
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    block.scales_h = 0;
    std::memset(block.scales_l, 0, sizeof(block.scales_l));
    for (int ib = 0; ib < 8; ++ib) {
      float v = inverse * scales[ib];
      v = v > -32.0f ? v : -32.0f;
      v = v < 31.0f ? v : 31.0f;
      const int ls = static_cast<int>(round_half_even(v)) + 32;
      block.scales_l[ib / 2] = uint8_t(block.scales_l[ib / 2] | ((ls & 15) << (4 * (ib % 2))));
      block.scales_h = uint16_t(block.scales_h | ((ls >> 4) << (2 * ib)));
      encode_iq4(x + 32 * ib, d * float(ls - 32), block.qs + 16 * ib);
    }
  }
}

}  // namespace strata::quant::scalar
