// The tokenizer section against the text module's fixture: tests/data/tokenizer/tokenizer.json (a
// byte-level BPE trained with HF tokenizers 0.23.2, Qwen-style added tokens) and gguf_vocab.json,
// the GGUF view that tools/make_tokenizer_fixtures.py derives from it in Python.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "convert/tokenizer_hf.h"
#include "convert_test_util.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace strata::convert {
namespace {

TEST(HfTokenizer, MatchesTheTextModulesGgufView) {
  const std::string data = std::string(STRATA_TEST_DATA_DIR) + "/tokenizer/";
  const nlohmann::json expected = nlohmann::json::parse(testing::read_text(data + "gguf_vocab.json"));
  testing::TempDir dir;
  testing::write_text(dir.file("tokenizer.json"), testing::read_text(data + "tokenizer.json"));
  // The Qwen convention the fixture assumes: eos <|im_end|>, pad <|endoftext|>, no bos.
  testing::write_text(dir.file("tokenizer_config.json"), R"({"eos_token":"<|im_end|>","pad_token":"<|endoftext|>","bos_token":null})");
  const auto n_tokens = static_cast<int64_t>(expected["tokens"].size());
  GgufWriter writer;
  writer.add_string("general.architecture", "qwen3moe");
  ASSERT_TRUE(add_hf_tokenizer(dir.path().string(), HfConfig(nlohmann::json::object(), "config"), n_tokens, "qwen2", writer));
  const auto file = GgufFile::open_from_memory(writer.write_memory(), "tokenizer.gguf");
  EXPECT_EQ(file->get<std::string>("tokenizer.ggml.model"), expected["model"].get<std::string>());
  EXPECT_EQ(file->get<std::string>("tokenizer.ggml.pre"), expected["pre"].get<std::string>());
  EXPECT_EQ(file->get<std::vector<std::string>>("tokenizer.ggml.tokens"), expected["tokens"].get<std::vector<std::string>>());
  EXPECT_EQ(file->get<std::vector<int64_t>>("tokenizer.ggml.token_type"), expected["token_type"].get<std::vector<int64_t>>());
  EXPECT_EQ(file->get<std::vector<std::string>>("tokenizer.ggml.merges"), expected["merges"].get<std::vector<std::string>>());
  EXPECT_EQ(file->get<uint32_t>("tokenizer.ggml.eos_token_id"), expected["eos_token_id"].get<uint32_t>());
  EXPECT_EQ(file->get<uint32_t>("tokenizer.ggml.padding_token_id"), expected["padding_token_id"].get<uint32_t>());
  EXPECT_FALSE(file->has("tokenizer.ggml.bos_token_id"));
}

TEST(HfTokenizer, LooksSpecialLikeLlamaCpp) {
  EXPECT_TRUE(token_looks_special("<|im_start|>"));
  EXPECT_TRUE(token_looks_special("<\xEF\xBD\x9C" "begin\xEF\xBD\x9C>"));  // <｜begin｜>
  EXPECT_TRUE(token_looks_special("<unused12>"));
  EXPECT_TRUE(token_looks_special("<pad>"));
  EXPECT_FALSE(token_looks_special("<think>"));
  EXPECT_FALSE(token_looks_special("<|"));
  EXPECT_FALSE(token_looks_special("|>"));
}

TEST(HfTokenizer, RefusesNonBpeAndOutOfRangeIds) {
  testing::TempDir dir;
  const HfConfig config(nlohmann::json::object(), "config");
  GgufWriter writer;
  EXPECT_FALSE(add_hf_tokenizer(dir.path().string(), config, 4, "qwen2", writer));  // no tokenizer.json
  testing::write_text(dir.file("tokenizer.json"), R"({"model":{"type":"Unigram","vocab":[]}})");
  EXPECT_THROW(add_hf_tokenizer(dir.path().string(), config, 4, "qwen2", writer), Error);
  testing::write_text(dir.file("tokenizer.json"), R"({"model":{"type":"BPE","vocab":{"a":0,"b":9},"merges":[]}})");
  try {
    add_hf_tokenizer(dir.path().string(), config, 4, "qwen2", writer);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9 outside the model's vocab_size 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::convert
