// Gated DeltaNet recurrent steps on CUDA. Contract in deltanet.h.
#include "compute/cuda/deltanet.h"

#include <string>

#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kMaxConvKernel = 8;

__global__ void conv_silu_kernel(const float* x, int64_t n_rows, int64_t channels, const float* taps, int kernel,
                                 float* history, float* out) {
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

// Block h = V head; thread j = state column j. k̂ and q̂ of the token are staged in shared memory.
__global__ void delta_rule_kernel(const float* q, const float* k, const float* v, const float* beta,
                                  const float* decay, int64_t n_rows, int nk, int nv, int d, bool tiled,
                                  float* state, float* out) {
  extern __shared__ float shared[];  // k[d], q[d]
  float* ks = shared;
  float* qs = shared + d;
  const int h = blockIdx.x, j = threadIdx.x;
  const int kh = tiled ? h % nk : h / (nv / nk);
  const int64_t key_dim = int64_t(nk) * d, value_dim = int64_t(nv) * d;
  float* S = state + size_t(h) * d * d;
  for (int64_t t = 0; t < n_rows; ++t) {
    __syncthreads();  // the previous token's k/q are no longer read
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      ks[i] = k[t * key_dim + kh * d + i];
      qs[i] = q[t * key_dim + kh * d + i];
    }
    __syncthreads();
    if (j >= d) continue;
    const float g = decay[t * nv + h], b = beta[t * nv + h];
    // S ← g·S and (Sᵀk)_j, both in increasing i as the CPU's two loops give them.
    float recalled = 0.0f;
    for (int i = 0; i < d; ++i) {
      const float s = __fmul_rn(S[i * d + j], g);
      S[i * d + j] = s;
      recalled = __fadd_rn(recalled, __fmul_rn(s, ks[i]));
    }
    const float u = __fmul_rn(__fsub_rn(v[t * value_dim + h * d + j], recalled), b);
    float o = 0.0f;
    for (int i = 0; i < d; ++i) {
      const float s = __fadd_rn(S[i * d + j], __fmul_rn(ks[i], u));
      S[i * d + j] = s;
      o = __fadd_rn(o, __fmul_rn(s, qs[i]));
    }
    if (out) out[t * value_dim + h * d + j] = o;
  }
}

}  // namespace

void deltanet_conv_silu(const float* x, int64_t n_rows, int64_t channels, const float* taps, int kernel,
                        float* history, float* out, cudaStream_t stream) {
  if (kernel < 1 || kernel > kMaxConvKernel || channels <= 0)
    cuda_fail("CUDA deltanet conv: expected 1 <= kernel <= " + std::to_string(kMaxConvKernel) +
              " and channels > 0, found kernel " + std::to_string(kernel) + ", channels " + std::to_string(channels));
  if (n_rows <= 0) return;
  conv_silu_kernel<<<unsigned((channels + 255) / 256), 256, 0, stream>>>(x, n_rows, channels, taps, kernel, history, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* beta, const float* decay,
                          int64_t n_rows, int n_k_heads, int n_v_heads, int head_dim, bool tiled, float* state,
                          float* out, cudaStream_t stream) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || n_v_heads % n_k_heads != 0 || head_dim <= 0 || head_dim > 1024)
    cuda_fail("CUDA delta rule: expected n_v_heads a multiple of n_k_heads and 0 < head_dim <= 1024, found " +
              std::to_string(n_k_heads) + " K heads, " + std::to_string(n_v_heads) + " V heads, head_dim " +
              std::to_string(head_dim));
  if (n_rows <= 0) return;
  const int threads = (head_dim + 31) / 32 * 32;
  delta_rule_kernel<<<unsigned(n_v_heads), threads, size_t(2 * head_dim) * sizeof(float), stream>>>(
      q, k, v, beta, decay, n_rows, n_k_heads, n_v_heads, head_dim, tiled, state, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::compute::cuda
