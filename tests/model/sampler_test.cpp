#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "engine/sampler.h"
#include "util/error.h"

namespace strata {
namespace {

TEST(Sampler, GreedyPicksArgmaxWithLowerIdOnTies) {
  Sampler sampler(SamplerConfig{});
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(sampler.sample(logits, {}), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplerConfig config;
  config.temperature = 0.8f;
  config.seed = 42;
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.25f, 0.0f};
  Sampler a(config), b(config);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, {}), b.sample(logits, {}));
}

TEST(Sampler, FrequenciesFollowSoftmaxAtTemperature) {
  SamplerConfig config;
  config.temperature = 2.0f;
  config.seed = 3;
  Sampler sampler(config);
  const std::vector<float> logits = {0.0f, std::log(2.0f) * 2.0f, std::log(3.0f) * 2.0f};
  // At T = 2 the probabilities are 1:2:3.
  std::map<int32_t, int> counts;
  const int n = 60000;
  for (int i = 0; i < n; ++i) ++counts[sampler.sample(logits, {})];
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 6, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 2.0 / 6, 0.01);
  EXPECT_NEAR(counts[2] / double(n), 3.0 / 6, 0.01);
}

TEST(Sampler, TopKTopPMinPTruncate) {
  SamplerConfig config;
  config.temperature = 1.0f;
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  config.top_k = 2;
  TokenDistribution d = Sampler(config).distribution(logits, {});
  ASSERT_EQ(d.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(d.probs[0], 0.5 / 0.8, 1e-6);
  config.top_k = 0;
  config.top_p = 0.9f;  // 0.5 + 0.3 + 0.15 = 0.95 >= 0.9 -> three tokens
  d = Sampler(config).distribution(logits, {});
  EXPECT_EQ(d.ids.size(), 3u);
  config.top_p = 1.0f;
  config.min_p = 0.5f;  // keep p >= 0.25
  d = Sampler(config).distribution(logits, {});
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1}));
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplerConfig config;
  config.temperature = 1.0f;
  config.repetition_penalty = 2.0f;
  const std::vector<float> logits = {2.0f, 2.0f, -1.0f};
  const std::vector<int32_t> history = {0, 2};
  const TokenDistribution d = Sampler(config).distribution(logits, history);
  // Adjusted logits: {1, 2, -2} -> token 1 first.
  ASSERT_EQ(d.ids[0], 1);
  EXPECT_NEAR(d.probs[0], std::exp(2.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(-2.0)), 1e-6);
}

TEST(Sampler, LogitBiasBansAndForcesTokens) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, -1.0f};
  SamplerConfig config;
  config.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(Sampler(config).sample(logits, {}), 2);  // greedy: the banned argmax is skipped
  config.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(Sampler(config).sample(logits, {}), 3);
  config.temperature = 1.0f;
  config.seed = 7;
  config.logit_bias = {{1, -100.0f}};
  Sampler sampler(config);
  for (int i = 0; i < 2000; ++i) EXPECT_NE(sampler.sample(logits, {}), 1);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountOnlyGeneratedTokens) {
  // OpenAI's rule: logit[t] -= count[t] * frequency + (count[t] > 0) * presence.
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f};
  SamplerConfig config;
  config.n_prompt = 2;
  config.frequency_penalty = 0.5f;
  config.presence_penalty = 0.25f;
  // Prompt {0, 0}: not counted; generated {0, 2, 0}: token 0 twice, token 2 once.
  const std::vector<int32_t> history = {0, 0, 0, 2, 0};
  std::vector<TokenLogprob> top;
  const Sampler sampler(config);
  sampler.logprobs(logits, history, 0, 3, top);
  ASSERT_EQ(top.size(), 3u);
  // Adjusted: {3 - 1.25, 2.9, -0.75}: token 1 is now the most likely, greedy picks it.
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 0);
  const double norm = std::log(std::exp(1.75) + std::exp(2.9) + std::exp(-0.75));
  EXPECT_NEAR(top[1].logprob, 1.75 - norm, 1e-6);
  EXPECT_NEAR(top[2].logprob, -0.75 - norm, 1e-6);
  EXPECT_EQ(Sampler(config).sample(logits, history), 1);
  // Without the prompt offset the prompt's two 0s count too.
  config.n_prompt = 0;
  Sampler(config).logprobs(logits, history, 0, 1, top);
  EXPECT_EQ(top[0].id, 1);
  // A negative penalty encourages repetition.
  config.n_prompt = 2;
  config.frequency_penalty = -1.0f;
  config.presence_penalty = 0.0f;
  const std::vector<float> close = {2.0f, 2.5f, 2.2f};
  EXPECT_EQ(Sampler(config).sample(close, history), 0);
}

TEST(Sampler, LogprobsAreTheTemperedLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -50.0f};
  SamplerConfig config;
  config.temperature = 0.5f;
  config.top_k = 2;  // truncation does not change the reported log-probabilities
  const Sampler sampler(config);
  std::vector<TokenLogprob> top;
  const TokenLogprob chosen = sampler.logprobs(logits, {}, 2, 5, top);
  double norm = 0;
  for (float v : logits) norm += std::exp(double(v) / 0.5);
  EXPECT_EQ(chosen.id, 2);
  EXPECT_NEAR(chosen.logprob, 2.0 / 0.5 - std::log(norm), 1e-9);
  ASSERT_EQ(top.size(), 5u);
  EXPECT_EQ(top[0].id, 1);  // ties to the lower id
  EXPECT_EQ(top[1].id, 3);
  double mass = 0;
  for (size_t i = 0; i < top.size(); ++i) {
    EXPECT_LE(top[i].logprob, 0.0);
    if (i > 0) {
      EXPECT_LE(top[i].logprob, top[i - 1].logprob);
    }
    mass += std::exp(top[i].logprob);
  }
  EXPECT_NEAR(mass, 1.0, 1e-9);
  // Greedy: temperature 1, and the top entry is the token greedy picks.
  Sampler greedy(SamplerConfig{});
  const int32_t picked = greedy.sample(logits, {});
  greedy.logprobs(logits, {}, picked, 1, top);
  EXPECT_EQ(top[0].id, picked);
  EXPECT_THROW(greedy.logprobs(logits, {}, 5, 0, top), Error);
}

TEST(Sampler, RejectsBadSettings) {
  SamplerConfig config;
  config.top_p = 0.0f;
  EXPECT_THROW(Sampler{config}, Error);
  config = {};
  config.temperature = -1.0f;
  EXPECT_THROW(Sampler{config}, Error);
  config = {};
  config.frequency_penalty = std::numeric_limits<float>::infinity();
  EXPECT_THROW(Sampler{config}, Error);
  config = {};
  config.logit_bias = {{0, std::numeric_limits<float>::quiet_NaN()}};
  EXPECT_THROW(Sampler{config}, Error);
}

}  // namespace
}  // namespace strata
