// strata convert on the qwen4exp fixture (tests/data/models/qwen4exp/hf, transformers 5.17 +
// random MTP head): the tensor list and shapes of reference qwen4exp.md §12, the transforms checked
// value by value against the HF tensors, the metadata keys/types, and the committed model-f32.gguf.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "convert/checkpoint.h"
#include "convert_test_util.h"
#include "gguf/gguf.h"

namespace strata::convert {
namespace {

using testing::TempDir;

const std::string kHfDir = std::string(STRATA_TEST_DATA_DIR) + "/models/qwen4exp/hf";
const std::string kCommitted = std::string(STRATA_TEST_DATA_DIR) + "/models/qwen4exp/model-f32.gguf";

// The fixture's config (docs/fixtures.md): H 64, 4 layers [lin lin lin QSA], ...
constexpr int64_t H = 64, L = 4, V = 512, NH = 4, NKV = 2, HD = 32, NK = 2, NV = 6, DK = 16, DV = 16;
constexpr int64_t E = 32, I = 16, IS = 32, S = 4, LR = 16, NI = 2, DI = 16, W = S * H;
constexpr int64_t KD = NK * DK, VD = NV * DV, CONV = 2 * KD + VD, R = NV / NK;

class Qwen4ExpConvert : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    testing::convert_dir(kHfDir, dir_->file("m.gguf"));
    gguf_ = GgufFile::open(dir_->file("m.gguf")).release();
    hf_ = HfCheckpoint::open(kHfDir).release();
  }
  static void TearDownTestSuite() {
    delete gguf_;
    delete hf_;
    delete dir_;
  }
  static std::vector<float> g(const std::string& name) { return testing::gguf_tensor_f32(*gguf_, name); }
  static std::vector<float> h(const std::string& name) { return hf_->read_f32(name); }
  static inline TempDir* dir_ = nullptr;
  static inline GgufFile* gguf_ = nullptr;
  static inline HfCheckpoint* hf_ = nullptr;
};

// The HF V head that GGUF (tiled) position p holds: p = i*NK + g  <-  h = g*R + i.
int64_t hf_head(int64_t p) { return (p % NK) * R + p / NK; }

