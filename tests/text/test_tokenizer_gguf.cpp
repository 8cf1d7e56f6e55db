// Tokenizer::from_gguf and ChatTemplate::from_gguf on GGUF files written with GgufWriter: the
// fixture vocabulary stored the way convert_hf_to_gguf.py stores it must encode exactly like the
// spec built directly, and bad metadata must fail with the file name, key and value.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text_fixtures.h"
#include "util/error.h"

namespace strata {
namespace {

class TempGguf {
 public:
  explicit TempGguf(const std::function<void(GgufWriter&)>& fill) {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() /
             ("strata_text_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".gguf"))
                .string();
    GgufWriter writer;
    writer.add_string("general.architecture", "qwen3moe");
    fill(writer);
    writer.write_file(path_);
  }
  ~TempGguf() { std::filesystem::remove(path_); }
  std::unique_ptr<GgufFile> open() const { return GgufFile::open(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void add_fixture_tokenizer(GgufWriter& w, const std::string& model, const std::string& pre) {
  const TokenizerSpec spec = test::fixture_spec();
  w.add_string("tokenizer.ggml.model", model);
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_array_string("tokenizer.ggml.tokens", spec.tokens);
  w.add_array_i32("tokenizer.ggml.token_type", spec.token_types);
  w.add_array_string("tokenizer.ggml.merges", spec.merges);
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*spec.eos_id));
  w.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*spec.pad_id));
}

TEST(TokenizerGguf, FromGgufEncodesLikeTheReference) {
  const TempGguf file([](GgufWriter& w) { add_fixture_tokenizer(w, "gpt2", "qwen2"); });
  const auto gguf = file.open();
  const Tokenizer tok = Tokenizer::from_gguf(*gguf);
  EXPECT_EQ(tok.n_tokens(), 3007);
  EXPECT_EQ(tok.source(), file.path());
  EXPECT_EQ(tok.eos_id(), tok.find_token("<|im_end|>"));
  EXPECT_EQ(tok.pad_id(), tok.find_token("<|endoftext|>"));
  EXPECT_FALSE(tok.bos_id().has_value());
  const nlohmann::json cases = test::load_json("encode_cases.json").at("cases");
  for (const auto& c : cases) {
    EXPECT_EQ(tok.encode(c.at("text").get<std::string>()), c.at("ids").get<std::vector<int32_t>>());
  }
}

void expect_gguf_error(const std::string& model, const std::string& pre, const std::vector<std::string>& fragments) {
  const TempGguf file([&](GgufWriter& w) { add_fixture_tokenizer(w, model, pre); });
  const auto gguf = file.open();
  try {
    Tokenizer::from_gguf(*gguf);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file.path()), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
  }
}

TEST(TokenizerGguf, RejectsOtherModelsAndPreTokenizers) {
  expect_gguf_error("llama", "qwen2", {"tokenizer.ggml.model", "\"llama\"", "gpt2"});
  expect_gguf_error("gpt2", "default", {"tokenizer.ggml.pre", "\"default\"", "qwen2"});
}

TEST(TokenizerGguf, MissingTokenizerKeysAreNamed) {
  const TempGguf file([](GgufWriter&) {});
  const auto gguf = file.open();
  try {
    Tokenizer::from_gguf(*gguf);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateGguf, ChosenFromTemplateTextOrArchitecture) {
  const std::string qwen3 = test::read_file(test::tokenizer_data_path("templates/qwen3.jinja"));
  const TempGguf with_template([&](GgufWriter& w) { w.add_string("tokenizer.chat_template", qwen3); });
  EXPECT_EQ(ChatTemplate::from_gguf(*with_template.open()).format(), ChatFormat::Qwen3);

  const TempGguf without([](GgufWriter&) {});  // architecture qwen3moe, no template
  EXPECT_EQ(ChatTemplate::from_gguf(*without.open()).format(), ChatFormat::Qwen3);

  const TempGguf llama([](GgufWriter& w) {
    w.add_string("tokenizer.chat_template", "{{ '<|start_header_id|>' + m.role + '<|end_header_id|>' }}");
  });
  try {
    ChatTemplate::from_gguf(*llama.open());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(llama.path()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a ChatML template"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
