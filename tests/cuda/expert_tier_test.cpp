// The GPU expert tier (compute/cuda/expert_tier.h) on the H200 box: routed experts under a GPU
// budget, copied in per layer through the in-window handshake, give bitwise the logits of the
// all-resident CUDA backend — for every budget (1 slot per layer, 8, 25 %, 50 %, all), read-ahead
// on and off at each of them, eager and replayed windows, prefill chunks of several sizes,
// speculative verify windows of 2, 3 and 4 rows (drafts accepted whole or in part, the rest rolled
// back) and each host tier: the GGUF mapping (pinned, read by the load kernel), a RAM arena holding
// every expert (pinned), and a RAM arena of 2 slots per layer that streams from the file (pointers
// that die at the next call: copied one by one). Every cell runs twice: with waits that release
// themselves off and on (GpuTierOptions::self_release, the production default). A budget below one
// slot per layer plus the transient slots fails with the numbers. Each model: greedy decode of 24
// tokens after a 40-token prompt, compared logit for logit with memcmp. Waits that release
// themselves (every routed expert already resident on the device) are counted alike by the GPU and
// the host, happen when all but 2 experts per layer have slots, and change no bit. The policies on
// the GPU arena: the startup fill (a usage history's ranking, counted from GPU windows) and
// prompt-hot pins change residency, never the logits, and do what they are for (more hits; pinned
// slots held).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/backend_registry.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cuda/cuda_backend.h"
#include "compute/gpu_memory_plan.h"
#include "cuda_test_util.h"
#include "engine/session.h"
#include "experts/expert_store.h"
#include "experts/usage_history.h"
#include "model/model.h"
#include "synth/synth.h"
#include "synthetic_models.h"
#include "util/error.h"

namespace strata {
namespace {

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  compute::cuda::GpuTierInfo tier;
};

std::vector<int32_t> prompt_for(const HParams& hp, size_t n) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = int32_t((i * 7919 + 13) % uint64_t(hp.n_vocab));
  return ids;
}

// A 4-layer mid-qwen4exp written to the temp directory for one test and removed when the test
// ends, however it ends (an ASSERT returns early).
struct TempMidModel {
  std::string path;
  explicit TempMidModel(const std::string& name)
      : path(std::filesystem::temp_directory_path().string() + "/strata-tier-" + name + ".gguf") {
    test_support::write_mid_qwen4exp_4_layers(path);
  }
  TempMidModel(const TempMidModel&) = delete;
  TempMidModel& operator=(const TempMidModel&) = delete;
  ~TempMidModel() { std::filesystem::remove(path); }

  // The model loaded with the CUDA backend registered and a GPU tier over every expert layer of
  // `slots_per_layer` slots (0: the budget decides, set by the caller).
  std::unique_ptr<Model> load_tiered(int slots_per_layer) const {
    compute::cuda::register_cuda_backend();
    auto model = Model::load(path);
    compute::GpuTierOptions& tier = model->backend_shared().gpu_tier;
    tier.layers = model->expert_layouts();
    tier.slots_per_layer = slots_per_layer;
    return model;
  }
};

struct Setting {
  std::string name;
  uint64_t budget_share_permille = 0;  // of all expert bytes; 0 = by slots
  int slots = 0;                       // 0 with share 0: no tier (all resident)
  bool read_ahead = true;
  bool eager = false;
  int chunk = 16;
  int ram_slots = -1;  // -1: the GGUF mapping; 0: a RAM arena of every expert; > 0: that many slots
  // The production default is off; the invariance test runs each cell both ways.
  bool self_release = false;
  int slots_short = 0;  // > 0: n_expert - slots_short cache slots per layer (overrides the two above)
  // > 0: decode in speculative verify windows of this many rows (decode_in_verify_windows).
  int verify_rows = 0;
};

