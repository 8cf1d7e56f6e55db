// Backend registry — which compute backends this build has, and making one by name.
// In backends/ with the CPU backend it always has (compute/ below holds only the interface).
//
// Contract
// - "cpu" is always registered. Others register themselves once at start-up, from the executable
//   that links them (the CUDA backend: compute::cuda::register_cuda_backend(), called by main
//   where STRATA_HAVE_CUDA is defined), so strata_core never depends on a GPU library.
// - resolve_backend("auto") is the first registered non-CPU backend whose `usable()` says yes
//   (a device is present), else "cpu". A name that is not registered, or a registered one whose
//   device is missing, throws strata::Error naming it and what this build has.
// - Thread safety: register at start-up, before any other thread asks.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "compute/backend.h"
#include "compute/expert_tier.h"
#include "compute/gpu_memory_plan.h"

namespace strata::compute {

// What the backends of one model share (its uploaded weights, on a GPU): one per Model, kept as
// long as the model (Model::backend_shared), so that every sequence of a model (each serve
// request, each Session::reset) reuses one device copy of the weights. Each backend keeps its own
// entry, created on first use under `mutex`.
// `gpu_tier` (compute/expert_tier.h) is read by a GPU backend when it first needs experts: set it
// before the model's first GPU sequence. `gpu_footprint` (compute/gpu_memory_plan.h, set by
// Model::load) is what a GPU backend checks against its device's free memory, with `gpu_tier`,
// when the model's first GPU sequence starts; unknown (a test's bare BackendShared): no check.
struct BackendShared {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<void>> by_backend;
  GpuTierOptions gpu_tier;
  GpuModelFootprint gpu_footprint;
};

struct BackendEntry {
  std::string name;
  std::function<bool()> usable;                   // a device is present and works
  std::function<std::string()> describe;          // "NVIDIA H200 (sm_90, ...)" or why not usable
  std::function<std::unique_ptr<Backend>(BackendShared&)> make;
};

void register_backend(BackendEntry entry);
std::vector<std::string> backend_names();
// "cpu", a registered name, or "auto" → the name to use (see the contract).
std::string resolve_backend(std::string_view requested);
// A new backend of that (resolved) name, sharing `shared` with the model's other backends.
std::unique_ptr<Backend> make_backend(std::string_view name, BackendShared& shared);

}  // namespace strata::compute
