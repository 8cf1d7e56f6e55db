// Greedy speculative decoding emits plain greedy decoding's tokens, token for token: on the
// committed transformers fixtures (random weights: drafts are mostly rejected, exercising every
// rollback length), on the trained default model (its MTP head drafts well: long accepted runs),
// and on synthetic models (skewed routing), for every drafter, fixed depth 1..4 and the gate on.
#include <gtest/gtest.h>

#include <filesystem>

#include "../common/temp_dir.h"
#include "decode/generate.h"
#include "spec_test_util.h"
#include "synth/synth.h"
#include "text/tokenizer.h"

namespace strata {
namespace {

using spec::SpecMode;
using spec_test::plain_generate;
using spec_test::spec_generate;

struct Case {
  SpecMode mode;
  int depth;
  bool gate;
};

std::vector<Case> all_cases(bool has_mtp) {
  std::vector<Case> cases;
  std::vector<SpecMode> modes = {SpecMode::Suffix};
  if (has_mtp) modes = {SpecMode::Mtp, SpecMode::Suffix, SpecMode::Both};
  for (SpecMode mode : modes) {
    for (int depth = 1; depth <= 4; ++depth) cases.push_back({mode, depth, false});
    cases.push_back({mode, 4, true});
  }
  return cases;
}

const char* mode_name(SpecMode m) {
  return m == SpecMode::Mtp ? "mtp" : m == SpecMode::Suffix ? "suffix" : "both";
}

// Proposes the true greedy continuation with every third-ish draft corrupted (a deterministic
// hash of the position), so windows are accepted in full, cut at every depth, or rejected at once.
class OracleDrafter final : public spec::Drafter {
 public:
  OracleDrafter(std::vector<int32_t> reference, size_t prompt_size, int64_t vocab)
      : reference_(std::move(reference)), prompt_size_(prompt_size), vocab_(vocab) {}
  spec::DraftSource source() const override { return spec::DraftSource::Suffix; }
  void on_commit(const Session&, int64_t) override {}
  spec::Draft propose(const Session& session, int32_t, int max_tokens, const KeepGoingFn&) override {
    spec::Draft d;
    const size_t g = session.tokens().size() - prompt_size_;  // index of `next` in the reference
    for (int j = 1; j <= max_tokens && g + size_t(j) < reference_.size(); ++j) {
      const size_t at = g + size_t(j);
      const bool corrupt = (at * 2654435761u) % 7 < 2;
      d.tokens.push_back(corrupt ? int32_t((reference_[at] + 1) % vocab_) : reference_[at]);
      d.confidence.push_back(0.7f);
    }
    return d;
  }

 private:
  std::vector<int32_t> reference_;
  size_t prompt_size_;
  int64_t vocab_;
};

// Checks every case on every prompt; returns the drafts accepted over all runs (so a test can
// insist the speculative path was actually taken).
uint64_t expect_exact(const Model& model, const std::vector<std::vector<int32_t>>& prompts, int n,
                      const std::string& label) {
  compute::ThreadPool pool(2);
  SamplerConfig greedy;
  uint64_t accepted = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t> reference = plain_generate(model, pool, prompts[p], n, greedy);
    for (const Case& c : all_cases(model.has_mtp())) {
      spec::SpecOptions options;
      options.mode = c.mode;
      options.gate.max_depth = c.depth;
      options.gate.enabled = c.gate;
      Session session(model, pool);
      Sampler sampler(greedy);
      spec::SpecDecoder decoder(session, sampler, options, pool);
      decoder.prefill(prompts[p], 16);
      std::vector<int32_t> got;
      generate(
          session, sampler, session.logits(), n, std::nullopt, [&](int32_t t) { got.push_back(t); },
          &decoder);
      EXPECT_EQ(got, reference) << label << " prompt " << p << " --spec " << mode_name(c.mode)
                                << " depth " << c.depth << " gate " << (c.gate ? "on" : "off")
                                << "\n" << decoder.summary();
      accepted += decoder.gate().drafts_accepted();
    }
    for (int depth = 1; depth <= 4; ++depth)
      for (bool gate : {false, true}) {
        spec::SpecOptions options;
        options.gate.max_depth = depth;
        options.gate.enabled = gate;
        std::string summary;
        const std::vector<int32_t> got = spec_generate(
            model, pool, prompts[p], n, greedy, options,
            std::make_unique<OracleDrafter>(reference, prompts[p].size(), model.hparams().n_vocab),
            &summary);
        EXPECT_EQ(got, reference) << label << " prompt " << p << " oracle drafter, depth " << depth
                                  << " gate " << (gate ? "on" : "off") << "\n" << summary;
      }
  }
  return accepted;
}

class FixtureGreedy : public testing::TestWithParam<std::string> {};

TEST_P(FixtureGreedy, SameTokensAsPlainGreedy) {
  const auto model = Model::load(spec_test::fixture_path(GetParam()));
  // Repetitive prompts give the suffix drafter matches; random weights give the MTP head misses.
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 17, 5, 42, 9, 3, 17, 5},
      {1, 2, 3, 4, 1, 2, 3, 4, 1, 2},
      {100, 7, 250, 7, 100, 7, 250},
      {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22},
  };
  expect_exact(*model, prompts, 24, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureGreedy, testing::Values("qwen3moe", "qwen3next", "qwen4exp"));

TEST(DefaultModelGreedy, SameTokensAsPlainGreedyWithLongAcceptedRuns) {
  const std::string path = std::string(STRATA_TEST_DATA_DIR) + "/../../models/strata-default.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  const auto model = Model::load(path);
  ASSERT_TRUE(model->has_mtp());
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  const std::vector<std::vector<int32_t>> prompts = {
      tokenizer.encode("And the LORD spake unto Moses, saying,"),
      tokenizer.encode("NAME\n       grep - print lines that match patterns\n\nSYNOPSIS\n       grep"),
      tokenizer.encode("def main():\n    for i in range(10):\n        print(i)\n"),
  };
  const uint64_t accepted = expect_exact(*model, prompts, 32, "default model");
  EXPECT_GT(accepted, 20u);
}

TEST(SyntheticGreedy, SameTokensAsPlainGreedyOnSkewedSyntheticModels) {
  test_support::ScratchDir dir("spec-synth");
  for (const char* shape : {"tiny-qwen4exp", "tiny-qwen3next"}) {
    for (uint64_t seed : {1u, 7u}) {
      SynthOptions options;
      options.hparams = synth_shape(shape);
      // With a random MTP head (llama.cpp's layout: the trailing block, dense attention for qwen4exp),
      // so the MTP drafter runs on both architectures.
      options.hparams.n_nextn = 1;
      if (options.hparams.arch == Arch::Qwen4Exp) options.hparams.compress_ratios.push_back(0);
      options.seed = seed;
      options.routing.skew = 1.2;
      options.routing.correlation = 0.5;
      const std::string path = dir.file(std::string(shape) + std::to_string(seed) + ".gguf");
      write_synthetic_model(options, path);
      const auto model = Model::load(path);
      ASSERT_TRUE(model->has_mtp()) << shape;
      const int64_t vocab = model->hparams().n_vocab;
      std::vector<std::vector<int32_t>> prompts;
      for (int p = 0; p < 2; ++p) {
        std::vector<int32_t> prompt;
        for (int i = 0; i < 10; ++i) prompt.push_back(int32_t((seed * 131 + p * 17 + (i % 4) * 29) % uint64_t(vocab)));
        prompts.push_back(prompt);
      }
      expect_exact(*model, prompts, 20, std::string(shape) + " seed " + std::to_string(seed));
    }
  }
}

}  // namespace
}  // namespace strata
