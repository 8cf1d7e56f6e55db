#include "text/bpe.h"

#include <algorithm>

namespace strata {
namespace {

// std::push_heap builds a max-heap; "greater" puts the lowest (rank, pos) on top.
bool later(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

MergeTable::MergeTable(size_t expected_entries) {
  size_t capacity = 16;
  while (capacity < expected_entries * 2) capacity *= 2;  // load factor <= 1/2
  slots_.assign(capacity, Entry{});
  mask_ = capacity - 1;
}

void MergeTable::grow() {
  std::vector<Entry> old = std::move(slots_);
  slots_.assign(old.size() * 2, Entry{});
  mask_ = slots_.size() - 1;
  for (const Entry& e : old) {
    if (e.key == kEmpty) continue;
    size_t slot = hash(e.key) & mask_;
    while (slots_[slot].key != kEmpty) slot = (slot + 1) & mask_;
    slots_[slot] = e;
  }
}

bool MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pair_key(left, right);
  size_t slot = hash(key) & mask_;
  while (slots_[slot].key != kEmpty) {
    if (slots_[slot].key == key) return false;
    slot = (slot + 1) & mask_;
  }
  slots_[slot] = Entry{key, rank, merged};
  ++size_;
  return true;
}

void bpe_merge(const MergeTable& merges, std::vector<int32_t>& ids, BpeScratch& scratch) {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};

  const auto push_candidate = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const MergeTable::Entry* e = merges.find(symbols[pos].id, symbols[next].id)) {
      heap.push_back({e->rank, pos, symbols[pos].id, symbols[next].id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = symbols[top.pos];
    // Stale entries: the left symbol was merged away or changed, or its right neighbour changed.
    if (left.id != top.left || left.next < 0) continue;
    BpeScratch::Symbol& right = symbols[left.next];
    if (right.id != top.right) continue;
    left.id = merges.find(top.left, top.right)->merged;
    const int32_t removed = left.next;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    symbols[removed].id = -1;  // dead
    if (left.prev >= 0) push_candidate(left.prev);
    push_candidate(top.pos);
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace strata
