// CUDA twins of the Gated DeltaNet steps of layers/gated_deltanet.cpp for short windows (decode
// and speculative verify, T < 32 rows: the recurrent form).
//
// Contract
// - deltanet_conv_silu: causal depthwise conv over [history (K-1 rows) | the window's rows],
//   then SiLU, row by row; the history is shifted in place exactly as the CPU does (it ends as
//   the last K-1 input rows). Sums in the CPU's order (taps oldest first) with explicitly rounded
//   f32 operations, so the pre-SiLU sums are bitwise the CPU's; SiLU uses CUDA's expf (≤ 2 ulp).
// - delta_rule_recurrent: per V head h (K head kmap(h): h % nk when `tiled`, h / (nv/nk) else),
//   token by token:  S ← decay·S;  u = β(v − Sᵀk);  S ← S + k uᵀ;  o = Sᵀq.  It takes the decay
//   itself (e^g, computed by the caller), and performs every multiply and add in the CPU's order
//   with explicit rounding: for the same inputs, state and outputs are bitwise the CPU's.
//   One thread block per V head, one thread per state column (dv of them); the state lives in
//   device memory ([nv][dk][dv], the CPU layout). For dk in {16, 32, 64, 128} and dv <= 256 each
//   column is held in registers for the whole window (read once, written once: 55.6 → 8.5 µs per
//   decode call on the 48-layer model, where the version that reads and writes it twice per
//   token was 16 % of the GPU time); other shapes read and write it twice per token. Both give
//   the same bits.
//   The key head dim dk (q, k) may differ from the value head dim dv (v, the output).
// - Window identity: each row is processed by the same code whatever the window size; a T-row
//   call equals T one-row calls bitwise (tested).
// - Device pointers; launches on `stream`; argument errors throw strata::Error first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::compute::cuda {

void deltanet_conv_silu(const float* x, int64_t n_rows, int64_t channels, const float* taps, int kernel,
                        float* history, float* out, cudaStream_t stream);

// Splits each conv output row [q (nk·dk) | k (nk·dk) | v (nv·dv)] into q, k, v; L2-normalises each
// q and k head as the CPU's l2_normalize (sequential Σ, v·(extra/√(Σ+1e-6)), extra = 1/√d for q,
// 1 for k: bitwise the CPU's); beta = σ(beta_raw); decay = e^(a·softplus(alpha_raw + dt_bias)).
// beta and decay use CUDA's expf/log1pf: a few ulp from the CPU's.
void deltanet_prepare(const float* conv_out, const float* beta_raw, const float* alpha_raw, const float* a,
                      const float* dt_bias, int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim,
                      int value_head_dim, float* q, float* k, float* v, float* beta, float* decay,
                      cudaStream_t stream);

void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* beta, const float* decay,
                          int64_t n_rows, int n_k_heads, int n_v_heads, int key_head_dim, int value_head_dim,
                          bool tiled, float* state, float* out, cudaStream_t stream);

}  // namespace strata::compute::cuda
