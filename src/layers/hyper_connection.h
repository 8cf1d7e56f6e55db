// Hyper-connections (qwen4exp `Qwen4ExpTextGatedResidual`): S residual streams X ∈ R^{S·H},
// stream-major, mixed into one block input x ∈ R^H, plus per-stream injection weights for the
// block output. See shared/reference/qwen4exp.md §5:
//   Xn  = G1p(X; hc_norm)            per-stream RMS, full-width weight (GGUF has the +1 folded in)
//   m   = silu(W_down·Xn / S);  G = σ(W_up·m);  x = (1/S) Σ_s G_s ⊙ Xn_s
//   inj = 2·σ(W_inj·Xn / S)          (blocks only; the final/MTP mixers have no inject)
// The caller updates X_s ← X_s + inj_s·y with the unnormalised X.
// Every row is computed independently (window identity holds).
#pragma once

#include <cstdint>
#include <vector>

#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cpu/workspace.h"

namespace strata {

struct HyperConnectionWeights {
  std::vector<float> norm;           // [S·H]
  compute::WeightMatrix down;        // [r x S·H]
  compute::WeightMatrix up;          // [S·H x r]
  compute::WeightMatrix inject;      // [S x S·H]; data == nullptr for a mixer
  bool has_inject() const { return inject.data != nullptr; }
};

// X: [n_rows][S·H]. Writes x: [n_rows][H] and, when the weights have an inject, inject: [n_rows][S].
void hyper_connection_in(compute::ThreadPool& pool, compute::Workspace& ws,
                         const HyperConnectionWeights& w, int n_streams,
                         int64_t n_embd, float eps, const float* X, int64_t n_rows, float* x,
                         float* inject);

// X_s += inject_s · y for every stream s (y: [n_rows][H]).
void hyper_connection_out(int n_streams, int64_t n_embd, const float* y, const float* inject,
                          int64_t n_rows, float* X);

// hyper_connection_out, then hyper_connection_in of the next mixer `next` on the updated X: the
// same bits as the two calls. A window that takes row slices (compute/cpu/row_slices.h) runs both
// per slice in one hand-out; next_inject may be `inject` (each row reads its old inject before
// writing the new one).
void hyper_connection_out_in(compute::ThreadPool& pool, compute::Workspace& ws, int n_streams,
                             int64_t n_embd, const float* y, const float* inject, float* X,
                             const HyperConnectionWeights& next, float eps, int64_t n_rows,
                             float* x, float* next_inject);

}  // namespace strata
