// Device-side elementwise activations shared by the CUDA kernels (internal to compute/cuda/), so
// every kernel that applies SiLU or σ does so with the same f32 operations: a fused kernel
// (e.g. the activation quantizer's prologue in matmul.cu) is then bitwise the separate steps.
// CUDA's expf is within 2 ulp of the CPU's; the divisions and additions are explicitly rounded.
#pragma once

namespace strata::compute::cuda {

__device__ __forceinline__ float sigmoid_value(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float silu_value(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
// SwiGLU's middle: silu(gate)·up.
__device__ __forceinline__ float silu_mul_value(float gate, float up) { return __fmul_rn(silu_value(gate), up); }
// The hyper-connection's mixing activation: silu(m·scale).
__device__ __forceinline__ float scaled_silu_value(float m, float scale) { return silu_value(__fmul_rn(m, scale)); }

}  // namespace strata::compute::cuda
