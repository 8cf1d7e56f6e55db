// Lookup tables of the IQ2_XS format, as data from ggml (MIT licence; see iq2xs_tables.cpp).
//
// kIq2xsGrid: 512 points of an 8-D lattice; each u64 packs 8 unsigned magnitudes, byte j being
//   element j of the group. Every byte is 8, 25 or 43.
// kIq2xsSigns: 128 sign bytes; entry s holds the 7 bits of s plus their parity in bit 7, so every
//   group has an even number of negative signs.
// kIq2xsScaleVectors: derived from the format, not from ggml: for each sub-block scale byte s,
//   sixteen i16 = 2·(s & 15) + 1 eight times then 2·(s >> 4) + 1 eight times, the integer
//   sub-block scales (db = d·(2s+1)/8) laid out for the SIMD kernels' 32-weight sub-blocks.
// All are immutable; read them from any thread.
#pragma once

#include <array>
#include <cstdint>

namespace strata::quant {

inline constexpr int kIq2xsGridSize = 512;
inline constexpr int kIq2xsSignsSize = 128;

extern const uint64_t kIq2xsGrid[kIq2xsGridSize];
extern const uint8_t kIq2xsSigns[kIq2xsSignsSize];

struct alignas(32) Iq2xsScaleVector {
  int16_t lanes[16];
};
extern const std::array<Iq2xsScaleVector, 256> kIq2xsScaleVectors;
[[gnu::always_inline]] inline const int16_t* iq2xs_scale_vector(uint8_t scale_byte) {
  return kIq2xsScaleVectors[scale_byte].lanes;
}

}  // namespace strata::quant
