// Tokenizer::from_gguf: the thin adapter from GGUF metadata to TokenizerSpec.
#include <limits>

#include "gguf/gguf.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace strata {
namespace {

std::optional<int32_t> optional_id(const GgufFile& file, std::string_view key) {
  if (!file.has(key)) return std::nullopt;
  const auto value = file.get<int64_t>(key);
  if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
    fail("{}: {}: expected a token id, found {}", file.path(), key, value);
  }
  return static_cast<int32_t>(value);
}

std::string require_string(const GgufFile& file, std::string_view key) {
  if (!file.has(key)) fail("{}: {}: key is missing (this GGUF carries no usable tokenizer)", file.path(), key);
  return file.get<std::string>(key);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
  const std::string model = require_string(file, "tokenizer.ggml.model");
  if (model != "gpt2") {
    fail("{}: tokenizer.ggml.model: expected \"gpt2\" (byte-level BPE), found \"{}\"", file.path(), model);
  }
  TokenizerSpec spec;
  spec.source = file.path();
  spec.pre_tokenizer = parse_pre_tokenizer(require_string(file, "tokenizer.ggml.pre"), file.path());
  if (!file.has("tokenizer.ggml.tokens")) fail("{}: tokenizer.ggml.tokens: key is missing", file.path());
  spec.tokens = file.get<std::vector<std::string>>("tokenizer.ggml.tokens");
  if (!file.has("tokenizer.ggml.merges")) fail("{}: tokenizer.ggml.merges: key is missing", file.path());
  spec.merges = file.get<std::vector<std::string>>("tokenizer.ggml.merges");
  if (file.has("tokenizer.ggml.token_type")) {
    const auto types = file.get<std::vector<int64_t>>("tokenizer.ggml.token_type");
    spec.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < 0 || types[i] > 6) {
        fail("{}: tokenizer.ggml.token_type[{}]: expected a type in 0..6, found {}", file.path(), i,
             types[i]);
      }
      spec.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  spec.bos_id = optional_id(file, "tokenizer.ggml.bos_token_id");
  spec.eos_id = optional_id(file, "tokenizer.ggml.eos_token_id");
  spec.pad_id = optional_id(file, "tokenizer.ggml.padding_token_id");
  return Tokenizer(std::move(spec));
}

}  // namespace strata
