// CUDA twins of the small per-window steps the CUDA backend needs between the big kernels: the
// residual add, the fused beta/alpha split and output gate of Gated DeltaNet, QSA's block keys
// and block scores, the PLE gate and dilated conv, and the "last rows of [history | window]"
// step that both conv histories (DeltaNet, PLE) and their speculative rollback use.
//
// Contract
// - Formulas are the CPU's (layers/gated_deltanet.cpp, layers/attention.cpp, layers/ple.cpp), with
//   explicitly rounded f32 operations in the CPU's order wherever one thread computes one output:
//   add_rows, split_beta_alpha, history_tail and qsa_block_keys are bitwise the CPU's, and so is
//   qsa_block_scores (its sums are sequential, as the CPU's, because the QSA selection made from
//   them must be the CPU's and transformers' — ties included). The output gate, the PLE gate and
//   conv use CUDA's expf (a few ulp from glibc's); ple_gate's dot is a fixed-order tree sum.
// - Rows are independent (window identity); nothing depends on the launch shape or timing.
// - Device pointers; launches on `stream`; argument errors throw strata::Error first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::compute::cuda {

// acc[i] += y[i] for n values.
void add_rows(float* acc, const float* y, int64_t n, cudaStream_t stream);

// dst rows first .. first + n_rows - 1 = src's n_rows rows (of `width` floats), with first read
// from device memory when the kernel runs (the KV and QSA index appends of a replayed window).
void append_rows_at(const float* src, int64_t n_rows, int64_t width, const int32_t* first_row_device, float* dst,
                    cudaStream_t stream);

// qwen3next's fused [2nv] projection, groups of (b[r] | a[r]) per K head (r = nv / nk):
// beta[t][g·r + j] = ba[t][g·2r + j], alpha[t][g·r + j] = ba[t][g·2r + r + j].
void split_beta_alpha(const float* ba, int64_t n_rows, int n_k_heads, int v_per_k, float* beta, float* alpha,
                      cudaStream_t stream);

// o[i] *= sigmoid(z[i]) (sigmoid_gate) or silu(z[i]), for n values.
void gate_rows(float* o, const float* z, int64_t n, bool sigmoid_gate, cudaStream_t stream);

// out row i (i < n_hist) = row n_rows - n_hist + i of [before (n_hist rows) | rows (n_rows rows)],
// rows of `width` floats: the conv history after a window (or after its first n_rows rows).
// out must not alias before or rows.
void history_tail(const float* before, const float* rows, int64_t n_rows, int64_t n_hist, int64_t width, float* out,
                  cudaStream_t stream);

// QSA block keys before their norm and RoPE: key_b[i] = (Σ_j raw[(b·ratio + j)·di + i], j
// ascending) / ratio for blocks first_block .. first_block + n_blocks - 1, written to
// keys + (b - first_block)·di. raw: the cache's raw indexer keys [n_tokens][di].
void qsa_block_means(const float* raw, int64_t first_block, int64_t n_blocks, int ratio, int di, float* keys,
                     cudaStream_t stream);

// QSA block scores of window row t (position first_pos + t, blocks b < (first_pos + t + 1) / ratio):
// s_tb = (Σ_h max(Σ_i q_thi·κ_bi, 0)) · scale, sums sequential as the CPU's; scores [n_rows][max_blocks]
// (entries past a row's block count are left alone). index_q [n_rows][n_heads·di].
void qsa_block_scores(const float* index_q, int64_t n_rows, int n_heads, int di, const float* block_keys,
                      int64_t first_pos, int ratio, int64_t max_blocks, float scale, float* scores,
                      cudaStream_t stream);

// The same with the window's first position read from device memory when the kernel runs.
void qsa_block_scores_at(const float* index_q, int64_t n_rows, int n_heads, int di, const float* block_keys,
                         const int32_t* first_pos_device, int ratio, int64_t max_blocks, float scale, float* scores,
                         cudaStream_t stream);

// QSA token selection on the device, for rows at positions first .. first + n_rows − 1 (first =
// *first_pos_device, read when the kernel runs): row t with n_blocks = (first + t + 1) / ratio
// complete blocks attends tokens 0 .. first + t when n_blocks <= budget_blocks; otherwise the
// tokens of its budget_blocks best blocks by scores[t·max_blocks + b] (ascending positions) and
// then the n_visible − n_blocks·ratio tokens of its incomplete block: the CPU's select_tokens
// (layers/attention.cpp), blocks tied at the budget boundary kept as torch's CPU topk keeps
// them (layers/torch_top_k.h), so the lists are the CPU's exactly for the same scores.
// Writes token_lists[t·max_tokens + i] for i < token_counts[t]; max_tokens >= (budget_blocks +
// 1)·ratio − 1 holds every row. A row's scores sit in shared memory (9 bytes per block: up to
// 160 KiB, beyond which it throws strata::Error naming the count).
void qsa_select_tokens(const float* scores, int64_t n_rows, int64_t max_blocks, const int32_t* first_pos_device,
                       int ratio, int64_t budget_blocks, int max_tokens, int32_t* token_lists, int32_t* token_counts,
                       cudaStream_t stream);

// PLE gate: per row t and stream s, score = ⟨key_ts, query_ts⟩/√H, gate = σ(sign(score)·√max(|score|, 1e-6)),
// gated[t][s·H + i] = gate·values[t][i]. keys and queries [n_rows][S·H] (normed), values [n_rows][H].
void ple_gate(const float* keys, const float* queries, const float* values, int64_t n_rows, int n_streams,
              int64_t n_embd, float* gated, cudaStream_t stream);

// PLE conv: X[t][c] += gated[t][c] + silu(Σ_j taps[c·K + j]·N(t − (K−1−j)·dilation)[c]), j ascending, where
// N(i) is normed row i for i >= 0 and history row (K−1)·dilation + i before the window.
void ple_conv(const float* normed, const float* history, const float* taps, const float* gated, int64_t n_rows,
              int64_t width, int kernel, int dilation, float* X, cudaStream_t stream);

}  // namespace strata::compute::cuda
