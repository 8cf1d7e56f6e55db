// CudaBackend — the Backend of compute/backend.h on one CUDA device: each op is a few kernel
// launches on one stream, in the order the forward calls them; nothing returns to the host inside
// a window except `read`. Windows of a shape seen before are recorded once as CUDA graphs and
// replayed (compute/cuda/window_graph.h, bitwise the eager path; STRATA_CUDA_GRAPH=0 runs every
// window eagerly), kernels launch with programmatic dependent launch (launch.cuh), and
// STRATA_CUDA_PROFILE=1 prints the GPU time per op. Host → device copies of a window (token rows,
// positions, PLE rows) go through pinned staging reused per window.
//
// What lives where
// - Window tensors, per-op scratch (a bump arena reset at every op), the uploaded weights (keyed
//   by the host address of the GGUF view, uploaded on first use, shared by all the backends of
//   one model through compute::BackendShared) and the sequence's states are device memory. The
//   states are keyed by layer: this backend keeps layer l's KV cache, DeltaNet conv + recurrent
//   state and the PLE conv history; the host structs keep only the bookkeeping (KvCache::n_tokens,
//   the PLE n-gram context). One backend = one sequence (ModelState owns it).
// - Routed experts: all of a layer's experts are fetched once through the ExpertSource (a
//   publish of every id) into a device arena of slots [gate | up | down] with an identity
//   slot map, the first time the layer runs (issue 15: all experts in VRAM; GPU tiers under a
//   budget are the GPU-window issue's). Each (row, expert) pair is one entry of one grouped
//   launch, so a row's result never depends on the other rows.
// - QSA: block keys, block scores and the token selection of rows over budget run on the device
//   from the window's first position (window_ops.h qsa_select_tokens), so nothing comes back to
//   the host and a replayed window serves any n_past. Blocks tied at the budget boundary are
//   kept as torch's CPU topk keeps them (layers/torch_top_k.h), as on the CPU backend.
// - The MTP head runs on the host, on its own CPU backend (MtpState::backend), over the trunk rows
//   the window runner read back.
//
// Exactness (tests/cuda/backend_test.cpp): rows are independent, and every reduction's order is
// fixed by widths, so a row's logits are bitwise the same in a T = 1 and a T = k window and run
// to run; against the CPU backend within the per-op tolerances of docs/bench-cuda.md.
// Speculative rollback: recorded windows keep a snapshot of each DeltaNet state and the
// window's delta-rule inputs on the device; rollback restores and replays the kept rows, the
// same kernels in the same order, so it is bitwise the state a plain run of the kept rows gives.
//
// Errors: strata::Error naming the op and the sizes (CUDA errors: the call, file:line, CUDA's
// text).
#pragma once

#include <memory>

#include "backends/backend_registry.h"
#include "compute/backend.h"
#include "compute/cuda/expert_tier.h"

namespace strata::compute::cuda {

// A CUDA backend on device 0, keeping the model's device weights in `shared` (one per model).
// Throws when no device is usable.
std::unique_ptr<Backend> make_cuda_backend(BackendShared& shared);
// Registers "cuda" in backends/backend_registry.h (idempotent).
void register_cuda_backend();

// Window-graph counters of a CUDA backend (window_graph.h; zeros for any other backend), for
// tests and benches: windows run, windows replayed from a recording, recordings kept, and the
// host's time in replayed windows from begin_window to the first graph launch (the ops' host
// bookkeeping and input staging, while the GPU waits for the window) with the count of windows it
// sums (a replayed window counts in `replays` once it finished, at the next window).
struct GraphCounters {
  int64_t windows = 0, replays = 0, records = 0, forgotten = 0;
  double replay_host_before_s = 0;
  int64_t replays_launched = 0;
};
GraphCounters graph_counters(const Backend& backend);

// The GPU expert tier of a CUDA backend's model (expert_tier.h), when it runs under a budget
// (BackendShared::gpu_tier); tiered = false otherwise and for any other backend.
struct GpuTierInfo {
  bool tiered = false;
  int slots_per_layer = 0, transient_slots = 0;
  uint64_t arena_bytes = 0;
  GpuTierStats stats;
};
GpuTierInfo gpu_tier_info(const Backend& backend);
// Between windows: the prompt-hot pins of the backend's GPU tier (GpuExpertTier::pin_prompt_hot;
// returns the pins added or dropped) and the reset of its prompt heat. No-ops (0) for a backend
// without a tier, or before its first window.
int gpu_tier_pin_prompt_hot(Backend& backend, const HotPinOptions& options, const UsageHistory* history);
void gpu_tier_reset_prompt_heat(Backend& backend);

}  // namespace strata::compute::cuda