std::map<std::string, std::vector<int64_t>> expected_tensors() {
  std::map<std::string, std::vector<int64_t>> t;
  const auto blk = [](int64_t b, const std::string& s) { return "blk." + std::to_string(b) + "." + s; };
  const auto hc = [&](const std::string& p) {
    t[p + "norm.weight"] = {W};
    t[p + "down.weight"] = {W, LR};
    t[p + "up.weight"] = {LR, W};
  };
  const auto moe = [&](int64_t b) {
    t[blk(b, "ffn_gate_inp.weight")] = {H, E};
    t[blk(b, "ffn_gate_exps.weight")] = {H, I, E};
    t[blk(b, "ffn_up_exps.weight")] = {H, I, E};
    t[blk(b, "ffn_down_exps.weight")] = {I, H, E};
    t[blk(b, "ffn_gate_inp_shexp.weight")] = {H, 1};
    t[blk(b, "ffn_gate_shexp.weight")] = {H, IS};
    t[blk(b, "ffn_up_shexp.weight")] = {H, IS};
    t[blk(b, "ffn_down_shexp.weight")] = {IS, H};
  };
  const auto qsa = [&](int64_t b) {
    t[blk(b, "attn_q.weight")] = {H, 2 * NH * HD};
    t[blk(b, "attn_k.weight")] = {H, NKV * HD};
    t[blk(b, "attn_v.weight")] = {H, NKV * HD};
    t[blk(b, "attn_output.weight")] = {NH * HD, H};
    t[blk(b, "attn_q_norm.weight")] = {HD};
    t[blk(b, "attn_k_norm.weight")] = {HD};
    t[blk(b, "indexer.q_proj.weight")] = {H, NI * DI};
    t[blk(b, "indexer.k_proj.weight")] = {H, DI};
    t[blk(b, "indexer.q_norm.weight")] = {DI};
    t[blk(b, "indexer.k_norm.weight")] = {DI};
  };
  t["token_embd.weight"] = {H, V};
  t["output.weight"] = {H, V};
  hc("output_hc_");
  t["per_layer_token_embd.weight"] = {4, 16832};
  for (int64_t b = 0; b <= L; ++b) {
    hc(blk(b, "hc_attn_"));
    hc(blk(b, "hc_ffn_"));
    t[blk(b, "hc_attn_inject.weight")] = {W, S};
    t[blk(b, "hc_ffn_inject.weight")] = {W, S};
    moe(b);
    if (b == 3 || b == 4) {
      qsa(b);
    } else {
      t[blk(b, "attn_qkv.weight")] = {H, CONV};
      t[blk(b, "attn_gate.weight")] = {H, VD};
      t[blk(b, "ssm_beta.weight")] = {H, NV};
      t[blk(b, "ssm_alpha.weight")] = {H, NV};
      t[blk(b, "ssm_conv1d.weight")] = {4, CONV};
      t[blk(b, "ssm_dt.bias")] = {NV};
      t[blk(b, "ssm_a")] = {NV};
      t[blk(b, "ssm_norm.weight")] = {DV};
      t[blk(b, "ssm_out.weight")] = {VD, H};
    }
  }
  t["blk.1.ple_key.weight"] = {H, W};
  t["blk.1.ple_value.weight"] = {H, H};
  t["blk.1.ple_norm_key.weight"] = {W};
  t["blk.1.ple_norm_query.weight"] = {W};
  t["blk.1.ple_norm_conv.weight"] = {W};
  t["blk.1.ple_conv1d.weight"] = {4, W};
  t["blk.4.nextn.eh_proj.weight"] = {2 * H, H};
  t["blk.4.nextn.enorm.weight"] = {H};
  t["blk.4.nextn.hnorm.weight"] = {W};
  hc("blk.4.nextn.hc_head_");
  return t;
}

TEST_F(Qwen4ExpConvert, WritesExactlyTheReferenceTensorsAndShapes) {
  const auto expected = expected_tensors();
  // Reference §12 counts: 3 GDN blocks x 25 + 1 QSA block x 26 + PLE 6 + globals 6 + MTP 32.
  EXPECT_EQ(expected.size(), 3u * 25 + 26 + 6 + 6 + 32);
  ASSERT_EQ(gguf_->tensors().size(), expected.size());
  for (const TensorInfo& info : gguf_->tensors()) {
    const auto it = expected.find(info.name);
    ASSERT_NE(it, expected.end()) << "unexpected tensor " << info.name;
    EXPECT_EQ(std::vector<int64_t>(info.ne, info.ne + info.n_dims), it->second) << info.name;
    EXPECT_EQ(info.type, GgmlType::F32) << info.name;
  }
}

TEST_F(Qwen4ExpConvert, FoldsOnePlusWNormsExactlyOnce) {
  const std::pair<const char*, const char*> folded[] = {
      {"blk.0.hc_attn_norm.weight", "model.layers.0.attn_hyper_connection.hc_norm.weight"},
      {"blk.3.hc_ffn_norm.weight", "model.layers.3.mlp_hyper_connection.hc_norm.weight"},
      {"blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"},
      {"blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight"},
      {"blk.3.indexer.q_norm.weight", "model.layers.3.self_attn.indexer.q_layernorm.weight"},
      {"blk.3.indexer.k_norm.weight", "model.layers.3.self_attn.indexer.k_layernorm.weight"},
      {"blk.1.ple_norm_key.weight", "model.layers.1.ple.norm_key.weight"},
      {"blk.1.ple_norm_query.weight", "model.layers.1.ple.norm_query.weight"},
      {"blk.1.ple_norm_conv.weight", "model.layers.1.ple.norm_conv.weight"},
      {"output_hc_norm.weight", "model.hyper_connection_mixer.hc_norm.weight"},
      {"blk.4.nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight"},
      {"blk.4.nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight"},
      {"blk.4.nextn.hc_head_norm.weight", "mtp.hyper_connection_mixer.hc_norm.weight"},
      {"blk.4.hc_attn_norm.weight", "mtp.layers.0.attn_hyper_connection.hc_norm.weight"},
  };
  for (const auto& [gguf_name, hf_name] : folded) {
    const auto w = h(hf_name);
    const auto got = g(gguf_name);
    ASSERT_EQ(got.size(), w.size()) << gguf_name;
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(got[i], w[i] + 1.0f) << gguf_name << "[" << i << "]";
  }
  // The GDN output norm is a plain gain: stored as is.
  EXPECT_EQ(g("blk.2.ssm_norm.weight"), h("model.layers.2.linear_attn.norm.weight"));
}

