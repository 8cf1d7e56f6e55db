// Gated DeltaNet recurrent steps on CUDA. Contract in deltanet.h.
#include "compute/cuda/deltanet.h"

#include <string>

#include "compute/cuda/launch.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kMaxConvKernel = 8;
// The prepare kernel stages the q and k parts of a row in shared memory: within the default limit
// (no opt-in attribute), 16 KiB for the flagship's 16 K heads of 128.
constexpr size_t kMaxPrepareSharedBytes = 48 * 1024;

__global__ void conv_silu_kernel(const float* x, int64_t n_rows, int64_t channels, const float* taps, int kernel,
                                 float* history, float* out) {
  pdl_begin();
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= channels) return;
  float hist[kMaxConvKernel];
  float w[kMaxConvKernel];
  for (int j = 0; j < kernel; ++j) w[j] = taps[ch * kernel + j];
  for (int j = 0; j + 1 < kernel; ++j) hist[j] = history[j * channels + ch];
  for (int64_t t = 0; t < n_rows; ++t) {
    const float current = x[t * channels + ch];
    float sum = 0.0f;
    for (int j = 0; j + 1 < kernel; ++j) sum = __fadd_rn(sum, __fmul_rn(w[j], hist[j]));
    sum = __fadd_rn(sum, __fmul_rn(w[kernel - 1], current));
    out[t * channels + ch] = __fdiv_rn(sum, __fadd_rn(1.0f, expf(-sum)));
    for (int j = 0; j + 2 < kernel; ++j) hist[j] = hist[j + 1];
    if (kernel > 1) hist[kernel - 2] = current;
  }
  for (int j = 0; j + 1 < kernel; ++j) history[j * channels + ch] = hist[j];
}

// Block h = V head; thread j = state column j (of dv). k̂ and q̂ of the token (dk values each)
// are staged in shared memory. The state of head h is [dk][dv], the CPU layout.
__global__ void delta_rule_kernel(const float* q, const float* k, const float* v, const float* beta,
                                  const float* decay, int64_t n_rows, int nk, int nv, int dk, int dv, bool tiled,
                                  float* state, float* out) {
  pdl_begin();
  extern __shared__ float shared[];  // k[dk], q[dk]
  float* ks = shared;
  float* qs = shared + dk;
  const int h = blockIdx.x, j = threadIdx.x;
  const int kh = tiled ? h % nk : h / (nv / nk);
  const int64_t key_dim = int64_t(nk) * dk, value_dim = int64_t(nv) * dv;
  float* S = state + size_t(h) * dk * dv;
  for (int64_t t = 0; t < n_rows; ++t) {
    __syncthreads();  // the previous token's k/q are no longer read
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      ks[i] = k[t * key_dim + kh * dk + i];
      qs[i] = q[t * key_dim + kh * dk + i];
    }
    __syncthreads();
    if (j >= dv) continue;
    const float g = decay[t * nv + h], b = beta[t * nv + h];
    // S ← g·S and (Sᵀk)_j, both in increasing i as the CPU's two loops give them.
    float recalled = 0.0f;
    for (int i = 0; i < dk; ++i) {
      const float s = __fmul_rn(S[i * dv + j], g);
      S[i * dv + j] = s;
      recalled = __fadd_rn(recalled, __fmul_rn(s, ks[i]));
    }
    const float u = __fmul_rn(__fsub_rn(v[t * value_dim + h * dv + j], recalled), b);
    float o = 0.0f;
    for (int i = 0; i < dk; ++i) {
      const float s = __fadd_rn(S[i * dv + j], __fmul_rn(ks[i], u));
      S[i * dv + j] = s;
      o = __fadd_rn(o, __fmul_rn(s, qs[i]));
    }
    if (out) out[t * value_dim + h * dv + j] = o;
  }
}

// The same rule with each thread's state column held in registers for the whole window: one
// coalesced load and one store per state value instead of two of each per token, and the loads
// all in flight at once (the kernel above waits on each). Same operations in the same order, so
// bitwise the kernel above (tests/cuda/deltanet_test.cpp checks both against the CPU). DK is the
// key head dim (the column length); dv <= kRegisterMaxDv threads per block fit the registers.
constexpr int kRegisterMaxDv = 256;

