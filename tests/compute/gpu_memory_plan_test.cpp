// The GPU memory plan (compute/gpu_memory_plan.h): the arithmetic the CUDA backend checks at start,
// before any upload, run here without a GPU on a made-up model whose numbers are easy to follow:
// 4 MoE layers of 64 experts, top-4, each expert 384 KiB (three 128 KiB F32 matrices); so a slot
// per layer is 1.5 MiB, the 64 transient slots (min(64, 4 x 256 rows)) 24 MiB, every expert
// 96 MiB; 2 GiB of dense weights and 10 + 20 MiB of window tensors and states beside the 128 MiB
// of scratch. Checked: a budget that fits; a budget too big, whose message names the device, the
// free, dense and arena bytes, the flag as given and the largest budget that fits (which must fit
// itself, and one slot per layer more must not); the dense part alone too big; the smallest arena
// too big; percent, byte and slot budgets; no budget with too little room for every expert; a
// tier larger than every expert; the tier's own layout.
#include <gtest/gtest.h>

#include <string>

#include "compute/gpu_memory_plan.h"
#include "util/byte_size.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::compute {
namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20, kGiB = uint64_t(1) << 30;
constexpr int kExperts = 64, kTopK = 4, kLayers = 4;
constexpr uint64_t kSlot = 384 << 10, kSlotSum = kLayers * kSlot, kTransient = 64 * kSlot;
constexpr uint64_t kAllExperts = kSlotSum * kExperts;       // 96 MiB
constexpr uint64_t kTierMaps = 2 * kLayers * kExperts * 4;  // slot map + pending rows
constexpr uint64_t kResidentMaps = kLayers * kExperts * 4;  // the all-resident slot maps
const std::string kDevice = "NVIDIA Test GPU (sm_90, 132 SMs, 1.0 GiB)";

GpuModelFootprint footprint() {
  GpuModelFootprint f;
  f.dense_weight_bytes = 2 * kGiB;
  f.window_bytes = 10 * kMiB;
  f.state_bytes = 20 * kMiB;
  f.n_expert = kExperts;
  f.n_expert_used = kTopK;
  ExpertLayerLayout layer;
  layer.present = true;
  layer.gate = {GgmlType::F32, 256, 128, 1024};
  layer.up = {GgmlType::F32, 256, 128, 1024};
  layer.down = {GgmlType::F32, 128, 256, 512};
  f.expert_layers.assign(kLayers, layer);
  return f;
}

uint64_t base() {
  return footprint().working_bytes() + 2 * kGiB;
}

GpuTierOptions budget(const std::string& text) {
  GpuTierOptions t;
  t.budget_bytes = parse_byte_size(text, kAllExperts, "--gpu-budget");
  t.budget_flag = "--gpu-budget " + text;
  return t;
}

GpuTierOptions slots(int n) {
  GpuTierOptions t;
  t.slots_per_layer = n;
  t.budget_flag = "--gpu-slots-per-layer " + std::to_string(n);
  return t;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(GpuMemoryPlan, TheTierLayoutIsTheOneTheArenaAllocates) {
  GpuTierOptions options = budget("50%");
  options.layers = footprint().expert_layers;
  const GpuArenaPlan plan = plan_gpu_arena(options, kExperts, kTopK, kGpuTierMinWindowRows);
  EXPECT_EQ(plan.slot_sum, kSlotSum);
  EXPECT_EQ(plan.transient_slots, kExperts);
  EXPECT_EQ(plan.transient_bytes(), kTransient);
  EXPECT_EQ(plan.slots, 16);  // (48 MiB - 24 MiB) / 1.5 MiB
  EXPECT_EQ(plan.arena_bytes, 48 * kMiB);
  EXPECT_EQ(plan.layers[1].first_offset, 16 * kSlot);
  EXPECT_EQ(plan.layers[1].up_offset, size_t(128 << 10));
  EXPECT_EQ(plan.layers[1].down_offset, size_t(256 << 10));
  EXPECT_EQ(plan.transient_offset, 4 * 16 * kSlot);
  EXPECT_TRUE(uses_gpu_tier(options, kExperts));
  GpuTierOptions every = budget("100%");
  every.layers = options.layers;
  EXPECT_FALSE(uses_gpu_tier(every, kExperts));
  EXPECT_FALSE(uses_gpu_tier(slots(kExperts), kExperts));
  EXPECT_TRUE(uses_gpu_tier(slots(kExperts - 1), kExperts));
  EXPECT_FALSE(uses_gpu_tier(GpuTierOptions{}, kExperts));

  options.budget_bytes = 1 * kMiB;
  try {
    plan_gpu_arena(options, kExperts, kTopK, kGpuTierMinWindowRows);
    ADD_FAILURE() << "a 1 MiB budget was laid out";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "--gpu-budget 1.0 MiB is below the smallest GPU expert arena"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "64 transient slots for a 256-row window")) << e.what();
  }
}

