// SlotResidency (experts/slot_residency.h) is the residency policy without memory or I/O: the
// ExpertStore decides with it, and so does the GPU expert arena.
// - Against the oracle: cache_replay (route/cache_replay.h) reimplements the policy on its own.
//   Driven by the same trace, SlotResidency must give the replay's counters after every window:
//   visits, hits, misses, read-ahead issued and used, and every byte the loads it lists would read.
// - Against the store: an ExpertStore driven by the same calls has, at every step, the same slot
//   for every (layer, expert) as a bare SlotResidency — the store hands the policy the calls it
//   gets (hits and misses split, predictions gated, pins counted) and changes nothing of its own.
// - The rules one by one: loads, transients, prompt-hot pins, and fill on resident experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "../common/fixture_models.h"
#include "experts/expert_store.h"
#include "experts/slot_residency.h"
#include "model/model.h"
#include "route/cache_replay.h"
#include "route/routing_trace.h"
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
  while (!store.wait().empty()) {
  }
}

// A trace built in memory: `n_windows` windows, each visiting every block with routed experts in
// order (block 1 has none) with a skewed random union, and — every other layer — a read-ahead
// guess for the next block, most likely first.
RoutingTrace random_trace(uint32_t seed, int n_expert, int max_union, int n_windows) {
  std::mt19937 rng(seed);
  RoutingTrace trace;
  trace.header.n_block = 4;
  trace.header.n_expert = uint32_t(n_expert);
  trace.header.k = 2;
  trace.header.record_bytes = {4096, 0, 8192, 12288};
  const std::vector<int> moe = {0, 2, 3};
  for (int w = 0; w < n_windows; ++w) {
    RoutingTrace::Window window;
    window.n_rows = w % 5 == 0 ? 3 : 1;
    window.first_record = uint32_t(trace.records.size());
    for (size_t m = 0; m < moe.size(); ++m) {
      RoutingTrace::LayerRecord rec;
      rec.layer = uint16_t(moe[m]);
      rec.union_offset = trace.union_ids.size();
      for (const int32_t e : random_union(rng, n_expert, max_union, 2.0))
        trace.union_ids.push_back(uint16_t(e));
      rec.union_size = uint32_t(trace.union_ids.size() - rec.union_offset);
      if ((w + int(m)) % 2 == 0) {
        std::vector<int32_t> guess = random_union(rng, n_expert, 4, 2.0);
        std::shuffle(guess.begin(), guess.end(), rng);
        rec.predict_layer = moe[(m + 1) % moe.size()];
        rec.predict_offset = trace.predicted.size();
        rec.predict_size = uint32_t(guess.size());
        for (const int32_t e : guess) trace.predicted.push_back(uint16_t(e));
      }
      trace.records.push_back(rec);
    }
    window.n_records = uint32_t(trace.records.size() - window.first_record);
    trace.windows.push_back(window);
  }
  return trace;
}

// SlotResidency driven the way the ExpertStore drives it, with the counters a store derives from
// it (bytes: every load it lists, at the block's record size).
struct DrivenResidency {
  SlotResidency residency;
  bool read_ahead;
  bool all_resident;
  uint64_t total_slots = 0;
  uint64_t bytes_read = 0, miss_bytes = 0;
  std::vector<SlotResidency::Load> loads;

