// Gated DeltaNet (linear attention) for qwen4exp and qwen3next, recurrent form.
//
// Math (shared/reference/qwen4exp.md §6, qwen3next-qwen3moe.md §3), per token t:
//   c = W_qkv·x; conv: c'[ch] = silu(Σ_j w[ch,j]·c_{t-K+1+j}[ch]); split q | k | v
//   β = σ(b), g = A·softplus(a + dt_bias)   (A = −exp(A_log), stored that way in GGUF)
//   k̂ = k/‖k‖ (rsqrt(Σk²+1e-6)), q̂ = q/‖q‖/√dk, V head h reads K head kmap(h)
//   S ← e^g·S;  u = v − Sᵀk̂;  S ← S + β·k̂uᵀ;  o = Sᵀq̂
//   y = W_out·concat_h( w_norm ⊙ rmsnorm(o_h) ⊙ gate(z_h) ),  gate = σ (qwen4exp) or silu
// kmap is tiled (h % nk) in qwen4exp GGUF order and grouped (h / (nv/nk)) in qwen3next.
// q, k have the key head dim dk (ssm.state_size), v, z, o and the norm the value head dim dv
// (ssm.inner_size / time_step_rank); dk ≠ dv is allowed (transformers accepts it), S is dk × dv.
// Windows shorter than 32 rows (decode, speculative verify) run the recurrent form token by
// token, so a row's result is the same bits whether its window holds 1 or T < 32 rows (window
// identity). Longer windows (prefill) run the chunked WY form (64-token chunks from the window
// start), equal to the recurrent form up to fp32 rounding (~1e-6; tested), touching the state
// once per chunk; a trailing chunk of fewer than 32 rows runs recurrent, as a window of its own
// rows would (delta_rule_window_chunked_rows): so on the CPU a window is bitwise the 64-row
// windows it can be cut into from its start (what lets chat and serve prefill in long windows
// and still resume cached states at 64-row boundaries, decode/state_cache.h).
// State is owned by the caller (GatedDeltaNetState) and advanced by exactly n_rows tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compute/backend.h"
#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cpu/workspace.h"
#include "layers/dims.h"

