#include "experts/expert_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/error.h"
#include "util/progress.h"

namespace strata {

ExpertArena::ExpertArena(std::span<const uint64_t> slot_bytes, int slots_per_layer, int n_transient)
    : slot_bytes_(slot_bytes.begin(), slot_bytes.end()), layer_base_(slot_bytes.size(), nullptr) {
  uint64_t slot_sum = 0, largest_slot = 0;
  for (const uint64_t b : slot_bytes) {
    slot_sum += b;
    largest_slot = std::max(largest_slot, b);
  }
  bytes_ = slot_sum * uint64_t(slots_per_layer) + uint64_t(n_transient) * largest_slot;
  mapping_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    fail("expert store: cannot reserve {} for the expert arena: {}", format_bytes(bytes_),
         std::strerror(errno));
  }
  madvise(mapping_, bytes_, MADV_HUGEPAGE);  // a hint: failure changes nothing
  auto* cursor = static_cast<uint8_t*>(mapping_);
  for (size_t l = 0; l < slot_bytes_.size(); ++l) {
    if (slot_bytes_[l] == 0) continue;
    layer_base_[l] = cursor;
    cursor += slot_bytes_[l] * uint64_t(slots_per_layer);
  }
  for (int i = 0; i < n_transient; ++i) {
    transient_.push_back(cursor);
    cursor += largest_slot;
  }
  const char* prefault_env = std::getenv("STRATA_ARENA_PREFAULT");
  if (prefault_env && std::strcmp(prefault_env, "off") == 0) return;
  prefault_ = std::jthread([base = static_cast<uint8_t*>(mapping_),
                            bytes = bytes_](std::stop_token stop) {
    // 64 MiB: small enough to stop promptly, large enough that the syscalls cost nothing.
    constexpr uint64_t kChunkBytes = uint64_t{64} << 20;
    for (uint64_t at = 0; at < bytes && !stop.stop_requested(); at += kChunkBytes)
      if (madvise(base + at, size_t(std::min(kChunkBytes, bytes - at)), MADV_POPULATE_WRITE) != 0)
        return;  // a kernel without it (before 5.14), or out of memory: first touch stays on the
                 // read path
  });
}

ExpertArena::~ExpertArena() {
  if (prefault_.joinable()) {
    prefault_.request_stop();
    prefault_.join();  // before the unmap: the thread may be inside madvise on the mapping
  }
  if (mapping_) munmap(mapping_, bytes_);
}

}  // namespace strata
