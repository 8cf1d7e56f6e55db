// Gated DeltaNet steps on CUDA (conv, prepare, the recurrent and the chunked delta rule). Contract
// in deltanet.h.
#include "compute/cuda/deltanet.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "compute/cuda/launch.cuh"
#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

constexpr int kMaxConvKernel = 8;
// The prepare kernel stages the q and k parts of a row in shared memory: within the default limit
// (no opt-in attribute), 16 KiB for the flagship's 16 K heads of 128.
constexpr size_t kMaxPrepareSharedBytes = 48 * 1024;

// One channel's causal depthwise conv + SiLU over the window's rows, taps oldest first with
// explicitly rounded operations (deltanet.h); store(t, value) takes row t's output, and the
// channel's history ends as its last K-1 inputs. Shared by conv_silu_kernel and
// conv_prepare_kernel, so the two give the same bits.
template <class Store>
__device__ __forceinline__ void conv_silu_channel(const float* x, int64_t n_rows, int64_t channels, const float* taps,
                                                  int kernel, float* history, int64_t ch, Store store) {
  float hist[kMaxConvKernel];
  float w[kMaxConvKernel];
  for (int j = 0; j < kernel; ++j) w[j] = taps[ch * kernel + j];
  for (int j = 0; j + 1 < kernel; ++j) hist[j] = history[j * channels + ch];
  for (int64_t t = 0; t < n_rows; ++t) {
    const float current = x[t * channels + ch];
    float sum = 0.0f;
    for (int j = 0; j + 1 < kernel; ++j) sum = __fadd_rn(sum, __fmul_rn(w[j], hist[j]));
    sum = __fadd_rn(sum, __fmul_rn(w[kernel - 1], current));
    store(t, __fdiv_rn(sum, __fadd_rn(1.0f, expf(-sum))));
    for (int j = 0; j + 2 < kernel; ++j) hist[j] = hist[j + 1];
    if (kernel > 1) hist[kernel - 2] = current;
  }
  for (int j = 0; j + 1 < kernel; ++j) history[j * channels + ch] = hist[j];
}

__global__ void conv_silu_kernel(const float* x, int64_t n_rows, int64_t channels, const float* taps, int kernel,
                                 float* history, float* out) {
  pdl_begin();
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= channels) return;
  conv_silu_channel(x, n_rows, channels, taps, kernel, history, ch,
                    [&](int64_t t, float value) { out[t * channels + ch] = value; });
}

// The L2 scale of one q or k head of d values: Σv² in sequence (the CPU's l2_normalize order),
// then extra/√(Σ + 1e-6) with extra = 1/√d for q, 1 for k.
__device__ __forceinline__ float head_scale(const float* src, int d, bool is_q) {
  float sum = 0.0f;
  for (int i = 0; i < d; ++i) sum = __fadd_rn(sum, __fmul_rn(src[i], src[i]));
  const float extra = is_q ? __fdiv_rn(1.0f, __fsqrt_rn(float(d))) : 1.0f;
  return __fdiv_rn(extra, __fsqrt_rn(__fadd_rn(sum, 1e-6f)));
}