TEST(GpuMemoryPlan, ABudgetThatFitsPasses) {
  const GpuFit fit = check_gpu_fit(kDevice, 3 * kGiB, footprint(), budget("50%"));
  EXPECT_TRUE(fit.fits) << fit.message;
  EXPECT_TRUE(fit.tiered);
  EXPECT_EQ(fit.arena_bytes, 48 * kMiB + kTierMaps);
  EXPECT_EQ(fit.working_bytes, 128 * kMiB + 30 * kMiB);
  EXPECT_EQ(fit.need_bytes, base() + 48 * kMiB + kTierMaps);
  EXPECT_TRUE(fit.message.empty());
  EXPECT_TRUE(fit.everything_fits);

  // Every expert, no budget: the all-resident arena.
  const GpuFit all = check_gpu_fit(kDevice, 3 * kGiB, footprint(), GpuTierOptions{});
  EXPECT_TRUE(all.fits);
  EXPECT_FALSE(all.tiered);
  EXPECT_EQ(all.arena_bytes, kAllExperts + kResidentMaps);

  // Exactly enough is enough.
  EXPECT_TRUE(check_gpu_fit(kDevice, fit.need_bytes, footprint(), budget("50%")).fits);
  EXPECT_FALSE(check_gpu_fit(kDevice, fit.need_bytes - 1, footprint(), budget("50%")).fits);
}

TEST(GpuMemoryPlan, ABudgetTooBigFailsWithTheNumbersAndTheLargestThatFits) {
  const uint64_t free_bytes = base() + 60 * kMiB;
  const GpuFit fit = check_gpu_fit(kDevice, free_bytes, footprint(), budget("90%"));
  ASSERT_FALSE(fit.fits);
  // 90 % = 86.4 MiB: 41 slots per layer + the transient slots = 85.5 MiB.
  EXPECT_EQ(fit.arena_bytes, 41 * kSlotSum + kTransient + kTierMaps);
  EXPECT_EQ(fit.largest_budget_bytes, 60 * kMiB - kTierMaps);
  EXPECT_EQ(fit.largest_slots, 23);  // (60 MiB - 2 KiB - 24 MiB) / 1.5 MiB
  const std::string& m = fit.message;
  EXPECT_TRUE(contains(m, "--gpu-budget 90% does not fit")) << m;
  EXPECT_TRUE(contains(m, kDevice)) << m;
  EXPECT_TRUE(contains(m, format_bytes(free_bytes) + " free")) << m;
  EXPECT_TRUE(contains(m, "the dense weights 2.00 GiB")) << m;
  const std::string arena = "routed-expert arena " + format_bytes(fit.arena_bytes);
  EXPECT_TRUE(contains(m, arena + " (41 slots per layer + 64 transient slots)")) << m;
  // A percent flag gets a percent answer (rounded down), and the bytes.
  EXPECT_TRUE(contains(m,
                       "The largest budget that fits: --gpu-budget 62.4% (or --gpu-budget 59M), "
                       "23 cache slots per layer."))
      << m;

  // What it suggests fits; one slot per layer more does not.
  EXPECT_TRUE(check_gpu_fit(kDevice, free_bytes, footprint(), budget("62.4%")).fits);
  EXPECT_TRUE(check_gpu_fit(kDevice, free_bytes, footprint(), budget("59M")).fits);
  GpuTierOptions more;
  more.budget_bytes = fit.largest_budget_bytes + kSlotSum;
  EXPECT_FALSE(check_gpu_fit(kDevice, free_bytes, footprint(), more).fits);

  // A byte budget gets a byte answer with its share; a budget set without a flag (a test's, a
  // bench's) is described by its bytes.
  GpuTierOptions bytes = budget("80M");
  const GpuFit by_bytes = check_gpu_fit(kDevice, free_bytes, footprint(), bytes);
  ASSERT_FALSE(by_bytes.fits);
  EXPECT_TRUE(contains(by_bytes.message, "--gpu-budget 80M does not fit")) << by_bytes.message;
  EXPECT_TRUE(
      contains(by_bytes.message, "--gpu-budget 59M (62.4% of the routed experts' 96.0 MiB)"))
      << by_bytes.message;
  bytes.budget_flag.clear();
  EXPECT_TRUE(contains(check_gpu_fit(kDevice, free_bytes, footprint(), bytes).message,
                       "a GPU expert budget of 80.0 MiB does not fit"));
}