  DrivenResidency(const RoutingTraceHeader& h, int slots, bool read_ahead_on)
      : residency(per_layer(h, slots), int(h.n_expert), int(h.n_expert)),
        read_ahead(read_ahead_on),
        all_resident(uint32_t(slots) == h.n_expert) {
    for (uint32_t b = 0; b < h.n_block; ++b) total_slots += h.record_bytes[b] ? uint64_t(slots) : 0;
  }
  static std::vector<int> per_layer(const RoutingTraceHeader& h, int slots) {
    std::vector<int> out(h.n_block, 0);
    for (uint32_t b = 0; b < h.n_block; ++b) out[b] = h.record_bytes[b] ? slots : 0;
    return out;
  }
  void fill(const RoutingTraceHeader& h, const std::vector<std::vector<int32_t>>& ranking,
            int n_pinned) {
    for (size_t b = 0; b < ranking.size(); ++b) {
      if (!residency.has_experts(int(b))) continue;
      residency.fill(int(b), ranking[b], n_pinned, loads);
      bytes_read += loads.size() * h.record_bytes[b];
    }
  }
  void window(const RoutingTrace& trace, const RoutingTrace::Window& w) {
    for (uint32_t r = w.first_record; r < w.first_record + w.n_records; ++r) {
      const RoutingTrace::LayerRecord& rec = trace.records[r];
      const uint64_t bytes = trace.header.record_bytes[rec.layer];
      std::vector<int32_t> u(
          trace.union_ids.begin() + ptrdiff_t(rec.union_offset),
          trace.union_ids.begin() + ptrdiff_t(rec.union_offset + rec.union_size));
      residency.resolve(rec.layer, u, loads);
      bytes_read += loads.size() * bytes;
      miss_bytes += loads.size() * bytes;
      // ExpertStore::wants_guess: read-ahead until an all-resident store is full.
      const bool wants = read_ahead && !(all_resident && residency.filled_slots() == total_slots);
      if (rec.predict_layer < 0 || !wants) continue;
      std::vector<int32_t> guess(
          trace.predicted.begin() + ptrdiff_t(rec.predict_offset),
          trace.predicted.begin() + ptrdiff_t(rec.predict_offset + rec.predict_size));
      residency.predict(rec.predict_layer, guess, loads);
      bytes_read += loads.size() * trace.header.record_bytes[size_t(rec.predict_layer)];
    }
  }
};

class SlotResidencyVsReplay : public testing::TestWithParam<std::tuple<int, bool, int>> {};

