// Hyper-connection and MoE-combine elementwise steps on CUDA. Contract in hyper_connection.h.
#include "compute/cuda/hyper_connection.h"

#include <algorithm>

#include "compute/cuda/activation_math.cuh"
#include "compute/cuda/launch.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20)); }

__global__ void scaled_silu_kernel(float* m, int64_t n, float inv_streams) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    m[i] = scaled_silu_value(m[i], inv_streams);
  }
}

// x = the stream combine of n_rows rows, then (inject non-null) the block's injection weights in
// place: inject[i] = 2·σ(inject[i]·inv_streams) for i < n_inject. One launch for both steps of
// hyper_connection_in after its matmuls (the grid strides over the larger of the two).
__global__ void combine_kernel(const float* gates, const float* normed, int64_t n_rows, int n_streams, int64_t n_embd,
                               float inv_streams, float* x, float* inject, int64_t n_inject) {
  pdl_begin();
  const int64_t total = n_rows * n_embd;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = first; e < total; e += stride)
    x[e] = hc_combine_value(gates, normed, n_streams, n_embd, e / n_embd, e % n_embd, inv_streams);
  for (int64_t i = first; i < n_inject; i += stride) inject[i] = hc_inject_value(inject[i], inv_streams);
}

__global__ void out_kernel(const float* y, const float* inject, int64_t n_rows, int n_streams, int64_t n_embd, float* X) {
  pdl_begin();
  const int64_t width = int64_t(n_streams) * n_embd, total = n_rows * width;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / width, s = (e % width) / n_embd, i = e % n_embd;
    X[e] = __fadd_rn(X[e], __fmul_rn(inject[t * n_streams + s], y[t * n_embd + i]));
  }
}

// One block per row: the shared expert's gate logit is a dot over the row (done on the CPU by
// add_gated_shared; here the caller passes it, computed by a 1-row matvec), then per element
// the routed sum in ascending expert id and the gated shared term.
__global__ void moe_combine_kernel(const float* out, const float* weights, int k, int64_t n_embd, const float* shared,
                                   const float* shared_gate_logit, float* y) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const float gate = shared ? sigmoid_value(shared_gate_logit[t]) : 0.0f;
  for (int64_t c = threadIdx.x; c < n_embd; c += blockDim.x)
    y[t * n_embd + c] = moe_combine_value(out, weights, k, n_embd, t, c, shared, gate);
}

// moe_combine_kernel then out_kernel in one launch: one block per row; each thread computes y_t[c]
// (stored) and adds inject_s·y_t[c] to the row's n_streams streams, the two kernels' operations.
__global__ void moe_combine_out_kernel(MoeCombineInputs in, const float* inject, int n_streams, int64_t n_embd,
                                       float* y, float* X) {
  pdl_begin();
  const int64_t t = blockIdx.x, width = int64_t(n_streams) * n_embd;
  const float gate = in.shared ? sigmoid_value(in.shared_gate_logit[t]) : 0.0f;
  for (int64_t c = threadIdx.x; c < n_embd; c += blockDim.x) {
    const float v = moe_combine_value(in.expert_out, in.weights, in.k, n_embd, t, c, in.shared, gate);
    y[t * n_embd + c] = v;
    for (int s = 0; s < n_streams; ++s) {
      float& dst = X[t * width + s * n_embd + c];
      dst = __fadd_rn(dst, __fmul_rn(inject[t * n_streams + s], v));
    }
  }
}

}  // namespace

void hc_scaled_silu(float* m, int64_t n, float inv_streams, cudaStream_t stream) {
  if (n <= 0) return;
  launch(scaled_silu_kernel, grid_for(n), kThreads, 0, stream, m, n, inv_streams);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void hc_combine(const float* gates, const float* normed, int64_t n_rows, int n_streams, int64_t n_embd,
                float inv_streams, float* x, cudaStream_t stream, float* inject) {
  if (n_rows <= 0) return;
  const int64_t n_inject = inject ? n_rows * n_streams : 0;
  launch(combine_kernel, grid_for(std::max(n_rows * n_embd, n_inject)), kThreads, 0, stream, gates, normed, n_rows,
         n_streams, n_embd, inv_streams, x, inject, n_inject);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void hc_inject(float* inject, int64_t n, float inv_streams, cudaStream_t stream) {
  if (n <= 0) return;
  launch(combine_kernel, grid_for(n), kThreads, 0, stream, nullptr, nullptr, int64_t(0), 1, int64_t(0), inv_streams,
         nullptr, inject, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void hc_out(const float* y, const float* inject, int64_t n_rows, int n_streams, int64_t n_embd, float* X,
            cudaStream_t stream) {
  if (n_rows <= 0) return;
  launch(out_kernel, grid_for(n_rows * n_streams * n_embd), kThreads, 0, stream, y, inject, n_rows, n_streams, n_embd,
         X);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

static void check_moe_combine(const MoeCombineInputs& in, int64_t n_embd) {
  if (in.k <= 0 || n_embd <= 0) cuda_fail("CUDA moe_combine: expected k > 0 and n_embd > 0");
  if ((in.shared == nullptr) != (in.shared_gate_logit == nullptr))
    cuda_fail("CUDA moe_combine: the shared expert's output and gate logit go together");
}

void moe_combine_hc_out(const MoeCombineInputs& in, const float* inject, int64_t n_rows, int n_streams,
                        int64_t n_embd, float* y, float* X, cudaStream_t stream) {
  check_moe_combine(in, n_embd);
  if (n_rows <= 0) return;
  launch(moe_combine_out_kernel, unsigned(n_rows), kThreads, 0, stream, in, inject, n_streams, n_embd, y, X);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void moe_combine(const float* expert_out, const float* weights, int64_t n_rows, int k, int64_t n_embd,
                 const float* shared, const float* shared_gate_logit, float* y, cudaStream_t stream) {
  check_moe_combine(MoeCombineInputs{expert_out, weights, k, shared, shared_gate_logit}, n_embd);
  if (n_rows <= 0) return;
  launch(moe_combine_kernel, unsigned(n_rows), kThreads, 0, stream, expert_out, weights, k, n_embd, shared,
         shared_gate_logit, y);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::compute::cuda
