// ExpertSource — the per-layer handshake between the MoE layer and whoever holds the routed
// experts: the MoE layer publishes which experts the window needs, the source delivers them as
// they become resident. Experts are delivered, never pulled one by one: the source decides what
// is ready and when.
//
// Contract (one layer of one window, called from the window's thread only)
//   observe_routing(layer, routing)  the router's per-row decision (for profiles, traces, stats)
//   publish(layer, experts)          the sorted, unique union of expert ids the window routes to.
//                                    The source resolves hits and misses here and starts the
//                                    misses' reads (before the read-ahead guess below is even
//                                    computed, so the reads get a head start on the router).
//   publish_guess(layer + 1, ids)    optional, when wants_guess(): the read-ahead prediction for
//                                    the next layer, most likely first
//   moce() / resident(layer, e)      optional cache-aware routing (route/moce.h): the policy the
//                                    router applies, and the residency it reads
//   wait() → batch                   blocks until at least one published expert not yet
//                                    delivered is resident, then returns EVERY such expert (its
//                                    index in `experts` and its slot's matrices); empty once all
//                                    were delivered. The first wait returns, without blocking when
//                                    there are any, all the experts that were already resident
//                                    (resident first: the caller computes them while the misses
//                                    load). A batch and its matrices stay valid until the next
//                                    wait() or publish(); each expert is delivered exactly once.
//
// A source decides where bytes come from (the file mapping, an arena read from the GGUF or the
// sidecar, a GPU arena) and when experts are delivered; it must never change which experts are
// used or their values — except through an opt-in MoCE policy (moce()), which the router applies,
// never the source itself. The MoE layer makes its result independent of the delivery order and
// batching (outputs are combined in ascending expert id), so every source gives bitwise the same
// tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compute/cpu/matmul.h"

namespace strata {

struct ExpertMatrices {
  compute::WeightMatrix gate;  // [n_ff x n_embd]
  compute::WeightMatrix up;    // [n_ff x n_embd]
  compute::WeightMatrix down;  // [n_embd x n_ff]
};

// The routing decision of one window: for each row, k expert ids (ascending) and their weights.
struct Routing {
  int k = 0;
  std::vector<int32_t> experts;  // [n_rows][k]
  std::vector<float> weights;    // [n_rows][k]
  int64_t n_rows() const { return k > 0 ? int64_t(experts.size()) / k : 0; }
};

// One delivered expert: its place in the published union and the matrices of the slot holding it.
struct DeliveredExpert {
  int index = 0;
  ExpertMatrices matrices;
};

struct MocePolicy;

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual void observe_routing(int /*layer*/, const Routing& /*routing*/) {}
  virtual void publish(int layer, std::span<const int32_t> experts) = 0;
  virtual std::span<const DeliveredExpert> wait() = 0;
  virtual bool wants_guess() const { return false; }
  virtual void publish_guess(int /*layer*/, std::span<const int32_t> /*experts*/) {}
  // Cache-aware routing: nullptr (the default) routes exactly. A source that returns a policy
  // changes which experts are used, so it must answer resident() deterministically.
  virtual MocePolicy* moce() { return nullptr; }
  virtual bool resident(int /*layer*/, int32_t /*expert*/) const { return false; }

  // For a tier that copies experts onward (the GPU arena, compute/cuda/expert_tier.h): the host
  // memory every matrix handed out lies in, so that it can be pinned once (empty: unknown), and
  // whether a delivered pointer stays valid for the source's whole life (false: only until the
  // next wait()/publish() call, as the contract above says).
  struct HostRegion {
    const uint8_t* data = nullptr;
    size_t bytes = 0;
  };
  virtual std::vector<HostRegion> host_regions() const { return {}; }
  virtual bool pointers_stay_valid() const { return false; }
};

// Every published expert as the source delivers it, one call of fn(index, matrices) each: for a
// consumer that takes one expert at a time (copies into another tier, tools, tests).
template <class Fn>
void for_each_delivered(ExpertSource& source, Fn&& fn) {
  for (std::span<const DeliveredExpert> batch = source.wait(); !batch.empty();
       batch = source.wait())
    for (const DeliveredExpert& d : batch) fn(d.index, d.matrices);
}

}  // namespace strata
