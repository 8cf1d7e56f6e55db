// SlotResidency (experts/slot_residency.h) is the ExpertStore's residency policy without memory or
// I/O, for the GPU expert arena. Its contract is that it makes the same decisions as the store:
// driven by the same calls, every (layer, expert) has the same slot in both, at every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "../common/fixture_models.h"
#include "experts/expert_store.h"
#include "experts/slot_residency.h"
#include "model/model.h"
#include "util/error.h"

namespace strata {
namespace {

std::vector<int32_t> random_union(std::mt19937& rng, int n_expert, int max_size, double skew) {
  std::uniform_int_distribution<int> size(1, max_size);
  std::set<int32_t> ids;
  const int n = size(rng);
  while (int(ids.size()) < n) {
    // Skewed draws (a few hot experts) so hits, evictions and transients all happen.
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    ids.insert(int32_t(std::min<double>(n_expert - 1, std::pow(u, 1.0 + skew) * n_expert)));
  }
  return {ids.begin(), ids.end()};
}

void drain(ExpertStore& store) {
  int index = 0;
  ExpertMatrices m;
  while (store.next(index, m)) {
  }
}

class SlotResidencyVsStore : public testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(SlotResidencyVsStore, SameSlotsAsTheExpertStoreAtEveryStep) {
  const auto& [arch, slots] = GetParam();
  const auto model = Model::load(test_support::fixture_model_gguf(arch));
  const HParams& hp = model->hparams();
  ExpertStoreOptions options;
  options.slots_per_layer = slots;
  options.io_threads = 1;
  options.urgent_only_threads = 0;
  ExpertStore store(*model, options);
  std::vector<int> per_layer(model->layers().size(), 0);
  std::vector<int> moe_layers;
  for (int l = 0; l < int(per_layer.size()); ++l)
    if (model->layers()[size_t(l)].gate_exps.n_expert > 0) {
      per_layer[size_t(l)] = slots;
      moe_layers.push_back(l);
    }
  ASSERT_FALSE(moe_layers.empty());
  SlotResidency residency(per_layer, hp.n_expert, hp.n_expert);

  std::mt19937 rng(11);
  std::vector<SlotResidency::Load> loads;
  // Pins first, as a startup fill would.
  std::vector<std::vector<int32_t>> ranking(per_layer.size());
  for (const int l : moe_layers) {
    ranking[size_t(l)] = {int32_t(l % hp.n_expert), int32_t((l + 3) % hp.n_expert)};
    residency.fill(l, ranking[size_t(l)], 1, loads);
  }
  store.fill(ranking, 1);
  uint64_t transients = 0;
  for (int step = 0; step < 400; ++step) {
    const int layer = moe_layers[size_t(step) % moe_layers.size()];
    const std::vector<int32_t> u = random_union(rng, hp.n_expert, std::min(hp.n_expert, slots + 3), 2.0);
    residency.resolve(layer, u, loads);
    store.begin_layer(layer, u);
    drain(store);
    for (const auto& load : loads) transients += load.transient;
    if (step % 3 == 0) {
      std::vector<int32_t> guess = random_union(rng, hp.n_expert, hp.n_expert_used, 2.0);
      std::shuffle(guess.begin(), guess.end(), rng);  // most likely first: any order
      const int next = moe_layers[size_t(step + 1) % moe_layers.size()];
      residency.predict(next, guess, loads);
      store.predict(next, guess);
    }
    for (const int l : moe_layers)
      for (int e = 0; e < hp.n_expert; ++e) {
        ASSERT_EQ(residency.slot_of(l, e), store.slot_of(l, e)) << "step " << step << " layer " << l << " expert " << e;
        ASSERT_EQ(residency.pinned(l, e), store.pinned(l, e));
      }
  }
  const ExpertStoreStats s = store.stats();
  EXPECT_EQ(residency.stats().hits, s.hits);
  EXPECT_EQ(residency.stats().misses, s.misses);
  EXPECT_EQ(residency.stats().read_ahead_issued, s.read_ahead_issued);
  EXPECT_EQ(residency.stats().read_ahead_used, s.read_ahead_used);
  if (slots < hp.n_expert) {
    EXPECT_GT(s.misses, 0u);
    EXPECT_GT(transients, 0u);  // unions larger than the slots went to transient slots
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SlotResidencyVsStore,
                         testing::Combine(testing::Values("qwen4exp", "qwen3next", "qwen3moe"),
                                          testing::Values(1, 2, 5)));

TEST(SlotResidency, LoadsSayWhatToCopyAndTransientsAreCapped) {
  SlotResidency r({2, 0, 2}, 8, 2);
  std::vector<SlotResidency::Load> loads;
  const std::vector<int32_t> a = {1, 4};
  r.resolve(0, a, loads);
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].expert, 1);
  EXPECT_EQ(loads[0].slot, 0u);
  EXPECT_FALSE(loads[0].transient);
  r.resolve(0, a, loads);
  EXPECT_TRUE(loads.empty());  // both resident now
  const std::vector<int32_t> b = {0, 1, 4, 6};
  r.resolve(0, b, loads);  // 1 and 4 protected: 0 and 6 go to transient slots 0, 1
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_TRUE(loads[0].transient && loads[1].transient);
  EXPECT_EQ(loads[1].slot, 1u);
  EXPECT_EQ(r.slot_of(0, 0), SlotResidency::kMiss);
  const std::vector<int32_t> c = {0, 1, 2, 4, 6};
  EXPECT_THROW(r.resolve(0, c, loads), Error);    // three misses, two transient slots
  EXPECT_THROW(r.resolve(1, a, loads), Error);    // layer 1 has no experts
}

}  // namespace
}  // namespace strata
