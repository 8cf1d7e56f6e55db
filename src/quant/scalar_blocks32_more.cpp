// Scalar kernels (the specification) of Q4_1, Q5_0, Q5_1 and IQ4_NL, 32 weights per block, written
// from the block definitions (shared/reference/gguf-and-quants.md §4, ggml-common.h), and their
// reference quantizers. Dots take Q8_0 activations (see kernels_more.h for Q4_1/Q5_1's min term).
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/kernels_more.h"
#include "util/fp16.h"

namespace strata::quant::scalar {
namespace {

// The 5-bit quant of element j (j < 32) of a Q5_0 / Q5_1 block: nibble as Q4_0, bit j of qh on top.
template <typename Block>
int q5_quant(const Block& block, int j) {
  uint32_t qh;
  std::memcpy(&qh, block.qh, 4);
  const int nibble = j < 16 ? (block.qs[j] & 15) : (block.qs[j - 16] >> 4);
  return nibble | int((qh >> j) & 1) << 4;
}

int q4_quant(const uint8_t qs[16], int j) {
  return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}

// Σ of the 32 activation quants of a Q8_0 block (the min term of Q4_1/Q5_1).
int activation_sum(const BlockQ8_0& act) {
  int sum = 0;
  for (int j = 0; j < 32; ++j) sum += act.qs[j];
  return sum;
}

// Clamps v to [0, hi] (NaN → 0) and truncates, as ggml's (int)(x + 0.5) after clamping.
uint8_t truncate_clamped(float v, int hi) {
  v = v > 0.0f ? v : 0.0f;
  v = v < float(hi) ? v : float(hi);
  return static_cast<uint8_t>(v);
}

// Packs 32 quants < 32 into Q5's nibbles and high-bit word.
void pack_q5(const uint8_t q[32], uint8_t qs[16], uint8_t qh_bytes[4]) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t((q[j] & 15) | ((q[j + 16] & 15) << 4));
  for (int j = 0; j < 32; ++j) qh |= uint32_t(q[j] >> 4) << j;
  std::memcpy(qh_bytes, &qh, 4);
}

// Min and max of one block, for the affine quantizers (Q4_1, Q5_1), as ggml's reference.
void min_max(const float* x, float* lo, float* hi) {
  *lo = x[0];
  *hi = x[0];
  for (int j = 1; j < 32; ++j) {
    *lo = x[j] < *lo ? x[j] : *lo;
    *hi = x[j] > *hi ? x[j] : *hi;
  }
}

// The signed value of largest magnitude (Q4_0/Q5_0's reference picks d from it).
float extreme_value(const float* x, int n) {
  float amax = 0.0f, extreme = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      extreme = x[j];
    }
  }
  return extreme;
}

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

// The block loops of the four types. Symmetric types (Q5_0, IQ4_NL) decode to d·value(block, j);
// affine types (Q4_1, Q5_1) to d·quant(block, j) + m, and their dot adds m·d_a·Σ a.
template <typename Block, typename Value>
void dequantize_symmetric32(const void* src, float* dst, int64_t n, Value value) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    for (int j = 0; j < 32; ++j) dst[32 * b + j] = d * float(value(blocks[b], j));
  }
}

template <typename Block, typename Quant>
void dequantize_affine32(const void* src, float* dst, int64_t n, Quant quant) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    const float m = f16_to_f32(blocks[b].m);
    for (int j = 0; j < 32; ++j) dst[32 * b + j] = d * float(quant(blocks[b], j)) + m;
  }
}

template <typename Block, typename Value>
float dot_symmetric32(const void* w, const void* a, int64_t n, Value value) {
  const auto* blocks = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += value(blocks[b], j) * acts[b].qs[j];
    sum += double(f16_to_f32(blocks[b].d)) * double(f16_to_f32(acts[b].d)) * isum;
  }
  return static_cast<float>(sum);
}

template <typename Block, typename Quant>
float dot_affine32(const void* w, const void* a, int64_t n, Quant quant) {
  const auto* blocks = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += quant(blocks[b], j) * acts[b].qs[j];
    const double da = f16_to_f32(acts[b].d);
    sum += double(f16_to_f32(blocks[b].d)) * da * isum +
           double(f16_to_f32(blocks[b].m)) * da * activation_sum(acts[b]);
  }
  return static_cast<float>(sum);
}

// The affine quantizers (Q4_1, Q5_1) as ggml's reference: d = (max − min)/max_q, m = min,
// q = min(max_q, trunc((x − min)/d + 0.5)); pack(q, block) stores the 32 quants.
template <typename Block, typename Pack>
void quantize_affine32(const float* src, void* dst, int64_t n, int max_q, Pack pack) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float* x = src + 32 * b;
    float lo, hi;
    min_max(x, &lo, &hi);
    const float d = (hi - lo) / float(max_q);
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    blocks[b].m = f32_to_f16(lo);
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) q[j] = truncate_clamped((x[j] - lo) * inverse + 0.5f, max_q);
    pack(q, blocks[b]);
  }
}

const auto q4_1_quant = [](const BlockQ4_1& block, int j) { return q4_quant(block.qs, j); };
const auto q5_1_quant = [](const BlockQ5_1& block, int j) { return q5_quant(block, j); };
const auto q5_0_value = [](const BlockQ5_0& block, int j) { return q5_quant(block, j) - 16; };
const auto iq4_nl_value = [](const BlockIQ4_NL& block, int j) {
  return int(kIq4nlValues[q4_quant(block.qs, j)]);
};

}  // namespace

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  dequantize_affine32<BlockQ4_1>(src, dst, n, q4_1_quant);
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  dequantize_symmetric32<BlockQ5_0>(src, dst, n, q5_0_value);
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  dequantize_affine32<BlockQ5_1>(src, dst, n, q5_1_quant);
}

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  dequantize_symmetric32<BlockIQ4_NL>(src, dst, n, iq4_nl_value);
}

float dot_q4_1(const void* w, const void* a, int64_t n) {
  return dot_affine32<BlockQ4_1>(w, a, n, q4_1_quant);
}

float dot_q5_0(const void* w, const void* a, int64_t n) {
  return dot_symmetric32<BlockQ5_0>(w, a, n, q5_0_value);
}

float dot_q5_1(const void* w, const void* a, int64_t n) {
  return dot_affine32<BlockQ5_1>(w, a, n, q5_1_quant);
}

float dot_iq4_nl(const void* w, const void* a, int64_t n) {
  return dot_symmetric32<BlockIQ4_NL>(w, a, n, iq4_nl_value);
}

void quantize_q4_1(const float* src, void* dst, int64_t n) {
  quantize_affine32<BlockQ4_1>(src, dst, n, 15, [](const uint8_t q[32], BlockQ4_1& block) {
    for (int j = 0; j < 16; ++j) block.qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
  });
}

// Q5_0 as ggml's reference: the signed extreme v maps to −16 (d = v/−16),
// q = min(31, trunc(x/d + 16.5)).
void quantize_q5_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_0*>(dst);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float* x = src + 32 * b;
    const float d = extreme_value(x, 32) / -16.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) q[j] = truncate_clamped(x[j] * inverse + 16.5f, 31);
    pack_q5(q, blocks[b].qs, blocks[b].qh);
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t n) {
  quantize_affine32<BlockQ5_1>(src, dst, n, 31, [](const uint8_t q[32], BlockQ5_1& block) {
    pack_q5(q, block.qs, block.qh);
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
