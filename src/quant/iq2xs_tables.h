// Lookup tables of the IQ2_XS format, as data from ggml (MIT licence; see iq2xs_tables.cpp).
//
// kIq2xsGrid: 512 points of an 8-D lattice; each u64 packs 8 unsigned magnitudes, byte j being
//   element j of the group. Every byte is 8, 25 or 43.
// kIq2xsSigns: 128 sign bytes; entry s holds the 7 bits of s plus their parity in bit 7, so every
//   group has an even number of negative signs.
// Both are immutable; read them from any thread.
#pragma once

#include <cstdint>

namespace strata::quant {

inline constexpr int kIq2xsGridSize = 512;
inline constexpr int kIq2xsSignsSize = 128;

extern const uint64_t kIq2xsGrid[kIq2xsGridSize];
extern const uint8_t kIq2xsSigns[kIq2xsSignsSize];

}  // namespace strata::quant