// Decodes in verify windows of `rows` rows, as speculative decoding does: the window is the last
// sampled token and rows - 1 drafts, the greedy tokens are read off its rows for as long as the
// drafts match, and the rest is rolled back (keep_rows). The drafts are `oracle`'s tokens (the
// reference's greedy ones), with the last draft of every other window spoiled, so windows are
// kept whole and in part. Appends the logits of every kept row (each predicts one greedy token)
// until `t` has n_tokens of them, as plain decode would.
void decode_in_verify_windows(Session& session, const std::vector<int32_t>& oracle, int rows,
                              int n_tokens, Trace& t) {
  const int64_t vocab = session.model().hparams().n_vocab;
  auto argmax = [](const float* row, int64_t n) {
    return int32_t(std::max_element(row, row + n) - row);
  };
  t.logits.assign(session.logits().begin(), session.logits().end());
  t.tokens.push_back(argmax(t.logits.data(), vocab));
  for (int round = 0; int(t.tokens.size()) < n_tokens; ++round) {
    const size_t at = t.tokens.size();  // the window's first token is tokens[at - 1]
    std::vector<int32_t> window = {t.tokens.back()};
    for (int j = 1; j < rows; ++j)
      window.push_back(at - 1 + size_t(j) < oracle.size() ? oracle[at - 1 + size_t(j)]
                                                          : int32_t(j));
    if (round % 2 == 1) window.back() = int32_t((window.back() + 1) % vocab);
    const std::vector<float> all = session.verify(window);
    int kept = 0;
    while (kept < rows && int(t.tokens.size()) < n_tokens) {
      const float* row = all.data() + size_t(kept) * size_t(vocab);
      t.logits.insert(t.logits.end(), row, row + vocab);
      t.tokens.push_back(argmax(row, vocab));
      ++kept;
      const bool next_draft_wrong = kept < rows && window[size_t(kept)] != t.tokens.back();
      if (next_draft_wrong) break;
    }
    session.keep_rows(kept);
  }
}

Trace run(const std::string& path, const Setting& s, int n_tokens = 24,
          const std::vector<int32_t>* oracle = nullptr) {
  compute::cuda::register_cuda_backend();
  auto model = Model::load(path);
  const HParams& hp = model->hparams();
  compute::GpuTierOptions& tier = model->backend_shared().gpu_tier;
  tier.read_ahead = s.read_ahead;
  tier.self_release = s.self_release;
  if (s.slots > 0 || s.budget_share_permille > 0 || s.slots_short > 0) {
    tier.layers = model->expert_layouts();
    tier.slots_per_layer = s.slots_short > 0 ? hp.n_expert - s.slots_short : s.slots;
    // A share of the experts' bytes as cache, plus room for the transient slots (at most one
    // layer's experts), which the budget also pays for.
    int moe_layers = 0;
    for (const auto& l : tier.layers) moe_layers += l.present;
    const uint64_t all = tier.all_expert_bytes(hp.n_expert);
    if (s.budget_share_permille > 0) tier.budget_bytes = all * s.budget_share_permille / 1000 + all / uint64_t(moe_layers);
  }
  std::unique_ptr<ExpertStore> store;
  if (s.ram_slots >= 0) {
    ExpertStoreOptions o;
    o.slots_per_layer = s.ram_slots == 0 ? hp.n_expert : s.ram_slots;
    o.io_threads = 2;
    store = std::make_unique<ExpertStore>(*model, o);
  }
  if (s.eager) setenv("STRATA_CUDA_GRAPH", "0", 1);
  compute::ThreadPool pool(2);
  Trace t;
  {
    Session session(*model, pool, store.get(), "cuda");
    if (s.eager) unsetenv("STRATA_CUDA_GRAPH");
    session.prefill(prompt_for(hp, 40), s.chunk);
    if (s.verify_rows > 0) {
      if (!oracle) throw Error("verify windows need the reference's tokens as drafts");
      decode_in_verify_windows(session, *oracle, s.verify_rows, n_tokens, t);
    } else {
      for (int i = 0; i < n_tokens; ++i) {
        const std::vector<float>& logits = session.logits();
        t.logits.insert(t.logits.end(), logits.begin(), logits.end());
        const int32_t next =
            int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        t.tokens.push_back(next);
        session.decode(next);
      }
      (void)session.logits();
    }
    t.tier = compute::cuda::gpu_tier_info(*session.state().backend);
  }
  return t;
}

