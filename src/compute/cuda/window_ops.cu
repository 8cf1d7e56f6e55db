// Small per-window CUDA steps of the backend. Contract in window_ops.h.
#include "compute/cuda/window_ops.h"

#include <string>

#include "compute/cuda/activation_math.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }


__global__ void add_kernel(float* acc, const float* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = __fadd_rn(acc[i], y[i]);
}

__global__ void append_rows_kernel(const float* src, int64_t n, int64_t width, const int32_t* first_row, float* dst) {
  float* to = dst + int64_t(*first_row) * width;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    to[i] = src[i];
}

__global__ void split_beta_alpha_kernel(const float* ba, int64_t n_rows, int nk, int r, float* beta, float* alpha) {
  const int64_t nv = int64_t(nk) * r, n = n_rows * nv;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / nv, h = i % nv, g = h / r, j = h % r;
    const float* row = ba + t * 2 * nv + g * 2 * r;
    beta[i] = row[j];
    alpha[i] = row[r + j];
  }
}

__global__ void gate_kernel(float* o, const float* z, int64_t n, bool sigmoid_gate) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    o[i] = __fmul_rn(o[i], sigmoid_gate ? sigmoid_value(z[i]) : silu_value(z[i]));
}

__global__ void history_tail_kernel(const float* before, const float* rows, int64_t n_rows, int64_t n_hist,
                                    int64_t width, float* out) {
  const int64_t n = n_hist * width;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / width, c = e % width;
    const int64_t idx = n_rows - n_hist + i;  // window-relative
    out[e] = idx >= 0 ? rows[idx * width + c] : before[(n_hist + idx) * width + c];
  }
}

__global__ void block_means_kernel(const float* raw, int64_t first_block, int64_t n_blocks, int ratio, int di,
                                   float* keys) {
  const int64_t n = n_blocks * di;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = first_block + e / di, i = e % di;
    float acc = 0.0f;
    for (int j = 0; j < ratio; ++j) acc = __fadd_rn(acc, raw[(b * ratio + j) * di + i]);
    keys[e] = __fdiv_rn(acc, float(ratio));
  }
}

// One thread per (row, block).
__global__ void block_scores_kernel(const float* index_q, int64_t n_rows, int n_heads, int di, const float* keys,
                                    int64_t first_pos, int ratio, int64_t max_blocks, float scale, float* scores) {
  const int64_t n = n_rows * max_blocks;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / max_blocks, b = e % max_blocks;
    if (b >= (first_pos + t + 1) / ratio) continue;
    const float* key = keys + b * di;
    float sum = 0.0f;
    for (int h = 0; h < n_heads; ++h) {
      const float* q = index_q + (t * n_heads + h) * di;
      float dot = 0.0f;
      for (int i = 0; i < di; ++i) dot = __fadd_rn(dot, __fmul_rn(q[i], key[i]));
      sum = __fadd_rn(sum, fmaxf(dot, 0.0f));
    }
    scores[e] = __fmul_rn(sum, scale);
  }
}

// One block per (row, stream).
__global__ void ple_gate_kernel(const float* keys, const float* queries, const float* values, int n_streams,
                                int64_t n_embd, float* gated) {
  __shared__ float partial[32];
  const int64_t t = blockIdx.x / n_streams, s = blockIdx.x % n_streams;
  const int64_t width = n_streams * n_embd;
  const float* k = keys + t * width + s * n_embd;
  const float* q = queries + t * width + s * n_embd;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) sum = __fmaf_rn(k[i], q[i], sum);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, off));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) partial[warp] = sum;
  __syncthreads();
  float score = partial[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) score = __fadd_rn(score, partial[w]);
  score = __fmul_rn(score, __fdiv_rn(1.0f, __fsqrt_rn(float(n_embd))));
  const float magnitude = __fsqrt_rn(fmaxf(fabsf(score), 1e-6f));
  const float gate = sigmoid_value(score < 0 ? -magnitude : (score > 0 ? magnitude : 0.0f));
  float* out = gated + t * width + s * n_embd;
  const float* v = values + t * n_embd;
  for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) out[i] = __fmul_rn(gate, v[i]);
}

__global__ void ple_conv_kernel(const float* normed, const float* history, const float* taps, const float* gated,
                                int64_t n_rows, int64_t width, int kernel, int dilation, float* X) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  const int64_t history_steps = int64_t(kernel - 1) * dilation;
  for (int64_t t = 0; t < n_rows; ++t) {
    float sum = 0.0f;
    for (int j = 0; j < kernel; ++j) {
      const int64_t idx = t - int64_t(kernel - 1 - j) * dilation;
      const float n = idx >= 0 ? normed[idx * width + c] : history[(history_steps + idx) * width + c];
      sum = __fadd_rn(sum, __fmul_rn(taps[c * kernel + j], n));
    }
    float* x = X + t * width + c;
    *x = __fadd_rn(*x, __fadd_rn(gated[t * width + c], silu_value(sum)));
  }
}