TEST(GpuMemoryPlan, ASlotBudgetGetsASlotAnswer) {
  const GpuFit fit = check_gpu_fit(kDevice, base() + 60 * kMiB, footprint(), slots(40));
  ASSERT_FALSE(fit.fits);
  EXPECT_TRUE(contains(fit.message, "--gpu-slots-per-layer 40 does not fit")) << fit.message;
  EXPECT_TRUE(contains(
      fit.message, "The largest budget that fits: --gpu-slots-per-layer 23 (or --gpu-budget 59M)"))
      << fit.message;
  EXPECT_TRUE(check_gpu_fit(kDevice, base() + 60 * kMiB, footprint(), slots(23)).fits);
  EXPECT_FALSE(check_gpu_fit(kDevice, base() + 60 * kMiB, footprint(), slots(24)).fits);
}

TEST(GpuMemoryPlan, TheDensePartAloneTooBigFailsWhateverTheBudget) {
  for (const GpuTierOptions& tier : {GpuTierOptions{}, budget("10%"), slots(1)}) {
    const GpuFit fit = check_gpu_fit(kDevice, 1 * kGiB, footprint(), tier);
    ASSERT_FALSE(fit.fits);
    EXPECT_EQ(fit.largest_budget_bytes, 0u);
    EXPECT_TRUE(contains(fit.message, "1.00 GiB free")) << fit.message;
    EXPECT_TRUE(contains(fit.message, "the dense weights 2.00 GiB")) << fit.message;
    EXPECT_TRUE(contains(
        fit.message, "are " + format_bytes(base() - kGiB) + " more than is free: no --gpu-budget"))
        << fit.message;
    EXPECT_TRUE(contains(fit.message, "--backend cpu")) << fit.message;
  }
  const GpuFit none = check_gpu_fit(kDevice, 1 * kGiB, footprint(), GpuTierOptions{});
  EXPECT_TRUE(
      contains(none.message, "no --gpu-budget (every routed expert in GPU memory) does not fit"))
      << none.message;
}

TEST(GpuMemoryPlan, RoomForLessThanTheSmallestArenaFails) {
  const GpuFit fit = check_gpu_fit(kDevice, base() + 10 * kMiB, footprint(), budget("30%"));
  ASSERT_FALSE(fit.fits);
  EXPECT_EQ(fit.largest_budget_bytes, 0u);
  const std::string smallest = format_bytes(kSlotSum + kTransient + kTierMaps);
  EXPECT_TRUE(contains(fit.message, "Even the smallest arena (" + smallest +
                                        ": 1 slot per layer + 64 transient slots) does not fit in "
                                        "the 10.0 MiB left"))
      << fit.message;
}

TEST(GpuMemoryPlan, ABudgetBelowTheSmallestArenaFailsAtTheCheck) {
  try {
    check_gpu_fit(kDevice, 3 * kGiB, footprint(), budget("10%"));
    ADD_FAILURE() << "a budget below the smallest arena passed the check";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "is below the smallest GPU expert arena")) << e.what();
  }
}

TEST(GpuMemoryPlan, NoBudgetWithoutRoomForEveryExpertSuggestsOne) {
  const GpuFit fit = check_gpu_fit(kDevice, base() + 50 * kMiB, footprint(), GpuTierOptions{});
  ASSERT_FALSE(fit.fits);
  EXPECT_FALSE(fit.tiered);
  EXPECT_EQ(fit.arena_bytes, kAllExperts + kResidentMaps);
  EXPECT_TRUE(contains(fit.message, "a slot for each of the 64 experts of every MoE layer"))
      << fit.message;
  EXPECT_TRUE(contains(fit.message, "--gpu-budget 49M (52% of the routed experts' 96.0 MiB)"))
      << fit.message;
  EXPECT_TRUE(check_gpu_fit(kDevice, base() + 50 * kMiB, footprint(), budget("52%")).fits);
}

TEST(GpuMemoryPlan, ATierLargerThanEveryExpertIsToldToDropTheBudget) {
  // 63 slots per layer + 64 transient slots (118.5 MiB) hold more than every expert (96 MiB).
  const GpuFit fit = check_gpu_fit(kDevice, base() + 100 * kMiB, footprint(), slots(63));
  ASSERT_FALSE(fit.fits);
  EXPECT_TRUE(fit.everything_fits);
  EXPECT_TRUE(contains(fit.message, "Every routed expert fits in GPU memory")) << fit.message;
  EXPECT_TRUE(check_gpu_fit(kDevice, base() + 100 * kMiB, footprint(), GpuTierOptions{}).fits);
}

}  // namespace
}  // namespace strata::compute