TEST_P(SlotResidencyVsReplay, SameCountersAsTheIndependentReplayAfterEveryWindow) {
  const auto& [slots, read_ahead, n_pinned] = GetParam();
  const int n_expert = 12;
  const RoutingTrace trace = random_trace(5, n_expert, std::min(n_expert, slots + 3), 80);
  CacheReplaySettings settings;
  settings.slots_per_layer = slots;
  settings.read_ahead = read_ahead;
  if (n_pinned >= 0) {
    settings.fill_ranking = {{3, 0, 7}, {}, {1, 2}, {11, 4, 5, 6}};
    settings.n_pinned = n_pinned;
  }
  DrivenResidency driven(trace.header, slots, read_ahead);
  if (n_pinned >= 0) driven.fill(trace.header, settings.fill_ranking, settings.n_pinned);

  RoutingTrace prefix = trace;
  for (size_t w = 0; w < trace.windows.size(); ++w) {
    driven.window(trace, trace.windows[w]);
    prefix.windows.assign(trace.windows.begin(), trace.windows.begin() + ptrdiff_t(w + 1));
    const ExpertStoreStats replayed = replay_cache(prefix, settings).stats;
    const SlotResidencyStats& r = driven.residency.stats();
    const std::string at = "after window " + std::to_string(w);
    ASSERT_EQ(r.layer_visits, replayed.layer_visits) << at;
    ASSERT_EQ(r.needed, replayed.needed) << at;
    ASSERT_EQ(r.hits, replayed.hits) << at;
    ASSERT_EQ(r.misses, replayed.misses) << at;
    ASSERT_EQ(r.read_ahead_issued, replayed.read_ahead_issued) << at;
    ASSERT_EQ(r.read_ahead_used, replayed.read_ahead_used) << at;
    ASSERT_EQ(driven.miss_bytes, replayed.miss_bytes) << at;
    ASSERT_EQ(driven.bytes_read, replayed.bytes_read) << at;
  }
  // The trace exercises what it should: hits and misses, read-ahead that is used, transients.
  const SlotResidencyStats& r = driven.residency.stats();
  EXPECT_GT(r.hits, 0u);
  if (slots < n_expert) {
    EXPECT_GT(r.misses, 0u);
    EXPECT_GT(r.transient, 0u);
  }
  if (read_ahead && slots < n_expert && slots > n_pinned) {  // (else every slot is pinned)
    EXPECT_GT(r.read_ahead_used, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Settings, SlotResidencyVsReplay,
                         testing::Combine(testing::Values(1, 2, 5, 12), testing::Bool(),
                                          testing::Values(-1, 0, 2)));

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
  uint64_t total_slots = 0;
  for (const int n : per_layer) total_slots += uint64_t(n);

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
    store.publish(layer, u);
    drain(store);
    for (const auto& load : loads) transients += load.transient;
    if (step % 3 == 0) {
      std::vector<int32_t> guess = random_union(rng, hp.n_expert, hp.n_expert_used, 2.0);
      std::shuffle(guess.begin(), guess.end(), rng);  // most likely first: any order
      const int next = moe_layers[size_t(step + 1) % moe_layers.size()];
      const bool full = slots == hp.n_expert && residency.filled_slots() == total_slots;
      ASSERT_EQ(store.wants_guess(), !full) << "step " << step;
      residency.predict(next, guess, loads);
      store.publish_guess(next, guess);
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

TEST(SlotResidency, HotPinsAreKeptUntilDroppedAndNeverEvicted) {
  SlotResidency r({4}, 10, 4);
  std::vector<SlotResidency::Load> loads;
  const std::vector<int32_t> hot = {2, 5};
  EXPECT_EQ(r.pin_hot(0, hot, loads), 2);
  ASSERT_EQ(loads.size(), 2u);  // both loaded into empty slots 0 and 1, in the given order
  EXPECT_EQ(loads[0].expert, 2);
  EXPECT_EQ(loads[1].slot, 1u);
  EXPECT_TRUE(r.hot(0, 2) && r.hot(0, 5));
  EXPECT_FALSE(r.pinned(0, 2));  // pinned() is fill's pin only
  EXPECT_EQ(r.hot_pins(0), hot);
  // Unions of four other experts: only two slots can move, so two go to transient slots.
  const std::vector<int32_t> u = {0, 1, 3, 4};
  r.resolve(0, u, loads);
  ASSERT_EQ(loads.size(), 4u);
  EXPECT_FALSE(loads[0].transient || loads[1].transient);
  EXPECT_TRUE(loads[2].transient && loads[3].transient);
  EXPECT_NE(r.slot_of(0, 2), SlotResidency::kMiss);
  EXPECT_NE(r.slot_of(0, 5), SlotResidency::kMiss);
  // Same pins again: no change, no load. Then 5 is dropped for 9: one drop, one add.
  EXPECT_EQ(r.pin_hot(0, hot, loads), 0);
  EXPECT_TRUE(loads.empty());
  const std::vector<int32_t> next = {2, 9};
  EXPECT_EQ(r.pin_hot(0, next, loads), 2);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].expert, 9);
  EXPECT_FALSE(r.hot(0, 5));
  EXPECT_EQ(r.hot_pins(0), next);
  // 9 took the least recently used unpinned slot (expert 0's, the lower of two equally old), not
  // 5's: 5 was touched by the last pin_hot. LRU order: this call's (lower slot first), then older.
  EXPECT_EQ(r.slot_of(0, 0), SlotResidency::kMiss);
  EXPECT_EQ(r.lru_order(0), (std::vector<int32_t>{2, 9, 5, 1}));
}

TEST(SlotResidency, FillKeepsTheLruTimeOfResidentExpertsAndDropEmptiesASlot) {
  // Two slots: 1 then 2 resident, 1 the older. A fill naming 1 (resident) and nothing else must
  // not touch it (as ExpertStore::fill and cache_replay do): the next miss still evicts 1.
  SlotResidency r({2}, 6, 2);
  std::vector<SlotResidency::Load> loads;
  r.resolve(0, std::vector<int32_t>{1}, loads);
  r.resolve(0, std::vector<int32_t>{2}, loads);
  r.fill(0, std::vector<int32_t>{1}, 0, loads);
  EXPECT_TRUE(loads.empty());
  r.resolve(0, std::vector<int32_t>{3}, loads);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(r.slot_of(0, 1), SlotResidency::kMiss);
  EXPECT_EQ(r.slot_of(0, 3), loads[0].slot);
  EXPECT_EQ(r.filled_slots(), 2u);
  r.drop(0, 3);
  EXPECT_EQ(r.slot_of(0, 3), SlotResidency::kMiss);
  EXPECT_EQ(r.filled_slots(), 1u);
  r.resolve(0, std::vector<int32_t>{4}, loads);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_FALSE(loads[0].transient);
  EXPECT_EQ(r.slot_of(0, 4), loads[0].slot);
}

}  // namespace
}  // namespace strata
