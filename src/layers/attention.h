// Causal self-attention with a KV cache, in the three flavours the architectures use:
//   plain GQA (qwen3moe), gated (qwen3next: per head [q | gate], output ⊙ σ(gate)), and
//   QSA (qwen4exp: gated attention restricted to the query's tail plus the top-budget 4-token
//   blocks chosen by a lightweight indexer; shared/reference/qwen4exp.md §7).
// q/k get a per-head RMS norm (weights as stored in GGUF: +1 already folded where HF uses
// (1+w)) and partial NeoX RoPE on the first n_rot dims. Softmax is fp32 over keys in ascending
// position order. Each row attends to the cache plus the rows before it in the window, and is
// computed independently of the rows after it, so results are window-size invariant.
//
// QSA selection for a query at position p (all of 0..p visible): nb = ⌊(p+1)/ratio⌋ complete
// blocks; when nb ≤ budget/ratio every block is selected (dense). Otherwise block b scores
// s_b = (1/√di)·Σ_h relu(qI_h·κ_b) with κ_b = RoPE_{ratio·b}(N1p(mean of the block's raw
// indexer keys)); the top budget/ratio blocks plus the tail tokens ratio·nb..p are attended.
// Ties between block scores (common: relu zeroes many) are broken exactly as torch.topk on the
// CPU does (see torch_cpu_top_k_set), so selection is deterministic and matches HF.
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

struct AttentionWeights {
  compute::WeightMatrix q;  // [n_head·head_dim·(gated ? 2 : 1) x H]
  compute::WeightMatrix k;  // [kv_dim x H]
  compute::WeightMatrix v;  // [kv_dim x H]
  compute::WeightMatrix o;  // [H x n_head·head_dim]
  std::vector<float> q_norm, k_norm;  // [head_dim]; empty = no per-head norm
  bool gated = false;
  // QSA indexer: sparse when loaded and compress_ratio > 0; ratio 0 (llama.cpp's "no ratio")
  // attends densely with the indexer unused.
  compute::WeightMatrix index_q;  // [n_idx_head·di x H]
  compute::WeightMatrix index_k;  // [di x H]
  std::vector<float> index_q_norm, index_k_norm;  // [di]
  int compress_ratio = 0;
  bool sparse() const { return index_q.data != nullptr && compress_ratio > 0; }
};

// Per-layer cache. Keys are stored after norm + RoPE; raw indexer keys are kept per token and
// each completed block's key κ_b is computed once.
struct KvCache {
  int64_t n_tokens = 0;
  std::vector<float> k, v;            // [n_tokens][kv_dim]
  std::vector<float> index_k_raw;     // [n_tokens][di]
  std::vector<float> block_keys;      // [n_complete_blocks][di]
  void clear();
  // Reserves room for n tokens so that appending up to n never allocates (session start).
  void reserve(int64_t n, int64_t kv_dim, int index_dim, int compress_ratio);
  // Drops everything after the first n tokens (speculative rollback).
  void truncate(int64_t n, int64_t kv_dim, int index_dim, int compress_ratio);
};

// The QSA block selection's tie rule: the k indices of `values` torch.topk picks on the CPU
// (ties included; see attention.cpp). `set` receives them in no particular order.
void torch_cpu_top_k_set(const std::vector<float>& values, int64_t k, std::vector<int64_t>& set);

// Row t sits at absolute position cache.n_tokens + t; the cache grows by n_rows.
// Scratch comes from `ws` (nothing is allocated once the window shape has run and the cache was
// reserved).
void attention_forward(compute::ThreadPool& pool, compute::Workspace& ws, const AttentionDims& dims,
                       const AttentionWeights& w, KvCache& cache, const float* x, int64_t n_rows,
                       float* y);

// Several sequences in one window (serve --parallel): rows [segments[s].first_row, + n_rows) of
// x belong to caches[s]. The q/k/v (and QSA indexer) projections and the output projection run
// once over all rows, everything that reads the cache or the positions per sequence; each
// sequence's rows and cache are bitwise what attention_forward gives it alone.
void attention_forward_rows(compute::ThreadPool& pool, compute::Workspace& ws,
                            const AttentionDims& dims, const AttentionWeights& w,
                            std::span<KvCache* const> caches,
                            std::span<const compute::RowSegment> segments, const float* x,
                            int64_t n_rows, float* y);

}  // namespace strata
