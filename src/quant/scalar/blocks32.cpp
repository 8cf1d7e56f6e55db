// Scalar kernels for the 32-weight block types Q8_0 and Q4_0, and the activation quantizers
// (Q8_0 for those two, Q8_K for the K-quants and IQ2_XS).
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "util/fp16.h"

namespace strata::quant::scalar {

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

}  // namespace strata::quant::scalar
