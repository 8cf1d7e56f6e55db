// The committed test data is exactly what the generator (strata's own writer) produces, the
// README fixture has the promised shape, and every fuzz seed behaves as its name says.
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "util/error.h"

namespace strata {
namespace {

const char* kRegenerate = "regenerate with: build-gguf/tests/gguf/gguf_make_fixtures tests/data";

TEST(TinyFixture, CommittedFileMatchesTheGenerator) {
  test::ScratchDir dir("fixture");
  test::write_tiny_qwen4exp(dir.file("tiny.gguf"));
  EXPECT_TRUE(test::read_bytes(dir.file("tiny.gguf")) ==
              test::read_bytes(std::string(STRATA_TEST_DATA_DIR) + "/gguf/tiny-qwen4exp.gguf"))
      << kRegenerate;
}

TEST(TinyFixture, IsASmallQwen4expWithRoutedExperts) {
  const auto f = GgufFile::open(std::string(STRATA_TEST_DATA_DIR) + "/gguf/tiny-qwen4exp.gguf");
  EXPECT_LT(f->file_size(), 200u * 1024);
  EXPECT_EQ(f->architecture(), "qwen4exp");
  const uint32_t layers = f->get<uint32_t>("qwen4exp.block_count");
  const uint32_t hidden = f->get<uint32_t>("qwen4exp.embedding_length");
  const uint32_t experts = f->get<uint32_t>("qwen4exp.expert_count");
  const uint32_t expert_ffn = f->get<uint32_t>("qwen4exp.expert_feed_forward_length");
  EXPECT_EQ(layers, 2u);
  for (uint32_t layer = 0; layer < layers; ++layer) {
    const std::string blk = "blk." + std::to_string(layer) + ".";
    const TensorInfo& gate = f->tensor(blk + "ffn_gate_exps.weight");
    const TensorInfo& down = f->tensor(blk + "ffn_down_exps.weight");
    EXPECT_EQ(gate.ne[0], hidden);
    EXPECT_EQ(gate.ne[1], expert_ffn);
    EXPECT_EQ(gate.ne[2], experts);
    EXPECT_EQ(down.ne[0], expert_ffn);
    EXPECT_EQ(down.ne[1], hidden);
  }
  EXPECT_EQ(f->tensor("blk.0.ffn_up_exps.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(f->tensor("blk.1.ffn_up_exps.weight").type, GgmlType::Q4_0);
  EXPECT_EQ(f->tensor("token_embd.weight").type, GgmlType::F16);
  EXPECT_EQ(f->tensor("output_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(f->get<std::vector<std::string>>("tokenizer.ggml.tokens").size(),
            static_cast<size_t>(f->tensor("token_embd.weight").ne[1]));
}

TEST(FuzzSeeds, CommittedSeedsMatchTheGeneratorAndBehaveAsNamed) {
  test::ScratchDir dir("seeds");
  test::write_fuzz_seeds(dir.path().string());
  const std::string committed = std::string(STRATA_TEST_DATA_DIR) + "/fuzz/gguf/";
  size_t n_generated = 0;
  for (const std::string& name : dir.list()) {
    SCOPED_TRACE(name);
    ++n_generated;
    EXPECT_TRUE(test::read_bytes(dir.file(name)) == test::read_bytes(committed + name)) << kRegenerate;
  }
  EXPECT_GE(n_generated, 40u);
  // Every committed seed (generated or a fuzzer finding kept as a regression input) is small and
  // either opens or fails with strata::Error; valid_* must open, broken_* must fail.
  for (const auto& entry : std::filesystem::directory_iterator(committed)) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    EXPECT_LT(entry.file_size(), 16u * 1024);
    bool opened = false;
    try {
      opened = GgufFile::open(entry.path().string()) != nullptr;
    } catch (const Error&) {
      opened = false;
    }
    if (name.starts_with("valid_")) {
      EXPECT_TRUE(opened);
    }
    if (name.starts_with("broken_")) {
      EXPECT_FALSE(opened);
    }
  }
}

}  // namespace
}  // namespace strata
