// Lookup tables of the low-bit IQ formats (IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), as
// data from ggml (MIT licence; see iq_lowbit_tables.cpp). The sign table they share with IQ2_XS
// is kIq2xsSigns (iq2xs_tables.h).
//
// kIq2xxsGrid (256) / kIq2sGrid (1024): 8-D lattice points; each u64 packs 8 unsigned
//   magnitudes, byte j being element j of the group. Every byte is 8, 25 or 43.
// kIq3xxsGrid (256) / kIq3sGrid (512): 4-D points; each u32 packs 4 unsigned magnitudes, byte j
//   being element j. IQ3_XXS bytes are in {4, 12, 20, 28, 36, 44, 52, 62}, IQ3_S bytes are the
//   odd numbers 1..15.
// kIq1sGrid (2048): 8-D ternary points shared by IQ1_S and IQ1_M; each u64 packs 8 signed bytes
//   in {-1, 0, +1}, byte j being element j.
// kIq1Delta: the offset IQ1_S and IQ1_M add to every grid value (±1/8, sign from the block).
// All are immutable; read them from any thread.
#pragma once

#include <cstdint>

namespace strata::quant {

inline constexpr int kIq2xxsGridSize = 256;
inline constexpr int kIq2sGridSize = 1024;
inline constexpr int kIq3xxsGridSize = 256;
inline constexpr int kIq3sGridSize = 512;
inline constexpr int kIq1sGridSize = 2048;

// ggml's IQ1S_DELTA and IQ1M_DELTA (both 0.125f; IQ1_M's dequantizer uses IQ1S_DELTA).
inline constexpr float kIq1Delta = 0.125f;

extern const uint64_t kIq2xxsGrid[kIq2xxsGridSize];
extern const uint64_t kIq2sGrid[kIq2sGridSize];
extern const uint32_t kIq3xxsGrid[kIq3xxsGridSize];
extern const uint32_t kIq3sGrid[kIq3sGridSize];
extern const uint64_t kIq1sGrid[kIq1sGridSize];

}  // namespace strata::quant