TEST_F(Qwen4ExpConvert, ReordersVHeadsGroupedToTiled) {
  const std::string la = "model.layers.1.linear_attn.";
  const auto a_log = h(la + "A_log"), ssm_a = g("blk.1.ssm_a");
  const auto dt = h(la + "dt_bias"), ssm_dt = g("blk.1.ssm_dt.bias");
  for (int64_t p = 0; p < NV; ++p) {
    EXPECT_EQ(ssm_a[p], -std::exp(a_log[hf_head(p)])) << p;
    EXPECT_EQ(ssm_dt[p], dt[hf_head(p)]) << p;
  }
  // attn_qkv: q and k rows unchanged, V rows moved by whole heads of DV rows.
  const auto qkv = h(la + "in_proj_qkv.weight"), attn_qkv = g("blk.1.attn_qkv.weight");
  for (int64_t row = 0; row < CONV; ++row) {
    const int64_t src = row < 2 * KD ? row : 2 * KD + hf_head((row - 2 * KD) / DV) * DV + (row - 2 * KD) % DV;
    for (int64_t col = 0; col < H; ++col) ASSERT_EQ(attn_qkv[row * H + col], qkv[src * H + col]) << row;
  }
  const auto z = h(la + "in_proj_z.weight"), gate = g("blk.1.attn_gate.weight");
  const auto b = h(la + "in_proj_b.weight"), beta = g("blk.1.ssm_beta.weight");
  for (int64_t p = 0; p < NV; ++p) {
    for (int64_t col = 0; col < H; ++col) {
      ASSERT_EQ(beta[p * H + col], b[hf_head(p) * H + col]);
      for (int64_t j = 0; j < DV; ++j) ASSERT_EQ(gate[(p * DV + j) * H + col], z[(hf_head(p) * DV + j) * H + col]);
    }
  }
  // conv1d [C, 1, 4] squeezed to {4, C}: channel rows follow the qkv rows.
  const auto conv = h(la + "conv1d.weight"), ssm_conv = g("blk.1.ssm_conv1d.weight");
  for (int64_t ch = 0; ch < CONV; ++ch) {
    const int64_t src = ch < 2 * KD ? ch : 2 * KD + hf_head((ch - 2 * KD) / DV) * DV + (ch - 2 * KD) % DV;
    for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(ssm_conv[ch * 4 + k], conv[src * 4 + k]) << ch;
  }
  // ssm_out: the V *columns* (the input dimension) move.
  const auto out = h(la + "out_proj.weight"), ssm_out = g("blk.1.ssm_out.weight");
  for (int64_t row = 0; row < H; ++row) {
    for (int64_t col = 0; col < VD; ++col) {
      ASSERT_EQ(ssm_out[row * VD + col], out[row * VD + hf_head(col / DV) * DV + col % DV]);
    }
  }
}

