// TensorLoader — typed, shape-checked access to a GGUF file's tensors by name and explicit shape.
//
// The architecture files do not use it directly: they reach their weights through their tensor
// table (model/tensor_table.h), which declares each shape once and checks with this class.
// Every accessor checks the tensor exists, has exactly the expected ggml shape, and a type the
// kernels support; a mismatch throws strata::Error naming the file, the tensor, expected and found
// (e.g. "m.gguf: tensor blk.3.ffn_up_exps: expected shape [64, 32, 16], found [64, 16, 16]").
// Matrices are views into the read-only mapping (no copy); vectors are dequantized to owned f32.
// Expert stacks are described by offset so the expert store can pread them instead of touching
// the mapping.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compute/cpu/matmul.h"
#include "gguf/gguf.h"

namespace strata {

// "[64, 32, 16]"
std::string shape_string(const int64_t* ne, int n_dims);

// One [n_expert] stack of [n_out x n_in] matrices (ggml ne = {n_in, n_out, n_expert}).
struct ExpertTensor {
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  int64_t n_expert = 0;
  uint64_t file_offset = 0;   // of expert 0
  size_t expert_bytes = 0;    // bytes of one expert's matrix
  const uint8_t* mapped = nullptr;

  compute::WeightMatrix expert(int64_t e) const;  // view into the mapping
};

class TensorLoader {
 public:
  explicit TensorLoader(const GgufFile& file) : file_(file) {}

  // Names are given without the ".weight" suffix llama.cpp's converter appends to tensors whose
  // HF names carry it; lookups try "<name>.weight" first, then "<name>" exactly.
  bool has(const std::string& name) const { return find(name) != nullptr; }
  const TensorInfo* find(const std::string& name) const;
  // A [n_out x n_in] matrix, ggml ne = {n_in, n_out}.
  compute::WeightMatrix matrix(const std::string& name, int64_t n_in, int64_t n_out) const;
  // A tensor of n elements in any shape whose element count is n (1-D norms, biases, conv taps),
  // dequantized to f32.
  std::vector<float> floats(const std::string& name, int64_t n) const;
  ExpertTensor experts(const std::string& name, int64_t n_in, int64_t n_out, int64_t n_expert) const;
  const GgufFile& file() const { return file_; }
  // The tensor, after checking it exists, has exactly this ggml shape and a type with kernels.
  const TensorInfo& checked(const std::string& name, const std::vector<int64_t>& shape) const;
  // The two checks of `checked` on a tensor already found. Trailing dimensions of 1 are equal
  // to absent ones (HF [1, H] stores as ne {H, 1}), as in llama.cpp's loader.
  void check_shape(const TensorInfo& info, const std::vector<int64_t>& shape) const;
  void check_type(const TensorInfo& info) const;

 private:
  const GgufFile& file_;
};

}  // namespace strata
