// strata convert on the qwen3next and qwen3moe fixtures (tests/data/models/*/hf): tensor sets,
// the qkvz regroup, norm folding rules, metadata, and the committed model-f32.gguf files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "convert/checkpoint.h"
#include "convert_test_util.h"
#include "gguf/gguf.h"

namespace strata::convert {
namespace {

using testing::TempDir;

std::string fixture(const std::string& arch, const std::string& file) {
  return std::string(STRATA_TEST_DATA_DIR) + "/models/" + arch + "/" + file;
}

struct Converted {
  explicit Converted(const std::string& arch) {
    testing::convert_dir(fixture(arch, "hf"), dir.file("m.gguf"));
    gguf = GgufFile::open(dir.file("m.gguf"));
    hf = HfCheckpoint::open(fixture(arch, "hf"));
  }
  std::vector<float> g(const std::string& name) const { return testing::gguf_tensor_f32(*gguf, name); }
  std::vector<float> h(const std::string& name) const { return hf->read_f32(name); }
  TempDir dir;
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<HfCheckpoint> hf;
};

std::vector<float> plus_one(std::vector<float> v) {
  for (float& x : v) x += 1.0f;
  return v;
}

TEST(Qwen3NextConvert, RegroupsQkvzFoldsNormsAndMatchesTheCommittedFile) {
  const Converted c("qwen3next");
  // 3 GDN layers x 18 + 1 attention layer x 16 + 3 globals (reference Part A §7 count rule), and
  // the MTP head as blk.4: an attention block (16) + nextn.{eh_proj, enorm, hnorm, shared_head_norm}.
  EXPECT_EQ(c.gguf->tensors().size(), 3u * 18 + 16 + 3 + 16 + 4);
  constexpr int64_t H = 64, NK = 2, DK = 16, R = 2, DV = 16, NV = 4, GROUP = 2 * DK + 2 * R * DV;
  const auto qkvz = c.h("model.layers.0.linear_attn.in_proj_qkvz.weight");
  const auto qkv = c.g("blk.0.attn_qkv.weight"), gate = c.g("blk.0.attn_gate.weight");
  const auto row_eq = [&](const std::vector<float>& out, int64_t out_row, int64_t src_row) {
    return std::equal(out.begin() + out_row * H, out.begin() + (out_row + 1) * H, qkvz.begin() + src_row * H);
  };
  for (int64_t g = 0; g < NK; ++g) {
    for (int64_t j = 0; j < DK; ++j) {
      EXPECT_TRUE(row_eq(qkv, g * DK + j, g * GROUP + j)) << "q " << g << " " << j;
      EXPECT_TRUE(row_eq(qkv, NK * DK + g * DK + j, g * GROUP + DK + j)) << "k " << g << " " << j;
    }
    for (int64_t j = 0; j < R * DV; ++j) {
      EXPECT_TRUE(row_eq(qkv, 2 * NK * DK + g * R * DV + j, g * GROUP + 2 * DK + j)) << "v " << g << " " << j;
      EXPECT_TRUE(row_eq(gate, g * R * DV + j, g * GROUP + 2 * DK + R * DV + j)) << "z " << g << " " << j;
    }
  }
  // No V-head reorder for qwen3next: ssm_ba, ssm_a, ssm_dt keep the HF order.
  EXPECT_EQ(c.g("blk.0.ssm_ba.weight"), c.h("model.layers.0.linear_attn.in_proj_ba.weight"));
  const auto a_log = c.h("model.layers.2.linear_attn.A_log"), ssm_a = c.g("blk.2.ssm_a");
  for (int64_t p = 0; p < NV; ++p) EXPECT_EQ(ssm_a[p], -std::exp(a_log[p]));
  EXPECT_EQ(c.g("blk.2.ssm_dt.bias"), c.h("model.layers.2.linear_attn.dt_bias"));
  EXPECT_EQ(c.g("blk.1.ssm_conv1d.weight"), c.h("model.layers.1.linear_attn.conv1d.weight"));
  // (1+w) everywhere a name ends in norm.weight, except linear_attn.norm.
  EXPECT_EQ(c.g("blk.0.attn_norm.weight"), plus_one(c.h("model.layers.0.input_layernorm.weight")));
  EXPECT_EQ(c.g("blk.3.post_attention_norm.weight"), plus_one(c.h("model.layers.3.post_attention_layernorm.weight")));
  EXPECT_EQ(c.g("blk.3.attn_q_norm.weight"), plus_one(c.h("model.layers.3.self_attn.q_norm.weight")));
  EXPECT_EQ(c.g("output_norm.weight"), plus_one(c.h("model.norm.weight")));
  EXPECT_EQ(c.g("blk.0.ssm_norm.weight"), c.h("model.layers.0.linear_attn.norm.weight"));
  EXPECT_EQ(c.g("blk.3.attn_q.weight"), c.h("model.layers.3.self_attn.q_proj.weight"));  // [q|gate] kept
  EXPECT_EQ(c.gguf->tensor("blk.3.attn_q.weight").ne[1], 2 * 4 * 32);

  const GgufFile& f = *c.gguf;
  EXPECT_EQ(f.architecture(), "qwen3next");
  EXPECT_EQ(f.get<uint32_t>("qwen3next.block_count"), 5u);  // 4 + the MTP block
  EXPECT_EQ(f.get<uint32_t>("qwen3next.nextn_predict_layers"), 1u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.full_attention_interval"), 4u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.ssm.conv_kernel"), 4u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.ssm.state_size"), 16u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.ssm.group_count"), 2u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.ssm.time_step_rank"), 4u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.ssm.inner_size"), 64u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.rope.dimension_count"), 8u);
  EXPECT_EQ(f.get<float>("qwen3next.rope.freq_base"), 10000.0f);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.expert_count"), 16u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.expert_used_count"), 4u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.expert_feed_forward_length"), 32u);
  EXPECT_EQ(f.get<uint32_t>("qwen3next.expert_shared_feed_forward_length"), 48u);
  EXPECT_EQ(testing::read_text(c.dir.file("m.gguf")), testing::read_text(fixture("qwen3next", "model-f32.gguf")));
}

