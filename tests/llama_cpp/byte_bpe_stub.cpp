#include "byte_bpe_stub.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace strata::testing_llama_cpp {
namespace {

constexpr char kLetters[] = "abcdefghijklmnop";  // 16 letters → up to 256 two-letter merges
constexpr int64_t kMaxMerges = 16 * 16;

std::string utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out += char(code_point);
  } else {  // every spelling is below U+0800
    out += char(0xC0 | (code_point >> 6));
    out += char(0x80 | (code_point & 0x3F));
  }
  return out;
}

bool spells_itself(uint32_t byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
}

void write_json(const std::filesystem::path& path, const nlohmann::json& value) {
  std::ofstream out(path, std::ios::binary);
  out << value.dump();
  if (!out) fail("{}: cannot write", path.string());
}

}  // namespace

std::string gpt2_byte_spelling(uint8_t byte) {
  if (spells_itself(byte)) return utf8(byte);
  uint32_t shifted = 0;  // rank of `byte` among the bytes that do not spell themselves
  for (uint32_t b = 0; b < byte; ++b) {
    if (!spells_itself(b)) ++shifted;
  }
  return utf8(0x100 + shifted);
}

ByteBpeStubSummary write_byte_bpe_stub(const std::string& directory, int64_t vocab_size) {
  if (vocab_size < 2 || vocab_size > 256 + kMaxMerges) {
    fail("byte BPE stub: vocab_size {}: expected 2..{}", vocab_size, 256 + kMaxMerges);
  }
  ByteBpeStubSummary summary;
  summary.n_byte_tokens = std::min<int64_t>(256, vocab_size - 1);
  summary.n_merges = vocab_size - summary.n_byte_tokens;

  nlohmann::json vocab = nlohmann::json::object();
  for (int64_t b = 0; b < summary.n_byte_tokens; ++b) vocab[gpt2_byte_spelling(uint8_t(b))] = b;
  nlohmann::json merges = nlohmann::json::array();
  for (int64_t k = 0; k < summary.n_merges; ++k) {
    const std::string left(1, kLetters[k / 16]), right(1, kLetters[k % 16]);
    merges.push_back({left, right});
    vocab[left + right] = summary.n_byte_tokens + k;
  }
  const nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array()},
      {"model", {{"type", "BPE"}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}},
  };
  const std::filesystem::path dir(directory);
  write_json(dir / "tokenizer.json", tokenizer);
  write_json(dir / "tokenizer_config.json",
             {{"tokenizer_class", "Qwen2Tokenizer"}, {"add_bos_token", false}});
  return summary;
}

}  // namespace strata::testing_llama_cpp