void expect_bitwise(const Trace& a, const Trace& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  size_t first = a.logits.size();
  for (size_t i = 0; i < a.logits.size() && first == a.logits.size(); ++i)
    if (!test_support::same_bits(a.logits[i], b.logits[i])) first = i;
  EXPECT_EQ(first, a.logits.size()) << what << ": logits differ first at " << first;
}

struct TierModel {
  std::string name, path;
};

std::vector<TierModel> tier_models() {
  std::vector<TierModel> models;
  const std::string dir = std::filesystem::temp_directory_path().string();
  {
    TierModel m{"mid-qwen4exp-4L", dir + "/strata-tier-mid.gguf"};
    if (!std::filesystem::exists(m.path)) test_support::write_mid_qwen4exp_4_layers(m.path);
    models.push_back(m);
  }
  struct Synth {
    const char* shape;
    GgmlType dense, experts;
  };
  for (const Synth& s : {Synth{"tiny-qwen3next", GgmlType::Q4_K, GgmlType::Q4_K},
                         Synth{"tiny-qwen3moe", GgmlType::Q6_K, GgmlType::IQ4_XS}}) {
    TierModel m{s.shape, dir + "/strata-tier-" + s.shape + ".gguf"};
    if (!std::filesystem::exists(m.path)) {
      SynthOptions options;
      options.hparams = synth_shape(s.shape);
      options.dense_type = s.dense;
      options.expert_type = s.experts;
      options.seed = 11;
      write_synthetic_model(options, m.path);
    }
    models.push_back(m);
  }
  return models;
}

