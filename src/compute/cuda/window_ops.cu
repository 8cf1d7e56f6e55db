// Small per-window CUDA steps of the backend. Contract in window_ops.h.
#include "compute/cuda/window_ops.h"

#include <mutex>
#include <string>

#include "compute/cuda/activation_math.cuh"
#include "compute/cuda/launch.cuh"
#include "compute/cuda/runtime.h"
#include "layers/torch_top_k.h"

namespace strata::compute::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }


__global__ void add_kernel(float* acc, const float* y, int64_t n) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = __fadd_rn(acc[i], y[i]);
}

__global__ void append_rows_kernel(const float* src, int64_t n, int64_t width, const int32_t* first_row, float* dst) {
  pdl_begin();
  float* to = dst + int64_t(*first_row) * width;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    to[i] = src[i];
}

__global__ void split_beta_alpha_kernel(const float* ba, int64_t n_rows, int nk, int r, float* beta, float* alpha) {
  pdl_begin();
  const int64_t nv = int64_t(nk) * r, n = n_rows * nv;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / nv, h = i % nv, g = h / r, j = h % r;
    const float* row = ba + t * 2 * nv + g * 2 * r;
    beta[i] = row[j];
    alpha[i] = row[r + j];
  }
}

__global__ void gate_kernel(float* o, const float* z, int64_t n, bool sigmoid_gate) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    o[i] = __fmul_rn(o[i], sigmoid_gate ? sigmoid_value(z[i]) : silu_value(z[i]));
}

__global__ void history_tail_kernel(const float* before, const float* rows, int64_t n_rows, int64_t n_hist,
                                    int64_t width, float* out) {
  pdl_begin();
  const int64_t n = n_hist * width;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / width, c = e % width;
    const int64_t idx = n_rows - n_hist + i;  // window-relative
    out[e] = idx >= 0 ? rows[idx * width + c] : before[(n_hist + idx) * width + c];
  }
}

__global__ void block_means_kernel(const float* raw, int64_t first_block, int64_t n_blocks, int ratio, int di,
                                   float* keys) {
  pdl_begin();
  const int64_t n = n_blocks * di;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = first_block + e / di, i = e % di;
    float acc = 0.0f;
    for (int j = 0; j < ratio; ++j) acc = __fadd_rn(acc, raw[(b * ratio + j) * di + i]);
    keys[e] = __fdiv_rn(acc, float(ratio));
  }
}

