#include "gguf/mapping_advice.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace strata {
namespace {

// Adds [begin, end) to `ranges` (ascending input), merging with the last range when they touch.
void append_merged(std::vector<ByteRange>& ranges, uint64_t begin, uint64_t end) {
  if (end <= begin) return;
  if (!ranges.empty() && begin <= ranges.back().end()) {
    ranges.back().length = std::max(ranges.back().end(), end) - ranges.back().offset;
    return;
  }
  ranges.push_back(ByteRange{begin, end - begin});
}

// Removes the parts of `sparse` that overlap `dense` (both ascending and disjoint).
std::vector<ByteRange> subtract(const std::vector<ByteRange>& sparse,
                                const std::vector<ByteRange>& dense) {
  std::vector<ByteRange> out;
  size_t d = 0;
  for (const ByteRange& s : sparse) {
    uint64_t begin = s.offset;
    const uint64_t end = s.end();
    while (d < dense.size() && dense[d].end() <= begin) ++d;
    for (size_t k = d; k < dense.size() && dense[k].offset < end; ++k) {
      append_merged(out, begin, std::min(end, dense[k].offset));
      begin = std::max(begin, dense[k].end());
    }
    append_merged(out, begin, end);
  }
  return out;
}

}  // namespace

bool is_sparse_tensor(const TensorInfo& tensor) {
  const std::string_view name = tensor.name;
  return name.find("_exps") != std::string_view::npos || name.starts_with("per_layer_token_embd");
}

std::vector<ByteRange> outward_page_ranges(std::span<const TensorInfo> tensors, uint64_t file_size,
                                           uint64_t page_bytes,
                                           const std::function<bool(const TensorInfo&)>& selected) {
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors)
    if (t.n_bytes > 0 && selected(t)) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->file_offset < b->file_offset;
  });
  std::vector<ByteRange> ranges;
  for (const TensorInfo* t : by_offset)
    append_merged(ranges, t->file_offset & ~(page_bytes - 1),
                  std::min(file_size, (t->file_offset + t->n_bytes + page_bytes - 1) & ~(page_bytes - 1)));
  return ranges;
}

MappingAdvicePlan plan_mapping_advice(std::span<const TensorInfo> tensors, uint64_t file_size,
                                      uint64_t page_bytes) {
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors)
    if (t.n_bytes > 0 && is_sparse_tensor(t)) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->file_offset < b->file_offset;
  });
  std::vector<ByteRange> sparse_pages;  // inward: only pages holding nothing but sparse bytes
  for (const TensorInfo* t : by_offset)
    append_merged(sparse_pages, std::min(file_size, (t->file_offset + page_bytes - 1) & ~(page_bytes - 1)),
                  (t->file_offset + t->n_bytes) & ~(page_bytes - 1));
  MappingAdvicePlan plan;
  plan.dense = outward_page_ranges(tensors, file_size, page_bytes,
                                   [](const TensorInfo& t) { return !is_sparse_tensor(t); });
  plan.sparse = subtract(sparse_pages, plan.dense);
  return plan;
}

DensePrefetch::DensePrefetch(const GgufFile& gguf) {
  if (gguf.fd() < 0) return;
  const MappingAdvicePlan plan =
      plan_mapping_advice(gguf.tensors(), gguf.file_size(), uint64_t(sysconf(_SC_PAGESIZE)));
  for (const ByteRange& r : plan.sparse) gguf.advise(r.offset, r.length, MADV_RANDOM);
  for (const ByteRange& r : plan.dense) dense_bytes_ += r.length;
  // pread into a scratch buffer, 8 MiB at a time, in file order: measured against MADV_WILLNEED in
  // read-ahead-window chunks (which floods the queue and delayed startup by 1.6 s) and
  // MADV_POPULATE_READ (read-around faults, 1.3 s slower prefill) on the flagship, first token at
  // 10 %: 9.3 s vs 10.8 s and 10.3 s (docs/bench-experts.md). The pages land in the page cache; the
  // prefill's faults then only map them.
  const int fd = gguf.fd();
  static constexpr uint64_t kChunkBytes = uint64_t{8} << 20;
  std::vector<uint8_t> scratch(kChunkBytes);  // allocated here: the thread itself never allocates
  thread_ = std::jthread([fd, dense = plan.dense,
                          buffer = std::move(scratch)](std::stop_token stop) mutable {
    for (const ByteRange& r : dense)
      for (uint64_t at = r.offset; at < r.end() && !stop.stop_requested(); at += kChunkBytes)
        if (pread(fd, buffer.data(), size_t(std::min(kChunkBytes, r.end() - at)), off_t(at)) < 0 &&
            errno != EINTR)
          return;  // a hint only: the faults read what is missing
  });
}

DensePrefetch::~DensePrefetch() = default;  // the jthread requests stop and joins

}  // namespace strata