TEST(Qwen3NextConvert, WritesTheMtpHeadAsLlamaCppDoes) {
  const Converted c("qwen3next");
  // mtp.fc is eh_proj unchanged ([H, 2H], embedding half first); every norm gets the +1.
  EXPECT_EQ(c.gguf->tensor("blk.4.nextn.eh_proj.weight").ne[0], 128);
  EXPECT_EQ(c.gguf->tensor("blk.4.nextn.eh_proj.weight").ne[1], 64);
  EXPECT_EQ(c.g("blk.4.nextn.eh_proj.weight"), c.h("mtp.fc.weight"));
  EXPECT_EQ(c.g("blk.4.nextn.enorm.weight"), plus_one(c.h("mtp.pre_fc_norm_embedding.weight")));
  EXPECT_EQ(c.g("blk.4.nextn.hnorm.weight"), plus_one(c.h("mtp.pre_fc_norm_hidden.weight")));
  EXPECT_EQ(c.g("blk.4.nextn.shared_head_norm.weight"), plus_one(c.h("mtp.norm.weight")));
  EXPECT_EQ(c.g("blk.4.attn_norm.weight"), plus_one(c.h("mtp.layers.0.input_layernorm.weight")));
  EXPECT_EQ(c.g("blk.4.attn_k_norm.weight"), plus_one(c.h("mtp.layers.0.self_attn.k_norm.weight")));
  EXPECT_EQ(c.g("blk.4.attn_q.weight"), c.h("mtp.layers.0.self_attn.q_proj.weight"));
  const auto down = c.g("blk.4.ffn_down_exps.weight");
  const auto down5 = c.h("mtp.layers.0.mlp.experts.5.down_proj.weight");
  EXPECT_TRUE(std::equal(down5.begin(), down5.end(), down.begin() + 5 * ptrdiff_t(down5.size())));
  EXPECT_EQ(c.g("blk.4.ffn_gate_inp_shexp.weight"), c.h("mtp.layers.0.mlp.shared_expert_gate.weight"));

  // --no-mtp: the trunk alone, as before the head was exported.
  TempDir dir;
  testing::convert_dir(fixture("qwen3next", "hf"), dir.file("trunk.gguf"), GgmlType::F32, std::nullopt,
                       /*include_mtp=*/false);
  const auto trunk = GgufFile::open(dir.file("trunk.gguf"));
  EXPECT_EQ(trunk->tensors().size(), 3u * 18 + 16 + 3);
  EXPECT_EQ(trunk->get<uint32_t>("qwen3next.block_count"), 4u);
  EXPECT_EQ(trunk->find_tensor("blk.4.nextn.eh_proj.weight"), nullptr);
}

