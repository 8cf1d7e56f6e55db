// Scalar kernels for the float weight types F32, F16 and BF16. Their activation stays f32, so a
// dot product is an f32 x f32 sum after exact conversion of the weights.
#include <cstring>

#include "quant/kernels.h"
#include "util/fp16.h"

namespace strata::quant::scalar {

void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* halves = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(halves[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* halves = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(halves[i]);
}

void quantize_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* halves = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) halves[i] = f32_to_f16(src[i]);
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* halves = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) halves[i] = f32_to_bf16(src[i]);
}

float dot_f32(const void* w, const void* a, int64_t n) {
  // Weight rows are only promised 2-byte alignment (quant.h), so each weight is copied out rather
  // than read through a float pointer (UBSan: misaligned load).
  const auto* weight_bytes = static_cast<const unsigned char*>(w);
  const auto* x = static_cast<const float*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float weight;
    std::memcpy(&weight, weight_bytes + size_t(i) * sizeof(float), sizeof(float));
    sum += double(weight) * double(x[i]);
  }
  return static_cast<float>(sum);
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(f16_to_f32(weights[i])) * double(x[i]);
  return static_cast<float>(sum);
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(bf16_to_f32(weights[i])) * double(x[i]);
  return static_cast<float>(sum);
}

}  // namespace strata::quant::scalar
