// IEEE binary16 and bfloat16 <-> binary32 conversions (scalar, exact where the format allows).
//
// f16 -> f32 and bf16 -> f32 are exact (subnormals, inf and NaN preserved).
// f32 -> f16 rounds to nearest even; f32 -> bf16 rounds to nearest even and keeps NaN quiet,
// matching ggml's converters bit for bit (see shared/reference/gguf-and-quants.md §3).
#pragma once

#include <cstdint>
#include <cstring>

namespace strata {

inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_f32(sign);
    // Subnormal: normalise the mantissa.
    int shift = 0;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ff;
    return bits_to_f32(sign | uint32_t(127 - 15 + 1 - shift) << 23 | mantissa << 13);
  }
  if (exponent == 31) return bits_to_f32(sign | 0x7f800000u | mantissa << 13);
  return bits_to_f32(sign | (exponent + 127 - 15) << 23 | mantissa << 13);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t bits = f32_to_bits(f);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const uint32_t abs = bits & 0x7fffffff;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00 | ((abs >> 13) & 0x3ff));  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520 -> inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: scale so the f16 subnormal unit (2^-24) becomes 1.0.
    const float scaled = bits_to_f32(abs) * 16777216.0f;  // exact: power of two
    // Round to nearest even via the FPU's default rounding of float->int (nearbyint semantics).
    const float rounded = __builtin_nearbyintf(scaled);
    return uint16_t(sign | uint32_t(rounded));
  }
  // Normal: round mantissa from 23 to 10 bits, nearest even; carry may bump the exponent.
  const uint32_t rebiased = abs - ((127u - 15u) << 23);
  const uint32_t round_bit = 1u << 12;
  const uint32_t lsb = (rebiased >> 13) & 1;
  return uint16_t(sign | ((rebiased + round_bit - 1 + lsb) >> 13));
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t bits = f32_to_bits(f);
  if ((bits & 0x7fffffff) > 0x7f800000u) return uint16_t((bits >> 16) | 64);  // quiet NaN
  return uint16_t((bits + (0x7fff + ((bits >> 16) & 1))) >> 16);
}

}  // namespace strata