// Every cell of the invariance test, with waits that release themselves off or on (one test each,
// so that each has the label's time limit and can be run alone).
void expect_every_budget_bitwise(bool self_release) {
  unsetenv("STRATA_TIER_SELF_RELEASE");  // it would override the cells' setting (expert_tier.cpp)
  for (const TierModel& m : tier_models()) {
    const Trace reference = run(m.path, Setting{"all resident"});
    // name, budget share (permille), slots, read-ahead, eager, prefill chunk, RAM slots,
    // self-release (set below), slots short of all, verify rows.
    const std::vector<Setting> settings = {
        {"1 slot per layer", 0, 1},
        {"1 slot per layer, no read-ahead", 0, 1, false},
        {"8 slots per layer", 0, 8},
        {"8 slots per layer, no read-ahead", 0, 8, false},
        {"25% of the expert bytes", 250, 0},
        {"25% of the expert bytes, no read-ahead", 250, 0, false},
        {"50% of the expert bytes, eager", 500, 0, true, true},
        {"50% of the expert bytes", 500, 0},
        {"50% of the expert bytes, no read-ahead", 500, 0, false},
        {"2 slots, prefill in chunks of 1", 0, 2, true, false, 1},
        {"2 slots, prefill in chunks of 40", 0, 2, true, false, 40},
        {"2 slots, RAM arena of every expert", 0, 2, true, false, 16, 0},
        {"2 slots, RAM arena of 2 slots (streaming)", 0, 2, true, false, 16, 2},
        {"2 slots, RAM arena of 2 slots, eager, no read-ahead", 0, 2, false, true, 16, 2},
        // Speculative verify windows of 2, 3 and 4 rows, kept whole or in part.
        {"2 slots, verify windows of 2", 0, 2, true, false, 16, -1, false, 0, 2},
        {"8 slots, verify windows of 3", 0, 8, true, false, 16, -1, false, 0, 3},
        {"25%, verify windows of 4", 250, 0, true, false, 16, -1, false, 0, 4},
        {"2 slots, verify windows of 4, eager, no read-ahead", 0, 2, false, true, 16, -1, false, 0,
         4},
        // Most layers find all their experts resident: with self-release on, their waits release
        // themselves. (By slots: a share near 100 % plus the transient slots' room, a layer's
        // experts on these 4-layer models, buys every expert, and then there is no tier at all.)
        {"all experts but 2 per layer", 0, 0, true, false, 16, -1, false, 2},
        {"all but 2, no read-ahead", 0, 0, false, false, 16, -1, false, 2},
        {"all but 2, eager", 0, 0, true, true, 16, -1, false, 2},
        {"all but 2, RAM arena of 2 slots (streaming)", 0, 0, true, false, 16, 2, false, 2},
    };
    for (Setting s : settings) {
      s.self_release = self_release;
      s.name += self_release ? ", self-release on" : ", self-release off";
      const Trace t = run(m.path, s, 24, &reference.tokens);
      expect_bitwise(reference, t, m.name + ": " + s.name);
      if (!t.tier.tiered) {
        ADD_FAILURE() << m.name << ": " << s.name << " ran without a tier";
        continue;
      }
      std::printf(
          "[ tier ] %s, %s: %d slots per layer + %d transient (%.1f MiB); hit rate %.3f, %llu "
          "misses (%llu transient), read-ahead %llu issued / %llu used, %.1f MiB copied in\n",
          m.name.c_str(), s.name.c_str(), t.tier.slots_per_layer, t.tier.transient_slots,
          double(t.tier.arena_bytes) / (1 << 20), t.tier.stats.hit_rate(),
          (unsigned long long)t.tier.stats.misses, (unsigned long long)t.tier.stats.transient,
          (unsigned long long)t.tier.stats.read_ahead_issued,
          (unsigned long long)t.tier.stats.read_ahead_used,
          double(t.tier.stats.loaded_bytes) / (1 << 20));
      EXPECT_GT(t.tier.stats.misses, 0u) << s.name;  // the experts really moved
      // The GPU released exactly the handshakes the host's rule says it did (serve() also checks
      // each against the residency), and does so once most experts are resident.
      std::printf("[ tier ] %s, %s: %llu of %llu handshakes released by the GPU itself\n",
                  m.name.c_str(), s.name.c_str(), (unsigned long long)t.tier.stats.self_released,
                  (unsigned long long)t.tier.stats.handshakes);
      EXPECT_EQ(t.tier.stats.self_released, t.tier.stats.gpu_self_released) << s.name;
      if (!s.self_release) {
        EXPECT_EQ(t.tier.stats.self_released, 0u) << s.name;
      } else if (s.slots_short > 0) {
        EXPECT_GT(t.tier.stats.self_released, 0u) << s.name;
      }
      if (!s.read_ahead) {
        EXPECT_EQ(t.tier.stats.read_ahead_issued, 0u) << s.name;
        EXPECT_EQ(t.tier.stats.read_ahead_bytes, 0u) << s.name;
      } else {
        // The guesses were made and copied in beside the previous layer.
        EXPECT_GT(t.tier.stats.read_ahead_issued, 0u) << s.name;
        EXPECT_GT(t.tier.stats.read_ahead_bytes, 0u) << s.name;
        EXPECT_LE(t.tier.stats.read_ahead_used, t.tier.stats.read_ahead_issued) << s.name;
      }
    }
    std::filesystem::remove(m.path);
  }
}

// Self-release off (GpuTierOptions::self_release; on is the production default).
TEST(CudaExpertTier, EveryBudgetGivesTheAllResidentLogitsBitwise) {
  STRATA_REQUIRE_CUDA_DEVICE();
  expect_every_budget_bitwise(false);
}

TEST(CudaExpertTier, EveryBudgetWithSelfReleaseGivesTheAllResidentLogitsBitwise) {
  STRATA_REQUIRE_CUDA_DEVICE();
  expect_every_budget_bitwise(true);
}

