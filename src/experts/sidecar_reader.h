// SidecarReader — an ExpertReader over the sidecar `<model>.gguf.experts` (sidecar.h): one
// contiguous, 4 KiB-aligned record per expert, so an expert is one O_DIRECT read.
//
// Contract (beyond expert_reader.h)
// - A record larger than `split_bytes` (rounded up to the checksum chunk) is read by several jobs,
//   so a large miss is spread over several I/O threads; inside a job, with io_uring, every 256 KiB
//   checksum chunk is in flight at once.
// - Every chunk read is checked against the sidecar's checksum; a mismatch, a failed read or the
//   file ending early (truncated after open) throws naming the sidecar, layer, expert and bytes.
#pragma once

#include <atomic>

#include "experts/expert_reader.h"
#include "experts/read_file.h"

namespace strata {

class SidecarReader final : public ExpertReader {
 public:
  SidecarReader(Sidecar sidecar, const ReadOptions& options);

  const std::string& path() const override { return sidecar_.path(); }
  const char* kind() const override { return "sidecar"; }
  const SidecarLayout& layout() const override { return sidecar_.layout(); }
  uint64_t slot_bytes(int block) const override;
  ExpertPlacement place(int block, int32_t expert) const override;
  void read_jobs(int block, int32_t expert, uint8_t* slot, std::vector<IoPool::Job>& jobs) override;
  uint64_t read_bytes(int block, int32_t) const override { return slot_bytes(block); }
  uint64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }
  bool direct_io() const override { return file_.direct(); }
  bool io_uring() const override { return io_uring_; }
  const Sidecar& sidecar() const { return sidecar_; }

 private:
  void read_chunk(int block, int32_t expert, uint64_t begin, uint64_t end, uint8_t* dest);

  Sidecar sidecar_;
  ReadFile file_;
  bool io_uring_;
  uint64_t split_bytes_;
  std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace strata
