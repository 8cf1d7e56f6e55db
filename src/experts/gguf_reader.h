// GgufExpertReader — an ExpertReader straight over the model's GGUF: no second copy of the
// experts on disk. An expert's gate, up and down matrices are three slices of three different
// tensors (blk.N.ffn_{gate,up,down}_exps), far apart in the file and not 4 KiB-aligned.
//
// Contract (beyond expert_reader.h)
// - O_DIRECT with aligned over-reads: each slice is read as the 4 KiB-aligned span covering it,
//   straight into its region of the arena slot; the slice's bytes then start at the region plus
//   (slice offset mod 4096), so the matrices keep the alignment they have in the file mapping.
//   A span never reaches past the file's end: the part of a slice in the file's last, partial
//   4 KiB block is read through the page cache. Regions are sized for the largest span of any
//   expert of the block (exactly, not a bound).
// - io_uring: one submission per expert — the three slices' reads are submitted together by one
//   job (one io_uring_submit). With pread (no io_uring, or --io-backend pread), one job per slice,
//   so a miss is still spread over up to three I/O threads.
// - Without O_DIRECT (refused by the filesystem, e.g. tmpfs, or --no-direct-io): buffered reads
//   of exactly the slices, same placement; ReadFile prints the one warning.
// - Errors name the GGUF, the tensor, the layer and expert and the file bytes; a file that ends
//   before the slice (truncated after it was opened) says so, with the size it has now.
// - No checksums: the GGUF carries none (the mapped path reads the same bytes unchecked).
//   `gguf` must outlive the reader (it is the model's file).
#pragma once

#include <array>
#include <atomic>

#include "experts/block_reader.h"
#include "experts/expert_reader.h"
#include "experts/read_file.h"

namespace strata {

class GgufExpertReader final : public ExpertReader {
 public:
  // Throws strata::Error when the GGUF is not a file on disk or has no routed experts. `layout`:
  // SidecarLayout::for_gguf(gguf) when the caller has computed it already (null: computed here).
  GgufExpertReader(const GgufFile& gguf, const ReadOptions& options,
                   const SidecarLayout* layout = nullptr);

  const std::string& path() const override { return file_.path(); }
  const char* kind() const override { return "gguf"; }
  const SidecarLayout& layout() const override { return layout_; }
  uint64_t slot_bytes(int block) const override { return blocks_.at(size_t(block)).slot_bytes; }
  ExpertPlacement place(int block, int32_t expert) const override;
  void read_jobs(int block, int32_t expert, uint8_t* slot, std::vector<IoPool::Job>& jobs) override;
  uint64_t read_bytes(int block, int32_t expert) const override;
  uint64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }
  bool direct_io() const override { return file_.direct(); }
  bool io_uring() const override { return io_uring_; }

 private:
  static constexpr uint64_t kAlign = 4096;
  struct Matrix {
    const TensorInfo* tensor = nullptr;
    uint64_t expert_bytes = 0;
    uint64_t region = 0;  // where its region starts inside the slot (a multiple of kAlign)
  };
  struct Block {
    bool present = false;
    std::array<Matrix, 3> matrices;  // gate, up, down
    uint64_t slot_bytes = 0;
  };
  struct Slice {
    uint64_t begin = 0, end = 0;  // file bytes of the expert's matrix
  };
  Slice slice(const Matrix& m, int32_t expert) const;
  // At most two reads per matrix (see add_pieces), three matrices per expert.
  struct Pieces {
    std::array<ReadPiece, 6> reads;
    std::array<int, 6> matrix;  // which matrix each read belongs to
    size_t n = 0;
    void add(const ReadPiece& piece, int m) { reads[n] = piece, matrix[n++] = m; }
  };
  // The reads that bring one matrix's slice into its region: an aligned direct span, and the
  // buffered tail of the file's last partial block when the slice reaches into it.
  void add_pieces(int matrix, const Matrix& m, int32_t expert, uint8_t* slot, bool direct,
                  Pieces& pieces) const;
  void read(int block, int32_t expert, uint8_t* slot, int first_matrix, int n_matrices);

  SidecarLayout layout_;
  ReadFile file_;
  bool io_uring_;
  uint64_t direct_end_;  // reads through O_DIRECT stay below this (the file size rounded down)
  std::vector<Block> blocks_;
  std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace strata
