// Reference quantizers of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K). The byte formats are ggml's;
// the search is re-derived here:
// - Each sub-block gets its own (scale, offset) or scale by a weighted least-squares fit: for a
//   grid of candidate step sizes the values are rounded, then the best (scale, offset) for those
//   integer levels is solved in closed form; the candidate with the smallest weighted squared
//   error wins (ggml's make_qkx / make_qx idea).
// - The sub-block scales are then themselves quantized against one f16 super-scale (6 bits for
//   Q4_K, 4 bits for Q2_K, int8 for Q6_K), and the weights are re-rounded with the scales as
//   they will be decoded, so dequantization sees exactly the levels the quantizer chose.
// Inputs must be finite; the functions are pure and allocation-free.
#include <algorithm>
#include <cmath>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "util/fp16.h"

namespace strata::quant::scalar {
namespace {

// Clamps to [lo, hi] (NaN maps to lo) and rounds to nearest, ties to even.
int round_clamped(float v, int lo, int hi) {
  v = v > float(lo) ? v : float(lo);
  v = v < float(hi) ? v : float(hi);
  return static_cast<int>(round_half_even(v));
}

struct AffineFit {
  float scale;   // x ≈ scale·q − offset
  float offset;  // ≥ 0: K-quant mins are unsigned and subtracted
};

// Fits x[0..n) ≈ scale·q − offset with integer q in [0, q_max], minimising Σ w·err².
// Candidate inverse steps are (q_max + first_shift + shift_step·i) / (max − min), i = 0..n_steps.
AffineFit fit_affine(const float* x, const float* weight, int n, int q_max, float first_shift,
                     float shift_step, int n_steps, uint8_t* q_out) {
  float lo = x[0];
  float hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);  // the offset can only move the range down
  if (hi == lo) {
    std::fill(q_out, q_out + n, uint8_t{0});
    return {0.0f, -lo};
  }
  // Start from the plain min/max mapping.
  AffineFit best{(hi - lo) / float(q_max), -lo};
  double best_error = 0.0;
  {
    const float inverse = float(q_max) / (hi - lo);
    for (int i = 0; i < n; ++i) {
      q_out[i] = static_cast<uint8_t>(round_clamped(inverse * (x[i] - lo), 0, q_max));
      const double diff = double(best.scale) * q_out[i] + lo - x[i];
      best_error += weight[i] * diff * diff;
    }
  }
  double sum_wxx = 0.0;
  for (int i = 0; i < n; ++i) sum_wxx += double(weight[i]) * x[i] * x[i];
  // Σw and Σwx do not depend on the candidate; the other sums are gathered for a batch of
  // candidates in one pass over i (each candidate's sums still accumulate in i order, so the
  // bits are those of one candidate at a time, but the batch's chains run side by side).
  double sum_w = 0, sum_wx = 0;
  for (int i = 0; i < n; ++i) {
    sum_w += weight[i];
    sum_wx += double(weight[i]) * x[i];
  }
  constexpr int kBatch = 24;
  int best_step = -1;
  float best_inverse = 0.0f;
  for (int first = 0; first <= n_steps; first += kBatch) {
    const int n_batch = std::min(kBatch, n_steps + 1 - first);
    float inverse[kBatch] = {};  // set for c < n_batch below; g++ 14 cannot see that
    double sum_wq[kBatch] = {}, sum_wqq[kBatch] = {}, sum_wqx[kBatch] = {};
    for (int c = 0; c < n_batch; ++c)
      inverse[c] = (float(q_max) + first_shift + shift_step * float(first + c)) / (hi - lo);
    for (int i = 0; i < n; ++i) {
      const double w = weight[i];
      const float shifted = x[i] - lo;
      for (int c = 0; c < n_batch; ++c) {
        const uint8_t q = static_cast<uint8_t>(round_clamped(inverse[c] * shifted, 0, q_max));
        sum_wq[c] += w * q;
        sum_wqq[c] += w * q * q;
        sum_wqx[c] += w * q * x[i];
      }
    }
    for (int c = 0; c < n_batch; ++c) {
      // Normal equations of min Σ w (a·q + b − x)² over (a, b); b ≤ 0 is enforced afterwards.
      const double det = sum_w * sum_wqq[c] - sum_wq[c] * sum_wq[c];
      if (!(det > 0.0)) continue;
      double a = (sum_w * sum_wqx[c] - sum_wq[c] * sum_wx) / det;
      double b = (sum_wqq[c] * sum_wx - sum_wq[c] * sum_wqx[c]) / det;
      if (b > 0.0) {
        b = 0.0;
        a = sum_wqx[c] / sum_wqq[c];
      }
      if (!(a > 0.0)) continue;
      // Σ w (a·q + b − x)² expanded in the sums above (double keeps the cancellation harmless).
      const double error = a * a * sum_wqq[c] + 2 * a * b * sum_wq[c] + b * b * sum_w -
                           2 * a * sum_wqx[c] - 2 * b * sum_wx + sum_wxx;
      if (error < best_error) {
        best_error = error;
        best = {float(a), float(-b)};
        best_step = first + c;
        best_inverse = inverse[c];
      }
    }
  }
  if (best_step >= 0)
    for (int i = 0; i < n; ++i)
      q_out[i] = static_cast<uint8_t>(round_clamped(best_inverse * (x[i] - lo), 0, q_max));
  return best;
}

// Fits x[0..n) ≈ scale·q with integer q in [−q_neg, q_neg − 1], minimising Σ err² (the
// element of largest magnitude goes to the wider negative end). Returns the scale (may be < 0).
float fit_symmetric(const float* x, int n, int q_neg) {
  float amax = 0.0f;
  float extreme = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      extreme = x[i];
    }
  }
  if (amax == 0.0f) return 0.0f;
  float best_scale = -extreme / float(q_neg);
  float best_gain = -1.0f;
  // All 19 candidates advance together over i (each one's sums still accumulate in i order, so
  // the bits are those of one candidate at a time): independent chains instead of one long one.
  constexpr int kCandidates = 19;  // step = −9..9
  float inverse[kCandidates];
  float sum_qx[kCandidates] = {}, sum_qq[kCandidates] = {};
  for (int c = 0; c < kCandidates; ++c)
    inverse[c] = -(float(q_neg) + 0.1f * float(c - 9)) / extreme;
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < kCandidates; ++c) {
      const int q = round_clamped(inverse[c] * x[i], -q_neg, q_neg - 1);
      sum_qx[c] += float(q) * x[i];
      sum_qq[c] += float(q * q);
    }
  }
  for (int c = 0; c < kCandidates; ++c) {
    // For fixed q the best scale is Σqx/Σqq and the error drops by (Σqx)²/Σqq.
    if (sum_qq[c] > 0.0f && sum_qx[c] * sum_qx[c] / sum_qq[c] > best_gain) {
      best_gain = sum_qx[c] * sum_qx[c] / sum_qq[c];
      best_scale = sum_qx[c] / sum_qq[c];
    }
  }
  return best_scale;
}

