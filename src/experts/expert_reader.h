// ExpertReader — where the ExpertStore's bytes come from: the sidecar (one contiguous record per
// expert, sidecar_reader.h) or the GGUF itself (three slices per expert, gguf_reader.h).
//
// Contract
// - `layout()` is the model's expert layout (blocks with routed experts, expert count, each
//   matrix's type and bytes, the model identity): the same for every reader of one model.
// - `slot_bytes(block)` is the arena bytes one expert of that block needs (a multiple of 4096; 0
//   for a block without routed experts). `place(block, expert)` says where gate, up and down begin
//   inside the slot once the expert is read (they may differ from expert to expert).
// - `read_jobs(block, expert, slot, jobs)` appends the I/O jobs that fill `slot` (4096-aligned,
//   slot_bytes(block) long) with that expert's bytes, verbatim from the GGUF tensors. The jobs may
//   run in parallel on any I/O threads; each throws strata::Error naming the file, layer and
//   expert (and the tensor or the record's byte range) on a failed, short or corrupt read.
// - `read_bytes(block, expert)` is what reading that expert requests from the file (alignment
//   over-reads included); `bytes_read()` counts every byte the jobs requested so far.
// - Thread-safe for the jobs; everything else is immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experts/io_pool.h"
#include "experts/sidecar.h"

namespace strata {

// How a reader reads (ExpertStoreOptions carries the user's choice).
struct ReadOptions {
  bool direct_io = true;
  bool io_uring = true;               // used only when io_uring_available()
  uint64_t split_bytes = 512 * 1024;  // sidecar: a record larger than this is read by several jobs
};

// Where one expert's three matrices begin inside its slot.
struct ExpertPlacement {
  uint64_t gate = 0, up = 0, down = 0;
};

class ExpertReader {
 public:
  virtual ~ExpertReader() = default;
  virtual const std::string& path() const = 0;
  virtual const char* kind() const = 0;  // "sidecar" | "gguf"
  virtual const SidecarLayout& layout() const = 0;
  virtual uint64_t slot_bytes(int block) const = 0;
  virtual ExpertPlacement place(int block, int32_t expert) const = 0;
  virtual void read_jobs(int block, int32_t expert, uint8_t* slot,
                         std::vector<IoPool::Job>& jobs) = 0;
  virtual uint64_t read_bytes(int block, int32_t expert) const = 0;
  virtual uint64_t bytes_read() const = 0;
  virtual bool direct_io() const = 0;
  virtual bool io_uring() const = 0;

  // The arena bytes that hold every expert: what a budget of 100% means for this reader (the
  // GGUF's slots are slightly larger than sidecar records, so a share buys the same slots either
  // way).
  uint64_t all_experts_bytes() const {
    uint64_t per_expert = 0;
    for (uint32_t b = 0; b < layout().n_block; ++b) per_expert += slot_bytes(int(b));
    return per_expert * layout().n_expert;
  }
};

}  // namespace strata