// β = σ(β_raw), g = a·softplus(α_raw + dt_bias), decay = e^g (and g itself when asked) of one
// (row, V head), at index `at` of [n_rows][nv].
__device__ __forceinline__ void deltanet_gates(float beta_raw, float alpha_raw, float a, float dt_bias, int64_t at,
                                               float* beta, float* decay, float* decay_log) {
  beta[at] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-beta_raw)));
  const float x = __fadd_rn(alpha_raw, dt_bias);
  const float softplus = x > 20.0f ? x : log1pf(expf(x));
  const float g = __fmul_rn(a, softplus);
  decay[at] = expf(g);
  if (decay_log) decay_log[at] = g;
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
                               float* beta, float* decay, float* decay_log) {
  pdl_begin();
  extern __shared__ float staged[];  // [2·key_dim] q then k, then [2·nk] scales
  const int64_t t = blockIdx.x;
  const int64_t key_dim = int64_t(nk) * dk, value_dim = int64_t(nv) * dv, conv_dim = 2 * key_dim + value_dim;
  const float* row = conv_out + t * conv_dim;
  float* scales = staged + 2 * key_dim;
  for (int64_t i = threadIdx.x; i < 2 * key_dim; i += blockDim.x) staged[i] = row[i];
  __syncthreads();
  for (int head = threadIdx.x; head < 2 * nk; head += blockDim.x)
    scales[head] = head_scale(staged + int64_t(head) * dk, dk, head < nk);  // q heads, then k heads
  __syncthreads();
  for (int64_t i = threadIdx.x; i < 2 * key_dim; i += blockDim.x) {
    const float value = __fmul_rn(staged[i], scales[i / dk]);
    if (i < key_dim) q[t * key_dim + i] = value;
    else k[t * key_dim + i - key_dim] = value;
  }
  // v copied 8 values a thread at a time, all loaded before any is stored: v and conv_out may
  // alias as far as the compiler knows, so a load-store loop waited out one L2 round trip per value.
  constexpr int kHeld = 8;
  for (int64_t base = threadIdx.x; base < value_dim; base += int64_t(blockDim.x) * kHeld) {
    float held[kHeld];
#pragma unroll
    for (int n = 0; n < kHeld; ++n) {
      const int64_t i = base + int64_t(n) * blockDim.x;
      held[n] = i < value_dim ? row[2 * key_dim + i] : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < kHeld; ++n) {
      const int64_t i = base + int64_t(n) * blockDim.x;
      if (i < value_dim) v[t * value_dim + i] = held[n];
    }
  }
  for (int h = threadIdx.x; h < nv; h += blockDim.x)
    deltanet_gates(beta_raw[t * nv + h], alpha_raw[t * nv + h], a[h], dt_bias[h], t * nv + h, beta, decay, decay_log);
}

// conv + SiLU and prepare in one launch (deltanet.h deltanet_conv_prepare): block b owns K head
// b's q and k channels and the b-th nk-th of the v channels, one channel a thread, rows in order
// (so it alone reads and writes their conv history); the block's q and k heads of every row are
// staged in shared memory for their norms. The same device functions as conv_silu_kernel and
// prepare_kernel, in the same per-element order: bitwise the two launches.
struct ConvPrepareArgs {
  const float* x;  // [n_rows][2·key_dim + value_dim]: the projections' mixed rows (conv input)
  int n_rows;
  const float* taps;
  int kernel;
  float* history;
  const float* beta_raw;  // [n_rows][nv], or null with ba
  const float* alpha_raw;
  const float* ba;  // [n_rows][nk][2][nv/nk] (split_beta_alpha's input), or null
  const float* a;
  const float* dt_bias;
  int nk, nv, dk, dv;
  float *q, *k, *v, *beta, *decay, *decay_log;
};