namespace strata {

struct GatedDeltaNetWeights {
  compute::WeightMatrix qkv;  // [conv_dim x H]: all q | all k | all v
  compute::WeightMatrix z;    // [Vd x H] output gate input
  // qwen4exp: separate beta/alpha [nv x H]; qwen3next: one fused [2nv x H] in groups of
  // (b[r] | a[r]) per K head.
  compute::WeightMatrix beta;
  compute::WeightMatrix alpha;
  compute::WeightMatrix beta_alpha;
  std::vector<float> conv;     // [conv_dim][K] taps, oldest first
  std::vector<float> dt_bias;  // [nv]
  std::vector<float> a;        // [nv], = −exp(A_log)
  std::vector<float> norm;     // [dv], plain weight (no +1)
  compute::WeightMatrix out;   // [H x Vd]
  bool fused_beta_alpha() const { return beta_alpha.data != nullptr; }
};

// Per-token inputs of the delta rule, after conv, split and normalisation.
struct GatedDeltaNetInputs {
  int64_t n_rows = 0;
  std::vector<float> q, k;       // [n_rows][nk·dk], q̂ already scaled by 1/√dk
  std::vector<float> v;          // [n_rows][nv·dv]
  std::vector<float> beta;       // [n_rows][nv], σ(b)
  std::vector<float> decay_log;  // [n_rows][nv], g ≤ 0 (the decay is e^g)
};

// What a recorded window keeps so that `gated_deltanet_rollback` can undo its last rows
// (speculative verify). Rollback strategy, chosen for exactness at the lowest copy cost:
// - conv history: folded, no copy per row. The history after m rows is the last K-1 rows of
//   [history before | the window's m conv input rows], so the log keeps the pre-window history
//   (K-1 rows) and the window's conv inputs (one copy of the window's rows).
// - recurrent state S: the delta rule is not invertible in floating point (undoing e^g·S and the
//   rank-1 update does not give back the same bits), so the log keeps ONE snapshot of S from
//   before the window plus the window's delta-rule inputs (swapped in, not copied). Rollback
//   restores the snapshot and replays the state update of the kept rows only: no matmul, no expert,
//   the same code and float order as the forward, hence bitwise the state a plain run would have.
//   Versus a copy of S after every row (colibri: 113 MiB per row on Qwen3.8), this is one copy
//   per window whatever its depth, and the replay (d² flops per head per kept row) is paid only
//   when a draft is rejected.
struct GatedDeltaNetWindowLog {
  bool valid = false;
  std::vector<float> ssm_before, conv_before;
  std::vector<float> conv_inputs;  // [n_rows][conv_dim]
  GatedDeltaNetInputs inputs;
};

struct GatedDeltaNetState {
  std::vector<float> conv;            // [K-1][conv_dim], oldest first; zeros at sequence start
  std::vector<float> ssm;             // [nv][dk][dv]
  GatedDeltaNetWindowLog window_log;  // the last recorded window (speculative verify only)
  // A recorded window computes into these and swaps them with the log's (which become the next
  // recorded window's), so recording allocates nothing once warm: buffers never change role.
  std::vector<float> spare_conv_inputs;
  GatedDeltaNetInputs spare_inputs;
  void reset(const DeltaNetDims& dims);
};

// record_window: keep state.window_log for a later rollback (only windows under 32 rows, the
// recurrent form; longer windows fail). Without it nothing is kept and nothing changes.
// Scratch comes from `ws`; the log's buffers are swapped with it, so neither allocates once warm.
void gated_deltanet_forward(compute::ThreadPool& pool, compute::Workspace& ws,
                            const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                            GatedDeltaNetState& state, const float* x, int64_t n_rows, float* y,
                            bool record_window = false);

// Several sequences in one window (serve --parallel): rows [segments[s].first_row, + n_rows) of
// x belong to states[s]. The input and output projections and the gated norm run once over all
// rows, the conv and the delta rule per sequence; each sequence's rows and state are bitwise what
// gated_deltanet_forward gives it alone. Not recorded (speculative verify runs alone).
void gated_deltanet_forward_rows(compute::ThreadPool& pool, compute::Workspace& ws,
                                 const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                                 std::span<GatedDeltaNetState* const> states,
                                 std::span<const compute::RowSegment> segments, const float* x,
                                 int64_t n_rows, float* y);

// One token of the delta rule for one V head, in place on state [dk][dv] (row i, column j):
//   S ← e^g·S;  u_j = (v_j − Σ_i S_ij·k_i)·β;  S_ij ← S_ij + k_i·u_j;  o_j = Σ_i S_ij·q_i
// with every sum in index order i = 0, 1, ... from 0.0f and every product and sum rounded on its
// own (no fused multiply-add): bitwise the plain loops written that way (tested), whatever the
// vector width. out (dv floats) may be nullptr (state update only). q, k, v, out must not
// overlap state.
void delta_rule_token(const float* q, const float* k, const float* v, float beta, float decay_log,
                      int dk, int dv, float* state, float* out);
// The same token for state columns [j_begin, j_end) only (0 <= j_begin <= j_end <= dv): those
// columns of state and out, bitwise what delta_rule_token gives them (a column's update and
// output read no other column), nothing else touched. A head's columns can so go to several
// threads (decode on more threads than V heads).
void delta_rule_token_columns(const float* q, const float* k, const float* v, float beta,
                              float decay_log, int dk, int dv, int j_begin, int j_end, float* state,
                              float* out);

// Windows of at least this many rows run the chunked form (prefill); shorter ones (decode,
// speculative verify windows of 1+k rows) the recurrent form. The CUDA backend switches at the
// same count.
inline constexpr int64_t kDeltaRuleChunkedMinRows = 32;
inline constexpr int kDeltaRuleChunkRows = 64;  // HF's chunk size

// How many of a window's first rows the CPU runs in the chunked form; the rest (a trailing
// partial chunk of fewer than kDeltaRuleChunkedMinRows rows, or a whole window that short) runs
// recurrent. The form per 64-row chunk is then the form of a window holding that chunk's rows
// alone, so a window of n rows gives the bits of windows of 64 rows from its start (the last one
// n % 64). (The CUDA backend runs a long window's trailing partial chunk chunked: its prefill is
// not cached, so nothing needs that identity there.)
constexpr int64_t delta_rule_window_chunked_rows(int64_t n_rows) {
  const int64_t tail = n_rows % kDeltaRuleChunkRows;
  return tail < kDeltaRuleChunkedMinRows ? n_rows - tail : n_rows;
}

// One V head's rows of the delta rule's inputs, as plain strided arrays: row t's q̂ and k̂ (dk
// floats each) at q + t·key_stride and k + t·key_stride, its v (dv floats) at v + t·value_stride,
// its β and g (log-decay, ≤ 0) at beta[t·gate_stride] and decay_log[t·gate_stride].
struct DeltaRuleHeadRows {
  const float* q = nullptr;
  const float* k = nullptr;
  int64_t key_stride = 0;
  const float* v = nullptr;
  int64_t value_stride = 0;
  const float* beta = nullptr;
  const float* decay_log = nullptr;
  int64_t gate_stride = 0;
  int64_t n_rows = 0;
  int dk = 0, dv = 0;
};

// The chunked (WY) form of the delta rule for one V head (the form windows of >= 32 rows run,
// but for a trailing chunk of < 32 rows: delta_rule_window_chunked_rows):
// advances state [dk][dv] by rows.n_rows tokens and writes row t's output (dv floats) at
// out + t·out_stride. Mathematically the recurrent form (shared/reference/qwen4exp.md §6), equal
// to it up to fp32 rounding. Chunks of 64 rows in order (the last may be shorter: n rows, the
// last one z = n − 1); per chunk, with γ_i = g_0 + g_1 + ... + g_i (a running f32 sum from 0, in
// order) and Γ_ij = e^{γ_i−γ_j} (i ≥ j):
//   (I + L)U = diag(β)V,  (I + L)W = diag(β e^γ)K,  L = strict_lower(diag(β) K Kᵀ ⊙ Γ)
//   V' = U − W S;  O = diag(e^γ) Q S + (Q Kᵀ ⊙ Γ) V';  S ← e^{γ_z} S + (diag(e^{γ_z−γ}) K)ᵀ V'
// Operation order, which compute/cuda's delta_rule_chunked repeats (every product and sum rounded
// on its own, no fused multiply-add; each dot a sum in index order from 0.0f):
//   (KKᵀ)_ij, (QKᵀ)_ij: dots over r < dk;  −l_ij = −((β_i·(KKᵀ)_ij)·Γ_ij) for j < i;
//   a_ij = (QKᵀ)_ij·Γ_ij for j ≤ i;  row i of [U|W] starts at [β_i·v_i | (β_i·e^{γ_i})·k_i] and
//   adds (−l_ij)·row j for j = 0..i−1 (forward substitution);  V'_ic = U_ic − (W S)_ic;
//   O_ic starts at e^{γ_i}·(Q S)_ic and adds a_ij·V'_jc for j = 0..i;  S_rc ← S_rc·e^{γ_z},
//   then adds (e^{γ_z−γ_i}·k_ir)·V'_ic for i = 0..z.  Each e^x is std::exp of the f32 x.
// All of it runs with subnormals flushed to zero, operands and results (compute/cpu/subnormals.h,
// on x86; the reason is at the definition): strong decays make tiny factors, and an Intel core
// pays a microcode assist per subnormal. No output or state value is ever subnormal, and the bits
// are the same on every thread (the scope is opened inside, whoever calls).
// The reference of compute/cuda's delta_rule_chunked (tests/cuda/deltanet_test.cpp). Allocates
// its chunk scratch; out must not overlap the inputs or state.
void delta_rule_chunked_head(const DeltaRuleHeadRows& rows, float* state, float* out,
                             int64_t out_stride);

// Makes `state` what it would be had only the first keep_rows rows of the last recorded window
// been fed (bitwise). keep_rows in [0, n_rows]; the log is consumed.
void gated_deltanet_rollback(compute::ThreadPool& pool, const DeltaNetDims& dims,
                             GatedDeltaNetState& state, int64_t keep_rows);

}  // namespace strata
