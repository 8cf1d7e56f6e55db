// CUDA twin of the attention core of layers/attention.cpp (after the q/k norms and RoPE, which
// are ops.h's rms_norm/rope): scores, softmax and the weighted sum of values per (row, head),
// with GQA, the gated variant (out ⊙ σ(gate)) and an optional per-row token list (QSA's
// selection); plus the KV-cache append.
//
// Contract
// - Row t of the window attends either tokens 0 .. first_pos + t (dense, token_lists null) or
//   token_lists[t·max_tokens + i] for i < token_counts[t] (ascending positions, as the CPU's
//   select_tokens gives them). Head h reads KV head h / (n_head / n_head_kv).
// - Per (row, head): score_i = (Σ_j q_j·k_ij, j ascending)·(1/√hd), bitwise the CPU's; softmax in a
//   fixed tree order with CUDA's expf (a few ulp from the CPU's); out_j = Σ_i w_i·v_ij (i
//   ascending, as the CPU) then ·σ(gate_j) when gated. No result depends on the other rows of
//   the window or on the window size (window identity), and nothing on launch timing.
// - At most kMaxAttentionTokens tokens per row for now (the weights sit in shared memory);
//   beyond that the call throws strata::Error naming the count. (Flash-decoding splits come with
//   the window graph.)
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

void attention_rows(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                    const float* v_cache, int64_t first_pos, const int32_t* token_lists,
                    const int32_t* token_counts, int max_tokens, float* out, cudaStream_t stream);

// The same with the window's first position read from device memory when the kernel runs, so
// one captured launch serves every n_past: tokens_bound (>= the most tokens any row attends,
// rounded up by the caller so windows of a range share a launch shape) sizes the shared memory.
void attention_rows_at(const AttentionShape& shape, const float* q, int64_t n_rows, const float* k_cache,
                       const float* v_cache, const int32_t* first_pos_device, int64_t tokens_bound,
                       const int32_t* token_lists, const int32_t* token_counts, int max_tokens, float* out,
                       cudaStream_t stream);

void kv_append(const float* k, const float* v, int64_t n_rows, int64_t kv_dim, int64_t n_tokens, float* k_cache,
               float* v_cache, cudaStream_t stream);

}  // namespace strata::compute::cuda
