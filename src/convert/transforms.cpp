#include "convert/transforms.h"

#include <cmath>
#include <cstring>

#include "util/error.h"

namespace strata::convert {

void add_one(std::span<float> values) {
  for (float& v : values) v += 1.0f;
}

void negate_exp(std::span<float> values) {
  for (float& v : values) v = -std::exp(v);
}

std::vector<int64_t> v_heads_grouped_to_tiled(int64_t n_k_heads, int64_t v_per_k) {
  std::vector<int64_t> source(static_cast<size_t>(n_k_heads * v_per_k));
  for (int64_t i = 0; i < v_per_k; ++i) {
    for (int64_t g = 0; g < n_k_heads; ++g) source[i * n_k_heads + g] = g * v_per_k + i;
  }
  return source;
}

std::vector<int64_t> expand_block_permutation(std::span<const int64_t> source_of_block,
                                              int64_t block_size, int64_t base) {
  std::vector<int64_t> out;
  out.reserve(source_of_block.size() * static_cast<size_t>(block_size));
  for (int64_t block : source_of_block) {
    for (int64_t j = 0; j < block_size; ++j) out.push_back(base + block * block_size + j);
  }
  return out;
}

std::vector<float> gather_rows(std::span<const float> matrix, int64_t cols,
                               std::span<const int64_t> source_rows) {
  const int64_t n_rows = cols > 0 ? static_cast<int64_t>(matrix.size()) / cols : 0;
  std::vector<float> out(source_rows.size() * static_cast<size_t>(cols));
  for (size_t r = 0; r < source_rows.size(); ++r) {
    const int64_t src = source_rows[r];
    if (src < 0 || src >= n_rows) fail("gather_rows: source row {} outside {} rows", src, n_rows);
    std::memcpy(out.data() + r * cols, matrix.data() + src * cols, static_cast<size_t>(cols) * 4);
  }
  return out;
}

void gather_columns(std::span<float> matrix, int64_t cols, std::span<const int64_t> source_cols) {
  if (static_cast<int64_t>(source_cols.size()) != cols) {
    fail("gather_columns: {} column sources for {} columns", source_cols.size(), cols);
  }
  std::vector<float> row(static_cast<size_t>(cols));
  for (size_t start = 0; start + cols <= matrix.size(); start += cols) {
    for (int64_t c = 0; c < cols; ++c) row[c] = matrix[start + source_cols[c]];
    std::memcpy(matrix.data() + start, row.data(), static_cast<size_t>(cols) * 4);
  }
}

QkvzRows qwen3next_qkvz_rows(int64_t n_k_heads, int64_t k_head_dim, int64_t v_per_k,
                             int64_t v_head_dim) {
  const int64_t v_rows = v_per_k * v_head_dim;
  const int64_t group_rows = 2 * k_head_dim + 2 * v_rows;
  QkvzRows rows;
  // Part offsets inside one group: q at 0, k at dk, v at 2·dk, z at 2·dk + r·dv.
  const int64_t part_offset[3] = {0, k_head_dim, 2 * k_head_dim};
  const int64_t part_rows[3] = {k_head_dim, k_head_dim, v_rows};
  for (int part = 0; part < 3; ++part) {
    for (int64_t g = 0; g < n_k_heads; ++g) {
      for (int64_t j = 0; j < part_rows[part]; ++j) rows.qkv.push_back(g * group_rows + part_offset[part] + j);
    }
  }
  for (int64_t g = 0; g < n_k_heads; ++g) {
    for (int64_t j = 0; j < v_rows; ++j) rows.z.push_back(g * group_rows + 2 * k_head_dim + v_rows + j);
  }
  return rows;
}

}  // namespace strata::convert