// Q6_K and Q3_K: fit_symmetric's scale of each 16-weight sub-block of a 256-weight block into
// scales; returns the scale of largest magnitude (the first such, 0 if all are 0).
float fit_symmetric_scales(const float* x, int q_neg, float scales[16]) {
  float extreme_scale = 0.0f;
  for (int sub = 0; sub < 16; ++sub) {
    scales[sub] = fit_symmetric(x + 16 * sub, 16, q_neg);
    if (std::fabs(scales[sub]) > std::fabs(extreme_scale)) extreme_scale = scales[sub];
  }
  return extreme_scale;
}

// Q6_K and Q3_K: the sub-block scales of fit_symmetric_scales quantized against one f16 d (d_bits)
// so that the scale of largest magnitude maps to −code_neg (codes in [−code_neg, code_neg − 1]),
// then every weight re-rounded against d·code as the decoder will see it: quants in
// [−q_neg, q_neg − 1], 0 in a sub-block whose decoded scale is 0.
void fit_symmetric_block(const float* x, int q_neg, int code_neg, int codes[16],
                         int quants[kBlockK], uint16_t& d_bits) {
  float scales[16];
  const float extreme_scale = fit_symmetric_scales(x, q_neg, scales);
  const float inverse = extreme_scale != 0.0f ? -float(code_neg) / extreme_scale : 0.0f;
  for (int sub = 0; sub < 16; ++sub) {
    codes[sub] = round_clamped(inverse * scales[sub], -code_neg, code_neg - 1);
  }
  d_bits = f32_to_f16(inverse != 0.0f ? 1.0f / inverse : 0.0f);
  const float d = f16_to_f32(d_bits);
  for (int sub = 0; sub < 16; ++sub) {
    const float step = d * float(codes[sub]);
    for (int l = 0; l < 16; ++l) {
      quants[16 * sub + l] =
          step != 0.0f ? round_clamped(x[16 * sub + l] / step, -q_neg, q_neg - 1) : 0;
    }
  }
}

