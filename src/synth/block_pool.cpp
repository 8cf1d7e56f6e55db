#include "synth/block_pool.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "quant/quant.h"
#include "synth/chunk_pipeline.h"
#include "util/error.h"

namespace strata::synth_detail {

uint32_t BlockPool::size_for(uint64_t blocks_needed) {
  return uint32_t(std::bit_ceil(std::clamp<uint64_t>(blocks_needed, 1, kMaxBlocks)));
}

BlockPool::BlockPool(GgmlType type, float scale, uint64_t seed, uint32_t n_blocks, int n_threads)
    : type_(type),
      index_mask_(n_blocks - 1),
      block_bytes_(type_traits(type).block_bytes),
      block_elems_(type_traits(type).block_elems),
      blocks_(size_t(n_blocks) * block_bytes_) {
  if (!std::has_single_bit(n_blocks) || n_blocks > kMaxBlocks)
    fail("BlockPool: expected a power of two up to {} blocks, found {}", kMaxBlocks, n_blocks);
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, 4);
  const uint64_t pool_seed =
      seed ^ splitmix64(0xB10C0000ull + uint64_t(type)) ^ splitmix64(scale_bits);
  // Block i's floats come from the pool stream at position 4·block_elems·i (normal() takes four
  // values), so the pool does not depend on how its construction is split across threads.
  constexpr size_t kBlocksPerTask = 64;
  parallel_for((n_blocks + kBlocksPerTask - 1) / kBlocksPerTask, n_threads, [&](size_t task) {
    std::vector<float> values(static_cast<size_t>(block_elems_));
    for (size_t i = task * kBlocksPerTask;
         i < std::min<size_t>((task + 1) * kBlocksPerTask, n_blocks); ++i) {
      Random rng(pool_seed);
      rng.skip(4 * uint64_t(block_elems_) * i);
      for (float& v : values) v = scale * rng.normal();
      quant::quantize_row(type_, values.data(), blocks_.data() + i * block_bytes_, block_elems_);
    }
  });
}

uint64_t BlockPool::draws_per_row(GgmlType type, int64_t n) {
  const uint64_t n_blocks = uint64_t(n / type_traits(type).block_elems);
  return (n_blocks + 3) / 4;
}

void BlockPool::fill_row(Random& rng, uint8_t* dst, int64_t n) const {
  const int64_t n_blocks = n / block_elems_;
  uint64_t bits = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    if (b % 4 == 0) bits = rng.next();
    const uint32_t index = uint32_t(bits >> (16 * (b % 4))) & index_mask_;
    std::memcpy(dst + size_t(b) * block_bytes_, blocks_.data() + size_t(index) * block_bytes_,
                block_bytes_);
  }
}

}  // namespace strata::synth_detail