// The publish in the wait's launch and the early launch of the experts after a wait that released
// itself (STRATA_TIER_FUSE_PUBLISH=1, STRATA_TIER_EARLY_LAUNCH=1: off by default until measured):
// the same bits, in cells that miss, hit and release themselves, with and without read-ahead,
// replayed and eager.
TEST(CudaExpertTier, FusedPublishAndEarlyLaunchGiveTheAllResidentLogitsBitwise) {
  STRATA_REQUIRE_CUDA_DEVICE();
  unsetenv("STRATA_TIER_SELF_RELEASE");
  const TempMidModel m("fused-publish");
  const Trace reference = run(m.path, Setting{"all resident"});
  setenv("STRATA_TIER_FUSE_PUBLISH", "1", 1);
  setenv("STRATA_TIER_EARLY_LAUNCH", "1", 1);
  std::vector<Setting> settings = {
      {"1 slot per layer", 0, 1},
      {"25% of the expert bytes, no read-ahead", 250, 0, false},
      {"50% of the expert bytes, eager", 500, 0, true, true},
      {"25%, verify windows of 4", 250, 0, true, false, 16, -1, false, 0, 4},
      {"all but 2, self-release", 0, 0, true, false, 16, -1, true, 2},
      {"all but 2, self-release, eager", 0, 0, true, true, 16, -1, true, 2},
  };
  for (const Setting& s : settings) {
    const Trace t = run(m.path, s, 24, &reference.tokens);
    expect_bitwise(reference, t, "mid-qwen4exp-4L, fused publish: " + s.name);
    EXPECT_TRUE(t.tier.tiered) << s.name;
    EXPECT_GT(t.tier.stats.misses, 0u) << s.name;
    EXPECT_EQ(t.tier.stats.self_released, t.tier.stats.gpu_self_released) << s.name;
    if (s.self_release) {
      EXPECT_GT(t.tier.stats.self_released, 0u) << s.name;
    }
  }
  unsetenv("STRATA_TIER_FUSE_PUBLISH");
  unsetenv("STRATA_TIER_EARLY_LAUNCH");
}

// Greedy decode with the policies: optional startup fill, optional prompt-hot pins after the
// prompt (GpuExpertTier::pin_prompt_hot through the backend), optional RAM arena with a usage
// history as host tier (its history then counts the GPU windows).
struct PolicyRun {
  int slots = 4;
  std::vector<std::vector<int32_t>> fill;
  int fill_pinned = 0;
  int pin_hot = 0;
  bool history = false;
  double moce_lambda = 0.0;
  int moce_max_rank = 0;
  bool eager = false;
};
struct PolicyTrace {
  Trace trace;
  int pin_changes = 0;
  uint64_t history_tokens = 0;
  std::vector<std::vector<int32_t>> ranking;  // from the history, when kept
};

PolicyTrace run_policies(const std::string& path, const PolicyRun& p) {
  compute::cuda::register_cuda_backend();
  auto model = Model::load(path);
  const HParams& hp = model->hparams();
  compute::GpuTierOptions& tier = model->backend_shared().gpu_tier;
  tier.layers = model->expert_layouts();
  tier.slots_per_layer = p.slots;
  tier.fill_ranking = p.fill;
  tier.fill_pinned = p.fill_pinned;
  tier.moce_lambda = p.moce_lambda;
  tier.moce_max_rank = p.moce_max_rank;
  std::unique_ptr<ExpertStore> store;
  if (p.history) {
    ExpertStoreOptions o;
    o.slots_per_layer = hp.n_expert;
    o.io_threads = 2;
    store = std::make_unique<ExpertStore>(*model, o);
    const auto& layout = store->layout();
    store->attach_history(
        std::make_unique<UsageHistory>(layout.gguf_identity, int(layout.n_block), int(layout.n_expert)),
        std::filesystem::temp_directory_path().string() + "/strata-tier-policy.usage");
  }
  compute::ThreadPool pool(2);
  PolicyTrace out;
  {
    if (p.eager) setenv("STRATA_CUDA_GRAPH", "0", 1);
    Session session(*model, pool, store.get(), "cuda");
    if (p.eager) unsetenv("STRATA_CUDA_GRAPH");
    compute::cuda::gpu_tier_reset_prompt_heat(*session.state().backend);
    session.prefill(prompt_for(hp, 40), 16);
    if (p.pin_hot > 0) {
      HotPinOptions pins;
      pins.n_hot = p.pin_hot;
      out.pin_changes = compute::cuda::gpu_tier_pin_prompt_hot(*session.state().backend, pins, nullptr);
    }
    for (int i = 0; i < 24; ++i) {
      const std::vector<float>& logits = session.logits();
      out.trace.logits.insert(out.trace.logits.end(), logits.begin(), logits.end());
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.trace.tokens.push_back(next);
      session.decode(next);
    }
    (void)session.logits();
    out.trace.tier = compute::cuda::gpu_tier_info(*session.state().backend);
  }
  if (store) {
    const UsageHistory& h = *store->history();
    out.history_tokens = h.tokens();
    out.ranking = rank_experts(&h, nullptr, 1.0, 0, h.n_block(), h.n_expert());
  }
  return out;
}

