#include "gguf/resident_weights.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <string_view>

#include "gguf/gguf.h"

namespace strata {

std::vector<ByteRange> plan_resident_weights(std::span<const TensorInfo> tensors, uint64_t file_size,
                                             uint64_t page_bytes, bool experts_resident) {
  return outward_page_ranges(tensors, file_size, page_bytes, [experts_resident](const TensorInfo& t) {
    if (std::string_view(t.name).starts_with("per_layer_token_embd")) return false;
    return experts_resident || !is_sparse_tensor(t);
  });
}

std::vector<ByteRange> plan_resident_weights(const GgufFile& gguf, bool experts_resident) {
  return plan_resident_weights(gguf.tensors(), gguf.file_size(), uint64_t(sysconf(_SC_PAGESIZE)), experts_resident);
}

uint64_t copy_resident_weights(const GgufFile& gguf, std::span<const ByteRange> ranges, int threads,
                               const std::function<void(uint64_t, uint64_t)>& progress, uint64_t piece_bytes) {
  if (gguf.fd() < 0) return 0;
  if (threads <= 0) threads = int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  const uint64_t align = std::min(uint64_t{2} << 20, piece_bytes);  // a huge page, or less in tests
  const auto base = reinterpret_cast<uintptr_t>(gguf.mapped_data());
  std::vector<ByteRange> pieces;
  uint64_t total = 0;
  for (const ByteRange& r : ranges) {
    total += r.length;
    for (uint64_t at = r.offset; at < r.end();) {
      // A piece ends where the mapping's address is a multiple of 2 MiB (or at the range's end).
      const uint64_t cut = ((base + at + piece_bytes) & ~(align - 1)) - base;
      const uint64_t end = std::min(r.end(), cut);
      pieces.push_back(ByteRange{at, end - at});
      at = end;
    }
  }
  // Pieces are independent (each its own anonymous mapping, reads and mremap), so threads take
  // them in turn; the reads from a cold file and the zeroing of fresh huge pages both scale.
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> copied{0};
  std::mutex progress_mutex;
  uint64_t done = 0;
  const auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      copied += gguf.copy_in_place(pieces[i].offset, pieces[i].length);
      const std::lock_guard lock(progress_mutex);
      done += pieces[i].length;
      if (progress) progress(done, total);
    }
  };
  {
    std::vector<std::jthread> helpers;
    const size_t n_helpers = std::min(pieces.size(), size_t(std::max(threads, 1))) - (pieces.empty() ? 0 : 1);
    for (size_t t = 0; t < n_helpers; ++t) helpers.emplace_back(work);
    work();
  }  // joins the helpers
  return copied;
}

}  // namespace strata