// One thread per (row, block).
// The window's first position is *first_pos_device when that is given (a replayed window's).
__global__ void block_scores_kernel(const float* index_q, int64_t n_rows, int n_heads, int di, const float* keys,
                                    int64_t first_pos, const int32_t* first_pos_device, int ratio,
                                    int64_t max_blocks, float scale, float* scores) {
  pdl_begin();
  if (first_pos_device) first_pos = *first_pos_device;
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

// Scores as unsigned keys in the float order (larger score, larger key; −0 counts as +0).
__device__ __forceinline__ uint32_t score_key(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of `flag` over the block's threads (thread order) and the block total;
// `warp_totals` holds 32 ints. Integer counts: the result is exact, whatever the scheduling.
__device__ int block_prefix_count(bool flag, int* warp_totals, int& total) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = int(blockDim.x >> 5);
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  __syncthreads();  // warp_totals may still be read from the previous call
  if (lane == 0) warp_totals[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < n_warps; ++w) {
    if (w < warp) before += warp_totals[w];
    total += warp_totals[w];
  }
  return before;
}

// One block per row (kSelectThreads threads). Row t sits at position first + t and sees
// n_blocks = (first + t + 1) / ratio complete blocks. Within budget: tokens 0 .. first + t.
// Over budget: the budget best blocks by score, their tokens in ascending order, then the tail of
// the incomplete block. A most-significant-digit radix select on score_key finds the threshold
// key, how many of its ties to take and how many there are; when every tie is taken (or none
// ties) the set is unique, otherwise one thread runs torch's CPU selection (layers/torch_top_k.h)
// on the row, so tied blocks are kept exactly as torch and the CPU backend keep them.
constexpr int kSelectThreads = 256;
constexpr size_t kSelectSharedLimit = size_t(160) << 10;  // 12288 blocks (48 Ki tokens at ratio 4) need 108 KiB
__global__ void select_tokens_kernel(const float* scores, int64_t max_blocks, const int32_t* first_pos, int ratio,
                                     int64_t budget_blocks, int max_tokens, int32_t* lists, int32_t* counts) {
  pdl_begin();
  // The row's scores, torch's index array and the kept flags, in shared memory: the selection
  // passes and torch's sequential algorithm read them many times.
  extern __shared__ float row[];  // [max_blocks]
  auto* order = reinterpret_cast<int32_t*>(row + max_blocks);
  auto* kept = reinterpret_cast<uint8_t*>(order + max_blocks);
  __shared__ int histogram[256];
  __shared__ int warp_totals[32];
  __shared__ uint32_t chosen[3];  // threshold prefix, ties still to take, ties at the threshold
  const int64_t t = blockIdx.x, n_visible = int64_t(*first_pos) + t + 1, n_blocks = n_visible / ratio;
  int32_t* list = lists + t * max_tokens;
  if (n_blocks <= budget_blocks) {
    for (int64_t i = threadIdx.x; i < n_visible; i += blockDim.x) list[i] = int32_t(i);
    if (threadIdx.x == 0) counts[t] = int32_t(n_visible);
    return;
  }
  for (int64_t b = threadIdx.x; b < n_blocks; b += blockDim.x) row[b] = scores[t * max_blocks + b];
  __syncthreads();
  uint32_t prefix = 0, mask = 0;
  int remaining = int(budget_blocks);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0;
    __syncthreads();
    for (int64_t b = threadIdx.x; b < n_blocks; b += blockDim.x) {
      const uint32_t key = score_key(row[b]);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // the digit holding the remaining-th largest key
      int above = 0, digit = 255;
      for (; digit > 0 && above + histogram[digit] < remaining; --digit) above += histogram[digit];
      chosen[0] = prefix | (uint32_t(digit) << shift);
      chosen[1] = uint32_t(remaining - above);
      chosen[2] = uint32_t(histogram[digit]);
    }
    __syncthreads();
    prefix = chosen[0];
    remaining = int(chosen[1]);
    mask |= 255u << shift;
    __syncthreads();
  }
  const uint32_t threshold = prefix;
  // Ties straddle the boundary: torch's own selection decides which of them stay.
  const bool torch_order = int(chosen[2]) > remaining;
  if (torch_order) {
    for (int64_t b = threadIdx.x; b < n_blocks; b += blockDim.x) {
      order[b] = int32_t(b);
      kept[b] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      torch_top_k::torch_top_k_permute(order, n_blocks, budget_blocks,
                                       [values = static_cast<const float*>(row)](int32_t a, int32_t b) {
                                         return values[a] > values[b];
                                       });
      for (int64_t i = 0; i < budget_blocks; ++i) kept[order[i]] = 1;
    }
    __syncthreads();
  }
  int ties_before = 0, selected_before = 0;
  for (int64_t base = 0; base < n_blocks; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    const uint32_t key = b < n_blocks ? score_key(row[b]) : 0u;
    const bool tie = b < n_blocks && key == threshold;
    int ties_total = 0, selected_total = 0;
    const int tie_rank = ties_before + block_prefix_count(tie, warp_totals, ties_total);
    const bool selected =
        b < n_blocks && (torch_order ? kept[b] != 0 : (key > threshold || (tie && tie_rank < remaining)));
    const int slot = selected_before + block_prefix_count(selected, warp_totals, selected_total);
    if (selected)
      for (int j = 0; j < ratio; ++j) list[int64_t(slot) * ratio + j] = int32_t(b * ratio + j);
    ties_before += ties_total;
    selected_before += selected_total;
  }
  const int64_t head = budget_blocks * ratio, tail = n_visible - n_blocks * ratio;
  for (int64_t i = threadIdx.x; i < tail; i += blockDim.x) list[head + i] = int32_t(n_blocks * ratio + i);
  if (threadIdx.x == 0) counts[t] = int32_t(head + tail);
}