TEST(Qwen3MoeConvert, CopiesPlainNormsAndStacksExpertsAndMatchesTheCommittedFile) {
  const Converted c("qwen3moe");
  EXPECT_EQ(c.gguf->tensors().size(), 3u + 4 * 12);  // reference Part B: 3 + L x 12
  EXPECT_EQ(c.g("blk.1.attn_norm.weight"), c.h("model.layers.1.input_layernorm.weight"));  // no +1
  EXPECT_EQ(c.g("blk.1.ffn_norm.weight"), c.h("model.layers.1.post_attention_layernorm.weight"));
  EXPECT_EQ(c.g("output_norm.weight"), c.h("model.norm.weight"));
  EXPECT_EQ(c.g("blk.0.attn_k_norm.weight"), c.h("model.layers.0.self_attn.k_norm.weight"));
  const auto up = c.g("blk.3.ffn_up_exps.weight");
  const auto up9 = c.h("model.layers.3.mlp.experts.9.up_proj.weight");
  EXPECT_TRUE(std::equal(up9.begin(), up9.end(), up.begin() + 9 * 32 * 64));
  const TensorInfo& down = c.gguf->tensor("blk.3.ffn_down_exps.weight");
  EXPECT_EQ(std::vector<int64_t>(down.ne, down.ne + 3), (std::vector<int64_t>{32, 64, 16}));
  EXPECT_EQ(c.gguf->find_tensor("blk.0.ffn_gate_inp_shexp.weight"), nullptr);  // no shared expert

  const GgufFile& f = *c.gguf;
  EXPECT_EQ(f.architecture(), "qwen3moe");
  EXPECT_EQ(f.get<uint32_t>("qwen3moe.expert_count"), 16u);  // from num_local_experts in 5.17's config
  EXPECT_EQ(f.get<uint32_t>("qwen3moe.feed_forward_length"), 128u);
  EXPECT_EQ(f.get<uint32_t>("qwen3moe.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get<uint32_t>("qwen3moe.attention.key_length"), 16u);
  EXPECT_EQ(f.get<float>("qwen3moe.rope.freq_base"), 1e6f);
  EXPECT_FALSE(f.has("qwen3moe.rope.dimension_count"));
  EXPECT_EQ(testing::read_text(c.dir.file("m.gguf")), testing::read_text(fixture("qwen3moe", "model-f32.gguf")));
}

TEST(QuantizedConvert, Q8_0KeepsRoutersAndNormsF32AndStaysCloseToF32) {
  TempDir dir;
  testing::convert_dir(fixture("qwen3moe", "hf"), dir.file("q8.gguf"), GgmlType::Q8_0);
  const auto q8 = GgufFile::open(dir.file("q8.gguf"));
  const auto hf = HfCheckpoint::open(fixture("qwen3moe", "hf"));
  EXPECT_EQ(q8->tensor("blk.0.attn_q.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(q8->tensor("blk.0.ffn_down_exps.weight").type, GgmlType::Q8_0);  // row 32
  EXPECT_EQ(q8->tensor("token_embd.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(q8->tensor("output.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(q8->tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);
  EXPECT_EQ(q8->tensor("blk.0.attn_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(q8->tensor("blk.0.attn_q_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(q8->get<uint32_t>("general.file_type"), 7u);
  const auto ref = hf->read_f32("model.layers.2.self_attn.o_proj.weight");
  const auto got = testing::gguf_tensor_f32(*q8, "blk.2.attn_output.weight");
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); i += 32) {
    float amax = 0;
    for (size_t j = i; j < i + 32; ++j) amax = std::max(amax, std::fabs(ref[j]));
    for (size_t j = i; j < i + 32; ++j) ASSERT_LE(std::fabs(got[j] - ref[j]), amax / 127.0f * 0.6f + 1e-7f) << j;
  }
}

}  // namespace
}  // namespace strata::convert