template <int DK>
__global__ void __launch_bounds__(kRegisterMaxDv)
    delta_rule_registers_kernel(const float* q, const float* k, const float* v, const float* beta,
                                const float* decay, int64_t n_rows, int nk, int nv, int dv, bool tiled,
                                float* state, float* out) {
  pdl_begin();
  __shared__ float ks[DK], qs[DK];
  const int h = blockIdx.x, j = threadIdx.x;
  const int kh = tiled ? h % nk : h / (nv / nk);
  const int64_t key_dim = int64_t(nk) * DK, value_dim = int64_t(nv) * dv;
  float* S = state + size_t(h) * DK * dv;
  const bool active = j < dv;
  float column[DK];
  if (active) {
#pragma unroll
    for (int i = 0; i < DK; ++i) column[i] = S[i * dv + j];
  }
  for (int64_t t = 0; t < n_rows; ++t) {
    __syncthreads();  // the previous token's k/q are no longer read
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      ks[i] = k[t * key_dim + kh * DK + i];
      qs[i] = q[t * key_dim + kh * DK + i];
    }
    __syncthreads();
    if (!active) continue;
    const float g = decay[t * nv + h], b = beta[t * nv + h];
    float recalled = 0.0f;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      const float s = __fmul_rn(column[i], g);
      column[i] = s;
      recalled = __fadd_rn(recalled, __fmul_rn(s, ks[i]));
    }
    const float u = __fmul_rn(__fsub_rn(v[t * value_dim + h * dv + j], recalled), b);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      const float s = __fadd_rn(column[i], __fmul_rn(ks[i], u));
      column[i] = s;
      o = __fadd_rn(o, __fmul_rn(s, qs[i]));
    }
    if (out) out[t * value_dim + h * dv + j] = o;
  }
  if (active) {
#pragma unroll
    for (int i = 0; i < DK; ++i) S[i * dv + j] = column[i];
  }
}

template <int DK>
bool launch_registers(const float* q, const float* k, const float* v, const float* beta, const float* decay,
                      int64_t n_rows, int nk, int nv, int dk, int dv, bool tiled, float* state, float* out,
                      cudaStream_t stream) {
  if (dk != DK || dv > kRegisterMaxDv) return false;
  const int threads = (dv + 31) / 32 * 32;
  launch(delta_rule_registers_kernel<DK>, unsigned(nv), threads, 0, stream, q, k, v, beta, decay, n_rows, nk, nv, dv,
         tiled, state, out);
  return true;
}

// Block t = row. The row's q and k parts are staged in shared memory (coalesced), one thread per
// head then sums its squares in sequence (the CPU's order, so the scales are bitwise the CPU's)
// from there, and all threads write the scaled heads, copy v and compute the gates. Staging is
// what makes it fast: the sequential sum reads shared memory instead of waiting on global loads.
__global__ void prepare_kernel(const float* conv_out, const float* beta_raw, const float* alpha_raw, const float* a,
                               const float* dt_bias, int nk, int nv, int dk, int dv, float* q, float* k, float* v,
                               float* beta, float* decay) {
  pdl_begin();
  extern __shared__ float staged[];  // [2·key_dim] q then k, then [2·nk] scales
  const int64_t t = blockIdx.x;
  const int64_t key_dim = int64_t(nk) * dk, value_dim = int64_t(nv) * dv, conv_dim = 2 * key_dim + value_dim;
  const float* row = conv_out + t * conv_dim;
  float* scales = staged + 2 * key_dim;
  for (int64_t i = threadIdx.x; i < 2 * key_dim; i += blockDim.x) staged[i] = row[i];
  __syncthreads();
  const float q_scale = __fdiv_rn(1.0f, __fsqrt_rn(float(dk)));
  for (int head = threadIdx.x; head < 2 * nk; head += blockDim.x) {
    const float* src = staged + int64_t(head) * dk;  // q heads, then k heads
    float sum = 0.0f;
    for (int i = 0; i < dk; ++i) sum = __fadd_rn(sum, __fmul_rn(src[i], src[i]));
    scales[head] = __fdiv_rn(head < nk ? q_scale : 1.0f, __fsqrt_rn(__fadd_rn(sum, 1e-6f)));
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < 2 * key_dim; i += blockDim.x) {
    const float value = __fmul_rn(staged[i], scales[i / dk]);
    if (i < key_dim) q[t * key_dim + i] = value;
    else k[t * key_dim + i - key_dim] = value;
  }
  for (int64_t i = threadIdx.x; i < value_dim; i += blockDim.x) v[t * value_dim + i] = row[2 * key_dim + i];
  for (int h = threadIdx.x; h < nv; h += blockDim.x) {
    const float b = beta_raw[t * nv + h];
    beta[t * nv + h] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b)));
    const float x = __fadd_rn(alpha_raw[t * nv + h], dt_bias[h]);
    const float softplus = x > 20.0f ? x : log1pf(expf(x));
    decay[t * nv + h] = expf(__fmul_rn(a[h], softplus));
  }
}

}  // namespace

