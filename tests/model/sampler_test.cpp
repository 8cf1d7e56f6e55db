#include <gtest/gtest.h>

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

TEST(Sampler, RejectsBadSettings) {
  SamplerConfig config;
  config.top_p = 0.0f;
  EXPECT_THROW(Sampler{config}, Error);
  config = {};
  config.temperature = -1.0f;
  EXPECT_THROW(Sampler{config}, Error);
}

}  // namespace
}  // namespace strata
