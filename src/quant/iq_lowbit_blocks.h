// Byte layouts of the low-bit IQ blocks (256 weights each; internal to quant/ and its tests).
//
// Each struct mirrors ggml-common.h field for field, so a pointer into a GGUF tensor row can be
// read as an array of blocks (see blocks.h for the conventions: f16 as raw uint16_t bits, rows
// at least 2-byte aligned). Weights are in groups of 8 (one lattice point each, or two 4-D
// points for the IQ3 types), four groups to a 32-weight sub-block.
#pragma once

#include <cstdint>

namespace strata::quant {

// 2.0625 bpw. Per sub-block two u32 (qs[4s], qs[4s+1] as bytes/words): the first holds four
// 8-bit grid indices, the second four 7-bit sign indices (bits 7g..7g+6) and the sub-block scale
// s in bits 28-31: db = d·(0.5 + s)·0.25.
struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[32];
};
// 2.5625 bpw. qs[0..31]: low 8 bits of the 10-bit grid index of each group; qs[32..63]: the
// sign byte of each group (bit j negates element j); qh[s]: the index's two high bits, bits
// 2g..2g+1 for group g; scales[s]: nibble per 16 weights, db = d·(0.5 + nibble)·0.25.
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t scales[8];
};
// 3.0625 bpw. qs[0..63]: 8-bit indices of 4-D grid points, two per group; qs[64..95]: per
// sub-block a u32 with four 7-bit sign indices and the scale s in bits 28-31:
// db = d·(0.5 + s)·0.5.
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[96];
};
// 3.4375 bpw. qs: low 8 bits of the 9-bit indices of 4-D points (8 per sub-block); qh[s]: bit k
// is the high bit of point k of sub-block s; signs: one byte per group (bit j negates element
// j); scales[p]: nibble per sub-block (low for 2p, high for 2p+1), db = d·(1 + 2·nibble).
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t signs[32];
  uint8_t scales[4];
};
// 1.5625 bpw. qs: low 8 bits of the 11-bit grid index of each group; qh[s]: bits 3g..3g+2 the
// index's high bits for group g, bits 12-14 the scale s (dl = d·(2s + 1)), bit 15 the sign of
// the sub-block's delta (y = dl·(grid + delta), delta = ±1/8).
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[32];
  uint16_t qh[8];
};
// 1.75 bpw, no separate d: the f16 super-scale is the top nibbles of the four u16 words of
// `scales` (word 0's top nibble is its bits 0-3, ..., word 3's its bits 12-15). qs: low 8 bits
// of the 11-bit grid index of each group; qh[2s + h]: for group 2h (low nibble) and 2h+1 (high
// nibble), bits 0-2 the index's high bits and bit 3 the delta's sign. The rest of `scales`: per
// 16 weights a 3-bit s (dl = d·(2s + 1)), word w holding sub-blocks 2w (bits 0-5) and 2w+1
// (bits 6-11), the lower 3 bits for the first 16 weights.
struct BlockIQ1_M {
  uint8_t qs[32];
  uint8_t qh[16];
  uint8_t scales[8];
};

static_assert(sizeof(BlockIQ2_XXS) == 66);
static_assert(sizeof(BlockIQ2_S) == 82);
static_assert(sizeof(BlockIQ3_XXS) == 98);
static_assert(sizeof(BlockIQ3_S) == 110);
static_assert(sizeof(BlockIQ1_S) == 50);
static_assert(sizeof(BlockIQ1_M) == 56);

}  // namespace strata::quant
