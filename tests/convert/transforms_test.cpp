// Value transforms and the type policy of the converter, against hand-computed results.
#include <gtest/gtest.h>

#include <cmath>

#include "convert/convert.h"
#include "convert/plan.h"
#include "convert/transforms.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::convert {
namespace {

TEST(Transforms, VHeadsGroupedToTiledMatchesTheReferenceExample) {
  // nk = 2 K heads, r = 3 V heads each: HF order h = g*3 + i = [g0i0 g0i1 g0i2 g1i0 g1i1 g1i2];
  // tiled position p = i*2 + g takes head g*3 + i: [0, 3, 1, 4, 2, 5].
  EXPECT_EQ(v_heads_grouped_to_tiled(2, 3), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  // The real qwen4exp (nk 16, r 3): tiled position 17 (i = 1, g = 1) reads head 1*3 + 1 = 4, and
  // GGUF V head p uses K head p mod 16.
  const auto real = v_heads_grouped_to_tiled(16, 3);
  EXPECT_EQ(real[17], 4);
  for (int64_t p = 0; p < 48; ++p) EXPECT_EQ(real[p] / 3, p % 16) << p;
  EXPECT_EQ(v_heads_grouped_to_tiled(4, 1), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(Transforms, BlockPermutationsGatherRowsAndColumns) {
  const std::vector<int64_t> blocks{1, 0};
  EXPECT_EQ(expand_block_permutation(blocks, 2, 10), (std::vector<int64_t>{12, 13, 10, 11}));
  const std::vector<float> m{0, 1, 2, 10, 11, 12, 20, 21, 22};  // 3 x 3
  const std::vector<int64_t> rows{2, 0};
  EXPECT_EQ(gather_rows(m, 3, rows), (std::vector<float>{20, 21, 22, 0, 1, 2}));
  std::vector<float> c = m;
  const std::vector<int64_t> cols{2, 0, 1};
  gather_columns(c, 3, cols);
  EXPECT_EQ(c, (std::vector<float>{2, 0, 1, 12, 10, 11, 22, 20, 21}));
}

TEST(Transforms, NormFoldingAndALog) {
  std::vector<float> w{-0.5f, 0.0f, 2.0f};
  add_one(w);
  EXPECT_EQ(w, (std::vector<float>{0.5f, 1.0f, 3.0f}));
  std::vector<float> a{0.0f, std::log(2.0f)};
  negate_exp(a);
  EXPECT_FLOAT_EQ(a[0], -1.0f);
  EXPECT_FLOAT_EQ(a[1], -2.0f);
}

TEST(Transforms, Qwen3NextQkvzRegroupByHand) {
  // nk = 2 groups, dk = 1, r = 2, dv = 1: group rows [q k v0 v1 z0 z1] (6 per group).
  const QkvzRows rows = qwen3next_qkvz_rows(2, 1, 2, 1);
  EXPECT_EQ(rows.qkv, (std::vector<int64_t>{0, 6, 1, 7, 2, 3, 8, 9}));
  EXPECT_EQ(rows.z, (std::vector<int64_t>{4, 5, 10, 11}));
}

TEST(TypePolicy, KeepsNormsRoutersAndVectorsF32AndFallsBackPerRow) {
  const auto q4k = GgmlType::Q4_K;
  EXPECT_EQ(choose_tensor_type("blk.0.attn_norm.weight", {2560}, q4k, {}), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type("blk.0.hc_attn_norm.weight", {10240}, q4k, {}), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type("blk.0.ffn_gate_inp.weight", {2560, 512}, q4k, {}), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type("blk.0.ffn_gate_inp_shexp.weight", {2560, 1}, q4k, {}), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type("blk.0.ssm_conv1d.weight", {4, 10240}, q4k, {}), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type("blk.0.ssm_a", {48}, q4k, {}), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type("blk.0.ssm_dt.bias", {48}, q4k, {}), GgmlType::F32);
  // Rows that fit the 256-block type keep it; token_embd and output follow --type.
  EXPECT_EQ(choose_tensor_type("token_embd.weight", {2560, 248320}, q4k, {}), GgmlType::Q4_K);
  EXPECT_EQ(choose_tensor_type("output.weight", {2560, 248320}, GgmlType::Q6_K, {}), GgmlType::Q6_K);
  EXPECT_EQ(choose_tensor_type("blk.0.attn_qkv.weight", {2560, 10240}, GgmlType::F16, {}), GgmlType::F16);
  // --expert-type applies to *_exps only; 640-wide rows cannot hold 256-blocks, so they take
  // llama.cpp's substitute (llama-quant.cpp): Q4_0 for Q2_K, Q5_0 for Q4_K, Q8_0 for Q6_K.
  EXPECT_EQ(choose_tensor_type("blk.0.ffn_gate_exps.weight", {2560, 640, 512}, q4k, GgmlType::Q2_K), GgmlType::Q2_K);
  EXPECT_EQ(choose_tensor_type("blk.0.ffn_down_exps.weight", {640, 2560, 512}, q4k, GgmlType::Q2_K), GgmlType::Q4_0);
  EXPECT_EQ(choose_tensor_type("blk.0.ffn_down_shexp.weight", {640, 2560}, q4k, GgmlType::Q2_K), GgmlType::Q5_0);
  EXPECT_EQ(choose_tensor_type("blk.0.hc_attn_up.weight", {320, 10240}, GgmlType::Q6_K, {}), GgmlType::Q8_0);
  EXPECT_EQ(choose_tensor_type("per_layer_token_embd.weight", {160, 320001536}, q4k, {}), GgmlType::Q5_0);
  // Neither a 256- nor a 32-block fits 4 columns: F16 (llama.cpp's converter does the same).
  EXPECT_EQ(choose_tensor_type("blk.1.ple_conv1d.weight", {4, 10240}, GgmlType::Q8_0, {}), GgmlType::F16);
}

TEST(TypePolicy, FileTypesAndSupportedTypes) {
  EXPECT_EQ(llama_file_type(GgmlType::F32), 0u);
  EXPECT_EQ(llama_file_type(GgmlType::F16), 1u);
  EXPECT_EQ(llama_file_type(GgmlType::Q8_0), 7u);
  EXPECT_EQ(llama_file_type(GgmlType::BF16), 32u);
  EXPECT_TRUE(is_supported_output_type(GgmlType::Q6_K));
  EXPECT_FALSE(is_supported_output_type(GgmlType::IQ2_XS));  // needs an importance matrix
  EXPECT_FALSE(is_supported_output_type(GgmlType::Q5_0));    // no kernels in strata
}

TEST(LayerPattern, FromLayerTypesOrInterval) {
  const HfConfig typed(nlohmann::json{{"layer_types", {"linear_attention", "linear_attention", "qwen_sparse_attention",
                                                       "linear_attention", "linear_attention", "full_attention"}}},
                       "t");
  const auto pattern = linear_layer_pattern(typed, 6);
  EXPECT_EQ(pattern, (std::vector<bool>{true, true, false, true, true, false}));
  EXPECT_EQ(full_attention_interval(pattern), 3);
  EXPECT_EQ(full_attention_interval({true, false, false, true}), std::nullopt);
  const HfConfig plain(nlohmann::json::object(), "t");
  EXPECT_EQ(linear_layer_pattern(plain, 4), (std::vector<bool>{true, true, true, false}));
  EXPECT_THROW(linear_layer_pattern(typed, 4), Error);
}

TEST(Progress, FormatsCountsBytesRateAndEta) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * 1024), "3.00 KiB");
  EXPECT_EQ(format_bytes(uint64_t{1300} << 20), "1.27 GiB");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  // A quarter of 4 MiB done in 1 s: 1 MiB/s, 3 s left, bar 5/20 filled.
  EXPECT_EQ(ProgressBar::format_line("convert", 10, 40, 1 << 20, 4 << 20, 1.0),
            "convert [#####...............] 10/40 tensors  1.00 MiB/4.00 MiB  1.00 MiB/s  ETA 3s");
  EXPECT_EQ(ProgressBar::format_line("convert", 40, 40, 4 << 20, 4 << 20, 2.0),
            "convert [####################] 40/40 tensors  4.00 MiB/4.00 MiB  2.00 MiB/s  in 2s");
  EXPECT_EQ(ProgressBar::format_line("pack", 0, 7, 0, 0, 0.0, "experts"), "pack [....................] 0/7 experts");
}

}  // namespace
}  // namespace strata::convert