void deltanet_prepare(const float* conv_out, const float* beta_raw, const float* alpha_raw, const float* a,
                      const float* dt_bias, int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim,
                      int value_head_dim, float* q, float* k, float* v, float* beta, float* decay,
                      cudaStream_t stream) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || key_head_dim <= 0 || value_head_dim <= 0)
    cuda_fail("CUDA deltanet prepare: expected positive head counts and head dims");
  if (n_rows <= 0) return;
  const size_t staged_bytes = (size_t(2) * n_k_heads * key_head_dim + size_t(2) * n_k_heads) * sizeof(float);
  if (staged_bytes > kMaxPrepareSharedBytes)
    cuda_fail("CUDA deltanet prepare: " + std::to_string(n_k_heads) + " K heads of " + std::to_string(key_head_dim) +
              " need " + std::to_string(staged_bytes) + " bytes of shared memory, above the " +
              std::to_string(kMaxPrepareSharedBytes) + " allowed");
  launch(prepare_kernel, unsigned(n_rows), 256, staged_bytes, stream, conv_out, beta_raw, alpha_raw, a, dt_bias, n_k_heads,
         n_v_heads, key_head_dim, value_head_dim, q, k, v, beta, decay);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void deltanet_conv_silu(const float* x, int64_t n_rows, int64_t channels, const float* taps, int kernel,
                        float* history, float* out, cudaStream_t stream) {
  if (kernel < 1 || kernel > kMaxConvKernel || channels <= 0)
    cuda_fail("CUDA deltanet conv: expected 1 <= kernel <= " + std::to_string(kMaxConvKernel) +
              " and channels > 0, found kernel " + std::to_string(kernel) + ", channels " + std::to_string(channels));
  if (n_rows <= 0) return;
  launch(conv_silu_kernel, unsigned((channels + 255) / 256), 256, 0, stream, x, n_rows, channels, taps, kernel,
         history, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* beta, const float* decay,
                          int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim, int value_head_dim,
                          bool tiled, float* state, float* out, cudaStream_t stream) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || n_v_heads % n_k_heads != 0 || key_head_dim <= 0 ||
      value_head_dim <= 0 || value_head_dim > 1024)
    cuda_fail("CUDA delta rule: expected n_v_heads a multiple of n_k_heads, key_head_dim > 0 and "
              "0 < value_head_dim <= 1024, found " + std::to_string(n_k_heads) + " K heads, " +
              std::to_string(n_v_heads) + " V heads, head dims " + std::to_string(key_head_dim) + " x " +
              std::to_string(value_head_dim));
  if (n_rows <= 0) return;
  const bool registers =
      launch_registers<16>(q, k, v, beta, decay, n_rows, n_k_heads, n_v_heads, key_head_dim, value_head_dim, tiled,
                           state, out, stream) ||
      launch_registers<32>(q, k, v, beta, decay, n_rows, n_k_heads, n_v_heads, key_head_dim, value_head_dim, tiled,
                           state, out, stream) ||
      launch_registers<64>(q, k, v, beta, decay, n_rows, n_k_heads, n_v_heads, key_head_dim, value_head_dim, tiled,
                           state, out, stream) ||
      launch_registers<128>(q, k, v, beta, decay, n_rows, n_k_heads, n_v_heads, key_head_dim, value_head_dim, tiled,
                            state, out, stream);
  if (registers) {
    STRATA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int threads = (value_head_dim + 31) / 32 * 32;
  launch(delta_rule_kernel, unsigned(n_v_heads), threads, size_t(2 * key_head_dim) * sizeof(float), stream, q, k, v,
         beta, decay, n_rows, n_k_heads, n_v_heads, key_head_dim, value_head_dim, tiled, state, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::compute::cuda
