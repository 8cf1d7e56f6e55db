// Mixture-of-Experts feed-forward with an optional shared expert (qwen4exp, qwen3next, qwen3moe).
//
//   p = softmax_fp32(W_r·x);  (w, e) = top-k(p) (ties: lower expert id);  w ← w / Σw
//   y = Σ_j w_j·D_{e_j}(silu(G_{e_j}x) ⊙ U_{e_j}x)  [+ σ(w_sg·x)·D_s(silu(G_s x) ⊙ U_s x)]
// Routed experts of a window are processed once each over the rows routed to them (so each
// expert is streamed once per window), in ascending expert id; every row accumulates its
// experts in ascending id, like HF's index_add_, so a row's result does not depend on which
// other rows share the window. Expert bytes come from an ExpertSource, which may hand experts out
// in any order (resident first, misses as they arrive): each expert's output rows are kept apart
// and combined in ascending id afterwards, so the order never changes a bit of the result. The
// shared expert's gate and up run with the router (one hand-out to the threads), its down right
// after the misses are requested, overlapping their reads.
// Read-ahead: with `next_router` given and a source that wants predictions, the next layer's
// router is applied to this layer's input and its top-k union (most probable first) is passed to
// the source as a hint; it never affects the result.
// Cache-aware routing: when the source returns an enabled MoCE policy (route/moce.h), top-k is
// replaced by moce_select over the source's residency — in the router and in the read-ahead guess
// alike — and sampled windows also compute the exact-routing output for the policy's relMSE.
#pragma once

#include <cstdint>
#include <vector>

#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cpu/workspace.h"
#include "experts/expert_source.h"
#include "layers/dims.h"

namespace strata {

struct MoeWeights {
  compute::WeightMatrix router;        // [n_expert x H]
  compute::WeightMatrix shared_gate;   // [n_ff_shexp x H]; data == nullptr without shared expert
  compute::WeightMatrix shared_up;
  compute::WeightMatrix shared_down;   // [H x n_ff_shexp]
  std::vector<float> shared_gate_inp;  // [H], the shared expert's sigmoid gate
  bool has_shared() const { return shared_gate.data != nullptr; }
};

// Router only: fills `routing` for n_rows rows of x. With `cache_aware` (a source whose moce() is
// enabled) rows are routed by MoCE over its residency of `layer`, counting telemetry when
// `count_stats`; `exact` (optional) receives the true top-k routing too.
// Scratch comes from `ws` throughout (no allocation once the window shape has run, except on the
// opt-in MoCE relMSE sample windows).
void moe_route(compute::ThreadPool& pool, compute::Workspace& ws, const MoeDims& dims,
               const MoeWeights& w, const float* x, int64_t n_rows, Routing& routing,
               ExpertSource* cache_aware = nullptr, int layer = -1, Routing* exact = nullptr,
               bool count_stats = false);

void moe_forward(compute::ThreadPool& pool, compute::Workspace& ws, const MoeDims& dims,
                 const MoeWeights& w, ExpertSource& experts, int layer, const float* x,
                 int64_t n_rows, float* y, const MoeWeights* next_router = nullptr);

// The read-ahead guess for layer `layer`+1: the union over rows of top-k(router_next · x) (or of
// MoCE's choice when `source` has it on), ordered by the best weight any row gives the expert
// (descending; ties by lower id).
// The ids are written to `ids` (cleared first).
void moe_predict(compute::ThreadPool& pool, compute::Workspace& ws, const MoeDims& dims,
                 const MoeWeights& next_router, const float* x, int64_t n_rows,
                 std::vector<int32_t>& ids, ExpertSource* source = nullptr, int next_layer = -1);

}  // namespace strata