// One block per (row, stream).
__global__ void ple_gate_kernel(const float* keys, const float* queries, const float* values, int n_streams,
                                int64_t n_embd, float* gated) {
  pdl_begin();
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
  pdl_begin();
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
  launch(add_kernel, grid_for(n), kThreads, 0, stream, acc, y, n);
  check_launch();
}

void append_rows_at(const float* src, int64_t n_rows, int64_t width, const int32_t* first_row_device, float* dst,
                    cudaStream_t stream) {
  if (n_rows <= 0 || width <= 0) return;
  launch(append_rows_kernel, grid_for(n_rows * width), kThreads, 0, stream, src, n_rows * width, width,
         first_row_device, dst);
  check_launch();
}

void split_beta_alpha(const float* ba, int64_t n_rows, int n_k_heads, int v_per_k, float* beta, float* alpha,
                      cudaStream_t stream) {
  if (n_k_heads <= 0 || v_per_k <= 0)
    cuda_fail("CUDA split_beta_alpha: expected positive head counts, found " + std::to_string(n_k_heads) + " x " +
              std::to_string(v_per_k));
  if (n_rows <= 0) return;
  launch(split_beta_alpha_kernel, grid_for(n_rows * n_k_heads * v_per_k), kThreads, 0, stream, ba, n_rows, n_k_heads,
         v_per_k, beta, alpha);
  check_launch();
}

void gate_rows(float* o, const float* z, int64_t n, bool sigmoid_gate, cudaStream_t stream) {
  if (n <= 0) return;
  launch(gate_kernel, grid_for(n), kThreads, 0, stream, o, z, n, sigmoid_gate);
  check_launch();
}

void history_tail(const float* before, const float* rows, int64_t n_rows, int64_t n_hist, int64_t width, float* out,
                  cudaStream_t stream) {
  if (n_rows < 0 || width <= 0)
    cuda_fail("CUDA history_tail: expected n_rows >= 0 and width > 0, found " + std::to_string(n_rows) + ", " +
              std::to_string(width));
  if (n_hist <= 0) return;
  launch(history_tail_kernel, grid_for(n_hist * width), kThreads, 0, stream, before, rows, n_rows, n_hist, width,
         out);
  check_launch();
}

void qsa_block_means(const float* raw, int64_t first_block, int64_t n_blocks, int ratio, int di, float* keys,
                     cudaStream_t stream) {
  if (ratio <= 0 || di <= 0)
    cuda_fail("CUDA qsa_block_means: expected ratio > 0 and di > 0, found " + std::to_string(ratio) + ", " +
              std::to_string(di));
  if (n_blocks <= 0) return;
  launch(block_means_kernel, grid_for(n_blocks * di), kThreads, 0, stream, raw, first_block, n_blocks, ratio, di,
         keys);
  check_launch();
}

namespace {
// Both entry points: the window's first position from the host or from device memory.
void launch_block_scores(const char* name, const float* index_q, int64_t n_rows, int n_heads, int di,
                         const float* block_keys, int64_t first_pos, const int32_t* first_pos_device, int ratio,
                         int64_t max_blocks, float scale, float* scores, cudaStream_t stream) {
  if (ratio <= 0 || di <= 0 || n_heads <= 0)
    cuda_fail(std::string("CUDA ") + name + ": expected ratio, di and heads > 0, found " + std::to_string(ratio) +
              ", " + std::to_string(di) + ", " + std::to_string(n_heads));
  if (n_rows <= 0 || max_blocks <= 0) return;
  launch(block_scores_kernel, grid_for(n_rows * max_blocks), kThreads, 0, stream, index_q, n_rows, n_heads, di,
         block_keys, first_pos, first_pos_device, ratio, max_blocks, scale, scores);
  check_launch();
}
}  // namespace

