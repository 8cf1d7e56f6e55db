// strata convert — a Hugging Face checkpoint directory (config.json + safetensors) → one GGUF file
// that llama.cpp would also accept: the tensor names, shapes, value transforms and metadata keys of
// llama.cpp's converter for qwen3moe, qwen3next and qwen4exp (docs/convert.md).
//
// Contract
// - Bad input throws strata::Error naming the file/tensor/field: a missing config.json, an
//   unsupported model_type (named, with the supported list), a missing tensor, a shape mismatch
//   (expected vs found), a checkpoint tensor no mapping consumes, an unwritable output.
// - The output is written atomically (temp file + fsync + rename): on any error no file appears.
// - Memory: one tensor at a time, and the routed-expert stacks and the PLE table one expert / one
//   chunk of rows at a time, so a checkpoint larger than RAM converts (inputs are mmapped).
// - Types (`choose_tensor_type`), like llama.cpp's converter and quantizer: 1-D tensors, every
//   "*_norm.weight", routers (ffn_gate_inp, ffn_gate_inp_shexp), ssm_conv1d and names without a
//   ".weight" suffix (ssm_a, ssm_dt.bias) stay F32; routed experts (*_exps) use `expert_type` when
//   given; everything else, token_embd and output included, uses `type`. A block type that does not
//   divide the row length falls back as llama.cpp's quantizer does (storable_type: Q5_0 for Q4_K,
//   Q5_1 for Q5_K, Q4_0 for Q2_K, IQ4_NL for IQ2_XS, Q8_0 for Q6_K), else Q8_0, else F16.
// - Not thread-safe; one conversion per call.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "quant/ggml_type.h"

namespace strata::convert {

struct ConvertOptions {
  std::string hf_dir;
  std::string out_path;
  GgmlType type = GgmlType::F16;           // f32 f16 bf16 q8_0 q4_K q6_K q2_K
  std::optional<GgmlType> expert_type;     // for *_exps; default: `type`
  bool include_mtp = true;                 // qwen4exp, qwen3next: export the MTP head as blk.<L>
  bool show_progress = true;               // progress bar on stderr (when it is a terminal)
};

struct ConvertReport {
  std::string arch;          // GGUF architecture written
  std::string model_type;    // HF model_type read
  size_t n_tensors = 0;
  uint64_t file_bytes = 0;
  std::map<GgmlType, size_t> tensors_by_type;
  std::vector<std::string> fallbacks;  // "blk.0.ffn_down_exps.weight: q4_K -> q8_0 (row 640)"
  bool has_tokenizer = false;
};

ConvertReport convert_hf_to_gguf(const ConvertOptions& options);

// The storage type of one output tensor (see the contract above). `ne` is ggml order.
GgmlType choose_tensor_type(const std::string& name, const std::vector<int64_t>& ne, GgmlType type,
                            std::optional<GgmlType> expert_type);

// Types accepted for --type / --expert-type.
bool is_supported_output_type(GgmlType type);
// HF model_type values convert understands ("qwen3_moe", "qwen3_next", "qwen4_exp", ...).
std::vector<std::string> supported_model_types();
// llama.cpp's general.file_type (LlamaFileType) for a requested type.
uint32_t llama_file_type(GgmlType type);

}  // namespace strata::convert
