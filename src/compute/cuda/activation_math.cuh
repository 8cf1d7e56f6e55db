// Device-side elementwise activations shared by the CUDA kernels (internal to compute/cuda/), so
// every kernel that applies SiLU or σ does so with the same f32 operations: a fused kernel
// (e.g. the activation quantizer's prologue in matmul.cu) is then bitwise the separate steps.
// CUDA's expf is within 2 ulp of the CPU's; the divisions and additions are explicitly rounded.
#pragma once

#include <cstdint>

namespace strata::compute::cuda {

__device__ __forceinline__ float sigmoid_value(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float silu_value(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
// SwiGLU's middle: silu(gate)·up.
__device__ __forceinline__ float silu_mul_value(float gate, float up) { return __fmul_rn(silu_value(gate), up); }
// The hyper-connection's mixing activation: silu(m·scale).
__device__ __forceinline__ float scaled_silu_value(float m, float scale) { return silu_value(__fmul_rn(m, scale)); }

// Hyper-connection block input x_i of row t (hc_combine): (Σ_s σ(g_{s,i})·xn_{s,i}, s ascending)
// · inv_streams; gates and normed are [rows][n_streams·n_embd].
// One stream's term added to the running sum, streams ascending (hc_combine_value's step; the
// quantizer's register path, matmul.cu load8, takes the same steps on values it loaded first).
__device__ __forceinline__ float hc_combine_step(float sum, float gate, float normed) {
  return __fadd_rn(sum, __fmul_rn(sigmoid_value(gate), normed));
}
__device__ __forceinline__ float hc_combine_value(const float* gates, const float* normed, int n_streams,
                                                  int64_t n_embd, int64_t t, int64_t i, float inv_streams) {
  const int64_t row = t * n_streams * n_embd + i;
  float sum = 0.0f;
  for (int s = 0; s < n_streams; ++s) sum = hc_combine_step(sum, gates[row + s * n_embd], normed[row + s * n_embd]);
  return __fmul_rn(sum, inv_streams);
}
// The block's injection weight from its logit (hc_inject): 2·σ(v·inv_streams).
__device__ __forceinline__ float hc_inject_value(float v, float inv_streams) {
  return __fmul_rn(2.0f, sigmoid_value(__fmul_rn(v, inv_streams)));
}
// The MoE combine's y_t[c] (moe_combine): Σ_j w_tj·out_tj[c] over the row's k experts from 0 in
// the order given, then + gate·shared_t[c] where `shared` is non-null (gate = σ(the row's shared
// gate logit), computed once per row by the caller).
__device__ __forceinline__ float moe_combine_value(const float* out, const float* weights, int k, int64_t n_embd,
                                                   int64_t t, int64_t c, const float* shared, float gate) {
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(weights[t * k + j], out[(t * k + j) * n_embd + c]));
  if (shared) acc = __fadd_rn(acc, __fmul_rn(gate, shared[t * n_embd + c]));
  return acc;
}

}  // namespace strata::compute::cuda
