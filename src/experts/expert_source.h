// ExpertSource — where the MoE layer gets a routed expert's three matrices from.
//
// Contract (one layer of one window, called from the window's thread only)
//   observe_routing(layer, routing)  the router's per-row decision (for profiles, traces, stats)
//   begin_layer(layer, experts)      the sorted, unique union of expert ids the window routes to
//   predict(layer + 1, ids)          optional, when wants_prediction(): a read-ahead hint for the
//                                    next layer, most likely first
//   moce() / resident(layer, e)      optional cache-aware routing (route/moce.h): the policy the
//                                    router applies, and the residency it reads
//   next(index, matrices) → true     repeatedly, until it returns false: hands out each expert of
//                                    the union exactly once — resident ones first, then the others
//                                    in the order they arrive — as its index in `experts` and its
//                                    matrices, valid until the following next()/begin_layer call
//
// A source decides where bytes come from (the file mapping, an arena read from the GGUF or the
// sidecar, a GPU arena) and in which order experts are handed out; it must never change which
// experts are used or their values — except through an opt-in MoCE policy (moce()), which the
// router applies, never the source itself. The MoE layer makes its result independent of the hand-out
// order (outputs are combined in ascending expert id), so every source gives bitwise the same
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

struct MocePolicy;

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual void observe_routing(int /*layer*/, const Routing& /*routing*/) {}
  virtual void begin_layer(int layer, std::span<const int32_t> experts) = 0;
  virtual bool next(int& index, ExpertMatrices& out) = 0;
  virtual bool wants_prediction() const { return false; }
  virtual void predict(int /*layer*/, std::span<const int32_t> /*experts*/) {}
  // Cache-aware routing: nullptr (the default) routes exactly. A source that returns a policy
  // changes which experts are used, so it must answer resident() deterministically.
  virtual MocePolicy* moce() { return nullptr; }
  virtual bool resident(int /*layer*/, int32_t /*expert*/) const { return false; }

  // For a tier that copies experts onward (the GPU arena, compute/cuda/expert_tier.h): the host
  // memory every matrix handed out lies in, so that it can be pinned once (empty: unknown), and
  // whether a handed-out pointer stays valid for the source's whole life (false: only until the
  // following next()/begin_layer call, as the contract above says).
  struct HostRegion {
    const uint8_t* data = nullptr;
    size_t bytes = 0;
  };
  virtual std::vector<HostRegion> host_regions() const { return {}; }
  virtual bool pointers_stay_valid() const { return false; }
};

}  // namespace strata
