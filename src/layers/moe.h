// Mixture-of-Experts feed-forward with an optional shared expert (qwen4exp, qwen3next, qwen3moe).
//
//   p = softmax_fp32(W_r·x);  (w, e) = top-k(p) (ties: lower expert id);  w ← w / Σw
//   y = Σ_j w_j·D_{e_j}(silu(G_{e_j}x) ⊙ U_{e_j}x)  [+ σ(w_sg·x)·D_s(silu(G_s x) ⊙ U_s x)]
// Routed experts of a window are processed once each over the rows routed to them (so each
// expert is streamed once per window), in ascending expert id; every row accumulates its
// experts in ascending id, like HF's index_add_, so a row's result does not depend on which
// other rows share the window. Expert bytes come from an ExpertSource.
#pragma once

#include <cstdint>
#include <vector>

#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "experts/expert_source.h"
#include "model/hparams.h"

namespace strata {

struct MoeWeights {
  compute::WeightMatrix router;        // [n_expert x H]
  compute::WeightMatrix shared_gate;   // [n_ff_shexp x H]; data == nullptr without shared expert
  compute::WeightMatrix shared_up;
  compute::WeightMatrix shared_down;   // [H x n_ff_shexp]
  std::vector<float> shared_gate_inp;  // [H], the shared expert's sigmoid gate
  bool has_shared() const { return shared_gate.data != nullptr; }
};

// The routing decision of one window: for each row, k expert ids (ascending) and their weights.
struct Routing {
  int k = 0;
  std::vector<int32_t> experts;  // [n_rows][k]
  std::vector<float> weights;    // [n_rows][k]
};

// Router only: fills `routing` for n_rows rows of x.
void moe_route(compute::ThreadPool& pool, const HParams& hp, const MoeWeights& w, const float* x,
               int64_t n_rows, Routing& routing);

void moe_forward(compute::ThreadPool& pool, const HParams& hp, const MoeWeights& w,
                 ExpertSource& experts, int layer, const float* x, int64_t n_rows, float* y);

}  // namespace strata
