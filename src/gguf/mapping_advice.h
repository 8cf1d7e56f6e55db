// Mapping advice for a GGUF whose routed experts are streamed by the expert store (O_DIRECT or
// pread into its own arena) instead of being read through the mapping.
//
// The mapping then serves only the dense tensors (attention, norms, shared experts, embedding,
// head: ~6 GB of the 48 GiB flagship). Two kinds of byte ranges, computed from the tensor table by
// plan_mapping_advice (a pure function, so the split is testable without a file):
//   - sparse: the routed experts (`*_exps`) and the per-layer token embedding (row gathers). These
//     get MADV_RANDOM, so a stray fault never reads neighbouring expert bytes into the page cache.
//   - dense: everything else. These keep the default read-around and are read in ahead of the
//     first token by DensePrefetch, in large sequential chunks.
// Ranges are page-aligned: a page shared by a sparse and a dense tensor counts as dense (sparse
// ranges shrink inward, dense ranges grow outward), and adjacent ranges of one kind are merged.
//
// Why not MADV_RANDOM on the whole file plus MADV_WILLNEED on the dense tensors (what was done
// before): the kernel caps each MADV_WILLNEED/POSIX_FADV_WILLNEED call at the read-ahead window
// (force_page_cache_ra: max(read_ahead_kb, max_sectors_kb), 8 MiB here), so all but the first 8 MiB
// of every larger tensor came in through 4 KiB random faults: 130 MB/s, a 40-60 s first token
// (docs/bench-experts.md, "The flagship at full scale").
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <stop_token>
#include <thread>
#include <vector>

namespace strata {

class GgufFile;
struct TensorInfo;

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t end() const { return offset + length; }
  bool operator==(const ByteRange&) const = default;
};

struct MappingAdvicePlan {
  std::vector<ByteRange> sparse;  // MADV_RANDOM; ascending, disjoint, page-aligned
  std::vector<ByteRange> dense;   // read ahead; ascending, disjoint, page-aligned, end <= file
};

// True for the tensors the expert store streams or that are read by sparse row gathers.
bool is_sparse_tensor(const TensorInfo& tensor);

// The pages holding the bytes of the `selected` tensors (with bytes): each tensor's range widened
// to whole pages (the last clipped to the file), ascending, touching ranges merged.
// REQUIRES: page_bytes a power of two; tensors lie inside [0, file_size).
std::vector<ByteRange> outward_page_ranges(std::span<const TensorInfo> tensors, uint64_t file_size,
                                           uint64_t page_bytes,
                                           const std::function<bool(const TensorInfo&)>& selected);

// REQUIRES: page_bytes a power of two; tensors lie inside [0, file_size).
MappingAdvicePlan plan_mapping_advice(std::span<const TensorInfo> tensors, uint64_t file_size,
                                      uint64_t page_bytes);

// Applies the plan to `gguf`'s mapping (MADV_RANDOM on the sparse ranges) and reads the dense
// ranges into the page cache on a background thread, in file order, so the first token's faults
// find them there. Advice and reads are hints: failures change speed, never results. The destructor
// stops the thread (between chunks) and joins it; the object must not outlive `gguf`. No-op for a
// GgufFile without a file (open_from_memory).
class DensePrefetch {
 public:
  explicit DensePrefetch(const GgufFile& gguf);
  ~DensePrefetch();
  DensePrefetch(const DensePrefetch&) = delete;
  DensePrefetch& operator=(const DensePrefetch&) = delete;

  uint64_t dense_bytes() const { return dense_bytes_; }

 private:
  uint64_t dense_bytes_ = 0;
  std::jthread thread_;
};

}  // namespace strata