void check_launch() { STRATA_CUDA_CHECK(cudaGetLastError()); }

}  // namespace

void add_rows(float* acc, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(acc, y, n);
  check_launch();
}

void append_rows_at(const float* src, int64_t n_rows, int64_t width, const int32_t* first_row_device, float* dst,
                    cudaStream_t stream) {
  if (n_rows <= 0 || width <= 0) return;
  append_rows_kernel<<<grid_for(n_rows * width), kThreads, 0, stream>>>(src, n_rows * width, width, first_row_device,
                                                                      dst);
  check_launch();
}

void split_beta_alpha(const float* ba, int64_t n_rows, int n_k_heads, int v_per_k, float* beta, float* alpha,
                      cudaStream_t stream) {
  if (n_k_heads <= 0 || v_per_k <= 0)
    cuda_fail("CUDA split_beta_alpha: expected positive head counts, found " + std::to_string(n_k_heads) + " x " +
              std::to_string(v_per_k));
  if (n_rows <= 0) return;
  split_beta_alpha_kernel<<<grid_for(n_rows * n_k_heads * v_per_k), kThreads, 0, stream>>>(ba, n_rows, n_k_heads,
                                                                                             v_per_k, beta, alpha);
  check_launch();
}

void gate_rows(float* o, const float* z, int64_t n, bool sigmoid_gate, cudaStream_t stream) {
  if (n <= 0) return;
  gate_kernel<<<grid_for(n), kThreads, 0, stream>>>(o, z, n, sigmoid_gate);
  check_launch();
}

void history_tail(const float* before, const float* rows, int64_t n_rows, int64_t n_hist, int64_t width, float* out,
                  cudaStream_t stream) {
  if (n_rows < 0 || width <= 0)
    cuda_fail("CUDA history_tail: expected n_rows >= 0 and width > 0, found " + std::to_string(n_rows) + ", " +
              std::to_string(width));
  if (n_hist <= 0) return;
  history_tail_kernel<<<grid_for(n_hist * width), kThreads, 0, stream>>>(before, rows, n_rows, n_hist, width, out);
  check_launch();
}

void qsa_block_means(const float* raw, int64_t first_block, int64_t n_blocks, int ratio, int di, float* keys,
                     cudaStream_t stream) {
  if (ratio <= 0 || di <= 0)
    cuda_fail("CUDA qsa_block_means: expected ratio > 0 and di > 0, found " + std::to_string(ratio) + ", " +
              std::to_string(di));
  if (n_blocks <= 0) return;
  block_means_kernel<<<grid_for(n_blocks * di), kThreads, 0, stream>>>(raw, first_block, n_blocks, ratio, di, keys);
  check_launch();
}

void qsa_block_scores(const float* index_q, int64_t n_rows, int n_heads, int di, const float* block_keys,
                      int64_t first_pos, int ratio, int64_t max_blocks, float scale, float* scores,
                      cudaStream_t stream) {
  if (ratio <= 0 || di <= 0 || n_heads <= 0)
    cuda_fail("CUDA qsa_block_scores: expected ratio, di and heads > 0, found " + std::to_string(ratio) + ", " +
              std::to_string(di) + ", " + std::to_string(n_heads));
  if (n_rows <= 0 || max_blocks <= 0) return;
  block_scores_kernel<<<grid_for(n_rows * max_blocks), kThreads, 0, stream>>>(index_q, n_rows, n_heads, di, block_keys,
                                                                               first_pos, ratio, max_blocks, scale,
                                                                               scores);
  check_launch();
}

void ple_gate(const float* keys, const float* queries, const float* values, int64_t n_rows, int n_streams,
              int64_t n_embd, float* gated, cudaStream_t stream) {
  if (n_streams <= 0 || n_embd <= 0)
    cuda_fail("CUDA ple_gate: expected streams and n_embd > 0");
  if (n_rows <= 0) return;
  ple_gate_kernel<<<unsigned(n_rows * n_streams), kThreads, 0, stream>>>(keys, queries, values, n_streams, n_embd,
                                                                         gated);
  check_launch();
}

void ple_conv(const float* normed, const float* history, const float* taps, const float* gated, int64_t n_rows,
              int64_t width, int kernel, int dilation, float* X, cudaStream_t stream) {
  if (kernel < 1 || dilation < 1 || width <= 0)
    cuda_fail("CUDA ple_conv: expected kernel, dilation and width > 0, found " + std::to_string(kernel) + ", " +
              std::to_string(dilation) + ", " + std::to_string(width));
  if (n_rows <= 0) return;
  ple_conv_kernel<<<unsigned((width + kThreads - 1) / kThreads), kThreads, 0, stream>>>(normed, history, taps, gated,
                                                                                        n_rows, width, kernel,
                                                                                        dilation, X);
  check_launch();
}

}  // namespace strata::compute::cuda
