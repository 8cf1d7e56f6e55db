// Value transforms the HF → GGUF conversion applies, as llama.cpp's converter does (reference
// qwen4exp.md §12, qwen3next-qwen3moe.md §7). Pure functions on row-major f32 matrices; no I/O.
//
// Conventions: a PyTorch [rows, cols] matrix is stored row-major (cols contiguous) and becomes ggml
// ne = {cols, rows} unchanged in memory, so "rows" here are ggml ne1 entries.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata::convert {

// (1+w) norm folding: w ← w + 1 (GGUF stores the effective gain).
void add_one(std::span<float> values);
// A_log → A = −exp(A_log), computed in f32.
void negate_exp(std::span<float> values);

// V-head reorder, grouped → tiled. HF orders the n_k·v_per_k V heads grouped by K head
// (h = g·v_per_k + i); GGUF orders them tiled (p = i·n_k + g) so that V head p reads K head
// p mod n_k. Returns, for each output position p, the HF head it takes.
std::vector<int64_t> v_heads_grouped_to_tiled(int64_t n_k_heads, int64_t v_per_k);

// Expands a block permutation to element indices: block p of `block_size` elements comes from
// block source_of_block[p]; `base` is added to every index.
std::vector<int64_t> expand_block_permutation(std::span<const int64_t> source_of_block,
                                              int64_t block_size, int64_t base = 0);

// out row r = matrix row source_rows[r]; `matrix` has `cols` columns.
std::vector<float> gather_rows(std::span<const float> matrix, int64_t cols,
                               std::span<const int64_t> source_rows);
// In place: every row's column c becomes its old column source_cols[c].
void gather_columns(std::span<float> matrix, int64_t cols, std::span<const int64_t> source_cols);

// Qwen3-Next in_proj_qkvz: rows grouped per K head g as [q_g (dk) | k_g (dk) | v_g (r·dv) | z_g (r·dv)].
// llama.cpp regroups them into attn_qkv = [all q | all k | all v] and attn_gate = [all z], each in
// group order (V heads stay in g·r+j order). These return the source rows of each output row.
struct QkvzRows {
  std::vector<int64_t> qkv;
  std::vector<int64_t> z;
};
QkvzRows qwen3next_qkvz_rows(int64_t n_k_heads, int64_t k_head_dim, int64_t v_per_k,
                             int64_t v_head_dim);

}  // namespace strata::convert
