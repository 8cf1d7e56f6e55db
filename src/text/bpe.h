// BPE merge machinery on token ids (internal to the text module).
//
// MergeTable maps a pair of adjacent token ids to (rank, merged id) in an open-addressing hash
// table; `bpe_merge` applies merges to one pre-token's initial symbols with a min-heap keyed by
// (rank, position), which is exactly Hugging Face's BPE order: lowest rank first, leftmost first on
// equal ranks, stale heap entries skipped. O(n log n) per piece. Thread-safe once built (the
// scratch belongs to the caller).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  explicit MergeTable(size_t expected_entries = 0);
  // Adds (left, right) -> (rank, merged); keeps the existing entry when the pair is already there
  // (the lower rank wins) and returns false in that case.
  bool insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
      const Entry& e = slots_[slot];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  static size_t hash(uint64_t key) { return size_t((key * 0x9E3779B97F4A7C15ull) >> 17); }
  void grow();
  std::vector<Entry> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// Merges `ids` (the initial symbols of one piece) in place; on return `ids` holds the final tokens.
void bpe_merge(const MergeTable& merges, std::vector<int32_t>& ids, BpeScratch& scratch);

}  // namespace strata
