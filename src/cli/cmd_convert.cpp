// `strata convert HF_DIR OUT.gguf [--type T] [--expert-type T] [--no-mtp] [--no-progress]` —
// converts a Hugging Face safetensors checkpoint into a GGUF llama.cpp would also accept.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "convert/convert.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {
namespace {

GgmlType parse_output_type(const std::string& flag, const std::string& text) {
  const auto type = type_from_name(text);
  if (!type || !convert::is_supported_output_type(*type)) {
    fail("{} {}: unknown or unsupported type (expected f32, f16, bf16, q8_0, q4_k, q6_k or q2_k)", flag, text);
  }
  return *type;
}

struct ConvertArgs {
  std::string hf_dir, out_path, type = "f16", expert_type;
  bool no_mtp = false, no_progress = false;
};

}  // namespace

void register_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face safetensors checkpoint to GGUF");
  auto args = std::make_shared<ConvertArgs>();
  cmd->add_option("hf_dir", args->hf_dir, "checkpoint directory (config.json, *.safetensors, tokenizer files)")
      ->required();
  cmd->add_option("out", args->out_path, "output GGUF file")->required();
  cmd->add_option("--type", args->type, "tensor type: f32 f16 bf16 q8_0 q4_k q6_k q2_k (default f16)");
  cmd->add_option("--expert-type", args->expert_type, "type for routed experts (*_exps); default --type");
  cmd->add_flag("--no-mtp", args->no_mtp, "leave out the MTP (nextn) head");
  cmd->add_flag("--no-progress", args->no_progress, "no progress bar");
  cmd->callback([args] {
    convert::ConvertOptions options;
    options.hf_dir = args->hf_dir;
    options.out_path = args->out_path;
    options.type = parse_output_type("--type", args->type);
    if (!args->expert_type.empty()) options.expert_type = parse_output_type("--expert-type", args->expert_type);
    options.include_mtp = !args->no_mtp;
    options.show_progress = !args->no_progress;
    const convert::ConvertReport report = convert::convert_hf_to_gguf(options);

    std::string types;
    for (const auto& [type, count] : report.tensors_by_type) {
      types += fmt::format("{}{} x{}", types.empty() ? "" : ", ", type_name(type), count);
    }
    fmt::print("{}: {} ({}) -> {}: {} tensors, {} [{}]{}\n", args->hf_dir, report.model_type, report.arch,
               args->out_path, report.n_tensors, format_bytes(report.file_bytes), types,
               report.has_tokenizer ? "" : ", no tokenizer (no tokenizer.json)");
    if (!report.fallbacks.empty()) {
      fmt::print("{} tensor(s) stored in a fallback type (row not a multiple of the block):\n", report.fallbacks.size());
      for (const std::string& line : report.fallbacks) fmt::print("  {}\n", line);
    }
  });
}

}  // namespace strata::cli
