// GPU memory plan — what a GPU backend will hold on its device for one model, worked out before
// anything is uploaded, and the check that it fits (issue 20, Deliver 2: "dense weights stay in
// VRAM; a budget too small for the dense part fails at start with a message giving the numbers").
// Plain arithmetic, no CUDA: the CUDA backend calls check_gpu_fit with cudaMemGetInfo's free bytes
// when the model's first CUDA sequence starts (compute/cuda/cuda_backend_impl.h), and
// tests/compute/gpu_memory_plan_test.cpp covers it in builds without a GPU.
//
// What is counted
// - Dense weights (GpuModelFootprint::dense_weight_bytes, Model::load fills it): every trunk tensor
//   the CUDA backend uploads — matrices, routers and the output head in their file types, norms and
//   vectors as the f32 the loader made of them. Not the routed experts, not an untied token
//   embedding (the backend dequantizes its rows on the host), not the PLE table (read by rows), not
//   the MTP block (the MTP head runs on the host's CPU backend).
// - The expert arena: with no budget, or one that buys a slot for every expert, every expert in
//   the all-resident layout (cuda_backend_moe.cpp layer_experts); otherwise the tier's arena as
//   GpuExpertTier allocates it (plan_gpu_arena: cache slots + the transient slots of a window of
//   kGpuTierMinWindowRows), with its slot maps.
// - One sequence's working memory for its first windows (GpuModelFootprint::working_bytes): the
//   first chunk of each of the backend's two per-op scratch arenas, the window tensors of a CUDA
//   prefill window (kGpuFirstWindowRows rows, the logits included), each Gated DeltaNet layer's
//   conv and recurrent state and their snapshot for a speculative verify window, each attention
//   layer's KV (and QSA index keys) at the first capacity the backend gives them
//   (kGpuFirstKvTokens), and the PLE conv history with its two copies.
// What is not: the KV caches' growth past kGpuFirstKvTokens (they double as the context grows),
//   further sequences (serve --parallel: each has its own states and scratch), what the driver
//   allocates for lazily loaded kernels and graph executables. An allocation that fails later
//   says so with the numbers (compute/cuda/runtime.cpp DeviceBuffer).
//
// Errors: plan_gpu_arena throws strata::Error for a budget below the smallest arena
// (gpu_tier_slots), and so does check_gpu_fit unless the dense part does not fit either (that is
// reported instead); otherwise check_gpu_fit returns the verdict and, when the model does not fit,
// the message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "compute/expert_tier.h"

