// The tensor table of an architecture: every GGUF tensor it knows, declared once, with its ggml
// shape, its role, and whether a file must, may or must not hold it.
//
// Each architecture file provides one (`qwen4exp_tensor_specs`, ...), derived from the
// hyper-parameters alone, using the names llama.cpp's converter writes. Everything that needs to
// know an architecture's tensors reads this one list:
// - `Model::load` checks a file against it before building any weight (model/tensor_table.h): a
//   missing, misshapen, mistyped or refused tensor is reported up front naming the file, the
//   tensor, what was expected and what was found;
// - the architecture files then fetch their weights through the same table by name, so a shape
//   is written only here, and a tensor the table does not declare cannot be loaded;
// - `strata synth` writes a file from it (every entry marked `synthesized`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/hparams.h"

namespace strata {

// What a tensor is for. The role is also the type rule: the loader accepts any type with CPU
// kernels for every role (norms and vectors are dequantized to f32 at load); writers choose by
// role (synth: Router, Norm, Vector stay f32, Expert gets the expert type, the rest the dense
// type).
enum class TensorRole {
  Embedding,  // token_embd
  Output,     // lm head
  Matrix,     // dense 2-D weight, quantizable
  Router,     // ffn_gate_inp: kept F32 by quantizers
  Expert,     // *_exps stacks: streamed, quantized with the expert type
  Norm,       // 1-D norm weight (+1 folded where HF uses (1+w))
  Vector,     // other small f32 tensors: biases, conv taps, A
  PleTable,   // per_layer_token_embd: read row by row, never loaded whole; ne[1] is a minimum
              // (the converter pads the row count)
};

enum class Presence {
  Required,  // the file must hold it
  Optional,  // the file may leave it out; the loader then falls back (named where it is loaded)
  Refused,   // a layout strata does not run: a file holding it is refused with `refusal`
};

struct TensorSpec {
  std::string name;         // as in the file, e.g. "blk.3.ffn_up_exps.weight"
  std::vector<int64_t> ne;  // ggml order, ne[0] contiguous (empty for Refused)
  TensorRole role = TensorRole::Matrix;
  Presence presence = Presence::Required;
  // Whether `strata synth` writes it. False for Refused entries and for optional tensors synth
  // leaves out so that the loader's fallback is what its files exercise.
  bool synthesized = true;
  std::string refusal;  // Presence::Refused: why, and what to do instead
  int64_t n_elements() const;
};

std::vector<TensorSpec> qwen4exp_tensor_specs(const HParams& hp);
std::vector<TensorSpec> qwen3next_tensor_specs(const HParams& hp);
std::vector<TensorSpec> qwen3moe_tensor_specs(const HParams& hp);
std::vector<TensorSpec> tensor_specs(const HParams& hp);  // dispatches on hp.arch

}  // namespace strata
