// ExpertArena — the host memory an ExpertStore keeps routed experts in: fixed-size slots carved
// out of one anonymous mapping.
//
// What it promises
// - One mapping, made at construction and never grown or moved: `slots_per_layer` cache slots for
//   every layer with experts (each slot_bytes[layer] long: the size classes), layer after layer,
//   then `n_transient` transient slots of the largest size. bytes() is exactly that sum, so a
//   budget buys slots × size and nothing more.
// - Every slot starts at a multiple of 4096 when every slot_bytes is one (O_DIRECT reads land in
//   place). Transparent huge pages are requested (a hint: experts are read in ~0.3-1.5 MB pieces
//   scattered over the arena, and with 4 KiB pages each piece costs hundreds of TLB misses).
// - Pre-faulted in the background: a thread populates the mapping (MADV_POPULATE_WRITE, in chunks)
//   from construction on, so the I/O pool's reads do not pay the first touch of never-used memory
//   (a 2 MiB huge page's allocation, compaction and zeroing inside the O_DIRECT read: 50-85 ms of
//   I/O wait per token at a 25 % budget on the flagship until the arena had been written once;
//   docs/bench-experts.md). Populating a page that is already present changes nothing, so the
//   thread needs no coordination with readers or writers; it is stopped and joined before the
//   unmap. STRATA_ARENA_PREFAULT=off in the environment turns it off (to measure what it buys).
// - Throws strata::Error when the mapping cannot be made. Unmapped on destruction (RAII).
// - Holds no state besides the mapping: which expert a slot holds is SlotResidency's business,
//   reading into it the I/O pool's. Not copyable; pointers stay valid for the arena's life.
#pragma once

#include <cstdint>
#include <span>
#include <thread>
#include <vector>

namespace strata {

class ExpertArena {
 public:
  // slot_bytes[layer]: one expert's slot in that layer, 0 for a layer without routed experts.
  ExpertArena(std::span<const uint64_t> slot_bytes, int slots_per_layer, int n_transient);
  ~ExpertArena();
  ExpertArena(const ExpertArena&) = delete;
  ExpertArena& operator=(const ExpertArena&) = delete;

  uint8_t* slot(int layer, uint32_t slot) const {
    return layer_base_[size_t(layer)] + uint64_t(slot) * slot_bytes_[size_t(layer)];
  }
  uint8_t* transient(int index) const { return transient_[size_t(index)]; }
  int n_transient() const { return int(transient_.size()); }
  const uint8_t* data() const { return static_cast<const uint8_t*>(mapping_); }
  uint64_t bytes() const { return bytes_; }

 private:
  void* mapping_ = nullptr;
  uint64_t bytes_ = 0;
  std::vector<uint64_t> slot_bytes_;  // [layer]
  std::vector<uint8_t*> layer_base_;  // [layer]: its first cache slot (null: no experts)
  std::vector<uint8_t*> transient_;   // [n_transient]
  std::jthread prefault_;             // touches only the mapping, through madvise
};

}  // namespace strata