__global__ void conv_prepare_kernel(ConvPrepareArgs p) {
  pdl_begin();
  extern __shared__ float staged[];  // [n_rows][2·dk]: q then k head b of each row; then [n_rows][2] scales
  const int b = int(blockIdx.x), dk = p.dk, n_rows = p.n_rows;
  const int64_t key_dim = int64_t(p.nk) * dk, value_dim = int64_t(p.nv) * p.dv, channels = 2 * key_dim + value_dim;
  const int64_t v_share = value_dim / p.nk, mine = 2 * int64_t(dk) + v_share;
  float* scales = staged + int64_t(n_rows) * 2 * dk;
  for (int64_t c = threadIdx.x; c < mine; c += blockDim.x) {
    if (c < 2 * dk) {
      const int64_t ch = (c < dk ? 0 : key_dim) + int64_t(b) * dk + c % dk;
      conv_silu_channel(p.x, n_rows, channels, p.taps, p.kernel, p.history, ch,
                        [&](int64_t t, float value) { staged[t * 2 * dk + c] = value; });
    } else {
      const int64_t i = int64_t(b) * v_share + (c - 2 * dk);  // the channel's place in v
      conv_silu_channel(p.x, n_rows, channels, p.taps, p.kernel, p.history, 2 * key_dim + i,
                        [&](int64_t t, float value) { p.v[t * value_dim + i] = value; });
    }
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < 2 * n_rows; i += int(blockDim.x))
    scales[i] = head_scale(staged + int64_t(i) * dk, dk, i % 2 == 0);  // (row i/2, q or k)
  __syncthreads();
  for (int64_t i = threadIdx.x; i < int64_t(n_rows) * 2 * dk; i += blockDim.x) {
    const int64_t t = i / (2 * dk), r = i % (2 * dk);
    const float value = __fmul_rn(staged[i], scales[i / dk]);
    if (r < dk) p.q[t * key_dim + int64_t(b) * dk + r] = value;
    else p.k[t * key_dim + int64_t(b) * dk + (r - dk)] = value;
  }
  const int per = p.nv / p.nk;  // this block's V heads: b·per ..
  for (int i = int(threadIdx.x); i < n_rows * per; i += int(blockDim.x)) {
    const int64_t t = i / per;
    const int j = i % per, h = b * per + j;
    float beta_raw, alpha_raw;
    if (p.ba) {  // split_beta_alpha's indexing: K head b's [β | α] of its per V heads
      const float* row = p.ba + t * 2 * p.nv + int64_t(b) * 2 * per;
      beta_raw = row[j];
      alpha_raw = row[per + j];
    } else {
      beta_raw = p.beta_raw[t * p.nv + h];
      alpha_raw = p.alpha_raw[t * p.nv + h];
    }
    deltanet_gates(beta_raw, alpha_raw, p.a[h], p.dt_bias[h], t * p.nv + h, p.beta, p.decay, p.decay_log);
  }
}


// ---------------------------------------------------------------------------------------------
// Chunked (WY) form: one block per V head, chunks of C rows in order (contract in deltanet.h;
// the per-element order is layers/gated_deltanet.h's delta_rule_chunked_head, every step below
// names the CPU line it repeats).

// Rows per thread in the products with the state (W·S and Q·S; the state update): a thread's
// kChunkedRowsPerTask accumulators share each state value it loads (coalesced, from device
// memory) or each V' value (shared memory), instead of loading it once per row.
constexpr int kChunkedRowsPerTask = 8;

// Offsets (in floats) of the chunk's intermediates in dynamic shared memory.
struct ChunkedLayout {
  int key_stride;  // floats per staged k̂ row: dk rounded up to odd, so that a warp reading row j's
                   // element r for 32 consecutive j hits 32 different banks
  int uw_width;    // dv + dk: a row of [U | W]
  size_t keys, queries, neg_l, attn, uw, gamma, beta, exp_gamma, scale_w, tail, floats;
};

__host__ __device__ inline ChunkedLayout chunked_layout(int dk, int dv) {
  constexpr size_t C = kChunkedDeltaRuleRows;
  ChunkedLayout l{};
  l.key_stride = dk | 1;
  l.uw_width = dv + dk;
  l.keys = 0;                                   // [C][key_stride]  k̂ rows (scaled in place late)
  l.queries = l.keys + C * l.key_stride;        // [C][dk]          q̂ rows
  l.neg_l = l.queries + C * dk;                 // [C][C]           −L (strictly lower)
  l.attn = l.neg_l + C * C;                     // [C][C]           QKᵀ ⊙ Γ (lower, diagonal too)
  l.uw = l.attn + C * C;                        // [C][dv + dk]     [U | W]; U becomes V'
  l.gamma = l.uw + C * l.uw_width;              // [C] g, then γ
  l.beta = l.gamma + C;                         // [C] β
  l.exp_gamma = l.beta + C;                     // [C] e^γ
  l.scale_w = l.exp_gamma + C;                  // [C] β·e^γ
  l.tail = l.scale_w + C;                       // [C] e^{γ_{n−1}−γ}
  l.floats = l.tail + C;
  return l;
}

// Row i of the lower triangle's pair p (pairs numbered row by row: p = i(i+1)/2 + j, j <= i).
__device__ inline int triangle_row(int p) {
  int i = int((sqrtf(8.0f * float(p) + 1.0f) - 1.0f) * 0.5f);
  while (i * (i + 1) / 2 > p) --i;
  while ((i + 1) * (i + 2) / 2 <= p) ++i;
  return i;
}