void qsa_block_scores(const float* index_q, int64_t n_rows, int n_heads, int di, const float* block_keys,
                      int64_t first_pos, int ratio, int64_t max_blocks, float scale, float* scores,
                      cudaStream_t stream) {
  launch_block_scores("qsa_block_scores", index_q, n_rows, n_heads, di, block_keys, first_pos, nullptr, ratio,
                      max_blocks, scale, scores, stream);
}

void qsa_block_scores_at(const float* index_q, int64_t n_rows, int n_heads, int di, const float* block_keys,
                         const int32_t* first_pos_device, int ratio, int64_t max_blocks, float scale, float* scores,
                         cudaStream_t stream) {
  launch_block_scores("qsa_block_scores_at", index_q, n_rows, n_heads, di, block_keys, 0, first_pos_device, ratio,
                      max_blocks, scale, scores, stream);
}

void qsa_select_tokens(const float* scores, int64_t n_rows, int64_t max_blocks, const int32_t* first_pos_device,
                       int ratio, int64_t budget_blocks, int max_tokens, int32_t* token_lists, int32_t* token_counts,
                       cudaStream_t stream) {
  if (ratio <= 0 || budget_blocks <= 0 || max_tokens < (budget_blocks + 1) * ratio - 1)
    cuda_fail("CUDA qsa_select_tokens: expected ratio > 0, budget > 0 and max_tokens >= (budget + 1)·ratio − 1, "
              "found ratio " + std::to_string(ratio) + ", budget " + std::to_string(budget_blocks) +
              ", max_tokens " + std::to_string(max_tokens));
  if (n_rows <= 0) return;
  const size_t shared = size_t(max_blocks) * (sizeof(float) + sizeof(int32_t) + 1);
  if (shared > kSelectSharedLimit)
    cuda_fail("CUDA qsa_select_tokens: " + std::to_string(max_blocks) + " blocks per row need " +
              std::to_string(shared) + " bytes of shared memory, more than the " + std::to_string(kSelectSharedLimit) +
              " allowed");
  static std::once_flag raised;  // past the default 48 KiB of shared memory
  std::call_once(raised, [] {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(select_tokens_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(kSelectSharedLimit)));
  });
  launch(select_tokens_kernel, unsigned(n_rows), kSelectThreads, shared, stream, scores, max_blocks, first_pos_device,
         ratio, budget_blocks, max_tokens, token_lists, token_counts);
  check_launch();
}

void ple_gate(const float* keys, const float* queries, const float* values, int64_t n_rows, int n_streams,
              int64_t n_embd, float* gated, cudaStream_t stream) {
  if (n_streams <= 0 || n_embd <= 0)
    cuda_fail("CUDA ple_gate: expected streams and n_embd > 0");
  if (n_rows <= 0) return;
  launch(ple_gate_kernel, unsigned(n_rows * n_streams), kThreads, 0, stream, keys, queries, values, n_streams, n_embd,
         gated);
  check_launch();
}

void ple_conv(const float* normed, const float* history, const float* taps, const float* gated, int64_t n_rows,
              int64_t width, int kernel, int dilation, float* X, cudaStream_t stream) {
  if (kernel < 1 || dilation < 1 || width <= 0)
    cuda_fail("CUDA ple_conv: expected kernel, dilation and width > 0, found " + std::to_string(kernel) + ", " +
              std::to_string(dilation) + ", " + std::to_string(width));
  if (n_rows <= 0) return;
  launch(ple_conv_kernel, unsigned((width + kThreads - 1) / kThreads), kThreads, 0, stream, normed, history, taps,
         gated, n_rows, width, kernel, dilation, X);
  check_launch();
}

}  // namespace strata::compute::cuda
