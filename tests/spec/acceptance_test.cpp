// Sampled acceptance is the exact rejection-sampling rule: output tokens are distributed as the
// target. Chi-square goodness-of-fit tests, deterministic (fixed seeds). Thresholds: the 1e-6
// upper tail of the chi-square distribution for the test's degrees of freedom is far below them
// for the right rule, and a plausible wrong rule (drawing from p instead of the residual after a
// rejection) lands orders of magnitude above (checked here too).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>

#include "spec/acceptance.h"
#include "spec_test_util.h"

namespace strata::spec {
namespace {

double uniform(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

int32_t draw(const TokenDistribution& d, double u) {
  double c = 0;
  for (size_t i = 0; i < d.ids.size(); ++i)
    if (u < (c += d.probs[i])) return d.ids[i];
  return d.ids.back();
}

// Σ (observed − expected)² / expected over the target's support (all cells expected ≥ 5 here).
double chi_square(const std::map<int32_t, int>& counts, const TokenDistribution& p, int n) {
  double chi = 0;
  int inside = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const auto it = counts.find(p.ids[i]);
    const double observed = it == counts.end() ? 0 : it->second;
    inside += int(observed);
    const double expected = double(p.probs[i]) * n;
    chi += (observed - expected) * (observed - expected) / expected;
  }
  return inside == n ? chi : 1e30;  // a token outside the target's support: certainly wrong
}

TokenDistribution target() {
  return {{3, 5, 8, 13, 21, 34, 55, 89}, {0.30f, 0.20f, 0.15f, 0.12f, 0.10f, 0.07f, 0.04f, 0.02f}};
}

// Runs the rule n times; `wrong` replaces the residual draw by a draw from the target.
double run_rule(const TokenDistribution& q, bool wrong, int n, uint64_t seed) {
  const TokenDistribution p = target();
  std::mt19937_64 rng(seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    const int32_t d = draw(q, uniform(rng));
    const double u1 = uniform(rng), u2 = uniform(rng);
    std::optional<int32_t> replacement = rejection_step(p, q, d, u1, u2);
    if (wrong && replacement) replacement = draw(p, u2);
    ++counts[replacement ? *replacement : d];
  }
  return chi_square(counts, p, n);
}

constexpr double kThreshold = 45.0;  // 7 degrees of freedom: P(χ² > 45) ≈ 1.4e-7

TEST(Acceptance, RejectionRuleKeepsTheTargetDistribution) {
  // A proper draft distribution (overlapping, with a token the target never emits).
  const TokenDistribution q = {{5, 3, 99, 21, 89}, {0.4f, 0.1f, 0.2f, 0.2f, 0.1f}};
  const double right = run_rule(q, false, 200000, 1);
  const double wrong = run_rule(q, true, 200000, 1);
  std::printf("chi-square: rule %.1f, wrong rule %.1f (threshold %.0f)\n", right, wrong, kThreshold);
  EXPECT_LT(right, kThreshold);
  EXPECT_GT(wrong, 10 * kThreshold);
}

TEST(Acceptance, PointMassDraftsKeepTheTargetDistribution) {
  // strata's drafters are deterministic: q is a point mass on the draft.
  for (int32_t d : {3, 55, 99}) {
    const TokenDistribution q = {{d}, {1.0f}};
    const double right = run_rule(q, false, 100000, uint64_t(d));
    EXPECT_LT(right, kThreshold) << "draft " << d;
    if (d != 99) {
      EXPECT_GT(run_rule(q, true, 100000, uint64_t(d)), 10 * kThreshold) << "draft " << d;
    }
  }
}

TEST(Acceptance, CertainTargetAlwaysAcceptsItsToken) {
  const TokenDistribution p = {{4}, {1.0f}}, q = {{4}, {1.0f}};
  EXPECT_FALSE(rejection_step(p, q, 4, 0.999999, 0.5).has_value());
  const TokenDistribution q2 = {{9}, {1.0f}};
  EXPECT_EQ(rejection_step(p, q2, 9, 0.0, 0.5), std::optional<int32_t>(4));
}

// A drafter that always proposes the same tokens (confidence ½).
class FixedDrafter final : public Drafter {
 public:
  explicit FixedDrafter(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  DraftSource source() const override { return DraftSource::Suffix; }
  void on_commit(const Session&, int64_t) override {}
  Draft propose(const Session&, int32_t, int max_tokens, const KeepGoingFn&) override {
    Draft d;
    for (int i = 0; i < max_tokens && i < int(tokens_.size()); ++i) {
      d.tokens.push_back(tokens_[size_t(i)]);
      d.confidence.push_back(0.5f);
    }
    return d;
  }

 private:
  std::vector<int32_t> tokens_;
};

// End to end on the tiny qwen4exp fixture: the joint distribution of the first two generated
// tokens, the second decided by the rejection rule at row 0 of a verify window, against the exact
// joint computed from plain forwards (temperature 1, top-k 5, repetition penalty 1.3 so the
// target depends on the history through the window).
TEST(Acceptance, SpeculativeSamplingMatchesPlainSamplingOnAModel) {
  const auto model = Model::load(spec_test::fixture_path("qwen4exp"));
  compute::ThreadPool pool(1);
  const std::vector<int32_t> prompt = {3, 17, 5, 42, 9, 3, 17};
  SamplerConfig sampling;
  sampling.temperature = 1.0f;
  sampling.top_k = 5;
  sampling.repetition_penalty = 1.3f;
  // Exact joint p(t1) · p(t2 | t1).
  std::map<std::pair<int32_t, int32_t>, double> joint;
  std::map<int32_t, double> second;
  {
    Session base(*model, pool);
    Sampler sampler(sampling);
    base.prefill(prompt, 16);
    const TokenDistribution p1 = sampler.distribution(base.logits(), base.tokens());
    for (size_t i = 0; i < p1.ids.size(); ++i) {
      Session s(*model, pool);
      s.prefill(prompt, 16);
      s.decode(p1.ids[i]);
      const TokenDistribution p2 = sampler.distribution(s.logits(), s.tokens());
      for (size_t j = 0; j < p2.ids.size(); ++j) {
        joint[{p1.ids[i], p2.ids[j]}] = double(p1.probs[i]) * p2.probs[j];
        second[p2.ids[j]] += double(p1.probs[i]) * p2.probs[j];
      }
    }
  }
  int32_t draft = 0;
  double best = -1;
  for (auto [id, p] : second)
    if (p > best) best = p, draft = id;
  SpecOptions options;
  options.mode = SpecMode::Off;
  options.gate.enabled = false;
  options.gate.max_depth = 1;
  const int kRuns = getenv("SPEC_CHI_RUNS") ? atoi(getenv("SPEC_CHI_RUNS")) : 3000;
  std::map<std::pair<int32_t, int32_t>, int> counts;
  for (int seed = 0; seed < kRuns; ++seed) {
    sampling.seed = uint64_t(seed);
    const std::vector<int32_t> out = spec_test::spec_generate(
        *model, pool, prompt, 3, sampling, options, std::make_unique<FixedDrafter>(std::vector<int32_t>{draft}));
    ASSERT_EQ(out.size(), 3u);
    ++counts[{out[0], out[1]}];
  }
  // Cells expected < 5 are pooled into one.
  double chi = 0, pooled_expected = 0, pooled_observed = 0;
  int cells = 0;
  for (auto [cell, p] : joint) {
    const double expected = p * kRuns;
    const auto it = counts.find(cell);
    const double observed = it == counts.end() ? 0 : it->second;
    if (expected < 5) {
      pooled_expected += expected, pooled_observed += observed;
      continue;
    }
    chi += (observed - expected) * (observed - expected) / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    chi += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  int outside = 0;
  for (auto [cell, n] : counts)
    if (!joint.count(cell)) outside += n;
  EXPECT_EQ(outside, 0) << "tokens outside the target's support";
  // ≤ 25 cells → ≤ 24 degrees of freedom: P(χ² > 70) < 1e-6.
  std::printf("end-to-end chi-square %.1f over %d cells (draft %d)\n", chi, cells, draft);
  EXPECT_LT(chi, 70.0);
}

}  // namespace
}  // namespace strata::spec