// Phases per chunk of n rows, separated by __syncthreads (each reads only what an earlier phase
// wrote; the comment of each says what it writes):
//   0 stage k̂, q̂ rows, β and g;  γ (one thread: a running sum in row order)
//   1 −L and QKᵀ ⊙ Γ (one thread per (i, j ≤ i)); e^γ, β·e^γ, e^{γ_{n−1}−γ} (one per row)
//   2 forward substitution for [U | W] (one thread per column: rows in order)
//   3 V' = U − W·S in place of U; e^γ_i·(Q S)_i into out (one thread per column and row group)
//   4 out += (QKᵀ ⊙ Γ)·V' (the same threads, rows and columns as phase 3); k̂ rows scaled
//   5 S ← e^{γ_{n−1}}·S + Σ_i (scaled k̂_i)·V'_iᵀ (one thread per column and group of state rows)
__global__ void __launch_bounds__(kChunkedThreads)
    delta_rule_chunked_kernel(const float* q, const float* k, const float* v, const float* beta,
                              const float* decay_log, int64_t n_rows, int nk, int nv, int dk, int dv, bool tiled,
                              float* state, float* out) {
  pdl_begin();
  constexpr int C = kChunkedDeltaRuleRows, R = kChunkedRowsPerTask;
  extern __shared__ float shared[];
  const ChunkedLayout layout = chunked_layout(dk, dv);
  float* keys = shared + layout.keys;
  float* queries = shared + layout.queries;
  float* neg_l = shared + layout.neg_l;
  float* attn = shared + layout.attn;
  float* uw = shared + layout.uw;
  float* gamma = shared + layout.gamma;
  float* betas = shared + layout.beta;
  float* exp_gamma = shared + layout.exp_gamma;
  float* scale_w = shared + layout.scale_w;
  float* tail = shared + layout.tail;
  const int key_stride = layout.key_stride, uw_width = layout.uw_width;
  const int h = blockIdx.x, tid = threadIdx.x, threads = blockDim.x;
  const int kh = tiled ? h % nk : h / (nv / nk);
  const int64_t key_dim = int64_t(nk) * dk, value_dim = int64_t(nv) * dv;
  float* S = state + size_t(h) * dk * dv;  // [dk][dv]
  for (int64_t c0 = 0; c0 < n_rows; c0 += C) {
    const int n = n_rows - c0 < C ? int(n_rows - c0) : C;
    __syncthreads();  // the previous chunk's phase 5 no longer reads keys, uw, exp_gamma (nor S)

    // Phase 0. Only rows < n are staged, and no phase reads a row >= n.
    for (int e = tid; e < n * dk; e += threads) {
      const int i = e / dk, r = e % dk;
      const int64_t at = (c0 + i) * key_dim + int64_t(kh) * dk + r;
      keys[i * key_stride + r] = k[at];
      queries[i * dk + r] = q[at];
    }
    for (int i = tid; i < n; i += threads) {
      betas[i] = beta[(c0 + i) * nv + h];
      gamma[i] = decay_log[(c0 + i) * nv + h];
    }
    __syncthreads();
    if (tid == 0) {  // gamma[i] = acc_gamma += g_i
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) gamma[i] = acc = __fadd_rn(acc, gamma[i]);
    }
    __syncthreads();

    // Phase 1. kk, qk: gemm_f32(n, n, dk, K, ., Kᵀ) and (Q, Kᵀ), dots in r order from 0;
    // decay = exp(γ_i − γ_j);  kk ← −(β_i·kk·decay) below the diagonal;  a = qk·decay.
    for (int p = tid; p < n * (n + 1) / 2; p += threads) {
      const int i = triangle_row(p), j = p - i * (i + 1) / 2;
      const float* ki = keys + i * key_stride;
      const float* kj = keys + j * key_stride;
      const float* qi = queries + i * dk;
      float kk = 0.0f, qk = 0.0f;
      for (int r = 0; r < dk; ++r) {
        kk = __fadd_rn(kk, __fmul_rn(ki[r], kj[r]));
        qk = __fadd_rn(qk, __fmul_rn(qi[r], kj[r]));
      }
      const float decay = expf(__fsub_rn(gamma[i], gamma[j]));
      if (j < i) neg_l[i * C + j] = -__fmul_rn(__fmul_rn(betas[i], kk), decay);
      attn[i * C + j] = __fmul_rn(qk, decay);
    }
    // scale_w = β_i·exp(γ_i) (and e^γ_i for the outputs: the same exp);  e^{γ_{n−1}−γ_i}.
    for (int i = tid; i < n; i += threads) {
      const float e = expf(gamma[i]);
      exp_gamma[i] = e;
      scale_w[i] = __fmul_rn(betas[i], e);
      tail[i] = expf(__fsub_rn(gamma[n - 1], gamma[i]));
    }
    __syncthreads();

    // Phase 2. Row i of [U | W] = [β_i·v_i | scale_w_i·k_i], then gemm_f32(1, uw_width, i, −L row
    // i, [U | W]) accumulating: + (−l_ij)·row j for j = 0..i−1. A column depends on itself only.
    for (int c = tid; c < uw_width; c += threads) {
      const float* v_column = v + c0 * value_dim + int64_t(h) * dv + c;  // valid for c < dv only
      for (int i = 0; i < n; ++i) {
        float x = c < dv ? __fmul_rn(betas[i], v_column[i * value_dim])
                         : __fmul_rn(scale_w[i], keys[i * key_stride + (c - dv)]);
        const float* l_row = neg_l + i * C;
        for (int j = 0; j < i; ++j) x = __fadd_rn(x, __fmul_rn(l_row[j], uw[j * uw_width + c]));
        uw[i * uw_width + c] = x;
      }
    }
    __syncthreads();

    // Phase 3. wsp = gemm_f32(n, dv, dk, W, S) and gemm_f32(n, dv, dk, Q, S), dots in r order
    // from 0;  vp = U − wsp (in U's place);  o = exp(γ_i)·(Q S)_i. Task = (row group, column).
    const int row_groups = (n + R - 1) / R;
    for (int task = tid; task < row_groups * dv; task += threads) {
      const int c = task % dv, i0 = (task / dv) * R, rows = min(R, n - i0);
      float ws[R], qs[R];
#pragma unroll
      for (int a = 0; a < R; ++a) ws[a] = qs[a] = 0.0f;
      for (int r = 0; r < dk; ++r) {
        const float s = S[r * dv + c];
#pragma unroll
        for (int a = 0; a < R; ++a) {
          if (a < rows) {
            ws[a] = __fadd_rn(ws[a], __fmul_rn(uw[(i0 + a) * uw_width + dv + r], s));
            qs[a] = __fadd_rn(qs[a], __fmul_rn(queries[(i0 + a) * dk + r], s));
          }
        }
      }
#pragma unroll
      for (int a = 0; a < R; ++a) {
        if (a < rows) {
          float* u = uw + (i0 + a) * uw_width + c;
          *u = __fsub_rn(*u, ws[a]);
          out[(c0 + i0 + a) * value_dim + int64_t(h) * dv + c] = __fmul_rn(exp_gamma[i0 + a], qs[a]);
        }
      }
    }
    __syncthreads();

    // Phase 4. gemm_f32(1, dv, i + 1, a row i, V') accumulating onto o: + a_ij·V'_j for j = 0..i.
    // The same task → thread map as phase 3, so each thread reads back its own writes of out.
    for (int task = tid; task < row_groups * dv; task += threads) {
      const int c = task % dv, i0 = (task / dv) * R, rows = min(R, n - i0);
      for (int a = 0; a < rows; ++a) {
        const int i = i0 + a;
        float* o = out + (c0 + i) * value_dim + int64_t(h) * dv + c;
        float acc = *o;
        const float* a_row = attn + i * C;
        for (int j = 0; j <= i; ++j) acc = __fadd_rn(acc, __fmul_rn(a_row[j], uw[j * uw_width + c]));
        *o = acc;
      }
    }
    // kt = scale·kt with scale = exp(g_last − γ_i) (keys are not read by phases 3 and 4).
    for (int e = tid; e < n * dk; e += threads) {
      const int i = e / dk, r = e % dk;
      keys[i * key_stride + r] = __fmul_rn(tail[i], keys[i * key_stride + r]);
    }
    __syncthreads();

    // Phase 5. state *= exp(g_last), then gemm_f32(dk, dv, n, scaled Kᵀ, V') accumulating:
    // + kt_ri·V'_ic for i = 0..n−1. Task = (state row group, column); each S value has one owner.
    const float e_last = exp_gamma[n - 1];
    const int state_groups = (dk + R - 1) / R;
    for (int task = tid; task < state_groups * dv; task += threads) {
      const int c = task % dv, r0 = (task / dv) * R, rows = min(R, dk - r0);
      float acc[R];
#pragma unroll
      for (int a = 0; a < R; ++a) acc[a] = a < rows ? __fmul_rn(S[(r0 + a) * dv + c], e_last) : 0.0f;
      for (int i = 0; i < n; ++i) {
        const float vp = uw[i * uw_width + c];
        const float* k_row = keys + i * key_stride + r0;
#pragma unroll
        for (int a = 0; a < R; ++a)
          if (a < rows) acc[a] = __fadd_rn(acc[a], __fmul_rn(k_row[a], vp));
      }
#pragma unroll
      for (int a = 0; a < R; ++a)
        if (a < rows) S[(r0 + a) * dv + c] = acc[a];
    }
  }
}

}  // namespace

