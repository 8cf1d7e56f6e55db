// Attention core on CUDA. Contract in attention.h.
#include "compute/cuda/attention.h"

#include <algorithm>
#include <string>

#include "compute/cuda/launch.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kThreads = 256;

// attention.h's split rule, for the kernels and the host alike.
__host__ __device__ inline AttentionSplit split_of(int n_tok) {
  int count = (n_tok + kAttentionSplitTokens - 1) / kAttentionSplitTokens;
  count = count < 1 ? 1 : (count > kAttentionMaxSplits ? kAttentionMaxSplits : count);
  return {count, (n_tok + count - 1) / count};
}

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

// Flash-decoding: block (t, h, z) takes split z of row t's tokens (attention_split); a row of
// one split is finished by its block, a row of several by attention_combine_kernel.
// Partials of (t, h, z) at ((t·n_head + h)·max_splits + z)·(hd + 2): m, l, then acc[hd].

__global__ void attention_split_kernel(AttentionShape s, const float* q, const float* k_cache, const float* v_cache,
                                       int64_t first_pos, const int32_t* first_pos_device, const int32_t* token_lists,
                                       const int32_t* token_counts, int max_tokens, int max_splits, float* partials,
                                       float* out) {
  pdl_begin();
  extern __shared__ float shared[];
  __shared__ float reduce[32];
  const int t = blockIdx.x, h = blockIdx.y, z = blockIdx.z, hd = s.head_dim;
  const bool dense = token_lists == nullptr;
  if (first_pos_device) first_pos = *first_pos_device;
  const int n_tok = dense ? int(first_pos + t + 1) : token_counts[t];
  const AttentionSplit split = split_of(n_tok);
  if (z >= split.count) return;
  const int begin = z * split.tokens, len = min(split.tokens, n_tok - begin);
  if (len <= 0) return;  // not reached for n_tok within the limits (attention_split), kept as a guard
  const int kvh = h / (s.n_head / s.n_head_kv);
  const int q_head_stride = s.gated ? 2 * hd : hd;
  const float* qh = q + size_t(t) * s.q_row_stride + size_t(h) * q_head_stride;
  float* qs = shared;                                          // [hd]
  float* weights = shared + hd;                                // [split.tokens]
  int* tokens = reinterpret_cast<int*>(weights + split.tokens);  // [split.tokens]
  const int32_t* list = dense ? nullptr : token_lists + size_t(t) * max_tokens + begin;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) qs[j] = qh[j];
  for (int i = threadIdx.x; i < len; i += blockDim.x) tokens[i] = dense ? begin + i : list[i];
  __syncthreads();
  // Scores: one thread per token, Σ_j q_j·k_ij in ascending j (the CPU's order, bitwise).
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(float(hd)));
  float m = -INFINITY;
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const float* kt = k_cache + int64_t(tokens[i]) * s.kv_dim + size_t(kvh) * hd;
    float dot = 0.0f;
    if ((hd & 3) == 0 && ((reinterpret_cast<uintptr_t>(kt) | reinterpret_cast<uintptr_t>(qs)) & 15) == 0) {
      const float4* k4 = reinterpret_cast<const float4*>(kt);
      const float4* q4 = reinterpret_cast<const float4*>(qs);
      for (int j = 0; j < hd / 4; ++j) {
        const float4 kv = k4[j], qv = q4[j];
        dot = __fadd_rn(dot, __fmul_rn(qv.x, kv.x));
        dot = __fadd_rn(dot, __fmul_rn(qv.y, kv.y));
        dot = __fadd_rn(dot, __fmul_rn(qv.z, kv.z));
        dot = __fadd_rn(dot, __fmul_rn(qv.w, kv.w));
      }
    } else {
      for (int j = 0; j < hd; ++j) dot = __fadd_rn(dot, __fmul_rn(qs[j], kt[j]));
    }
    const float w = __fmul_rn(dot, scale);
    weights[i] = w;
    m = fmaxf(m, w);
  }
  m = reduce_max(m, reduce);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const float e = expf(__fsub_rn(weights[i], m));
    weights[i] = e;
    sum = __fadd_rn(sum, e);
  }
  const float l = reduce_sum(sum, reduce);  // its barriers also order the weights' writes
  // A row of one split normalises its weights first, w_i = e_i·(1/l), then sums w_i·v_ij: the
  // CPU's order, so up to 128 tokens the result is the one-block kernel's bit for bit. (Summing
  // e_i·v_ij and scaling after moved the tiny qwen3moe's router past a near-tie on the GPU box.)
  // Several splits: acc_j = Σ_i e_i·v_ij over the split's tokens, i ascending, for the combine.
  const bool single = split.count == 1;
  if (single) {
    const float inverse = __fdiv_rn(1.0f, l);
    for (int i = threadIdx.x; i < len; i += blockDim.x) weights[i] = __fmul_rn(weights[i], inverse);
    __syncthreads();
  }
  float* part = partials + ((size_t(t) * s.n_head + h) * max_splits + z) * size_t(hd + 2);
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    const float* vj = v_cache + size_t(kvh) * hd + j;
    float acc = 0.0f;
    int i = 0;
    for (; i + 4 <= len; i += 4) {
      const float v0 = vj[int64_t(tokens[i]) * s.kv_dim], v1 = vj[int64_t(tokens[i + 1]) * s.kv_dim];
      const float v2 = vj[int64_t(tokens[i + 2]) * s.kv_dim], v3 = vj[int64_t(tokens[i + 3]) * s.kv_dim];
      acc = __fadd_rn(acc, __fmul_rn(weights[i], v0));
      acc = __fadd_rn(acc, __fmul_rn(weights[i + 1], v1));
      acc = __fadd_rn(acc, __fmul_rn(weights[i + 2], v2));
      acc = __fadd_rn(acc, __fmul_rn(weights[i + 3], v3));
    }
    for (; i < len; ++i) acc = __fadd_rn(acc, __fmul_rn(weights[i], vj[int64_t(tokens[i]) * s.kv_dim]));
    if (single) {
      if (s.gated) acc = __fmul_rn(acc, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-qh[hd + j]))));
      out[size_t(t) * s.n_head * hd + size_t(h) * hd + j] = acc;
    } else {
      part[2 + j] = acc;
    }
  }
  if (!single && threadIdx.x == 0) {
    part[0] = m;
    part[1] = l;
  }
}