TEST(CudaExpertTier, UsageHistoryFillAndHotPinsKeepTheLogitsAndDoTheirJob) {
  STRATA_REQUIRE_CUDA_DEVICE();
  for (const TierModel& m : tier_models()) {
    const Trace reference = run(m.path, Setting{"all resident"});
    int moe_layers = 0;
    for (const auto& l : Model::load(m.path)->expert_layouts()) moe_layers += l.present;

    // The usage history of a RAM arena behind the GPU tier counts the GPU windows' routing: every
    // row of the first MoE layer once (40 prompt rows + 24 decode steps).
    const PolicyTrace counted = run_policies(m.path, PolicyRun{.slots = 4, .history = true});
    expect_bitwise(reference, counted.trace, m.name + ": usage history");
    EXPECT_EQ(counted.history_tokens, 64u) << m.name;
    ASSERT_FALSE(counted.ranking.empty()) << m.name;

    const PolicyTrace cold = run_policies(m.path, PolicyRun{.slots = 4});
    const PolicyTrace filled =
        run_policies(m.path, PolicyRun{.slots = 4, .fill = counted.ranking, .fill_pinned = 2});
    expect_bitwise(reference, filled.trace, m.name + ": startup fill");
    const compute::cuda::GpuTierStats& c = cold.trace.tier.stats;
    const compute::cuda::GpuTierStats& f = filled.trace.tier.stats;
    std::printf("[ tier ] %s, 4 slots: cold start %llu hits / %llu misses; filled from the history %llu hits / %llu "
                "misses (%llu experts filled, %.1f MiB)\n",
                m.name.c_str(), (unsigned long long)c.hits, (unsigned long long)c.misses, (unsigned long long)f.hits,
                (unsigned long long)f.misses, (unsigned long long)f.fill_loads, double(f.policy_bytes) / (1 << 20));
    EXPECT_EQ(f.fill_loads, uint64_t(4 * moe_layers)) << m.name;
    EXPECT_EQ(f.fill_pins, uint64_t(2 * moe_layers)) << m.name;  // pinned slots are never evicted
    EXPECT_GT(f.hits, c.hits) << m.name << ": a fill from the run's own usage must save misses";
    EXPECT_EQ(c.fill_loads, 0u);

    const PolicyTrace pinned = run_policies(m.path, PolicyRun{.slots = 4, .pin_hot = 2});
    expect_bitwise(reference, pinned.trace, m.name + ": prompt-hot pins");
    EXPECT_EQ(pinned.pin_changes, 2 * moe_layers) << m.name;
    EXPECT_EQ(pinned.trace.tier.stats.hot_pins, uint64_t(2 * moe_layers)) << m.name;
    std::filesystem::remove(m.path);
  }
}

