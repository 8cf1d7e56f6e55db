// CUDA twins of the elementwise steps of layers/hyper_connection.cpp and of the MoE combine of
// layers/moe.cpp (the matmuls and norms around them are matmul.h / ops.h).
//
// Contract (formulas as the CPU's, each output element by one thread in the CPU's order with
// explicitly rounded f32 operations; σ and silu use CUDA's expf, so they are a few ulp from the
// CPU's, everything else bitwise for the same inputs):
//   hc_scaled_silu:  m = silu(m · inv_streams)                                   (in place)
//   hc_combine:      x_i = (Σ_s σ(g_{s,i})·xn_{s,i}, s ascending) · inv_streams
//   hc_inject:       inj = 2·σ(inj · inv_streams)                                 (in place)
//   hc_out:          X_s += inj_s · y
//   moe_combine_hc_out: moe_combine then hc_out in one launch (y stored too)
//   moe_combine:     y_t = Σ_j w_tj·out_tj over the row's k experts in ascending expert id (the
//                    order route_top_k writes them), from 0, then + σ(gate_logit_t)·shared_t when
//                    shared is given; `out` holds expert j's output for row t at
//                    out + (t·k + j)·n_embd.
// Rows are independent: window identity holds. Device pointers; launches on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::compute::cuda {

void hc_scaled_silu(float* m, int64_t n, float inv_streams, cudaStream_t stream);
// With inject non-null ([n_rows][n_streams]), hc_inject's step on it in the same launch.
void hc_combine(const float* gates, const float* normed, int64_t n_rows, int n_streams, int64_t n_embd,
                float inv_streams, float* x, cudaStream_t stream, float* inject = nullptr);
void hc_inject(float* inject, int64_t n, float inv_streams, cudaStream_t stream);
void hc_out(const float* y, const float* inject, int64_t n_rows, int n_streams, int64_t n_embd, float* X,
            cudaStream_t stream);

// weights [n_rows][k]; shared and shared_gate_logit may be null (no shared expert).
// (moe_combine_value in activation_math.cuh is the per-element arithmetic every launch shares.)
void moe_combine(const float* expert_out, const float* weights, int64_t n_rows, int k, int64_t n_embd,
                 const float* shared, const float* shared_gate_logit, float* y, cudaStream_t stream);

// moe_combine's inputs, for launches that fold the combine into the next step (the backend defers
// it: hyper_connection_out's X update or the next block's norm computes y_t[c] where it reads it).
struct MoeCombineInputs {
  const float* expert_out = nullptr;         // [n_rows·k][n_embd]
  const float* weights = nullptr;            // [n_rows][k]
  int k = 0;
  const float* shared = nullptr;             // [n_rows][n_embd], or null: no shared expert
  const float* shared_gate_logit = nullptr;  // [n_rows], with shared
};
// moe_combine into y, then hc_out with it (X_s += inject_s·y), in one launch: bitwise the two.
void moe_combine_hc_out(const MoeCombineInputs& in, const float* inject, int64_t n_rows, int n_streams,
                        int64_t n_embd, float* y, float* X, cudaStream_t stream);

}  // namespace strata::compute::cuda