TEST_F(Qwen4ExpConvert, SplitsStacksAndConcatenates) {
  const auto qk = h("model.layers.3.self_attn.indexer.index_qk_proj.weight");
  const auto q = g("blk.3.indexer.q_proj.weight"), k = g("blk.3.indexer.k_proj.weight");
  EXPECT_EQ(q, std::vector<float>(qk.begin(), qk.begin() + NI * DI * H));
  EXPECT_EQ(k, std::vector<float>(qk.begin() + NI * DI * H, qk.end()));
  // Experts stack as {in, out, E}: expert e is a contiguous [out, in] slab.
  const auto gate = g("blk.2.ffn_gate_exps.weight"), down = g("blk.2.ffn_down_exps.weight");
  for (int64_t e : {0, 17, 31}) {
    const auto ge = h("model.layers.2.mlp.experts." + std::to_string(e) + ".gate_proj.weight");
    const auto de = h("model.layers.2.mlp.experts." + std::to_string(e) + ".down_proj.weight");
    EXPECT_TRUE(std::equal(ge.begin(), ge.end(), gate.begin() + e * I * H)) << e;
    EXPECT_TRUE(std::equal(de.begin(), de.end(), down.begin() + e * H * I)) << e;
  }
  // The PLE table is shard 0's rows then shard 1's.
  const auto table = g("per_layer_token_embd.weight");
  const auto s0 = h("model.layers.1.ple.ple_embedding.ngram_embedding.shard_0.weight");
  const auto s1 = h("model.layers.1.ple.ple_embedding.ngram_embedding.shard_1.weight");
  ASSERT_EQ(table.size(), s0.size() + s1.size());
  EXPECT_TRUE(std::equal(s0.begin(), s0.end(), table.begin()));
  EXPECT_TRUE(std::equal(s1.begin(), s1.end(), table.begin() + static_cast<std::ptrdiff_t>(s0.size())));
  // eh_proj row o = [fc_embedding row o | fc_hidden row o].
  const auto fe = h("mtp.fc_embedding.weight"), fh = h("mtp.fc_hidden.weight"), eh = g("blk.4.nextn.eh_proj.weight");
  for (int64_t o = 0; o < H; ++o) {
    for (int64_t j = 0; j < H; ++j) {
      ASSERT_EQ(eh[o * 2 * H + j], fe[o * H + j]);
      ASSERT_EQ(eh[o * 2 * H + H + j], fh[o * H + j]);
    }
  }
  // Plain copies.
  EXPECT_EQ(g("token_embd.weight"), h("model.embed_tokens.weight"));
  EXPECT_EQ(g("output.weight"), h("lm_head.weight"));
  EXPECT_EQ(g("blk.1.ple_conv1d.weight"), h("model.layers.1.ple.conv1d.weight"));
  EXPECT_EQ(g("blk.4.attn_q.weight"), h("mtp.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(g("blk.0.hc_attn_inject.weight"), h("model.layers.0.attn_hyper_connection.block_inject_weight.weight"));
}

bool is_prime(int64_t n) {
  for (int64_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return n > 1;
}

TEST_F(Qwen4ExpConvert, WritesTheQwen4ExpMetadata) {
  const GgufFile& f = *gguf_;
  EXPECT_EQ(f.architecture(), "qwen4exp");
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.block_count"), 5u);  // 4 + the MTP block
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.nextn_predict_layers"), 1u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.embedding_length"), 64u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.full_attention_interval"), 4u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.rope.dimension_count"), 8u);  // 32 * 0.25
  EXPECT_EQ(f.get<float>("qwen4exp.rope.freq_base"), 1e7f);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.ssm.inner_size"), 96u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.ssm.time_step_rank"), 6u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.ssm.group_count"), 2u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.hyper_connection.count"), 4u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.hyper_connection.low_rank"), 16u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.attention.indexer.head_count"), 2u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.attention.indexer.key_length"), 16u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.attention.indexer.top_k"), 8u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.expert_feed_forward_length"), 16u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.expert_shared_feed_forward_length"), 32u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.attention.key_length"), 32u);
  EXPECT_EQ(f.get<std::vector<int64_t>>("qwen4exp.attention.compress_ratios"), (std::vector<int64_t>{0, 0, 0, 4, 0}));
  EXPECT_EQ(f.get_array("qwen4exp.attention.compress_ratios").element_type, GgufValueType::I32);
  EXPECT_EQ(f.get<std::vector<int64_t>>("qwen4exp.rope.dimension_sections"), (std::vector<int64_t>{2, 1, 1, 0}));
  EXPECT_EQ(f.get<std::vector<int64_t>>("qwen4exp.ple.layers"), (std::vector<int64_t>{1}));  // 0-based
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.ple.eos_token_id"), 2u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.embedding_length_per_layer_input"), 4u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.ple.ngram_size"), 3u);
  EXPECT_EQ(f.get<uint32_t>("qwen4exp.ple.heads_per_ngram"), 8u);
  // The hash constants, as u64, equal to the values reference §14 derives for this config...
  const GgufArray& m = f.get_array("qwen4exp.ple.layer_multipliers");
  EXPECT_EQ(m.element_type, GgufValueType::U64);
  EXPECT_EQ(m.ints, (std::vector<int64_t>{4295158889763781, 17440218147737327, 1270917961434445}));
  // ... and to the checkpoint's int64 buffer, bit for bit.
  EXPECT_EQ(m.ints, hf_->read_i64("model.layers.1.ple.ple_embedding.layer_multipliers"));
  // Head vocab sizes: the 16 primes after ngram_vocab_size_base - 1 = 999; offsets their prefix sums.
  std::vector<int64_t> primes, offsets;
  int64_t sum = 0;
  for (int64_t n = 1000; primes.size() < 16; ++n) {
    if (is_prime(n)) {
      offsets.push_back(sum);
      primes.push_back(n);
      sum += n;
    }
  }
  EXPECT_EQ(primes.front(), 1009);
  EXPECT_EQ(primes.back(), 1097);
  EXPECT_EQ(sum, 16826);
  EXPECT_EQ(f.get_array("qwen4exp.ple.head_vocab_sizes").ints, primes);
  EXPECT_EQ(f.get_array("qwen4exp.ple.head_offsets").ints, offsets);
  EXPECT_EQ(f.get<uint32_t>("general.file_type"), 0u);
  EXPECT_EQ(f.get<uint32_t>("general.quantization_version"), 2u);
  EXPECT_FALSE(f.has("tokenizer.ggml.model"));  // the fixture has no tokenizer files
}

