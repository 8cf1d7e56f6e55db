// `strata inspect FILE.gguf` — describes a GGUF model: container facts, the architecture's
// hyper-parameters, the tokenizer, tensor bytes by ggml type, routed-expert vs dense bytes and the
// largest tensors. `--tensors` lists every tensor, `--metadata` every key. A bad file is one
// strata::Error (main prints it on one line and exits 1).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool list_tensors = false;
  bool list_metadata = false;
  size_t top_n = 10;
};

std::string human_bytes(uint64_t n_bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(n_bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", n_bytes) : fmt::format("{:.2f} {}", value, kUnits[unit]);
}

std::string shape_string(const TensorInfo& t) {
  std::string out = "[";
  for (int d = 0; d < t.n_dims; ++d) out += fmt::format("{}{}", d ? ", " : "", t.ne[d]);
  return out + "]";
}

double percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

bool is_routed_expert(const TensorInfo& t) { return t.name.find("_exps") != std::string::npos; }

// "151643 '<|endoftext|>'" when the token text is available.
std::string token_with_text(const GgufFile& file, std::string_view id_key) {
  const GgufValue* id_value = file.find(id_key);
  if (id_value == nullptr) return "-";
  const int64_t id = file.get<int64_t>(id_key);
  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  if (tokens != nullptr && tokens->type == GgufValueType::ARRAY) {
    const GgufArray& array = std::get<GgufArray>(tokens->value);
    if (array.element_type == GgufValueType::STRING && id >= 0 &&
        static_cast<uint64_t>(id) < array.strings.size()) {
      GgufValue text;
      text.type = GgufValueType::STRING;
      text.value = array.strings[static_cast<size_t>(id)];
      return fmt::format("{} {}", id, gguf_value_to_string(text));
    }
  }
  return fmt::format("{}", id);
}

void print_overview(const GgufFile& file, const std::string& arch) {
  fmt::print("file            {}\n", file.path());
  fmt::print("size            {} bytes ({})\n", file.file_size(), human_bytes(file.file_size()));
  fmt::print("gguf            version {}, {} keys, {} tensors, alignment {}, data at offset {}\n",
             file.version(), file.keys().size(), file.tensors().size(), file.alignment(),
             file.data_section_offset());
  fmt::print("architecture    {}\n", arch.empty() ? "(general.architecture missing)" : arch);
  const std::pair<const char*, const char*> general_keys[] = {
      {"name", "general.name"}, {"file type", "general.file_type"}, {"quant version", "general.quantization_version"}};
  for (const auto& [label, key] : general_keys) {
    if (const GgufValue* value = file.find(key)) fmt::print("{:<15} {}\n", label, gguf_value_to_string(*value));
  }
}

void print_hyper_parameters(const GgufFile& file, const std::string& arch) {
  if (arch.empty()) return;
  const std::string prefix = arch + ".";
  std::vector<std::string> keys;
  for (const std::string& key : file.keys()) {
    if (key.starts_with(prefix)) keys.push_back(key);
  }
  fmt::print("\nhyper-parameters ({}.*, {} keys)\n", arch, keys.size());
  size_t width = 0;
  for (const std::string& key : keys) width = std::max(width, key.size() - prefix.size());
  for (const std::string& key : keys) {
    fmt::print("  {:<{}}  {}\n", key.substr(prefix.size()), width, gguf_value_to_string(*file.find(key), 6));
  }
}

void print_tokenizer(const GgufFile& file) {
  const bool has_tokenizer = std::any_of(file.keys().begin(), file.keys().end(), [](const std::string& k) {
    return k.starts_with("tokenizer.");
  });
  fmt::print("\ntokenizer\n");
  if (!has_tokenizer) {
    fmt::print("  (no tokenizer.* keys)\n");
    return;
  }
  auto string_or_dash = [&](std::string_view key) {
    return file.has(key) ? gguf_value_to_string(*file.find(key)) : std::string("-");
  };
  auto array_length = [&](std::string_view key) -> std::string {
    const GgufValue* value = file.find(key);
    if (value == nullptr) return "-";
    if (value->type != GgufValueType::ARRAY) return gguf_value_type_description(*value);
    return fmt::format("{}", std::get<GgufArray>(value->value).size());
  };
  fmt::print("  model          {}\n", string_or_dash("tokenizer.ggml.model"));
  fmt::print("  pre            {}\n", string_or_dash("tokenizer.ggml.pre"));
  fmt::print("  vocab size     {}\n", array_length("tokenizer.ggml.tokens"));
  fmt::print("  merges         {}\n", array_length("tokenizer.ggml.merges"));
  fmt::print("  bos            {}\n", token_with_text(file, "tokenizer.ggml.bos_token_id"));
  fmt::print("  eos            {}\n", token_with_text(file, "tokenizer.ggml.eos_token_id"));
  if (const GgufValue* tmpl = file.find("tokenizer.chat_template")) {
    fmt::print("  chat template  {}\n", tmpl->type == GgufValueType::STRING
                                           ? fmt::format("{} bytes", std::get<std::string>(tmpl->value).size())
                                           : gguf_value_type_description(*tmpl));
  }
}

void print_tensor_summary(const GgufFile& file, size_t top_n) {
  const auto& tensors = file.tensors();
  struct TypeTotals {
    size_t count = 0;
    uint64_t bytes = 0;
    int64_t elements = 0;
  };
  std::map<GgmlType, TypeTotals> by_type;
  uint64_t total_bytes = 0, expert_bytes = 0, expert_slice_bytes = 0;
  size_t expert_tensors = 0;
  std::set<std::string> expert_layers;
  for (const TensorInfo& t : tensors) {
    TypeTotals& totals = by_type[t.type];
    ++totals.count;
    totals.bytes += t.n_bytes;
    totals.elements += t.n_elements();
    total_bytes += t.n_bytes;
    if (is_routed_expert(t)) {
      ++expert_tensors;
      expert_bytes += t.n_bytes;
      // ne[2] is the expert index (outermost), so one expert's slice is n_bytes / ne[2].
      if (t.ne[2] > 0) expert_slice_bytes += t.n_bytes / static_cast<uint64_t>(t.ne[2]);
      expert_layers.insert(t.name.substr(0, t.name.find('.', t.name.find('.') + 1)));
    }
  }
  fmt::print("\ntensors         {} tensors, {} of data ({} bytes)\n", tensors.size(),
             human_bytes(total_bytes), total_bytes);
  std::vector<std::pair<GgmlType, TypeTotals>> rows(by_type.begin(), by_type.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  fmt::print("  {:<8} {:>7} {:>16} {:>12} {:>7} {:>7}\n", "type", "tensors", "bytes", "", "share", "bpw");
  for (const auto& [type, totals] : rows) {
    const double bpw = totals.elements == 0 ? 0.0 : 8.0 * double(totals.bytes) / double(totals.elements);
    fmt::print("  {:<8} {:>7} {:>16} {:>12} {:>6.2f}% {:>7.3f}\n", type_name(type), totals.count,
               totals.bytes, human_bytes(totals.bytes), percent(totals.bytes, total_bytes), bpw);
  }
  fmt::print("\nrouted experts  {} tensors (*_exps*), {} ({:.2f}%)\n", expert_tensors,
             human_bytes(expert_bytes), percent(expert_bytes, total_bytes));
  if (!expert_layers.empty()) {
    fmt::print("                {} layers; one expert of one layer (all its *_exps* slices) = {} bytes on average\n",
               expert_layers.size(), expert_slice_bytes / expert_layers.size());
  }
  fmt::print("dense           {} tensors, {} ({:.2f}%)\n", tensors.size() - expert_tensors,
             human_bytes(total_bytes - expert_bytes), percent(total_bytes - expert_bytes, total_bytes));

  std::vector<const TensorInfo*> largest;
  for (const TensorInfo& t : tensors) largest.push_back(&t);
  const size_t shown = std::min(top_n, largest.size());
  std::partial_sort(largest.begin(), largest.begin() + static_cast<std::ptrdiff_t>(shown), largest.end(),
                    [](const TensorInfo* a, const TensorInfo* b) { return a->n_bytes > b->n_bytes; });
  if (shown > 0) fmt::print("\nlargest tensors\n");
  for (size_t i = 0; i < shown; ++i) {
    const TensorInfo& t = *largest[i];
    fmt::print("  {:<40} {:<8} {:<24} {:>12}\n", t.name, type_name(t.type), shape_string(t), human_bytes(t.n_bytes));
  }
}

void print_all_tensors(const GgufFile& file) {
  fmt::print("\nall tensors\n  {:>5}  {:<40} {:<8} {:<24} {:>14} {:>14}\n", "#", "name", "type", "shape",
             "bytes", "file offset");
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const TensorInfo& t = file.tensors()[i];
    fmt::print("  {:>5}  {:<40} {:<8} {:<24} {:>14} {:>14}\n", i, t.name, type_name(t.type), shape_string(t),
               t.n_bytes, t.file_offset);
  }
}

void print_all_metadata(const GgufFile& file) {
  fmt::print("\nmetadata\n");
  for (const std::string& key : file.keys()) {
    const GgufValue& value = *file.find(key);
    fmt::print("  {:<48} {:<20} {}\n", key, gguf_value_type_description(value), gguf_value_to_string(value));
  }
}

void run_inspect(const InspectOptions& options) {
  const std::unique_ptr<GgufFile> file = GgufFile::open(options.path);
  // A present but non-string architecture is an error worth reporting; an absent one is shown.
  const std::string arch = file->has("general.architecture") ? file->architecture() : std::string();
  print_overview(*file, arch);
  print_hyper_parameters(*file, arch);
  print_tokenizer(*file);
  print_tensor_summary(*file, options.top_n);
  if (options.list_metadata) print_all_metadata(*file);
  if (options.list_tensors) print_all_tensors(*file);
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe a GGUF model file");
  auto options = std::make_shared<InspectOptions>();
  cmd->add_option("file", options->path, "GGUF file")->required();
  cmd->add_flag("--tensors", options->list_tensors, "List every tensor (name, type, shape, bytes, offset)");
  cmd->add_flag("--metadata", options->list_metadata, "List every metadata key with its type and value");
  cmd->add_option("--top", options->top_n, "How many of the largest tensors to show")->default_val(10);
  cmd->callback([options] { run_inspect(*options); });
}

}  // namespace strata::cli
