// The tensor list of an architecture: every GGUF tensor name with its ggml shape and its role.
//
// Each architecture file provides one (`qwen4exp_tensor_specs`, ...), derived from the
// hyper-parameters alone, using the names llama.cpp's converter writes. `strata synth` writes
// files from it, and `Model::load` checks a file against it before building weight views, so a
// missing or misshapen tensor is reported up front with the file, tensor, expected and found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/hparams.h"

namespace strata {

enum class TensorRole {
  Embedding,   // token_embd
  Output,      // lm head
  Matrix,      // dense 2-D weight, quantizable
  Router,      // ffn_gate_inp: kept F32 by quantizers
  Expert,      // *_exps stacks: streamed, quantized with the expert type
  Norm,        // 1-D norm weight (+1 folded where HF uses (1+w))
  Vector,      // other small f32 tensors: biases, conv taps, A
  PleTable,    // per_layer_token_embd: read row by row, never loaded whole
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order, ne[0] contiguous
  TensorRole role = TensorRole::Matrix;
  int64_t n_elements() const;
};

std::vector<TensorSpec> qwen4exp_tensor_specs(const HParams& hp);
std::vector<TensorSpec> qwen3next_tensor_specs(const HParams& hp);
std::vector<TensorSpec> qwen3moe_tensor_specs(const HParams& hp);
std::vector<TensorSpec> tensor_specs(const HParams& hp);  // dispatches on hp.arch

}  // namespace strata
