// Resident weights: the GGUF byte ranges a CPU session reads every token, copied at load into
// anonymous memory backed by transparent huge pages, at the very addresses the mapping gave them.
//
// Why: a decode token reads every dense weight and, when all routed experts stay resident, a few
// hundred expert matrices of 0.1-1 MiB scattered over the file. Through the file mapping each
// 4 KiB page is its own TLB entry (a two-level page walk under a hypervisor) and each first touch
// a fault; a 2 MiB huge page covers 512 of them. Measured on the 2-vCPU build box (mid-qwen4exp
// Q4_K, 1.4 GiB, all experts resident, 2 threads, 64 greedy tokens): docs/bench-cpu-decode.md.
// The bytes are the file's, so results never change: only speed and start-up time do.
//
// Contract
// - plan_resident_weights(tensors, file_size, page_bytes, experts_resident): the pages to copy:
//   every tensor's pages except the per-layer token embedding (read by sparse row gathers, and
//   larger than RAM on the flagship) and, unless `experts_resident`, the routed experts (the
//   expert store streams those into its own arena). Pages are widened outward and merged, so a
//   page shared with a tensor left out is copied too (harmless: same bytes). The GgufFile
//   overload plans the file's own tensors with the system's page size.
// - copy_resident_weights(gguf, ranges, threads, progress): copies the ranges in pieces of at most
//   kResidentPieceBytes (cut at 2 MiB-aligned addresses, so no huge page straddles two pieces),
//   `threads` pieces at a time (the calling thread and threads - 1 helpers; threads <= 0: one per
//   hardware thread, at most 16), calling
//   progress(bytes done, bytes total) after each piece, one call at a time (any thread). Returns
//   the bytes copied. A piece whose
//   system calls are refused (no memory, no mremap) stays mapped from the file: speed, not results.
//   REQUIRES: no other thread reads the ranges while it runs (call it at load, before a session).
// - A GgufFile without a file (open_from_memory) copies nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gguf/mapping_advice.h"

namespace strata {

class GgufFile;
struct TensorInfo;

inline constexpr uint64_t kResidentPieceBytes = uint64_t{64} << 20;

std::vector<ByteRange> plan_resident_weights(std::span<const TensorInfo> tensors, uint64_t file_size,
                                             uint64_t page_bytes, bool experts_resident);
std::vector<ByteRange> plan_resident_weights(const GgufFile& gguf, bool experts_resident);

// piece_bytes: a power of two >= the page size (smaller than 2 MiB only in tests).
uint64_t copy_resident_weights(const GgufFile& gguf, std::span<const ByteRange> ranges, int threads = 0,
                               const std::function<void(uint64_t done, uint64_t total)>& progress = {},
                               uint64_t piece_bytes = kResidentPieceBytes);

}  // namespace strata
