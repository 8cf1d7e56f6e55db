#include "convert/convert.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "convert/arch.h"
#include "convert/checkpoint.h"
#include "convert/hf_config.h"
#include "convert/tokenizer_hf.h"
#include "gguf/gguf_writer.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/fp16.h"
#include "util/progress.h"

namespace strata::convert {
namespace {

namespace fs = std::filesystem;

enum class Arch { Qwen3Moe, Qwen3Next, Qwen4Exp };

struct ArchEntry {
  std::string_view model_type;
  Arch arch;
  std::string_view gguf_arch;
  std::string_view tokenizer_pre;  // what llama.cpp's converter writes for these tokenizers
};

constexpr ArchEntry kArchs[] = {
    {"qwen3_moe", Arch::Qwen3Moe, "qwen3moe", "qwen2"},
    {"qwen3_next", Arch::Qwen3Next, "qwen3next", "qwen2"},
    {"qwen4_exp", Arch::Qwen4Exp, "qwen4exp", "qwen35"},
    {"qwen4_exp_text", Arch::Qwen4Exp, "qwen4exp", "qwen35"},
};

bool ends_with(std::string_view text, std::string_view suffix) { return text.ends_with(suffix); }

// general.name: the checkpoint directory's name, as llama.cpp falls back to.
std::string model_name(const std::string& hf_dir) {
  fs::path path = fs::path(hf_dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  return path.filename().string();
}

void check_output_writable(const std::string& out_path) {
  if (out_path.empty()) fail("no output path given");
  const fs::path path(out_path);
  if (fs::is_directory(path)) fail("{}: cannot write: it is a directory", out_path);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(dir)) fail("{}: cannot write: directory {} does not exist", out_path, dir.string());
  if (::access(dir.c_str(), W_OK) != 0) fail("{}: cannot write: directory {} is not writable", out_path, dir.string());
}

// Converts whole rows of f32 into `type` bytes.
void encode_rows(GgmlType type, std::span<const float> values, int64_t row_elems, std::vector<uint8_t>& out) {
  const int64_t n = static_cast<int64_t>(values.size());
  out.resize(row_bytes(type, row_elems) * static_cast<size_t>(n / row_elems));
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out.data(), values.data(), out.size());
      return;
    case GgmlType::F16:
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t bits = type == GgmlType::F16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
        out[2 * i] = static_cast<uint8_t>(bits & 0xff);
        out[2 * i + 1] = static_cast<uint8_t>(bits >> 8);
      }
      return;
    default:
      // Blocks never straddle rows (row_elems is a multiple of the block size), so a run of whole
      // rows quantizes in one call.
      quant::quantize_row(type, values.data(), out.data(), n);
  }
}

}  // namespace

bool is_supported_output_type(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
    case GgmlType::Q2_K:
      return true;
    default:
      return false;
  }
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const ArchEntry& entry : kArchs) out.emplace_back(entry.model_type);
  return out;
}

uint32_t llama_file_type(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 0;    // ALL_F32
    case GgmlType::F16: return 1;    // MOSTLY_F16
    case GgmlType::Q8_0: return 7;   // MOSTLY_Q8_0
    case GgmlType::Q2_K: return 10;  // MOSTLY_Q2_K
    case GgmlType::Q4_K: return 14;  // MOSTLY_Q4_K_S: one type for all tensors, no _M mix
    case GgmlType::Q6_K: return 18;  // MOSTLY_Q6_K
    case GgmlType::BF16: return 32;  // MOSTLY_BF16
    default: fail("no llama.cpp file type for {}", type_name(type));
  }
}

GgmlType choose_tensor_type(const std::string& name, const std::vector<int64_t>& ne, GgmlType type,
                            std::optional<GgmlType> expert_type) {
  const bool keep_f32 = ne.size() <= 1 || ends_with(name, "_norm.weight") || !ends_with(name, ".weight") ||
                        ends_with(name, ".ffn_gate_inp.weight") || ends_with(name, ".ffn_gate_inp_shexp.weight") ||
                        ends_with(name, ".ssm_conv1d.weight");
  if (keep_f32) return GgmlType::F32;
  const GgmlType requested = ends_with(name, "_exps.weight") && expert_type ? *expert_type : type;
  return storable_type(requested, ne.empty() ? 1 : ne[0]);
}

