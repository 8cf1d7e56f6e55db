// Shared helpers for the text-module tests: reading the JSON fixtures that
// tools/make_tokenizer_fixtures.py produced with Hugging Face `tokenizers` / transformers.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "text/tokenizer.h"

namespace strata::test {

inline std::string tokenizer_data_path(const std::string& name) {
  return std::string(STRATA_TEST_DATA_DIR) + "/tokenizer/" + name;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json load_json(const std::string& name) {
  return nlohmann::json::parse(read_file(tokenizer_data_path(name)));
}

// The GGUF-shaped view of the trained tokenizer (what convert_hf_to_gguf.py would store).
inline TokenizerSpec fixture_spec(PreTokenizerKind pre = PreTokenizerKind::Qwen2) {
  const nlohmann::json vocab = load_json("gguf_vocab.json");
  TokenizerSpec spec;
  spec.tokens = vocab.at("tokens").get<std::vector<std::string>>();
  spec.token_types = vocab.at("token_type").get<std::vector<int32_t>>();
  spec.merges = vocab.at("merges").get<std::vector<std::string>>();
  spec.pre_tokenizer = pre;
  if (!vocab.at("eos_token_id").is_null()) spec.eos_id = vocab.at("eos_token_id").get<int32_t>();
  if (!vocab.at("padding_token_id").is_null()) spec.pad_id = vocab.at("padding_token_id").get<int32_t>();
  spec.source = tokenizer_data_path("gguf_vocab.json");
  return spec;
}

// Escapes control characters and non-ASCII bytes so a failing string is readable in test output.
inline std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

}  // namespace strata::test