TEST_F(Qwen4ExpConvert, LeavesTheMtpHeadOutOnRequest) {
  TempDir dir;
  testing::convert_dir(kHfDir, dir.file("trunk.gguf"), GgmlType::F32, std::nullopt, /*include_mtp=*/false);
  const auto trunk = GgufFile::open(dir.file("trunk.gguf"));
  EXPECT_EQ(trunk->tensors().size(), 113u);  // reference §12: trunk only
  EXPECT_EQ(trunk->get<uint32_t>("qwen4exp.block_count"), 4u);
  EXPECT_FALSE(trunk->has("qwen4exp.nextn_predict_layers"));
  EXPECT_EQ(trunk->get<std::vector<int64_t>>("qwen4exp.attention.compress_ratios"), (std::vector<int64_t>{0, 0, 0, 4}));
  EXPECT_EQ(trunk->find_tensor("blk.4.nextn.eh_proj.weight"), nullptr);
}

TEST_F(Qwen4ExpConvert, MatchesTheCommittedModelF32ByteForByte) {
  // tests/data/models/qwen4exp/model-f32.gguf is what the forward tests load; it must be exactly
  // what convert produces today (regenerate it with `strata convert ... --type f32` otherwise).
  EXPECT_EQ(testing::read_text(dir_->file("m.gguf")), testing::read_text(kCommitted));
}

}  // namespace
}  // namespace strata::convert