void deltanet_prepare(const float* conv_out, const float* beta_raw, const float* alpha_raw, const float* a,
                      const float* dt_bias, int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim,
                      int value_head_dim, float* q, float* k, float* v, float* beta, float* decay,
                      float* decay_log, cudaStream_t stream) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || key_head_dim <= 0 || value_head_dim <= 0)
    cuda_fail("CUDA deltanet prepare: expected positive head counts and head dims");
  if (n_rows <= 0) return;
  const size_t staged_bytes = (size_t(2) * n_k_heads * key_head_dim + size_t(2) * n_k_heads) * sizeof(float);
  if (staged_bytes > kMaxPrepareSharedBytes)
    cuda_fail("CUDA deltanet prepare: " + std::to_string(n_k_heads) + " K heads of " + std::to_string(key_head_dim) +
              " need " + std::to_string(staged_bytes) + " bytes of shared memory, above the " +
              std::to_string(kMaxPrepareSharedBytes) + " allowed");
  launch(prepare_kernel, unsigned(n_rows), 256, staged_bytes, stream, conv_out, beta_raw, alpha_raw, a, dt_bias, n_k_heads,
         n_v_heads, key_head_dim, value_head_dim, q, k, v, beta, decay, decay_log);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

static size_t conv_prepare_shared_bytes(int64_t n_rows, int key_head_dim) {
  return size_t(n_rows) * (2 * size_t(key_head_dim) + 2) * sizeof(float);
}

