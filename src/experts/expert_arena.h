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
// - Throws strata::Error when the mapping cannot be made. Unmapped on destruction (RAII).
// - Holds no state besides the mapping: which expert a slot holds is SlotResidency's business,
//   reading into it the I/O pool's. Not copyable; pointers stay valid for the arena's life.
#pragma once

#include <cstdint>
#include <span>
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
};

}  // namespace strata