// Block (t, h) of a row with several splits: M = max_z m_z, α_z = e^(m_z − M),
// L = Σ_z α_z·l_z and out_j = (Σ_z α_z·acc_z,j)·(1/L), z ascending; then the gate.
__global__ void attention_combine_kernel(AttentionShape s, const float* q, int64_t first_pos,
                                         const int32_t* first_pos_device, const int32_t* token_counts,
                                         bool dense, int max_splits, const float* partials, float* out) {
  pdl_begin();
  __shared__ float alpha[kAttentionMaxSplits];
  __shared__ float inverse;
  const int t = blockIdx.x, h = blockIdx.y, hd = s.head_dim;
  if (first_pos_device) first_pos = *first_pos_device;
  const int n_tok = dense ? int(first_pos + t + 1) : token_counts[t];
  const AttentionSplit split = split_of(n_tok);
  if (split.count <= 1) return;  // finished by its split block
  const float* part = partials + (size_t(t) * s.n_head + h) * max_splits * size_t(hd + 2);
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int z = 0; z < split.count; ++z) m = fmaxf(m, part[size_t(z) * (hd + 2)]);
    float l = 0.0f;
    for (int z = 0; z < split.count; ++z) {
      const float a = expf(__fsub_rn(part[size_t(z) * (hd + 2)], m));
      alpha[z] = a;
      l = __fadd_rn(l, __fmul_rn(a, part[size_t(z) * (hd + 2) + 1]));
    }
    inverse = __fdiv_rn(1.0f, l);
  }
  __syncthreads();
  const int q_head_stride = s.gated ? 2 * hd : hd;
  const float* qh = q + size_t(t) * s.q_row_stride + size_t(h) * q_head_stride;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float acc = 0.0f;
    for (int z = 0; z < split.count; ++z) acc = __fadd_rn(acc, __fmul_rn(alpha[z], part[size_t(z) * (hd + 2) + 2 + j]));
    acc = __fmul_rn(acc, inverse);
    if (s.gated) acc = __fmul_rn(acc, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-qh[hd + j]))));
    out[size_t(t) * s.n_head * hd + size_t(h) * hd + j] = acc;
  }
}

