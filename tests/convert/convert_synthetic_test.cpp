// strata convert on small checkpoints built by the test: K-quants on 256-wide rows, the fused
// expert layout, the tokenizer section, every user-facing error, atomic output, and the CLI.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "convert/checkpoint.h"
#include "convert/convert.h"
#include "convert_test_util.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "util/error.h"

namespace strata::convert {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::TestTensor;

constexpr int64_t H = 256, HD = 128, E = 2, I = 256, V = 9;

std::string config_json(const std::string& model_type = "qwen3_moe") {
  return R"({"architectures":["Qwen3MoeForCausalLM"],"model_type":")" + model_type + R"(",
    "hidden_size":256,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":128,
    "num_experts":2,"num_experts_per_tok":1,"moe_intermediate_size":256,"vocab_size":9,"rms_norm_eps":1e-6,
    "max_position_embeddings":128,"rope_parameters":{"rope_type":"default","rope_theta":1000000.0},
    "bos_token_id":5,"eos_token_id":2,"tie_word_embeddings":false})";
}

// A one-layer qwen3moe checkpoint whose experts use transformers' fused in-memory layout.
std::vector<TestTensor> synthetic_tensors() {
  uint64_t seed = 1;
  const auto t = [&](std::string name, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return testing::f32_tensor(std::move(name), std::move(shape), testing::random_values(n, seed++));
  };
  const std::string l = "model.layers.0.";
  return {t("model.embed_tokens.weight", {V, H}), t(l + "input_layernorm.weight", {H}),
          t(l + "self_attn.q_proj.weight", {2 * HD, H}), t(l + "self_attn.k_proj.weight", {HD, H}),
          t(l + "self_attn.v_proj.weight", {HD, H}), t(l + "self_attn.o_proj.weight", {H, 2 * HD}),
          t(l + "self_attn.q_norm.weight", {HD}), t(l + "self_attn.k_norm.weight", {HD}),
          t(l + "post_attention_layernorm.weight", {H}), t(l + "mlp.gate.weight", {E, H}),
          t(l + "mlp.experts.gate_up_proj", {E, 2 * I, H}), t(l + "mlp.experts.down_proj", {E, H, I}),
          t("model.norm.weight", {H}), t("lm_head.weight", {V, H})};
}

void write_checkpoint(const TempDir& dir, const std::vector<TestTensor>& tensors, const std::string& config = config_json()) {
  testing::write_text(dir.file("config.json"), config);
  testing::write_bytes(dir.file("model.safetensors"), testing::build_safetensors(tensors));
}

