// Prefill windows: how many prompt rows one window holds on each backend, and the unit the
// windows of a cached conversation are aligned to.
//
// The CPU's window is long because of the routed experts: a 512-expert layer gives each routed
// expert ~10 rows of a 512-row window (~1 of a 64-row one), so the grouped expert kernels decode
// its weights once for many rows (docs/bench-cpu-scaling.md, session 46: the 48 x 512 file's
// 512-token prompt 1.65x faster than in 64-row windows at 2 threads; llama.cpp's batch is 512
// too). CUDA's prefill is measured at 64 (docs/bench-cuda.md).
//
// Exactness: on the CPU a window gives bitwise the results of the kPrefillAlignRows-row windows
// cut from its start (Gated DeltaNet picks its form per 64-row chunk: layers/gated_deltanet.h;
// every other op is row-wise), so any window length that is a multiple of kPrefillAlignRows
// gives the bits of kPrefillAlignRows-row windows. That is what lets `strata chat` and `strata
// serve` prefill in long windows while the conversation state cache (decode/state_cache.h)
// still resumes exactly at every multiple of kPrefillAlignRows.
#pragma once

#include <string_view>

#include "layers/gated_deltanet.h"

namespace strata {

inline constexpr int kPrefillAlignRows = kDeltaRuleChunkRows;
inline constexpr int kCpuPrefillRows = 512;
inline constexpr int kCudaPrefillRows = 64;
static_assert(kCpuPrefillRows % kPrefillAlignRows == 0 &&
              kCudaPrefillRows % kPrefillAlignRows == 0);

// The prefill window of `backend` (a resolved name: "cpu", "cuda").
constexpr int default_prefill_rows(std::string_view backend) {
  return backend == "cpu" ? kCpuPrefillRows : kCudaPrefillRows;
}

}  // namespace strata
