// libFuzzer target for the text module: tokenizer encode/decode on arbitrary bytes and the chat
// template / think filter on arbitrary messages. Invariants checked (trap on violation):
//   decode(encode(s)) == NFC(repair(s)); streaming decode == decode; chat rendering either
//   succeeds or throws strata::Error; think filter output is independent of chunking.
// Input layout: byte 0 selects the mode, the rest is the payload.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "text/think_filter.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "util/error.h"

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const strata::Tokenizer& fixture_tokenizer(strata::PreTokenizerKind kind) {
  static const nlohmann::json vocab = nlohmann::json::parse(
      read_file(std::filesystem::path(STRATA_SOURCE_DIR) / "tests/data/tokenizer/gguf_vocab.json"));
  auto make = [&](strata::PreTokenizerKind k) {
    strata::TokenizerSpec spec;
    spec.tokens = vocab.at("tokens").get<std::vector<std::string>>();
    spec.token_types = vocab.at("token_type").get<std::vector<int32_t>>();
    spec.merges = vocab.at("merges").get<std::vector<std::string>>();
    spec.pre_tokenizer = k;
    return strata::Tokenizer(std::move(spec));
  };
  static const strata::Tokenizer qwen2 = make(strata::PreTokenizerKind::Qwen2);
  static const strata::Tokenizer qwen35 = make(strata::PreTokenizerKind::Qwen35);
  return kind == strata::PreTokenizerKind::Qwen2 ? qwen2 : qwen35;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void fuzz_encode(std::string_view text, strata::PreTokenizerKind kind, bool parse_special) {
  const strata::Tokenizer& tok = fixture_tokenizer(kind);
  const auto ids = tok.encode(text, strata::EncodeOptions{.parse_special = parse_special});
  const std::string decoded = tok.decode(ids);
  check(decoded == strata::nfc_normalize(strata::utf8_repair(text)));
  strata::StreamingDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  check(streamed == decoded);
}

void fuzz_chat(std::string_view payload) {
  // Messages separated by '\x1e'; the first byte of each picks the role.
  static const char* roles[] = {"system", "user", "assistant", "tool", "narrator"};
  std::vector<strata::ChatMessage> messages;
  size_t start = 0;
  while (start <= payload.size()) {
    size_t end = payload.find('\x1e', start);
    if (end == std::string_view::npos) end = payload.size();
    const std::string_view part = payload.substr(start, end - start);
    if (!part.empty()) {
      messages.push_back({roles[static_cast<unsigned char>(part[0]) % 5], std::string(part.substr(1)), std::nullopt});
    }
    start = end + 1;
  }
  for (auto format : {strata::ChatFormat::ChatML, strata::ChatFormat::Qwen3, strata::ChatFormat::Qwen35}) {
    try {
      const std::string prompt = strata::ChatTemplate(format).render(messages, {.enable_thinking = payload.size() % 2 == 0});
      check(strata::utf8_is_valid(prompt));
    } catch (const strata::Error&) {
      // rejected conversations must throw strata::Error, nothing else
    }
  }
  try {
    strata::ChatTemplate::detect(payload, "fuzz");
  } catch (const strata::Error&) {
  }
}

void fuzz_think_filter(std::string_view payload) {
  const bool starts_in_thinking = !payload.empty() && (payload[0] & 1);
  std::string whole_thinking, whole_answer, split_thinking, split_answer;
  {
    strata::ThinkFilter filter(strata::ThinkFilter::Mode::Hide, starts_in_thinking);
    auto d = filter.push(payload);
    whole_thinking += d.thinking;
    whole_answer += d.answer;
    d = filter.finish();
    whole_thinking += d.thinking;
    whole_answer += d.answer;
  }
  {
    strata::ThinkFilter filter(strata::ThinkFilter::Mode::Hide, starts_in_thinking);
    for (char c : payload) {
      auto d = filter.push(std::string_view(&c, 1));
      split_thinking += d.thinking;
      split_answer += d.answer;
    }
    auto d = filter.finish();
    split_thinking += d.thinking;
    split_answer += d.answer;
  }
  check(whole_thinking == split_thinking && whole_answer == split_answer);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0: fuzz_encode(payload, strata::PreTokenizerKind::Qwen2, true); break;
    case 1: fuzz_encode(payload, strata::PreTokenizerKind::Qwen35, true); break;
    case 2: fuzz_encode(payload, strata::PreTokenizerKind::Qwen2, false); break;
    case 3: fuzz_chat(payload); break;
    case 4: fuzz_think_filter(payload); break;
    default: fuzz_encode(strata::utf8_repair(payload), strata::PreTokenizerKind::Qwen35, false); break;
  }
  return 0;
}