void launch_attention(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                      const float* v_cache, int64_t first_pos, const int32_t* first_pos_device, int64_t most,
                      const int32_t* token_lists, const int32_t* token_counts, int max_tokens, float* partials,
                      float* out, cudaStream_t stream) {
  if (shape.n_head <= 0 || shape.n_head_kv <= 0 || shape.n_head % shape.n_head_kv != 0 || shape.head_dim <= 0)
    cuda_fail("CUDA attention: expected n_head a multiple of n_head_kv and head_dim > 0, found " +
              std::to_string(shape.n_head) + " / " + std::to_string(shape.n_head_kv) + " heads, head_dim " +
              std::to_string(shape.head_dim));
  if (n_rows <= 0) return;
  if (most > kMaxAttentionTokens)
    cuda_fail("CUDA attention: " + std::to_string(most) + " tokens per row exceed the supported " +
              std::to_string(kMaxAttentionTokens));
  // Every row's split depends on its own token count only; the grid covers the most splits any
  // row of up to `most` tokens has, and blocks past a row's splits return at once. The split rule
  // is monotone in the token count, so `most` also bounds the tokens of any split.
  const AttentionSplit widest = split_of(int(std::max<int64_t>(most, 1)));
  const int max_splits = widest.count;
  const int64_t split_tokens = most <= int64_t(kAttentionSplitTokens) * kAttentionMaxSplits
                                   ? std::min<int64_t>(most, kAttentionSplitTokens)
                                   : widest.tokens;
  if (max_splits > 1 && partials == nullptr)
    cuda_fail("CUDA attention: rows of up to " + std::to_string(most) +
              " tokens need a partials buffer (attention_partial_floats)");
  // At most hd + 2·(kMaxAttentionTokens / kAttentionMaxSplits) words: ~13 KiB, under the default 48.
  const size_t shared = size_t(shape.head_dim) * sizeof(float) + size_t(split_tokens) * (sizeof(float) + sizeof(int));
  launch(attention_split_kernel, dim3(unsigned(n_rows), unsigned(shape.n_head), unsigned(max_splits)), kThreads,
         shared, stream, shape, q, k_cache, v_cache, first_pos, first_pos_device, token_lists, token_counts, max_tokens,
         max_splits, partials, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
  if (max_splits > 1) {
    launch(attention_combine_kernel, dim3(unsigned(n_rows), unsigned(shape.n_head)), kThreads, 0, stream, shape, q,
           first_pos, first_pos_device, token_counts, token_lists == nullptr, max_splits,
           static_cast<const float*>(partials), out);
    STRATA_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void attention_rows(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                    const float* v_cache, int64_t first_pos, const int32_t* token_lists,
                    const int32_t* token_counts, int max_tokens, float* partials, float* out, cudaStream_t stream) {
  launch_attention(shape, q, n_rows, k_cache, v_cache, first_pos, nullptr,
                   token_lists ? max_tokens : first_pos + n_rows, token_lists, token_counts, max_tokens, partials, out,
                   stream);
}

void attention_rows_at(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                       const float* v_cache, const int32_t* first_pos_device, int64_t tokens_bound,
                       const int32_t* token_lists, const int32_t* token_counts, int max_tokens, float* partials,
                       float* out, cudaStream_t stream) {
  if (!first_pos_device) cuda_fail("CUDA attention_rows_at: the first position's device word is missing");
  launch_attention(shape, q, n_rows, k_cache, v_cache, 0, first_pos_device,
                   token_lists ? std::max<int64_t>(max_tokens, tokens_bound) : tokens_bound, token_lists,
                   token_counts, max_tokens, partials, out, stream);
}

AttentionSplit attention_split(int n_tok) { return split_of(n_tok); }

int64_t attention_partial_floats(const AttentionShape& shape, int64_t n_rows, int64_t most_tokens) {
  const int splits = split_of(int(std::clamp<int64_t>(most_tokens, 1, kMaxAttentionTokens))).count;
  return splits > 1 ? n_rows * shape.n_head * splits * int64_t(shape.head_dim + 2) : 0;
}

void kv_append(const float* k, const float* v, int64_t n_rows, int64_t kv_dim, int64_t n_tokens, float* k_cache,
               float* v_cache, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const size_t bytes = size_t(n_rows * kv_dim) * sizeof(float);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(k_cache + n_tokens * kv_dim, k, bytes, cudaMemcpyDeviceToDevice, stream));
  STRATA_CUDA_CHECK(cudaMemcpyAsync(v_cache + n_tokens * kv_dim, v, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace strata::compute::cuda
