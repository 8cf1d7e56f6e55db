// Attention core on CUDA. Contract in attention.h.
#include "compute/cuda/attention.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "compute/cuda/launch.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float reduce_max(float v, float* shared) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) total = fmaxf(total, shared[w]);
  return total;
}

__device__ float reduce_sum(float v, float* shared) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) total = __fadd_rn(total, shared[w]);
  return total;
}

// Block (t, h): shared = q_h [hd] | weights [n_tok].
__global__ void attention_kernel(AttentionShape s, const float* q, const float* k_cache, const float* v_cache,
                                 int64_t first_pos, const int32_t* first_pos_device, const int32_t* token_lists,
                                 const int32_t* token_counts, int max_tokens, float* out) {
  pdl_begin();
  extern __shared__ float shared[];
  __shared__ float reduce[32];
  const int t = blockIdx.x, h = blockIdx.y, hd = s.head_dim;
  const int kvh = h / (s.n_head / s.n_head_kv);
  const int q_head_stride = s.gated ? 2 * hd : hd;
  const float* qh = q + size_t(t) * s.q_row_stride + size_t(h) * q_head_stride;
  float* qs = shared;
  float* weights = shared + hd;
  const bool dense = token_lists == nullptr;
  if (first_pos_device) first_pos = *first_pos_device;
  const int n_tok = dense ? int(first_pos + t + 1) : token_counts[t];
  const int32_t* list = dense ? nullptr : token_lists + size_t(t) * max_tokens;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) qs[j] = qh[j];
  __syncthreads();
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(float(hd)));
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n_tok; i += blockDim.x) {
    const int64_t token = dense ? i : list[i];
    const float* kt = k_cache + token * s.kv_dim + size_t(kvh) * hd;
    float dot = 0.0f;
    for (int j = 0; j < hd; ++j) dot = __fadd_rn(dot, __fmul_rn(qs[j], kt[j]));
    const float w = __fmul_rn(dot, scale);
    weights[i] = w;
    m = fmaxf(m, w);
  }
  m = reduce_max(m, reduce);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n_tok; i += blockDim.x) {
    const float e = expf(__fsub_rn(weights[i], m));
    weights[i] = e;
    sum = __fadd_rn(sum, e);
  }
  sum = reduce_sum(sum, reduce);
  const float inverse = __fdiv_rn(1.0f, sum);
  for (int i = threadIdx.x; i < n_tok; i += blockDim.x) weights[i] = __fmul_rn(weights[i], inverse);
  __syncthreads();
  float* o = out + size_t(t) * s.n_head * hd + size_t(h) * hd;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < n_tok; ++i) {
      const int64_t token = dense ? i : list[i];
      acc = __fadd_rn(acc, __fmul_rn(weights[i], v_cache[token * s.kv_dim + size_t(kvh) * hd + j]));
    }
    if (s.gated) {
      const float gate = qh[hd + j];
      acc = __fmul_rn(acc, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gate))));
    }
    o[j] = acc;
  }
}

}  // namespace

namespace {

void launch_attention(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                      const float* v_cache, int64_t first_pos, const int32_t* first_pos_device, int64_t most,
                      const int32_t* token_lists, const int32_t* token_counts, int max_tokens, float* out,
                      cudaStream_t stream) {
  if (shape.n_head <= 0 || shape.n_head_kv <= 0 || shape.n_head % shape.n_head_kv != 0 || shape.head_dim <= 0)
    cuda_fail("CUDA attention: expected n_head a multiple of n_head_kv and head_dim > 0, found " +
              std::to_string(shape.n_head) + " / " + std::to_string(shape.n_head_kv) + " heads, head_dim " +
              std::to_string(shape.head_dim));
  if (n_rows <= 0) return;
  if (most > kMaxAttentionTokens)
    cuda_fail("CUDA attention: " + std::to_string(most) + " tokens per row exceed the supported " +
              std::to_string(kMaxAttentionTokens));
  const size_t shared = size_t(shape.head_dim + most) * sizeof(float);
  static std::once_flag raised;  // allow the weights past the default 48 KiB of shared memory
  std::call_once(raised, [] {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int((kMaxAttentionTokens + 1024) * sizeof(float))));
  });
  const dim3 grid(unsigned(n_rows), unsigned(shape.n_head));
  launch(attention_kernel, grid, kThreads, shared, stream, shape, q, k_cache, v_cache, first_pos, first_pos_device,
         token_lists, token_counts, max_tokens, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention_rows(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                    const float* v_cache, int64_t first_pos, const int32_t* token_lists,
                    const int32_t* token_counts, int max_tokens, float* out, cudaStream_t stream) {
  launch_attention(shape, q, n_rows, k_cache, v_cache, first_pos, nullptr,
                   token_lists ? max_tokens : first_pos + n_rows, token_lists, token_counts, max_tokens, out, stream);
}

void attention_rows_at(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                       const float* v_cache, const int32_t* first_pos_device, int64_t tokens_bound,
                       const int32_t* token_lists, const int32_t* token_counts, int max_tokens, float* out,
                       cudaStream_t stream) {
  if (!first_pos_device) cuda_fail("CUDA attention_rows_at: the first position's device word is missing");
  launch_attention(shape, q, n_rows, k_cache, v_cache, 0, first_pos_device,
                   token_lists ? std::max<int64_t>(max_tokens, tokens_bound) : tokens_bound, token_lists,
                   token_counts, max_tokens, out, stream);
}

void kv_append(const float* k, const float* v, int64_t n_rows, int64_t kv_dim, int64_t n_tokens, float* k_cache,
               float* v_cache, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const size_t bytes = size_t(n_rows * kv_dim) * sizeof(float);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(k_cache + n_tokens * kv_dim, k, bytes, cudaMemcpyDeviceToDevice, stream));
  STRATA_CUDA_CHECK(cudaMemcpyAsync(v_cache + n_tokens * kv_dim, v, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace strata::compute::cuda