bool deltanet_conv_prepare_supported(int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim,
                                     int value_head_dim, int kernel) {
  if (n_rows < 1 || n_rows > kConvPrepareMaxRows || n_k_heads <= 0 || n_v_heads <= 0 || key_head_dim <= 0 ||
      value_head_dim <= 0 || n_v_heads % n_k_heads != 0 || kernel < 1 || kernel > kMaxConvKernel)
    return false;
  const int64_t channels = 2 * int64_t(key_head_dim) + int64_t(n_v_heads / n_k_heads) * value_head_dim;
  return channels <= 1024 && conv_prepare_shared_bytes(n_rows, key_head_dim) <= kMaxPrepareSharedBytes;
}

void deltanet_conv_prepare(const float* x, int64_t n_rows, const float* taps, int kernel, float* history,
                           const float* beta_raw, const float* alpha_raw, const float* ba, const float* a,
                           const float* dt_bias, int n_k_heads, int n_v_heads, int key_head_dim, int value_head_dim,
                           float* q, float* k, float* v, float* beta, float* decay, float* decay_log,
                           cudaStream_t stream) {
  if (!deltanet_conv_prepare_supported(n_rows, n_k_heads, n_v_heads, key_head_dim, value_head_dim, kernel))
    cuda_fail("CUDA deltanet conv + prepare: unsupported window (" + std::to_string(n_rows) + " rows, " +
              std::to_string(n_k_heads) + " K heads of " + std::to_string(key_head_dim) + ", " +
              std::to_string(n_v_heads) + " V heads of " + std::to_string(value_head_dim) + ", kernel " +
              std::to_string(kernel) + "): see deltanet_conv_prepare_supported");
  if (!ba && (!beta_raw || !alpha_raw))
    cuda_fail("CUDA deltanet conv + prepare: expected the fused β/α rows or both raw gate arrays");
  const int64_t channels = 2 * int64_t(key_head_dim) + int64_t(n_v_heads / n_k_heads) * value_head_dim;
  const ConvPrepareArgs args{x,         int(n_rows), taps,      kernel,         history,      beta_raw,
                             alpha_raw, ba,          a,         dt_bias,        n_k_heads,    n_v_heads,
                             key_head_dim, value_head_dim, q,   k,              v,            beta,
                             decay,     decay_log};
  launch(conv_prepare_kernel, unsigned(n_k_heads), unsigned((channels + 31) / 32 * 32),
         conv_prepare_shared_bytes(n_rows, key_head_dim), stream, args);
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

size_t delta_rule_chunked_shared_bytes(int key_head_dim, int value_head_dim) {
  return chunked_layout(key_head_dim, value_head_dim).floats * sizeof(float);
}

namespace {

// The device's per-block opt-in maximum of shared memory, read once.
size_t shared_optin_bytes() {
  static const size_t bytes = [] {
    int device = 0, optin = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return size_t(optin);
  }();
  return bytes;
}

}  // namespace

bool delta_rule_chunked_supported(int key_head_dim, int value_head_dim) {
  if (key_head_dim <= 0 || value_head_dim <= 0) return false;
  const size_t bytes = delta_rule_chunked_shared_bytes(key_head_dim, value_head_dim);
  return bytes <= kMaxChunkedSharedBytes && bytes <= shared_optin_bytes();
}

void delta_rule_chunked(const float* q, const float* k, const float* v, const float* beta, const float* decay_log,
                        int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim, int value_head_dim,
                        bool tiled, float* state, float* out, cudaStream_t stream) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || n_v_heads % n_k_heads != 0 || key_head_dim <= 0 || value_head_dim <= 0)
    cuda_fail("CUDA chunked delta rule: expected n_v_heads a multiple of n_k_heads and head dims > 0, found " +
              std::to_string(n_k_heads) + " K heads, " + std::to_string(n_v_heads) + " V heads, head dims " +
              std::to_string(key_head_dim) + " x " + std::to_string(value_head_dim));
  if (!out)
    cuda_fail("CUDA chunked delta rule: out is required (a state-only replay runs delta_rule_recurrent)");
  if (n_rows <= 0) return;
  const size_t bytes = delta_rule_chunked_shared_bytes(key_head_dim, value_head_dim);
  const size_t allowed = std::min(kMaxChunkedSharedBytes, shared_optin_bytes());
  if (bytes > allowed)
    cuda_fail("CUDA chunked delta rule: head dims " + std::to_string(key_head_dim) + " x " +
              std::to_string(value_head_dim) + " need " + std::to_string(bytes) +
              " bytes of shared memory per block, above the " + std::to_string(allowed) +
              " allowed (64·(3·dk + dv + 134) floats; the recurrent form has no such limit)");
  static std::once_flag raised;  // past the default 48 KiB of shared memory
  std::call_once(raised, [allowed] {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(delta_rule_chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(allowed)));
  });
  launch(delta_rule_chunked_kernel, unsigned(n_v_heads), kChunkedThreads, bytes, stream, q, k, v, beta, decay_log,
         n_rows, n_k_heads, n_v_heads, key_head_dim, value_head_dim, tiled, state, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::compute::cuda
