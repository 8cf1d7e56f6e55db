// CUDA twin of the attention core of layers/attention.cpp (after the q/k norms and RoPE, which
// are ops.h's rms_norm/rope): scores, softmax and the weighted sum of values per (row, head),
// with GQA, the gated variant (out ⊙ σ(gate)) and an optional per-row token list (QSA's
// selection); plus the KV-cache append.
//
// Contract
// - Row t of the window attends either tokens 0 .. first_pos + t (dense, token_lists null) or
//   token_lists[t·max_tokens + i] for i < token_counts[t] (ascending positions, as the CPU's
//   select_tokens gives them). Head h reads KV head h / (n_head / n_head_kv).
// - Per (row, head): score_i = (Σ_j q_j·k_ij, j ascending)·(1/√hd), bitwise the CPU's; softmax
//   with CUDA's expf, the max and the sum in a fixed tree order; ·σ(gate_j) when gated.
//   Flash-decoding: the row's tokens are cut into attention_split(n_tok) consecutive splits, one
//   thread block each, so a decode row of a long context spreads over many SMs.
//   - A row of one split (≤ 128 tokens): w_i = e_i·(1/Σe), out_j = Σ_i w_i·v_ij (i ascending),
//     the CPU's order (on the tiny qwen3moe fixture another order moved a router past a near-tie).
//   - Several: split z keeps its own max m_z, e_i = e^(s_i − m_z), l_z = Σ e_i and
//     acc_z,j = Σ_i e_i·v_ij (i ascending); then M = max m_z, α_z = e^(m_z − M),
//     out_j = (Σ_z α_z·acc_z,j)·(1/Σ_z α_z·l_z) (z ascending), within a few ulp per token of the
//     CPU (tests/cuda/attention_test.cpp states the bound).
//   The result depends on the row's own tokens only: not on the other rows of the window, the
//   window size or the launch's token bound (window identity), nor on launch timing.
// - Rows whose split count is above 1 need `partials`: attention_partial_floats(shape, n_rows,
//   most) floats of device memory (scratch, no initial contents), where `most` is the bound the
//   call works to: first_pos + n_rows for attention_rows (max_tokens with token lists), and
//   tokens_bound (or max(max_tokens, tokens_bound) with token lists) for attention_rows_at.
//   Null is fine when that is 0 (every row one split).
// - At most kMaxAttentionTokens tokens per row; beyond that the call throws strata::Error naming
//   the count.
// - kv_append copies n_rows rows of k and v ([n_rows][kv_dim]) to rows n_tokens.. of the caches.
// - Device pointers; launches on `stream`; argument errors throw strata::Error first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::compute::cuda {

inline constexpr int kMaxAttentionTokens = 48 * 1024;
struct AttentionShape {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  bool gated = false;          // q rows hold [q | gate] per head
  int64_t q_row_stride = 0;    // floats between rows of q
  int64_t kv_dim = 0;          // floats per cache row (n_head_kv · head_dim)
};

inline constexpr int kAttentionSplitTokens = 128;  // a split's tokens, up to kAttentionMaxSplits splits
inline constexpr int kAttentionMaxSplits = 32;

// The splits of a row of n_tok tokens: count = clamp(⌈n_tok / 128⌉, 1, 32), each of
// tokens = ⌈n_tok / count⌉ (the last one the rest).
struct AttentionSplit {
  int count = 1, tokens = 0;
};
AttentionSplit attention_split(int n_tok);
// Floats of `partials` a call over n_rows rows of at most `most` tokens needs (0: none).
int64_t attention_partial_floats(const AttentionShape& shape, int64_t n_rows, int64_t most);

void attention_rows(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                    const float* v_cache, int64_t first_pos, const int32_t* token_lists,
                    const int32_t* token_counts, int max_tokens, float* partials, float* out, cudaStream_t stream);

// The same with the window's first position read from device memory when the kernel runs, so
// one captured launch serves every n_past: tokens_bound (>= the most tokens any row attends,
// rounded up by the caller so windows of a range share a launch shape) sizes the shared memory.
void attention_rows_at(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                       const float* v_cache, const int32_t* first_pos_device, int64_t tokens_bound,
                       const int32_t* token_lists, const int32_t* token_counts, int max_tokens, float* partials,
                       float* out, cudaStream_t stream);

void kv_append(const float* k, const float* v, int64_t n_rows, int64_t kv_dim, int64_t n_tokens, float* k_cache,
               float* v_cache, cudaStream_t stream);

}  // namespace strata::compute::cuda
