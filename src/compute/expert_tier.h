// GPU expert tier settings — what a GPU backend needs to hold routed experts under a memory
// budget (the arena of compute/cuda/expert_tier.h): the budget, read-ahead, the shape of each
// layer's experts (so the arena can be laid out before the first window), and the startup fill
// (a profile's or the usage history's ranking, as the RAM arena is filled from it). Set on the model's
// compute::BackendShared before its first GPU sequence (cli/expert_options.h, benches, tests);
// the default (no budget) keeps every expert resident on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "quant/ggml_type.h"

namespace strata::compute {

struct ExpertMatrixLayout {
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0, n_out = 0;
  size_t row_stride_bytes = 0;
  size_t bytes() const { return size_t(n_out) * row_stride_bytes; }
};

struct ExpertLayerLayout {
  bool present = false;  // the layer has routed experts
  ExpertMatrixLayout gate, up, down;
  size_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

struct GpuTierOptions {
  uint64_t budget_bytes = 0;  // the arena: cache slots + the transient slots of the largest window
  int slots_per_layer = 0;    // > 0: exactly this many cache slots per layer (overrides the budget)
  bool read_ahead = true;     // the next layer's router guess fills its slots while a layer runs
  // A layer whose routed experts all have cache slots in the device's slot map goes on without
  // waiting for the host (which still resolves it, in order). On by default since session 53
  // (docs/bench-cuda.md: 1.03-1.05x at the skewed 25 % budget once the read-ahead kernel's blocks
  // stopped reading the job header across PCIe); STRATA_TIER_SELF_RELEASE=1 or 0 overrides this.
  bool self_release = true;
  std::vector<ExpertLayerLayout> layers;  // [layer], the trunk's layers
  // Startup fill (SlotResidency::fill): per layer, the experts most wanted first; each layer's
  // first `slots` are copied in when the arena is made, and its first `fill_pinned` pinned.
  // Empty: the arena starts empty.
  std::vector<std::vector<int32_t>> fill_ranking;
  int fill_pinned = 0;
  // Cache-aware routing (MoCE, route/moce.h) against the GPU arena's residency: lambda > 0 turns it
  // on (it changes tokens); protect and max_rank as MoceOptions.
  double moce_lambda = 0.0;
  int moce_protect = 1, moce_max_rank = 0;
  // The budget as the user gave it ("--gpu-budget 50%", "--gpu-slots-per-layer 8"), for messages
  // (compute/gpu_memory_plan.h check_gpu_fit); empty: described by budget_bytes or slots_per_layer.
  std::string budget_flag;
  // A budget below "every expert": the arena, its slot map and the per-layer handshake.
  bool tiered() const { return budget_bytes > 0 || slots_per_layer > 0; }
  uint64_t all_expert_bytes(int n_expert) const {
    uint64_t total = 0;
    for (const ExpertLayerLayout& l : layers) total += l.present ? uint64_t(l.bytes()) * uint64_t(n_expert) : 0;
    return total;
  }
};

}  // namespace strata::compute