ConvertReport convert_hf_to_gguf(const ConvertOptions& options) {
  for (const auto& [flag, type] : {std::pair{"--type", std::optional(options.type)}, {"--expert-type", options.expert_type}}) {
    if (type && !is_supported_output_type(*type)) {
      fail("{} {}: not supported by convert (expected f32, f16, bf16, q8_0, q4_k, q6_k or q2_k)", flag, type_name(*type));
    }
  }
  check_output_writable(options.out_path);
  const HfConfig config = HfConfig::load(options.hf_dir);
  const std::string model_type = config.string("model_type");
  const ArchEntry* arch = nullptr;
  for (const ArchEntry& entry : kArchs) {
    if (entry.model_type == model_type) arch = &entry;
  }
  if (arch == nullptr) {
    fail("{}: unsupported model_type \"{}\" (supported: {})", config.origin(), model_type,
         fmt::join(supported_model_types(), ", "));
  }
  const std::unique_ptr<HfCheckpoint> checkpoint = HfCheckpoint::open(options.hf_dir);

  GgufWriter writer;
  writer.add_string("general.architecture", std::string(arch->gguf_arch));
  writer.add_string("general.type", "model");
  writer.add_string("general.name", model_name(options.hf_dir));
  ConversionContext ctx(*checkpoint, config, writer, std::string(arch->gguf_arch));
  switch (arch->arch) {
    case Arch::Qwen3Moe: plan_qwen3moe(ctx); break;
    case Arch::Qwen3Next: plan_qwen3next(ctx, {options.include_mtp}); break;
    case Arch::Qwen4Exp: plan_qwen4exp(ctx, {options.include_mtp}); break;
  }
  if (const std::vector<std::string> unused = ctx.unused_tensors(); !unused.empty()) {
    const size_t shown = std::min<size_t>(unused.size(), 8);
    fail("{}: {} tensor(s) unknown to the {} mapping would be dropped: {}{}", options.hf_dir, unused.size(),
         arch->gguf_arch, fmt::join(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
         unused.size() > shown ? ", ..." : "");
  }
  writer.add_u32("general.file_type", llama_file_type(options.type));
  writer.add_u32("general.quantization_version", 2);  // GGML_QNT_VERSION

  ConvertReport report;
  report.arch = arch->gguf_arch;
  report.model_type = model_type;
  report.has_tokenizer = add_hf_tokenizer(options.hf_dir, config, config.integer("vocab_size"),
                                          arch->tokenizer_pre, writer);

  const std::vector<PlannedTensor>& plan = ctx.tensors();
  uint64_t total_bytes = 0;
  for (const PlannedTensor& tensor : plan) {
    if (tensor.ne.empty() || tensor.ne.size() > 4) {
      fail("{}: internal error: {} has {} dimensions", options.hf_dir, tensor.name, tensor.ne.size());
    }
    const GgmlType type = choose_tensor_type(tensor.name, tensor.ne, options.type, options.expert_type);
    const GgmlType requested = ends_with(tensor.name, "_exps.weight") && options.expert_type ? *options.expert_type : options.type;
    if (type != requested && type != GgmlType::F32) {
      report.fallbacks.push_back(fmt::format("{}: {} -> {} (row of {})", tensor.name, type_name(requested),
                                             type_name(type), tensor.ne[0]));
    }
    total_bytes += writer.add_tensor(tensor.name, type, tensor.ne).n_bytes;
    ++report.tensors_by_type[type];
  }
  report.n_tensors = plan.size();

  ProgressBar progress("convert", plan.size(), total_bytes);
  if (!options.show_progress) progress.set_enabled(false);
  size_t next = 0;
  std::vector<uint8_t> encoded;
  writer.write_file(options.out_path, [&](const GgufTensorDecl& decl, GgufTensorSink& sink) {
    const PlannedTensor& tensor = plan.at(next++);
    if (tensor.name != decl.name) fail("internal error: writer asked for {}, plan has {}", decl.name, tensor.name);
    const int64_t row_elems = decl.ne[0];
    const int64_t expected = decl.ne[0] * decl.ne[1] * decl.ne[2] * decl.ne[3];
    int64_t produced = 0;
    tensor.produce([&](std::span<const float> rows) {
      const auto n = static_cast<int64_t>(rows.size());
      if (n % row_elems != 0 || produced + n > expected) {
        fail("{}: internal error: producer for {} gave {} values after {} (rows of {}, {} expected)", options.hf_dir,
             decl.name, n, produced, row_elems, expected);
      }
      produced += n;
      encode_rows(decl.type, rows, row_elems, encoded);
      sink.write(encoded);
      progress.advance(0, encoded.size());
    });
    if (produced != expected) {
      fail("{}: internal error: producer for {} gave {} values, expected {}", options.hf_dir, decl.name, produced, expected);
    }
    progress.advance(1, 0);
  });
  progress.finish();
  report.file_bytes = fs::file_size(options.out_path);
  return report;
}

}  // namespace strata::convert
