// Random rows of the low-bit IQ types for tests: random bytes (every bit pattern is a valid
// block) with a sane f16 super-scale (finite and small, sometimes zero or subnormal).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/ggml_type.h"
#include "quant_test_util.h"

namespace strata::quant::testing {

inline constexpr GgmlType kIqLowbitTypes[] = {GgmlType::IQ2_XXS, GgmlType::IQ2_S, GgmlType::IQ3_XXS,
                                              GgmlType::IQ3_S,   GgmlType::IQ1_S, GgmlType::IQ1_M};

inline std::vector<uint8_t> random_iq_row(GgmlType type, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> row(row_bytes(type, n));
  for (uint8_t& byte : row) byte = static_cast<uint8_t>(rng());
  const size_t block_bytes = type_traits(type).block_bytes;
  for (size_t offset = 0; offset < row.size(); offset += block_bytes) {
    const uint16_t d = random_scale_f16(rng);
    if (type == GgmlType::IQ1_M) {
      // The f16 is spread over the top nibbles of the four u16 scale words (bytes 48..55).
      for (int word = 0; word < 4; ++word) {
        uint16_t v;
        std::memcpy(&v, &row[offset + 48 + 2 * size_t(word)], 2);
        v = uint16_t((v & 0x0fff) | (((d >> (4 * word)) & 15) << 12));
        std::memcpy(&row[offset + 48 + 2 * size_t(word)], &v, 2);
      }
    } else {
      std::memcpy(&row[offset], &d, 2);  // d is the first field of the other five
    }
  }
  return row;
}

}  // namespace strata::quant::testing
