// Scalar kernels (the specification) of the 32-weight block types Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1,
// written from the block definitions (shared/reference/gguf-and-quants.md §4, ggml-common.h), their
// reference quantizers, and the activation quantizers (Q8_0 for the 32-weight types, Q8_K for the
// K-quants and IQ types). Dots take Q8_0 activations (see kernels.h for Q4_1/Q5_1's min term).
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/scalar/blocks32_loops.h"
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

// The block loops of the affine types (Q4_1, Q5_1): d·quant(block, j) + m, and their dot adds
// m·d_a·Σ a.
template <typename Block, typename Quant>
void dequantize_affine32(const void* src, float* dst, int64_t n, Quant quant) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    const float m = f16_to_f32(blocks[b].m);
    for (int j = 0; j < 32; ++j) dst[32 * b + j] = d * float(quant(blocks[b], j)) + m;
  }
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

}  // namespace

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * blocks[b].qs[j];
  }
}

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * ((blocks[b].qs[j] & 15) - 8);
      y[j + 16] = d * ((blocks[b].qs[j] >> 4) - 8);
    }
  }
}

// Q8_0 as ggml's reference: d = max|x| / 127, q = round(x / d). Also the activation format for
// Q8_0/Q4_0 weights, so rounding goes through quantize_activation_value (shared with AVX2).
void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float* x = src + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) {
      blocks[b].qs[j] = static_cast<int8_t>(quantize_activation_value(x[j] * inverse));
    }
  }
}

// Q4_0 as ggml's reference: the signed value v of largest magnitude maps to -8 (d = v / -8),
// q = min(15, trunc(x/d + 8.5)).
void quantize_q4_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    const float* x = src + b * 32;
    float amax = 0.0f;
    float extreme = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        extreme = x[j];
      }
    }
    const float d = extreme / -8.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) {
      float v = x[j] * inverse + 8.5f;
      v = v > 0.0f ? v : 0.0f;  // also maps NaN to 0 so the cast below is defined
      v = v < 15.0f ? v : 15.0f;
      q[j] = static_cast<uint8_t>(v);
    }
    for (int j = 0; j < 16; ++j) blocks[b].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
  }
}

// Q8_K: d = max|x| / 127 (f32), q = round(x / d) in [-127, 127], bsums = sums of 16 quants.
void quantize_q8_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    const float* x = src + b * kBlockK;
    float amax = 0.0f;
    for (int j = 0; j < kBlockK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = d;
    for (int j = 0; j < kBlockK; ++j) {
      blocks[b].qs[j] = static_cast<int8_t>(quantize_activation_value(x[j] * inverse));
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += blocks[b].qs[g * 16 + j];
      blocks[b].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockQ8_0*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += weights[b].qs[j] * acts[b].qs[j];
    sum += double(f16_to_f32(weights[b].d)) * double(f16_to_f32(acts[b].d)) * isum;
  }
  return static_cast<float>(sum);
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockQ4_0*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kBlock32; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += ((weights[b].qs[j] & 15) - 8) * acts[b].qs[j];
      isum += ((weights[b].qs[j] >> 4) - 8) * acts[b].qs[j + 16];
    }
    sum += double(f16_to_f32(weights[b].d)) * double(f16_to_f32(acts[b].d)) * isum;
  }
  return static_cast<float>(sum);
}

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  dequantize_affine32<BlockQ4_1>(src, dst, n, q4_1_quant);
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  dequantize_symmetric32<BlockQ5_0>(src, dst, n, q5_0_value);
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  dequantize_affine32<BlockQ5_1>(src, dst, n, q5_1_quant);
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

}  // namespace strata::quant::scalar