namespace strata::compute {

// The CUDA backend's per-op scratch: a bump arena over chunks of at least this many bytes, two of
// them (the ops' and hyper_connection_in's), each taking its first chunk at its first op.
inline constexpr uint64_t kGpuScratchChunkBytes = uint64_t(64) << 20;
inline constexpr int kGpuScratchArenas = 2;
// The first KV capacity the CUDA backend allocates for an attention layer (then it doubles).
inline constexpr int64_t kGpuFirstKvTokens = 256;
// The window rows of the first windows: the CUDA prefill window (engine/prefill_window.h).
inline constexpr int64_t kGpuFirstWindowRows = 64;
// The GPU expert tier is sized for windows of at least this many rows (its transient slots).
inline constexpr int64_t kGpuTierMinWindowRows = 256;
// Slot-map offsets and slots are in these units.
inline constexpr size_t kGpuArenaUnit = 256;

// What one model asks of a GPU besides a budget (Model::load sets it on BackendShared).
struct GpuModelFootprint {
  uint64_t dense_weight_bytes = 0;  // 0: unknown (a backend made without a model): no check
  uint64_t window_bytes = 0;        // the window tensors of a kGpuFirstWindowRows-row window
  uint64_t state_bytes = 0;         // DeltaNet, KV (kGpuFirstKvTokens) and PLE states
  int n_expert = 0, n_expert_used = 0;
  std::vector<ExpertLayerLayout> expert_layers;  // [trunk layer]
  bool known() const { return dense_weight_bytes > 0; }
  uint64_t scratch_bytes() const { return kGpuScratchChunkBytes * kGpuScratchArenas; }
  uint64_t working_bytes() const { return scratch_bytes() + window_bytes + state_bytes; }
};

// One layer's slots in the arena: [gate | up | down], each 16-byte aligned, the slot 256-byte
// aligned; slot s of the layer lies at first_offset + s · slot_bytes.
struct GpuArenaLayer {
  bool present = false;
  size_t up_offset = 0, down_offset = 0, slot_bytes = 0;
  size_t first_offset = 0;
};

// The GPU expert tier's arena (compute/cuda/expert_tier.h): `slots` cache slots per layer with
// experts, then the transient slots, each of the largest layer's slot size.
struct GpuArenaPlan {
  std::vector<GpuArenaLayer> layers;
  uint64_t slot_sum = 0;            // one slot of every layer
  size_t transient_slot_bytes = 0;  // the largest layer's slot
  int transient_slots = 0;          // min(n_expert, k · max_rows)
  int slots = 0;                    // cache slots per layer (set_slots)
  int64_t max_rows = 0;             // the largest window the transient slots are for
  size_t transient_offset = 0;
  uint64_t arena_bytes = 0;
  uint64_t transient_bytes() const { return uint64_t(transient_slots) * transient_slot_bytes; }
  // The smallest arena: 1 slot per layer + the transient slots.
  uint64_t smallest_bytes() const { return slot_sum + transient_bytes(); }
  // Lays `slots` cache slots per layer out (offsets, arena_bytes).
  void set_slots(int slots);
};

// The slot layout of the layers' experts for windows of up to max_rows rows, no slots yet.
// Throws strata::Error when no layer has routed experts or n_expert, k, max_rows < 1.
GpuArenaPlan layout_gpu_arena(const std::vector<ExpertLayerLayout>& layers, int n_expert, int k,
                              int64_t max_rows);
// The cache slots per layer `options` buy on `plan`: slots_per_layer (at most n_expert), else as
// many as (budget − transient) ÷ slot_sum. Throws strata::Error naming the budget and the smallest
// arena when the budget is below it.
int gpu_tier_slots(const GpuTierOptions& options, const GpuArenaPlan& plan, int n_expert);
// layout_gpu_arena + gpu_tier_slots + set_slots: the arena GpuExpertTier allocates.
GpuArenaPlan plan_gpu_arena(const GpuTierOptions& options, int n_expert, int k, int64_t max_rows);
// Whether `options` make a tier (a budget below every expert), or every expert is resident.
bool uses_gpu_tier(const GpuTierOptions& options, int n_expert);
// Bytes of the all-resident arena (a slot for every expert of every layer, and its slot maps).
uint64_t all_resident_arena_bytes(const GpuArenaPlan& layout, int n_expert);

// The check at start: does the model with this tier fit in `free_bytes` of `device`?
struct GpuFit {
  bool fits = true;
  bool tiered = false;
  uint64_t dense_bytes = 0, working_bytes = 0, arena_bytes = 0, need_bytes = 0, free_bytes = 0;
  // The largest --gpu-budget that fits (bytes; 0 when no budget does), and in slots per layer.
  uint64_t largest_budget_bytes = 0;
  int largest_slots = 0;
  bool everything_fits = false;  // every expert fits beside the dense part: no budget needed
  std::string message;           // when it does not fit: why, with the numbers and what to do
};
// REQUIRES: footprint.known() and footprint.expert_layers of the model. `tier`: the session's
// options (its layers are ignored: the footprint's are used). The flag as the user gave it is
// GpuTierOptions::budget_flag; without one the budget is described by its bytes or slots.
GpuFit check_gpu_fit(const std::string& device, uint64_t free_bytes,
                     const GpuModelFootprint& footprint, const GpuTierOptions& tier);

}  // namespace strata::compute
