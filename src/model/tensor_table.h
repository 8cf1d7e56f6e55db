// TensorTable — an architecture's declared tensors (model/tensor_specs.h) bound to one GGUF file:
// the check of the whole file against the declarations, and the only way the architecture files
// reach their weights.
//
// Contract
// - `check()` walks every declaration before anything is loaded. Refused tensors are looked at
//   first (a file in a layout strata does not run gets that reason, not a missing-tensor error
//   caused by the layout); then each Required tensor must exist, and each present tensor must
//   have the declared shape (trailing 1s equal absent dimensions; a PleTable's row count is a
//   minimum) and a type with kernels. Errors name the file, the tensor, expected and found, e.g.
//   "m.gguf: tensor blk.0.ffn_gate_exps.weight: expected shape [64, 32, 32], found [64, 16, 32]".
// - Accessors take the name without the ".weight" suffix the declaration carries ("blk.3.attn_q";
//   "blk.3.ssm_a" for bare names) and return the declared tensor; the shape comes from the
//   declaration only. Asking for a tensor the table does not declare, or through an accessor
//   that does not fit its declared role, is an internal error naming the tensor. An Optional
//   tensor the file lacks is asked for only after `present` says it is there.
// - Every tensor handed out is recorded (`loaded`), which is what lets a test prove that the
//   loader and the declarations agree: every declared tensor a file holds is loaded, and nothing
//   else.
// - Views returned point into the file's read-only mapping; the file must outlive them.
//   Single-threaded (used during Model::load).
#pragma once

#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/tensor_loader.h"
#include "model/tensor_specs.h"

namespace strata {

class TensorTable {
 public:
  TensorTable(const GgufFile& file, std::vector<TensorSpec> specs);

  void check() const;

  const std::vector<TensorSpec>& specs() const { return specs_; }
  // Whether the table declares the tensor (any presence), and whether the file holds it.
  bool declares(const std::string& name) const { return lookup(name) != nullptr; }
  bool present(const std::string& name) const;

  // A declared 2-D weight (Matrix, Router, Embedding, Output): ne {n_in, n_out}.
  compute::WeightMatrix matrix(const std::string& name);
  // A declared Norm or Vector tensor, dequantized to f32 (all its elements, in file order).
  std::vector<float> floats(const std::string& name);
  // A declared Expert stack: ne {n_in, n_out, n_expert}.
  ExpertTensor experts(const std::string& name);
  // A declared PleTable, as the file describes it (its row count may exceed the declaration).
  const TensorInfo& table(const std::string& name);

  // File names of the tensors handed out so far, in the order they were asked for.
  const std::vector<std::string>& loaded() const { return loaded_; }

 private:
  const TensorSpec* lookup(const std::string& name) const;
  // The declaration, after checking it exists, is in the file and has one of the roles given.
  const TensorSpec& take(const std::string& name, std::initializer_list<TensorRole> roles,
                         const char* accessor);

  const GgufFile& file_;
  TensorLoader checker_;
  std::vector<TensorSpec> specs_;
  std::unordered_map<std::string, size_t> index_;  // file name → specs_ index
  std::vector<std::string> loaded_;
};

}  // namespace strata