// MoCE on the GPU path: it changes tokens by design, so its invariants are its own — the same
// tokens and logits bitwise run to run and eager as replayed (residency is a function of the
// tokens, never of timing), more hits than exact routing under the same budget, swaps counted.
TEST(CudaExpertTier, MoceIsDeterministicAndRaisesTheHitRate) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const TempMidModel file("moce");
  const std::string& path = file.path;
  const PolicyTrace exact = run_policies(path, PolicyRun{.slots = 8});
  const PolicyRun moce{.slots = 8, .moce_lambda = 2.0, .moce_max_rank = 16};
  const PolicyTrace a = run_policies(path, moce), b = run_policies(path, moce);
  PolicyRun moce_eager = moce;
  moce_eager.eager = true;
  const PolicyTrace c = run_policies(path, moce_eager);
  expect_bitwise(a.trace, b.trace, "moce, run to run");
  expect_bitwise(a.trace, c.trace, "moce, replayed vs eager");
  const compute::cuda::GpuTierStats& e = exact.trace.tier.stats;
  const compute::cuda::GpuTierStats& m = a.trace.tier.stats;
  std::printf("[ tier ] moce lambda 2, max rank 16, 8 slots: hit rate %.3f (exact routing %.3f); %.0f swaps over %.0f "
              "rows, agreement %.3f, KL %.4f\n",
              m.hit_rate(), e.hit_rate(), m.moce_swaps, m.moce_rows, m.moce_agreement_sum / std::max(1.0, m.moce_rows),
              m.moce_kl_sum / std::max(1.0, m.moce_rows));
  EXPECT_GT(m.moce_rows, 0.0);
  EXPECT_GT(m.moce_swaps, 0.0);
  EXPECT_GT(m.hit_rate(), e.hit_rate());
  EXPECT_EQ(e.moce_rows, 0.0);
}

TEST(CudaExpertTier, SpeculativeWindowsAndRollbackStayBitwise) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const TempMidModel file("spec");
  compute::cuda::register_cuda_backend();
  auto plain_model = Model::load(file.path);
  auto tier_model = file.load_tiered(2);
  compute::ThreadPool pool(2);
  Session plain(*plain_model, pool, nullptr, "cuda"), tiered(*tier_model, pool, nullptr, "cuda");
  const std::vector<int32_t> prompt = prompt_for(plain_model->hparams(), 20);
  plain.prefill(prompt, 8);
  tiered.prefill(prompt, 8);
  // Verify windows of 5 rows, keeping 2 of them, then plain decode: both sequences see the same
  // windows, so every logit must agree bitwise.
  for (int round = 0; round < 4; ++round) {
    std::vector<int32_t> draft(5);
    for (int i = 0; i < 5; ++i) draft[size_t(i)] = int32_t((round * 31 + i * 7 + 3) % plain_model->hparams().n_vocab);
    const std::vector<float>& a = plain.verify(draft);
    const std::vector<float> a_copy = a;
    const std::vector<float>& b = tiered.verify(draft);
    ASSERT_EQ(a_copy.size(), b.size());
    EXPECT_EQ(std::memcmp(a_copy.data(), b.data(), b.size() * 4), 0) << "round " << round;
    plain.keep_rows(2);
    tiered.keep_rows(2);
    const std::vector<float> pa = plain.logits();
    const std::vector<float>& pb = tiered.logits();
    EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pb.size() * 4), 0) << "round " << round << " after rollback";
  }
}

TEST(CudaExpertTier, ABudgetBelowTheSmallestArenaFailsWithTheNumbers) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const TempMidModel file("small");
  auto model = file.load_tiered(0);
  model->backend_shared().gpu_tier.budget_bytes = 1 << 20;
  compute::ThreadPool pool(2);
  try {
    Session session(*model, pool, nullptr, "cuda");
    session.prefill(prompt_for(model->hparams(), 4), 4);
    (void)session.logits();
    ADD_FAILURE() << "a 1 MiB budget ran";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--gpu-budget 1.0 MiB is below the smallest GPU expert arena"), std::string::npos) << what;
    EXPECT_NE(what.find("transient slots"), std::string::npos) << what;
  }
}