// Q4_K and Q5_K levels (0..max_level) of one 256-weight block: a weighted affine fit per 32-weight
// sub-block (fit_affine's first_shift and n_steps), 6-bit scale and min codes against f16 d and
// dmin, then every level re-rounded against the codes.
void fit_k4_block(const float* x, int max_level, float first_shift, int n_steps,
                  uint8_t levels[kBlockK], uint8_t packed_scales[12], uint16_t& d_bits,
                  uint16_t& dmin_bits) {
  float scales[8];
  float offsets[8];
  for (int sub = 0; sub < 8; ++sub) {
    const float* xs = x + 32 * sub;
    // Weight each value by (rms + |x|): large weights matter more, small ones still count.
    float sum_sq = 0.0f;
    for (int l = 0; l < 32; ++l) sum_sq += xs[l] * xs[l];
    const float rms = std::sqrt(sum_sq / 32.0f);
    float weight[32];
    for (int l = 0; l < 32; ++l) weight[l] = rms + std::fabs(xs[l]);
    const AffineFit fit =
        fit_affine(xs, weight, 32, max_level, first_shift, 0.1f, n_steps, levels + 32 * sub);
    scales[sub] = fit.scale;
    offsets[sub] = fit.offset;
  }
  const float max_scale = *std::max_element(scales, scales + 8);
  const float max_offset = *std::max_element(offsets, offsets + 8);
  const float inverse_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inverse_offset = max_offset > 0.0f ? 63.0f / max_offset : 0.0f;
  uint8_t scale_codes[8];
  uint8_t min_codes[8];
  for (int sub = 0; sub < 8; ++sub) {
    scale_codes[sub] = static_cast<uint8_t>(round_clamped(inverse_scale * scales[sub], 0, 63));
    min_codes[sub] = static_cast<uint8_t>(round_clamped(inverse_offset * offsets[sub], 0, 63));
  }
  pack_q4_K_scales(scale_codes, min_codes, packed_scales);
  d_bits = f32_to_f16(max_scale / 63.0f);
  dmin_bits = f32_to_f16(max_offset / 63.0f);
  // Re-round every weight against the scales exactly as the decoder will see them.
  const float d = f16_to_f32(d_bits);
  const float dmin = f16_to_f32(dmin_bits);
  for (int sub = 0; sub < 8; ++sub) {
    const float step = d * scale_codes[sub];
    const float offset = dmin * min_codes[sub];
    for (int l = 0; l < 32; ++l) {
      levels[32 * sub + l] =
          step > 0.0f ? uint8_t(round_clamped((x[32 * sub + l] + offset) / step, 0, max_level)) : 0;
    }
  }
}

}  // namespace

void quantize_q4_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_K*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + b * kBlockK;
    BlockQ4_K& block = blocks[b];
    uint8_t levels[kBlockK];
    fit_k4_block(x, 15, -1.0f, 20, levels, block.scales, block.d, block.dmin);
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (int l = 0; l < 32; ++l) {
        block.qs[32 * chunk + l] =
            uint8_t(levels[64 * chunk + l] | (levels[64 * chunk + 32 + l] << 4));
      }
    }
  }
}

void quantize_q2_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ2_K*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + b * kBlockK;
    BlockQ2_K& block = blocks[b];
    uint8_t levels[kBlockK];
    float scales[16];
    float offsets[16];
    for (int sub = 0; sub < 16; ++sub) {
      const float* xs = x + 16 * sub;
      float weight[16];
      for (int l = 0; l < 16; ++l) weight[l] = std::fabs(xs[l]);
      const AffineFit fit = fit_affine(xs, weight, 16, 3, -0.5f, 0.1f, 15, levels + 16 * sub);
      scales[sub] = fit.scale;
      offsets[sub] = fit.offset;
    }
    const float max_scale = *std::max_element(scales, scales + 16);
    const float max_offset = *std::max_element(offsets, offsets + 16);
    const float inverse_scale = max_scale > 0.0f ? 15.0f / max_scale : 0.0f;
    const float inverse_offset = max_offset > 0.0f ? 15.0f / max_offset : 0.0f;
    for (int sub = 0; sub < 16; ++sub) {
      const int scale_code = round_clamped(inverse_scale * scales[sub], 0, 15);
      const int min_code = round_clamped(inverse_offset * offsets[sub], 0, 15);
      block.scales[sub] = uint8_t(scale_code | (min_code << 4));
    }
    block.d = f32_to_f16(max_scale / 15.0f);
    block.dmin = f32_to_f16(max_offset / 15.0f);
    const float d = f16_to_f32(block.d);
    const float dmin = f16_to_f32(block.dmin);
    for (int sub = 0; sub < 16; ++sub) {
      const float step = d * (block.scales[sub] & 15);
      const float offset = dmin * (block.scales[sub] >> 4);
      for (int l = 0; l < 16; ++l) {
        levels[16 * sub + l] =
            step > 0.0f ? uint8_t(round_clamped((x[16 * sub + l] + offset) / step, 0, 3)) : 0;
      }
    }
    // Element 128·half + 32·step + l sits in bits 2·step of qs[32·half + l].
    std::fill(block.qs, block.qs + 64, uint8_t{0});
    for (int half = 0; half < 2; ++half) {
      for (int step = 0; step < 4; ++step) {
        for (int l = 0; l < 32; ++l) {
          block.qs[32 * half + l] |= uint8_t(levels[128 * half + 32 * step + l] << (2 * step));
        }
      }
    }
  }
}

