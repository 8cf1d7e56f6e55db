// Exactness gate: strata's forward vs HF transformers 5.17 (fp32, CPU) on the tiny random models
// of tests/data/models (made by tools/make_model_fixtures.py; docs/fixtures.md). Each test converts
// the checkpoint with `strata convert` (f32), loads it, and compares:
//   - full-prefill logits of every prompt position, one window;
//   - the 16-token greedy continuation (prefill + 15 single-token decode steps): tokens equal,
//     logits within tolerance;
//   - qwen4exp, qwen3next: the MTP head's step-1 draft logits for every prompt position (and, for
//     qwen3next, one chained draft step).
// Tolerance: max |Δlogit| ≤ 1e-4. HF's own prefill-vs-decode disagreement on these models is up to
// 1.0e-5 (fp32 summation order), our kernels reorder sums the same way, so 1e-4 leaves 10×
// headroom; the smallest top-2 margin of any greedy step is 2.8e-3, 28× larger, so every argmax
// is decided and must match exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/f32_file.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/thread_pool.h"
#include "convert/convert.h"
#include "engine/session.h"
#include "model/model.h"

namespace strata {
namespace {

using test_support::read_f32_file;

constexpr float kTolerance = 1e-4f;

std::string fixture_dir(const std::string& arch) {
  return std::string(STRATA_TEST_DATA_DIR) + "/models/" + arch;
}

float max_abs_diff(const float* a, const float* b, size_t n) {
  float worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

class Fixture : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string arch = GetParam();
    std::ifstream manifest_file(fixture_dir(arch) + "/ref/manifest.json");
    ASSERT_TRUE(manifest_file);
    manifest = nlohmann::json::parse(manifest_file);
    gguf_path = (std::filesystem::temp_directory_path() /
                 ("strata-fixture-" + arch + "-" + std::to_string(getpid()) + ".gguf"))
                    .string();
    convert::ConvertOptions options;
    options.hf_dir = fixture_dir(arch) + "/hf";
    options.out_path = gguf_path;
    options.type = GgmlType::F32;
    options.show_progress = false;
    convert::convert_hf_to_gguf(options);
    model = Model::load(gguf_path);
  }
  void TearDown() override { std::filesystem::remove(gguf_path); }

  std::vector<int32_t> prompt(size_t p) const {
    return manifest["prompts"][p]["ids"].get<std::vector<int32_t>>();
  }