std::string convert_error(const std::string& hf_dir, const std::string& out, GgmlType type = GgmlType::F32) {
  try {
    testing::convert_dir(hf_dir, out, type);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SyntheticConvert, KQuantsAndTheFusedExpertLayout) {
  TempDir dir;
  write_checkpoint(dir, synthetic_tensors());
  testing::convert_dir(dir.path().string(), dir.file("k.gguf"), GgmlType::Q4_K, GgmlType::Q2_K);
  const auto gguf = GgufFile::open(dir.file("k.gguf"));
  const auto hf = HfCheckpoint::open(dir.path().string());
  EXPECT_EQ(gguf->tensor("blk.0.attn_q.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(gguf->tensor("token_embd.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(gguf->tensor("output.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(gguf->tensor("blk.0.ffn_gate_exps.weight").type, GgmlType::Q2_K);
  EXPECT_EQ(gguf->tensor("blk.0.ffn_down_exps.weight").type, GgmlType::Q2_K);
  EXPECT_EQ(gguf->tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);
  EXPECT_EQ(gguf->tensor("blk.0.attn_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(gguf->get<uint32_t>("general.file_type"), 14u);

  // The stored blocks are exactly quant::quantize_row of the right source rows: experts split from
  // gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I] as is.
  const auto gate_up = hf->read_f32("model.layers.0.mlp.experts.gate_up_proj");
  const auto expect_blocks = [&](const std::string& name, GgmlType type, const std::vector<float>& rows) {
    std::vector<uint8_t> blocks(row_bytes(type, static_cast<int64_t>(rows.size())));
    quant::quantize_row(type, rows.data(), blocks.data(), static_cast<int64_t>(rows.size()));
    const TensorInfo& info = gguf->tensor(name);
    ASSERT_EQ(info.n_bytes, blocks.size()) << name;
    EXPECT_EQ(0, std::memcmp(gguf->tensor_data(info), blocks.data(), blocks.size())) << name;
  };
  std::vector<float> gates, ups;
  for (int64_t e = 0; e < E; ++e) {
    const auto expert = gate_up.begin() + e * 2 * I * H;
    gates.insert(gates.end(), expert, expert + I * H);
    ups.insert(ups.end(), expert + I * H, expert + 2 * I * H);
  }
  expect_blocks("blk.0.ffn_gate_exps.weight", GgmlType::Q2_K, gates);
  expect_blocks("blk.0.ffn_up_exps.weight", GgmlType::Q2_K, ups);
  expect_blocks("blk.0.ffn_down_exps.weight", GgmlType::Q2_K, hf->read_f32("model.layers.0.mlp.experts.down_proj"));
  expect_blocks("blk.0.attn_q.weight", GgmlType::Q4_K, hf->read_f32("model.layers.0.self_attn.q_proj.weight"));
  // And Q4_K really approximates the weights (uniform in [-1, 1): 4-bit steps of ~2/15 per
  // 32-weight sub-block, plus the 6-bit scale/min rounding).
  const auto q = hf->read_f32("model.layers.0.self_attn.q_proj.weight");
  const auto back = testing::gguf_tensor_f32(*gguf, "blk.0.attn_q.weight");
  double err = 0;
  for (size_t i = 0; i < q.size(); ++i) err = std::max(err, std::fabs(double(back[i]) - q[i]));
  EXPECT_LT(err, 0.15);
}

TEST(SyntheticConvert, FallsBackToQ8_0ForRowsThatDoNotFitAndReportsIt) {
  TempDir dir;
  write_checkpoint(dir, synthetic_tensors());
  ConvertOptions options;
  options.hf_dir = dir.path().string();
  options.out_path = dir.file("q6.gguf");
  options.type = GgmlType::Q6_K;
  options.show_progress = false;
  const ConvertReport report = convert_hf_to_gguf(options);
  EXPECT_EQ(report.arch, "qwen3moe");
  EXPECT_EQ(report.n_tensors, 15u);
  EXPECT_TRUE(report.fallbacks.empty());  // every row here is 256 wide
  EXPECT_EQ(report.tensors_by_type.at(GgmlType::Q6_K), 9u);  // embd, q, k, v, o, 3 expert stacks, output
  EXPECT_EQ(report.tensors_by_type.at(GgmlType::F32), 6u);
  // The 64-wide fixture cannot hold 256-blocks anywhere: Q8_0, listed as fallbacks.
  options.hf_dir = std::string(STRATA_TEST_DATA_DIR) + "/models/qwen3next/hf";
  const ConvertReport fixture = convert_hf_to_gguf(options);
  EXPECT_EQ(fixture.tensors_by_type.count(GgmlType::Q6_K), 0u);
  EXPECT_GT(fixture.tensors_by_type.at(GgmlType::Q8_0), 0u);
  EXPECT_THAT(fixture.fallbacks, ::testing::Contains(HasSubstr("token_embd.weight: q6_K -> q8_0 (row of 64)")));
}

TEST(SyntheticConvert, WritesTheTokenizerAsLlamaCppDoes) {
  TempDir dir;
  write_checkpoint(dir, synthetic_tensors());
  testing::write_text(dir.file("tokenizer.json"), R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"\u0120":3},
      "merges":[["a","b"],["a b","c"]]},
    "added_tokens":[{"id":4,"content":"\u2581x","special":false},{"id":5,"content":"<|endoftext|>","special":true},
      {"id":6,"content":"<think>","special":false},{"id":7,"content":"<|im_end|>","special":false}]})");
  testing::write_text(dir.file("tokenizer_config.json"), R"({"bos_token":null,"eos_token":"<|im_end|>",
    "pad_token":{"content":"<|endoftext|>"},"add_bos_token":false,"chat_template":"{{ messages }}"})");
  testing::convert_dir(dir.path().string(), dir.file("t.gguf"));
  const auto f = GgufFile::open(dir.file("t.gguf"));
  EXPECT_EQ(f->get<std::string>("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get<std::string>("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(f->get<std::vector<std::string>>("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "ab", "\u0120", " x", "<|endoftext|>", "<think>", "<|im_end|>", "[PAD8]"}));
  // NORMAL x4, USER_DEFINED ("▁" -> " "), CONTROL (special), USER_DEFINED, CONTROL (looks special), UNUSED.
  EXPECT_EQ(f->get<std::vector<int64_t>>("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 1, 1, 1, 4, 3, 4, 3, 5}));
  EXPECT_EQ(f->get_array("tokenizer.ggml.token_type").element_type, GgufValueType::I32);
  EXPECT_EQ(f->get<std::vector<std::string>>("tokenizer.ggml.merges"), (std::vector<std::string>{"a b", "a\u0120b c"}));
  EXPECT_EQ(f->get<uint32_t>("tokenizer.ggml.eos_token_id"), 7u);      // tokenizer_config wins over config.json
  EXPECT_EQ(f->get<uint32_t>("tokenizer.ggml.padding_token_id"), 5u);
  EXPECT_EQ(f->get<uint32_t>("tokenizer.ggml.bos_token_id"), 5u);      // from config.json
  EXPECT_FALSE(f->get<bool>("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f->get<std::string>("tokenizer.chat_template"), "{{ messages }}");
}

TEST(SyntheticConvert, ErrorsNameTheFileTensorAndField) {
  TempDir dir;
  const std::string out = dir.file("out.gguf");
  EXPECT_THAT(convert_error(dir.file("nowhere"), out), HasSubstr("not a directory"));
  EXPECT_THAT(convert_error(dir.path().string(), out), HasSubstr("missing config.json"));

  testing::write_text(dir.file("config.json"), R"({"model_type":"llama"})");
  const std::string unsupported = convert_error(dir.path().string(), out);
  EXPECT_THAT(unsupported, HasSubstr("unsupported model_type \"llama\""));
  EXPECT_THAT(unsupported, HasSubstr("qwen3_moe, qwen3_next, qwen4_exp"));

  auto tensors = synthetic_tensors();
  tensors.pop_back();  // lm_head
  write_checkpoint(dir, tensors);
  EXPECT_THAT(convert_error(dir.path().string(), out), HasSubstr("missing tensor lm_head.weight"));

  tensors = synthetic_tensors();
  tensors[2] = testing::f32_tensor("model.layers.0.self_attn.q_proj.weight", {HD, H}, std::vector<float>(HD * H));
  write_checkpoint(dir, tensors);
  EXPECT_THAT(convert_error(dir.path().string(), out),
              HasSubstr("tensor model.layers.0.self_attn.q_proj.weight: expected shape [256, 256], found [128, 256]"));

  tensors = synthetic_tensors();
  tensors.push_back(testing::f32_tensor("model.layers.0.mystery.weight", {2}, {1, 2}));
  write_checkpoint(dir, tensors);
  EXPECT_THAT(convert_error(dir.path().string(), out), HasSubstr("would be dropped: model.layers.0.mystery.weight"));

  write_checkpoint(dir, synthetic_tensors(), config_json().replace(config_json().find("\"num_experts\":2"), 15, "\"num_experts\":\"2\""));
  EXPECT_THAT(convert_error(dir.path().string(), out), HasSubstr("field num_experts: expected an integer, found \"2\""));

  write_checkpoint(dir, synthetic_tensors());
  EXPECT_THAT(convert_error(dir.path().string(), dir.file("missing/out.gguf")), HasSubstr("does not exist"));
  EXPECT_THAT(convert_error(dir.path().string(), dir.path().string()), HasSubstr("it is a directory"));
  EXPECT_THAT(convert_error(dir.path().string(), out, GgmlType::IQ2_XS), HasSubstr("--type iq2_xs: not supported"));
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(SyntheticConvert, AFailureWhileWritingLeavesNoFile) {
  TempDir dir;
  auto tensors = synthetic_tensors();
  // A weight in a dtype convert refuses is only read while writing, after the file was started.
  tensors.back() = testing::u16_tensor("lm_head.weight", "I16", {V, H}, std::vector<uint16_t>(V * H));
  write_checkpoint(dir, tensors);
  EXPECT_THAT(convert_error(dir.path().string(), dir.file("out.gguf")), HasSubstr("dtype I16 is not supported"));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr("out.gguf"))) << "left behind";
  }
}

TEST(ConvertCli, ConvertsAndReportsErrors) {
  TempDir dir;
  const std::string hf = std::string(STRATA_TEST_DATA_DIR) + "/models/qwen3moe/hf";
  const std::string log = dir.file("log.txt");
  const std::string ok = fmt::format("{} convert {} {} --type q8_0 --no-progress > {} 2>&1", STRATA_BINARY, hf,
                                     dir.file("cli.gguf"), log);
  ASSERT_EQ(std::system(ok.c_str()), 0) << testing::read_text(log);
  EXPECT_THAT(testing::read_text(log), HasSubstr("qwen3_moe (qwen3moe)"));
  EXPECT_THAT(testing::read_text(log), HasSubstr("51 tensors"));
  EXPECT_EQ(GgufFile::open(dir.file("cli.gguf"))->tensor("blk.0.attn_q.weight").type, GgmlType::Q8_0);

  const std::string bad = fmt::format("{} convert {} {} --type q5_0 > {} 2>&1", STRATA_BINARY, hf, dir.file("x.gguf"), log);
  const int status = std::system(bad.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  EXPECT_THAT(testing::read_text(log), HasSubstr("--type q5_0: unknown or unsupported type"));
}

}  // namespace
}  // namespace strata::convert