// The start check (compute/gpu_memory_plan.h check_gpu_fit, called by the CUDA backend's
// constructor for the model's first sequence): a model whose dense part cannot fit fails when the
// session is made, before anything is uploaded, with the device and the numbers; the budget below
// the smallest arena above fails there too. STRATA_CUDA_FIT_CHECK=0 skips the check (the same
// model then runs: its real dense part is small).
TEST(CudaExpertTier, ADensePartLargerThanTheDeviceFailsAtStartWithTheNumbers) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const TempMidModel file("fit");
  auto model = file.load_tiered(2);
  model->backend_shared().gpu_tier.budget_flag = "--gpu-slots-per-layer 2";
  ASSERT_TRUE(model->backend_shared().gpu_footprint.known());
  const uint64_t tebibyte = uint64_t(1) << 40;  // no device has it
  model->backend_shared().gpu_footprint.dense_weight_bytes = tebibyte;
  compute::ThreadPool pool(2);
  try {
    Session session(*model, pool, nullptr, "cuda");
    ADD_FAILURE() << "a 1 TiB dense part got a CUDA session";
  } catch (const Error& e) {
    const std::string what = e.what();
    std::printf("[ fit ] %s\n", what.c_str());
    EXPECT_NE(what.find("--gpu-slots-per-layer 2 does not fit on the GPU, " +
                        compute::cuda::describe_device()),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("the dense weights 1.00 TiB"), std::string::npos) << what;
    EXPECT_NE(what.find("no --gpu-budget makes room"), std::string::npos) << what;
  }
  setenv("STRATA_CUDA_FIT_CHECK", "0", 1);
  {
    Session session(*model, pool, nullptr, "cuda");
    unsetenv("STRATA_CUDA_FIT_CHECK");
    session.prefill(prompt_for(model->hparams(), 4), 4);
    EXPECT_EQ(session.logits().size(), size_t(model->hparams().n_vocab));
  }
  unsetenv("STRATA_CUDA_FIT_CHECK");
}

// What the start check counts, against what the first windows take from the device (the margin's
// terms are read off the code, so they are held to the device here): a session with a 2-slot tier,
// 40 prompt tokens in one window and 8 decode steps allocates at least the dense weights and the
// arena, and at most the check's total plus 256 MiB for what it leaves out (the kernels the driver
// loads on first launch, graph executables; the same headroom GpuExpertTier keeps).
TEST(CudaExpertTier, TheStartCheckBoundsWhatTheFirstWindowsAllocate) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const TempMidModel file("footprint");
  auto model = file.load_tiered(2);
  const compute::GpuTierOptions& tier = model->backend_shared().gpu_tier;
  const compute::GpuModelFootprint& footprint = model->backend_shared().gpu_footprint;
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the context exists before the first reading
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  const compute::GpuFit fit = compute::check_gpu_fit("", free_before, footprint, tier);
  ASSERT_TRUE(fit.fits) << fit.message;
  compute::ThreadPool pool(2);
  {
    Session session(*model, pool, nullptr, "cuda");
    session.prefill(prompt_for(model->hparams(), 40), 64);
    for (int i = 0; i < 8; ++i) {
      const std::vector<float>& logits = session.logits();
      session.decode(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    (void)session.logits();
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  }
  const uint64_t used = free_before - free_after;
  const uint64_t arena = fit.arena_bytes;
  std::printf(
      "[ fit ] the check counted %.1f MiB (dense %.1f, working %.1f, arena %.1f); the first "
      "windows took %.1f MiB\n",
      double(fit.need_bytes) / (1 << 20), double(fit.dense_bytes) / (1 << 20),
      double(fit.working_bytes) / (1 << 20), double(arena) / (1 << 20), double(used) / (1 << 20));
  EXPECT_GE(used, fit.dense_bytes + arena);
  EXPECT_LE(used, fit.need_bytes + (uint64_t(256) << 20));
}

}  // namespace
}  // namespace strata