void quantize_q6_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ6_K*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + b * kBlockK;
    BlockQ6_K& block = blocks[b];
    // The scale of largest magnitude maps to −128, the wider end of int8.
    int codes[16];
    int quants[kBlockK];
    fit_symmetric_block(x, 32, 128, codes, quants, block.d);
    for (int sub = 0; sub < 16; ++sub) block.scales[sub] = static_cast<int8_t>(codes[sub]);
    uint8_t levels[kBlockK];
    for (int e = 0; e < kBlockK; ++e) levels[e] = static_cast<uint8_t>(quants[e] + 32);
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t* q = levels + 128 * half + l;  // q[0], q[32], q[64], q[96]
        block.ql[64 * half + l] = uint8_t((q[0] & 15) | ((q[64] & 15) << 4));
        block.ql[64 * half + 32 + l] = uint8_t((q[32] & 15) | ((q[96] & 15) << 4));
        block.qh[32 * half + l] =
            uint8_t((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
      }
    }
  }
}

// Q5_K: Q4_K's search with 32 levels; the 5th bit of element 64·c + 32·u + l goes to bit 2c + u
// of qh[l].
void quantize_q5_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_K*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + b * kBlockK;
    BlockQ5_K& block = blocks[b];
    uint8_t levels[kBlockK];
    fit_k4_block(x, 31, -0.5f, 15, levels, block.scales, block.d, block.dmin);
    std::fill(block.qh, block.qh + 32, uint8_t{0});
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t low = levels[64 * chunk + l];
        const uint8_t high = levels[64 * chunk + 32 + l];
        block.qs[32 * chunk + l] = uint8_t((low & 15) | ((high & 15) << 4));
        block.qh[l] =
            uint8_t(block.qh[l] | ((low >> 4) << (2 * chunk)) | ((high >> 4) << (2 * chunk + 1)));
      }
    }
  }
}

// Q3_K: Q6_K's symmetric search with quants in [−4, 3] per 16 weights; the sub-block scale of
// largest magnitude maps to −32 of the 6-bit signed scales (stored +32).
void quantize_q3_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ3_K*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + b * kBlockK;
    BlockQ3_K& block = blocks[b];
    int codes[16];
    int quants[kBlockK];
    fit_symmetric_block(x, 4, 32, codes, quants, block.d);
    std::fill(block.scales, block.scales + 12, uint8_t{0});
    for (int sub = 0; sub < 16; ++sub) {
      const int stored = codes[sub] + 32;
      if (sub < 8) {
        block.scales[sub] = uint8_t(block.scales[sub] | (stored & 15));
      } else {
        block.scales[sub - 8] = uint8_t(block.scales[sub - 8] | ((stored & 15) << 4));
      }
      block.scales[8 + sub % 4] =
          uint8_t(block.scales[8 + sub % 4] | ((stored >> 4) << (2 * (sub / 4))));
    }
    std::fill(block.qs, block.qs + 64, uint8_t{0});
    std::fill(block.hmask, block.hmask + 32, uint8_t{0});
    for (int half = 0; half < 2; ++half) {
      for (int step = 0; step < 4; ++step) {
        for (int part = 0; part < 2; ++part) {
          const int sub = 8 * half + 2 * step + part;
          for (int l = 0; l < 16; ++l) {
            const int level = quants[16 * sub + l] + 4;  // 0..7: 2 low bits in qs, bit 2 in hmask
            block.qs[32 * half + 16 * part + l] =
                uint8_t(block.qs[32 * half + 16 * part + l] | ((level & 3) << (2 * step)));
            block.hmask[16 * part + l] =
                uint8_t(block.hmask[16 * part + l] | ((level >> 2) << (4 * half + step)));
          }
        }
      }
    }
  }
}

}  // namespace strata::quant::scalar
