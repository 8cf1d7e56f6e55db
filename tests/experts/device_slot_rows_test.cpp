// DeviceSlotRows (experts/device_slot_rows.h): the GPU expert tier's self-release protocol played on
// the CPU with the real SlotResidency. Each "layer visit" evaluates the wait kernel's rule on the
// mirrored device row, resolves, and writes the row where the tier writes it (the job's row, with
// transient slots, unless the device went on by itself); read-ahead guesses for the next layer,
// prompt-hot pins and startup fills write the residency's row. Whenever the rule lets the device
// go on by itself, resolve must list no load and the row must agree with the residency — what the
// tier's serve() checks on the GPU box; routing is skewed so that whole layers hit often. A
// protocol that forgets the read-ahead rows is caught. Plus the rule and agreement on hand-made rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "experts/device_slot_rows.h"
#include "experts/slot_residency.h"
#include "util/error.h"

namespace strata {
namespace {

constexpr uint32_t kMiss = DeviceSlotRows::kMiss;

std::vector<int32_t> skewed_union(std::mt19937& rng, int n_expert, int size, double skew) {
  std::set<int32_t> ids;
  while (int(ids.size()) < size) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    ids.insert(int32_t(std::min<double>(n_expert - 1, std::pow(u, 1.0 + skew) * n_expert)));
  }
  return {ids.begin(), ids.end()};
}

// The residency's row of a layer, a cache slot's offset being its index (transient ones start at
// n_expert, the rows' first_transient).
std::vector<uint32_t> cached_row(const SlotResidency& r, int layer) {
  std::vector<uint32_t> row(size_t(r.n_expert()));
  for (int32_t e = 0; e < r.n_expert(); ++e) row[size_t(e)] = r.slot_of(layer, e);
  return row;
}

struct ProtocolRun {
  int visits = 0, released_itself = 0, violations = 0;
};

// `mirror_read_ahead` false: the protocol forgets that a guess changed the next layer's row.
ProtocolRun play(uint32_t seed, int slots, bool mirror_read_ahead) {
  const int n_layer = 4, n_expert = 32, k = 6;
  std::mt19937 rng(seed);
  SlotResidency residency(std::vector<int>(n_layer, slots), n_expert, n_expert);
  DeviceSlotRows rows(n_layer, n_expert, uint32_t(n_expert));
  std::vector<SlotResidency::Load> loads;
  ProtocolRun run;
  for (int step = 0; step < 4000; ++step) {
    const int layer = step % n_layer;
    if (step % 97 == 0) {  // between windows: prompt-hot pins or a startup fill, uploaded at once
      const std::vector<int32_t> wanted = skewed_union(rng, n_expert, 2, 1.0);
      if (step % 2 == 0) residency.pin_hot(layer, wanted, loads);
      else residency.fill(layer, wanted, 1, loads);
      rows.write(layer, cached_row(residency, layer));
    }
    // A window of 1 to 3 rows: the union of their top-k.
    const int n_rows = step % 11 == 0 ? 3 : 1;
    std::set<int32_t> all;
    for (int r = 0; r < n_rows; ++r)
      for (const int32_t e : skewed_union(rng, n_expert, k, 3.0)) all.insert(e);
    const std::vector<int32_t> ids(all.begin(), all.end());
    const bool by_itself = rows.all_cached(layer, ids);
    residency.resolve(layer, ids, loads);
    ++run.visits;
    if (by_itself) {
      ++run.released_itself;
      if (!loads.empty() || !rows.agrees(layer, cached_row(residency, layer))) ++run.violations;
    } else {
      std::vector<uint32_t> row = cached_row(residency, layer);
      for (const SlotResidency::Load& load : loads)
        if (load.transient) row[size_t(load.expert)] = uint32_t(n_expert) + load.slot;
      rows.write(layer, row);
    }
    if (layer + 1 < n_layer && step % 3 != 0) {  // the next layer's guess, most likely first
      std::vector<int32_t> guess = skewed_union(rng, n_expert, k, 1.0);
      std::shuffle(guess.begin(), guess.end(), rng);
      residency.predict(layer + 1, guess, loads);
      if (mirror_read_ahead) rows.write(layer + 1, cached_row(residency, layer + 1));
    }
  }
  return run;
}

TEST(DeviceSlotRows, ALayerTheDeviceReleasesByItselfResolvesToHitsOnTheResidencysRow) {
  for (const int slots : {2, 8, 24, 32})
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      const ProtocolRun run = play(seed, slots, true);
      EXPECT_EQ(run.violations, 0) << slots << " slots, seed " << seed;
      if (slots >= 24) {
        EXPECT_GT(run.released_itself, run.visits / 10) << slots << " slots, seed " << seed;
      }
      if (slots == 32) {
        EXPECT_GT(run.released_itself, run.visits * 9 / 10);
      }
      std::printf("[ rows ] %d slots, seed %u: %d of %d visits released by the device itself\n", slots, seed,
                  run.released_itself, run.visits);
    }
}

TEST(DeviceSlotRows, AProtocolThatForgetsTheReadAheadRowsIsCaught) {
  int violations = 0;
  for (uint32_t seed = 1; seed <= 4; ++seed) violations += play(seed, 8, false).violations;
  EXPECT_GT(violations, 0);
}

TEST(DeviceSlotRows, TheRuleAndTheAgreementOnHandMadeRows) {
  DeviceSlotRows rows(2, 4, 10);
  const std::vector<uint32_t> row = {3, kMiss, 12, 0};  // expert 2 in a transient slot (12 >= 10)
  rows.write(1, row);
  EXPECT_TRUE(rows.all_cached(1, std::vector<int32_t>{0, 3}));
  EXPECT_FALSE(rows.all_cached(1, std::vector<int32_t>{0, 1}));  // no slot
  EXPECT_FALSE(rows.all_cached(1, std::vector<int32_t>{2}));     // transient: not cached
  EXPECT_FALSE(rows.all_cached(0, std::vector<int32_t>{0}));     // layer 0 untouched
  EXPECT_TRUE(rows.agrees(1, std::vector<uint32_t>{3, kMiss, kMiss, 0}));  // a stale transient entry
  EXPECT_FALSE(rows.agrees(1, std::vector<uint32_t>{3, kMiss, 4, 0}));     // the residency cached it
  EXPECT_FALSE(rows.agrees(1, std::vector<uint32_t>{3, 5, kMiss, 0}));     // the device lacks one
  EXPECT_FALSE(rows.agrees(1, std::vector<uint32_t>{1, kMiss, kMiss, 0})); // another slot
  EXPECT_THROW(rows.write(0, std::vector<uint32_t>{1, 2}), Error);
  EXPECT_THROW((void)rows.row(2), Error);
}

}  // namespace
}  // namespace strata
