// End to end: a GGUF whose expert stack is IQ2_XXS (and one dense matrix IQ3_XXS), written with
// the GGUF writer, opened, loaded through TensorLoader, and multiplied with compute::matvec; each
// output must match the double-precision dot of the dequantized row with the activation as the
// kernel sees it (Q8_K), within the rounding bound of kernels_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "../common/temp_dir.h"
#include "compute/cpu/matmul.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "iq_lowbit_test_util.h"
#include "model/tensor_loader.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace strata {
namespace {

using quant::testing::gaussian;
using quant::testing::kUnitRoundoff;
using quant::testing::make_activation;
using quant::testing::random_iq_row;

// Checks y = W·x row by row against the f64 reference.
void expect_matvec_matches_reference(const compute::WeightMatrix& w, compute::ThreadPool& pool,
                                     uint32_t seed) {
  const std::vector<float> x = gaussian(w.n_in, seed);
  std::vector<float> y(static_cast<size_t>(w.n_out));
  compute::matvec(pool, w, x.data(), y.data());
  const quant::testing::Activation act = make_activation(w.type, x);
  std::vector<float> row(static_cast<size_t>(w.n_in));
  for (int64_t o = 0; o < w.n_out; ++o) {
    quant::ref::dequantize_row(w.type, w.row(o), row.data(), w.n_in);
    double exact = 0.0, magnitude = 0.0;
    for (int64_t i = 0; i < w.n_in; ++i) {
      exact += double(row[i]) * double(act.values[i]);
      magnitude += std::fabs(double(row[i]) * double(act.values[i]));
    }
    const double bound = double(w.n_in / 256 + 16) * 2 * kUnitRoundoff * magnitude;
    EXPECT_LE(std::fabs(double(y[o]) - exact), bound) << type_name(w.type) << " output " << o;
  }
}

TEST(IqLowbitGguf, ExpertStackLoadsAndMultiplies) {
  constexpr int64_t kIn = 512, kOut = 24, kExperts = 4, kDenseIn = 768, kDenseOut = 16;
  const std::vector<uint8_t> experts = random_iq_row(GgmlType::IQ2_XXS, kIn * kOut * kExperts, 11);
  const std::vector<uint8_t> dense = random_iq_row(GgmlType::IQ3_XXS, kDenseIn * kDenseOut, 12);
  test_support::ScratchDir dir("iq-lowbit-gguf");
  const std::string path = dir.file("iq2xxs.gguf");
  GgufWriter writer;
  writer.add_string("general.architecture", "test");
  writer.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::IQ2_XXS, {kIn, kOut, kExperts}, experts);
  writer.add_tensor("blk.0.attn_q.weight", GgmlType::IQ3_XXS, {kDenseIn, kDenseOut}, dense);
  writer.write_file(path);

  const std::unique_ptr<GgufFile> file = GgufFile::open(path);
  const TensorLoader loader(*file);
  compute::ThreadPool pool(2);
  const ExpertTensor stack = loader.experts("blk.0.ffn_up_exps", kIn, kOut, kExperts);
  ASSERT_EQ(stack.type, GgmlType::IQ2_XXS);
  ASSERT_EQ(stack.expert_bytes, size_t(kOut) * row_bytes(GgmlType::IQ2_XXS, kIn));
  for (int64_t e = 0; e < kExperts; ++e) {
    const compute::WeightMatrix w = stack.expert(e);
    // The mapped bytes are the ones written.
    ASSERT_EQ(
        std::memcmp(w.data, experts.data() + size_t(e) * stack.expert_bytes, stack.expert_bytes),
        0);
    expect_matvec_matches_reference(w, pool, uint32_t(100 + e));
  }
  const compute::WeightMatrix q = loader.matrix("blk.0.attn_q", kDenseIn, kDenseOut);
  ASSERT_EQ(q.type, GgmlType::IQ3_XXS);
  expect_matvec_matches_reference(q, pool, 7);
}

}  // namespace
}  // namespace strata
