// BlockPool — random quantized rows for `strata synth` without quantizing every weight.
//
// Quantizing random floats costs the quantizer's search for every block (IQ4_NL's scale search
// made the full Qwen3.8-Flash-Next shape take over an hour). A pool holds up to kMaxBlocks blocks
// (fewer when the file needs fewer blocks of this kind: the power of two at or above that count)
// of one type, each the ordinary quantizer's output for one block of scale·N(0, 1) floats (the
// values synth draws for a matrix), and a row is assembled from blocks drawn uniformly from the
// pool. So every block is one the quantizer really produces for such weights (the scale
// distribution and code statistics are the real ones, and every reader accepts the file), at the
// cost of a memcpy per block. Rows share blocks by chance (a row of 80 blocks shares one with
// another row with probability ≈ 80²/2¹⁴ ≈ 0.4): fine for speed and streaming work, not a model to
// study. 2¹⁴ blocks build in well under a second even for the slowest quantizer synth pools
// (IQ4_NL).
//
// Contract
// - The pool's bytes depend only on (type, scale, seed, size); a row's bytes only on the pool and
//   the rng state passed to fill_row, which consumes exactly draws_per_row values.
// - Immutable after construction: fill_row may run on any number of threads at once.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/ggml_type.h"
#include "synth/synth_random.h"

namespace strata::synth_detail {

class BlockPool {
 public:
  static constexpr uint32_t kMaxBlocks = 1u << 14;

  // The pool size for a file that draws `blocks_needed` blocks from it.
  static uint32_t size_for(uint64_t blocks_needed);
  // Builds a pool of n_blocks (a power of two ≤ kMaxBlocks) with up to n_threads threads (the
  // bytes do not depend on it). `type` must be a block type quant::quantize_row can write.
  BlockPool(GgmlType type, float scale, uint64_t seed, uint32_t n_blocks, int n_threads);

  GgmlType type() const { return type_; }
  // Writes one row of n elements (a multiple of the block size) at dst.
  void fill_row(Random& rng, uint8_t* dst, int64_t n) const;
  // Rng values one row of n elements consumes: four 16-bit block indices per value.
  static uint64_t draws_per_row(GgmlType type, int64_t n);

 private:
  GgmlType type_;
  uint32_t index_mask_;
  size_t block_bytes_;
  int64_t block_elems_;
  std::vector<uint8_t> blocks_;
};

}  // namespace strata::synth_detail
