#include "experts/gguf_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace strata {
namespace {

uint64_t align_down(uint64_t value, uint64_t alignment) {
  return value / alignment * alignment;
}
uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

const std::string& path_on_disk(const GgufFile& gguf) {
  if (gguf.fd() < 0) fail("{}: streaming experts from the GGUF needs a file on disk", gguf.path());
  return gguf.path();
}

}  // namespace

GgufExpertReader::GgufExpertReader(const GgufFile& gguf, const ReadOptions& options,
                                   const SidecarLayout* layout)
    : layout_(layout ? *layout : SidecarLayout::for_gguf(gguf)),
      file_(path_on_disk(gguf), options.direct_io),
      io_uring_(options.io_uring && io_uring_available()),
      direct_end_(align_down(gguf.file_size(), kAlign)) {
  blocks_.resize(layout_.n_block);
  for (uint32_t b = 0; b < layout_.n_block; ++b) {
    if (!layout_.layers[b].present) continue;
    const ExpertTensorInfos infos = find_expert_tensors(gguf, int(b));
    Block& block = blocks_[b];
    block.present = true;
    const TensorInfo* tensors[3] = {infos.gate, infos.up, infos.down};
    for (int m = 0; m < 3; ++m) {
      Matrix& matrix = block.matrices[size_t(m)];
      matrix.tensor = tensors[m];
      matrix.expert_bytes = tensors[m]->n_bytes / layout_.n_expert;
      matrix.region = block.slot_bytes;
      // The widest aligned span any expert's slice needs (slices start at varying offsets mod
      // 4096).
      uint64_t widest = 0;
      for (uint32_t e = 0; e < layout_.n_expert; ++e) {
        const Slice s = slice(matrix, int32_t(e));
        widest = std::max(widest, align_up(s.end, kAlign) - align_down(s.begin, kAlign));
      }
      block.slot_bytes += widest;
    }
  }
}

GgufExpertReader::Slice GgufExpertReader::slice(const Matrix& m, int32_t expert) const {
  const uint64_t begin = m.tensor->file_offset + uint64_t(expert) * m.expert_bytes;
  return Slice{begin, begin + m.expert_bytes};
}

ExpertPlacement GgufExpertReader::place(int block, int32_t expert) const {
  const Block& b = blocks_[size_t(block)];
  uint64_t at[3];
  for (size_t m = 0; m < 3; ++m)
    at[m] = b.matrices[m].region + slice(b.matrices[m], expert).begin % kAlign;
  return ExpertPlacement{at[0], at[1], at[2]};
}

void GgufExpertReader::add_pieces(int matrix, const Matrix& m, int32_t expert, uint8_t* slot,
                                  bool direct, Pieces& pieces) const {
  const Slice s = slice(m, expert);
  const uint64_t span_begin = align_down(s.begin, kAlign);
  uint8_t* region = slot + m.region;  // file byte span_begin lands here
  uint64_t buffered_from = s.begin;
  if (direct) {
    const uint64_t span_end = std::min(align_up(s.end, kAlign), direct_end_);
    if (span_end > span_begin) {
      pieces.add(ReadPiece{file_.direct_fd(), span_begin, span_end - span_begin, region}, matrix);
      buffered_from = span_end;
    }
  }
  if (buffered_from < s.end) {
    pieces.add(ReadPiece{file_.buffered_fd(), buffered_from, s.end - buffered_from,
                         region + (buffered_from - span_begin)},
               matrix);
  }
}

uint64_t GgufExpertReader::read_bytes(int block, int32_t expert) const {
  const Block& b = blocks_.at(size_t(block));
  if (!b.present) return 0;
  const bool direct = file_.direct();
  uint64_t total = 0;
  for (const Matrix& m : b.matrices) {
    const Slice s = slice(m, expert);
    if (!direct) {
      total += s.end - s.begin;
      continue;
    }
    const uint64_t span_begin = align_down(s.begin, kAlign);
    const uint64_t span_end = std::min(align_up(s.end, kAlign), direct_end_);
    total += span_end > span_begin
                 ? (span_end - span_begin) + (s.end > span_end ? s.end - span_end : 0)
                 : s.end - s.begin;
  }
  return total;
}

void GgufExpertReader::read_jobs(int block, int32_t expert, uint8_t* slot,
                                 std::vector<IoPool::Job>& jobs) {
  if (io_uring_) {  // one submission for the whole expert
    jobs.push_back([this, block, expert, slot] { read(block, expert, slot, 0, 3); });
    return;
  }
  for (int m = 0; m < 3; ++m)
    jobs.push_back([this, block, expert, slot, m] { read(block, expert, slot, m, 1); });
}

void GgufExpertReader::read(int block, int32_t expert, uint8_t* slot, int first_matrix,
                            int n_matrices) {
  const Block& b = blocks_[size_t(block)];
  Pieces pieces;
  while (true) {
    const bool direct = file_.direct();
    pieces.n = 0;
    for (int m = first_matrix; m < first_matrix + n_matrices; ++m)
      add_pieces(m, b.matrices[size_t(m)], expert, slot, direct, pieces);
    try {
      read_pieces(io_uring_ ? ReadBackend::IoUring : ReadBackend::Pread,
                  std::span(pieces.reads.data(), pieces.n));
      break;
    } catch (const ReadError& e) {
      const bool failed_direct = pieces.reads[e.piece].fd == file_.direct_fd();
      const Matrix& m = b.matrices[size_t(pieces.matrix[e.piece])];
      const Slice s = slice(m, expert);
      const uint64_t size_now = file_.size_now();
      // A direct read at or past the end of a shortened file can fail with EINVAL as well as
      // return 0: the size the file has now tells truncation from a refused O_DIRECT.
      if (e.error_number == 0 || size_now < s.end)
        fail(
            "{}: tensor {}: layer {} expert {} (file bytes {}..{}): the file ends early: it is {} "
            "bytes now, "
            "the tensor ends at {} (truncated after it was opened?)",
            file_.path(), m.tensor->name, block, expert, s.begin, s.end, size_now,
            m.tensor->file_offset + m.tensor->n_bytes);
      if (e.error_number == EINVAL && failed_direct && file_.refuse_direct(std::strerror(EINVAL)))
        continue;
      fail(
          "{}: tensor {}: reading layer {} expert {} (file bytes {}..{}, {} read at offset {}): {}",
          file_.path(), m.tensor->name, block, expert, s.begin, s.end,
          failed_direct ? "O_DIRECT" : "buffered", e.offset, std::strerror(e.error_number));
    }
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < pieces.n; ++i) bytes += pieces.reads[i].length;
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace strata
