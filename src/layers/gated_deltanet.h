// Gated DeltaNet (linear attention) for qwen4exp and qwen3next, recurrent form.
//
// Math (shared/reference/qwen4exp.md §6, qwen3next-qwen3moe.md §3), per token t:
//   c = W_qkv·x; conv: c'[ch] = silu(Σ_j w[ch,j]·c_{t-K+1+j}[ch]); split q | k | v
//   β = σ(b), g = A·softplus(a + dt_bias)   (A = −exp(A_log), stored that way in GGUF)
//   k̂ = k/‖k‖ (rsqrt(Σk²+1e-6)), q̂ = q/‖q‖/√dk, V head h reads K head kmap(h)
//   S ← e^g·S;  u = v − Sᵀk̂;  S ← S + β·k̂uᵀ;  o = Sᵀq̂
//   y = W_out·concat_h( w_norm ⊙ rmsnorm(o_h) ⊙ gate(z_h) ),  gate = σ (qwen4exp) or silu
// kmap is tiled (h % nk) in qwen4exp GGUF order and grouped (h / (nv/nk)) in qwen3next.
// Windows shorter than 32 rows (decode, speculative verify) run the recurrent form token by
// token, so a row's result is the same bits whether its window holds 1 or T < 32 rows (window
// identity). Longer windows (prefill) run the chunked WY form (64-token chunks), equal to the
// recurrent form up to fp32 rounding (~1e-6; tested), touching the state once per chunk.
// State is owned by the caller (GatedDeltaNetState) and advanced by exactly n_rows tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "model/hparams.h"

namespace strata {

struct GatedDeltaNetWeights {
  compute::WeightMatrix qkv;     // [conv_dim x H]: all q | all k | all v
  compute::WeightMatrix z;       // [Vd x H] output gate input
  // qwen4exp: separate beta/alpha [nv x H]; qwen3next: one fused [2nv x H] in groups of
  // (b[r] | a[r]) per K head.
  compute::WeightMatrix beta;
  compute::WeightMatrix alpha;
  compute::WeightMatrix beta_alpha;
  std::vector<float> conv;       // [conv_dim][K] taps, oldest first
  std::vector<float> dt_bias;    // [nv]
  std::vector<float> a;          // [nv], = −exp(A_log)
  std::vector<float> norm;       // [dv], plain weight (no +1)
  compute::WeightMatrix out;     // [H x Vd]
  bool fused_beta_alpha() const { return beta_alpha.data != nullptr; }
};

struct GatedDeltaNetState {
  std::vector<float> conv;  // [K-1][conv_dim], oldest first; zeros at sequence start
  std::vector<float> ssm;   // [nv][dk][dv]
  void reset(const HParams& hp);
};

void gated_deltanet_forward(compute::ThreadPool& pool, const HParams& hp,
                            const GatedDeltaNetWeights& w, GatedDeltaNetState& state,
                            const float* x, int64_t n_rows, float* y);

}  // namespace strata