  nlohmann::json manifest;
  std::string gguf_path;
  std::unique_ptr<Model> model;
  compute::ThreadPool pool{2};
};

TEST_P(Fixture, PrefillLogitsMatchTransformers) {
  const int64_t vocab = model->hparams().n_vocab;
  for (size_t p = 0; p < manifest["prompts"].size(); ++p) {
    const std::vector<int32_t> ids = prompt(p);
    const std::vector<float> expected = read_f32_file(
        fixture_dir(GetParam()) + "/ref/prefill_logits_p" + std::to_string(p) + ".bin",
        ids.size() * size_t(vocab));
    ModelState state = model->new_state();
    std::vector<float> logits;
    model->forward(pool, state, ids, LogitRows::All, logits);
    ASSERT_EQ(logits.size(), expected.size());
    std::printf("%s prompt %zu: prefill max |dlogit| = %.3g over %zu positions\n",
                GetParam().c_str(), p, max_abs_diff(logits.data(), expected.data(), logits.size()),
                ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* got = logits.data() + t * size_t(vocab);
      const float* want = expected.data() + t * size_t(vocab);
      ASSERT_LE(max_abs_diff(got, want, size_t(vocab)), kTolerance)
          << "prompt " << p << " position " << t;
      ASSERT_EQ(compute::argmax(got, vocab), compute::argmax(want, vocab))
          << "prompt " << p << " position " << t;
    }
  }
}

TEST_P(Fixture, GreedyContinuationMatchesTransformers) {
  const int64_t vocab = model->hparams().n_vocab;
  for (size_t p = 0; p < manifest["prompts"].size(); ++p) {
    const auto greedy = manifest["prompts"][p]["greedy_tokens"].get<std::vector<int32_t>>();
    const std::vector<float> expected =
        read_f32_file(fixture_dir(GetParam()) + "/ref/greedy_logits_p" + std::to_string(p) + ".bin",
                      greedy.size() * size_t(vocab));
    Session session(*model, pool);
    session.prefill(prompt(p), 16);
    for (size_t k = 0; k < greedy.size(); ++k) {
      const std::vector<float>& logits = session.logits();
      EXPECT_LE(max_abs_diff(logits.data(), expected.data() + k * size_t(vocab), size_t(vocab)),
                kTolerance)
          << "prompt " << p << " step " << k;
      const int32_t token = int32_t(compute::argmax(logits.data(), vocab));
      ASSERT_EQ(token, greedy[k]) << "prompt " << p << " step " << k;
      if (k + 1 < greedy.size()) session.decode(token);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, Fixture, testing::Values("qwen3moe", "qwen3next", "qwen4exp"));

class MtpFixture : public Fixture {};

TEST_P(MtpFixture, DraftLogitsMatchReference) {
  ASSERT_TRUE(model->has_mtp());
  const std::string arch = GetParam();
  const int64_t vocab = model->hparams().n_vocab;
  const std::vector<int32_t> ids = prompt(0);
  const auto next = manifest["mtp"]["next_tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(next.size(), ids.size());
  ModelState state = model->new_state();
  std::vector<float> logits;
  model->forward(pool, state, ids, LogitRows::None, logits);
  // The head's input: qwen4exp the multi-stream residual before the final mixer, qwen3next the
  // trunk output after output_norm.
  const size_t width = size_t(model->hparams().hc_count * model->hparams().n_embd);
  const char* trunk_file =
      arch == "qwen4exp" ? "trunk_premixer_p0.bin" : "trunk_final_hidden_p0.bin";
  const std::vector<float> trunk =
      read_f32_file(fixture_dir(arch) + "/ref/" + trunk_file, ids.size() * width);
  ASSERT_EQ(state.residuals.size(), trunk.size());
  EXPECT_LE(max_abs_diff(state.residuals.data(), trunk.data(), trunk.size()), kTolerance);
  const std::vector<float> expected =
      read_f32_file(fixture_dir(arch) + "/ref/mtp_draft_logits_p0.bin", ids.size() * size_t(vocab));
  std::vector<float> head_out;
  model->mtp_forward(pool, state.mtp, state.residuals.data(), next, logits, &head_out);
  std::printf("%s MTP draft max |dlogit| = %.3g over %zu positions\n", arch.c_str(),
              max_abs_diff(logits.data(), expected.data(), logits.size()), ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* got = logits.data() + t * size_t(vocab);
    const float* want = expected.data() + t * size_t(vocab);
    ASSERT_LE(max_abs_diff(got, want, size_t(vocab)), kTolerance) << "position " << t;
    ASSERT_EQ(compute::argmax(got, vocab), compute::argmax(want, vocab)) << "position " << t;
  }
  if (!manifest["mtp"].contains("chain")) return;
  // One chained draft: the head's own output at the last entry and its draft token, one position
  // later, attending over the head's cache of the whole prompt.
  const int32_t chain_token = manifest["mtp"]["chain"]["token"].get<int32_t>();
  ASSERT_EQ(chain_token,
            int32_t(compute::argmax(logits.data() + (ids.size() - 1) * size_t(vocab), vocab)));
  const std::vector<float> last(head_out.end() - ptrdiff_t(width), head_out.end());
  const int32_t chained[1] = {chain_token};
  model->mtp_forward(pool, state.mtp, last.data(), chained, logits);
  const std::vector<float> chain_expected =
      read_f32_file(fixture_dir(arch) + "/ref/mtp_chain_logits_p0.bin", size_t(vocab));
  std::printf("%s MTP chained draft max |dlogit| = %.3g\n", arch.c_str(),
              max_abs_diff(logits.data(), chain_expected.data(), size_t(vocab)));
  EXPECT_LE(max_abs_diff(logits.data(), chain_expected.data(), size_t(vocab)), kTolerance);
  EXPECT_EQ(compute::argmax(logits.data(), vocab), compute::argmax(chain_expected.data(), vocab));
}

INSTANTIATE_TEST_SUITE_P(Heads, MtpFixture, testing::Values("qwen4exp", "qwen3next"));

}  // namespace
}  // namespace strata
