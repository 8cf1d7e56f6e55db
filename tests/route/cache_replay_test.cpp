// Replay == live: a routing trace recorded once (through the GGUF mapping) and replayed by
// route/cache_replay must give exactly the counters a live ExpertStore reports after the same
// tokens with the same settings — slots 1, 2, 3, 8 and all, read-ahead on and off, a profile fill
// with and without pins. The two are independent implementations of one policy; agreement checks
// both. Also: a trace does not depend on where experts come from (store or mapping, any setting),
// and a TracingSource does not change the store it wraps.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "../common/fixture_models.h"
#include "../common/temp_dir.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "experts/expert_store.h"
#include "experts/profile.h"
#include "experts/sidecar.h"
#include "model/model.h"
#include "route/cache_replay.h"
#include "route/routing_trace.h"
#include "synth/synth.h"

namespace strata {
namespace {

std::string model_path(const test_support::ScratchDir& dir, const std::string& name) {
  if (name != "synth-q4k")
    return test_support::fixture_model_gguf(name);
  SynthOptions options;
  options.hparams = synth_shape("tiny-qwen4exp");
  options.dense_type = GgmlType::Q8_0;
  options.expert_type = GgmlType::Q4_K;
  options.seed = 11;
  const std::string path = dir.file("synth.gguf");
  write_synthetic_model(options, path);
  return path;
}

// Greedy: a 6-token prompt in windows of 3 rows, the MTP head's draft of the last prompt token
// (qwen4exp: a 1-row window of the MTP block alone), then `n` single-token steps; returns the
// generated tokens.
std::vector<int32_t> greedy(const Model& model, ExpertSource* source, int n) {
  compute::ThreadPool pool(2);
  Session session(model, pool, source);
  const std::vector<int32_t> prompt = {1, 17, 5, 42, 9, 3};
  session.prefill(prompt, 3);
  if (model.has_mtp()) {
    std::vector<float> draft;
    ModelState& state = session.state();
    model.mtp_forward(pool, state.mtp, state.residuals.data(),
                      std::span<const int32_t>(prompt).last(1), draft, nullptr, source);
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& logits = session.logits();
    tokens.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    session.decode(tokens.back());
  }
  return tokens;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// The live counter counts a read when it completes; read-ahead of the last window may still be in
// flight when the run ends. Reads are never dropped while the store lives, so wait for them.
ExpertStoreStats settled_stats(const ExpertStore& store, uint64_t expected_bytes_read) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (store.stats().bytes_read < expected_bytes_read &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return store.stats();
}

void expect_same_counters(const ExpertStoreStats& live, const ExpertStoreStats& replayed,
                          const std::string& label) {
  EXPECT_EQ(replayed.layer_visits, live.layer_visits) << label;
  EXPECT_EQ(replayed.needed, live.needed) << label;
  EXPECT_EQ(replayed.hits, live.hits) << label;
  EXPECT_EQ(replayed.misses, live.misses) << label;
  EXPECT_EQ(replayed.miss_bytes, live.miss_bytes) << label;
  EXPECT_EQ(replayed.read_ahead_issued, live.read_ahead_issued) << label;
  EXPECT_EQ(replayed.read_ahead_used, live.read_ahead_used) << label;
  EXPECT_EQ(replayed.bytes_read, live.bytes_read) << label;
}

struct Setting {
  int slots;  // 0: every expert
  bool read_ahead;
  bool fill = false;
  int pinned = 0;
};

class ReplayEqualsLive : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplayEqualsLive, CountersMatchAStoreWithTheSameSettings) {
  test_support::ScratchDir dir("replay");
  const auto model = Model::load(model_path(dir, GetParam()));
  const int n_expert = model->hparams().n_expert;
  const std::string sidecar = dir.file("m.experts");
  pack_sidecar(model->file(), sidecar);
  const RoutingTraceHeader header =
      RoutingTraceHeader::for_model(model->file(), model->hparams().n_expert_used);
  constexpr int kSteps = 16;

  // The reference trace, through the mapping; and a profile of the same routing for the fills.
  const std::string trace_path = dir.file("mapped.trace");
  ExpertProfile profile;
  std::vector<int32_t> reference_tokens;
  {
    ProfilingSource profiling(model->mapped_experts(), profile, int(model->layers().size()),
                              n_expert);
    TracingSource tracer(profiling, trace_path, header);
    reference_tokens = greedy(*model, &tracer, kSteps);
  }
  const RoutingTrace trace = RoutingTrace::load(trace_path);
  EXPECT_EQ(trace.tokens(), 6u + kSteps);
  EXPECT_EQ(trace.tokens(true), uint64_t(kSteps));
  const std::vector<uint8_t> reference_bytes = file_bytes(trace_path);
  const auto ranking = profile.ranking();

  const Setting settings[] = {
      {1, true},           {1, false},         {2, true},          {2, false},
      {3, true},           {3, false},         {8, true},          {8, false},
      {0, true},           {0, false},         {3, true, true, 0}, {3, true, true, 2},
      {8, false, true, 3}, {8, true, true, 8}, {0, true, true, 4},
  };
  for (const Setting& s : settings) {
    CacheReplaySettings replay;
    replay.slots_per_layer = s.slots > 0 ? s.slots : n_expert;
    replay.read_ahead = s.read_ahead;
    if (s.fill) replay.fill_ranking = ranking;
    replay.n_pinned = s.pinned;
    const CacheReplayResult replayed = replay_cache(trace, replay);
    const std::string label =
        fmt::format("{}: slots {} read-ahead {} fill {} pinned {}", GetParam(),
                    replay.slots_per_layer, s.read_ahead, s.fill, s.pinned);
    EXPECT_EQ(replayed.slots_per_layer, std::min(replay.slots_per_layer, n_expert)) << label;

    ExpertStoreOptions options;
    options.slots_per_layer = replay.slots_per_layer;
    options.read_ahead = s.read_ahead;
    options.io_threads = 3;
    options.split_bytes = 4096;  // several reads per record, completing in any order
    ExpertStore store(*model, Sidecar::open(sidecar, model->file()), options);
    if (s.fill) store.fill(ranking, s.pinned);
    const std::string live_trace = dir.file("live.trace");
    {
      TracingSource tracer(store, live_trace, header);
      EXPECT_EQ(greedy(*model, &tracer, kSteps), reference_tokens) << label;
    }
    EXPECT_EQ(file_bytes(live_trace), reference_bytes)
        << label << ": the trace depends on the expert source";
    const ExpertStoreStats live = settled_stats(store, replayed.stats.bytes_read);
    expect_same_counters(live, replayed.stats, label);
    EXPECT_GT(replayed.stats.needed, 0u);
    if (s.slots == 1) {
      EXPECT_GT(replayed.stats.misses, 0u) << label;
    }
    if (s.read_ahead && !s.fill && s.slots > 0) {
      EXPECT_GT(replayed.stats.read_ahead_issued, 0u) << label;
    }
    if (s.fill && (s.slots == 0 || s.pinned >= s.slots)) {
      // Every slot pinned (nothing to evict) or every expert resident (read-ahead stops).
      EXPECT_EQ(replayed.stats.read_ahead_issued, 0u) << label;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ReplayEqualsLive,
                         ::testing::Values("qwen4exp", "qwen3moe", "qwen3next", "synth-q4k"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The decode part of a replay is what a live store counts after the prefill: windows of one row
// (the MTP draft of the prompt's last token included, as it runs after the prefill).
TEST(CacheReplay, DecodeCountersAreTheLiveCountersAfterThePrefill) {
  test_support::ScratchDir dir("replay");
  const auto model = Model::load(model_path(dir, "qwen4exp"));
  const std::string sidecar = dir.file("m.experts");
  pack_sidecar(model->file(), sidecar);
  const std::string trace_path = dir.file("t.trace");
  ExpertStoreOptions options;
  options.slots_per_layer = 5;
  ExpertStore store(*model, Sidecar::open(sidecar, model->file()), options);
  ExpertStoreStats prefill;
  {
    TracingSource tracer(
        store, trace_path,
        RoutingTraceHeader::for_model(model->file(), model->hparams().n_expert_used));
    compute::ThreadPool pool(2);
    Session session(*model, pool, &tracer);
    session.prefill(std::vector<int32_t>{4, 8, 15, 16, 23, 42}, 3);
    prefill = store.stats();
    for (int32_t token : {7, 1, 30, 2, 9, 9, 12}) session.decode(token);
  }
  const RoutingTrace trace = RoutingTrace::load(trace_path);
  CacheReplaySettings replay;
  replay.slots_per_layer = 5;
  const CacheReplayResult r = replay_cache(trace, replay);
  EXPECT_EQ(trace.tokens(true), 7u);
  const ExpertStoreStats live = settled_stats(store, r.stats.bytes_read);
  expect_same_counters(live, r.stats, "all");
  ExpertStoreStats decode = live - prefill;
  // Read-ahead started in the prefill may land after it: bytes_read is compared over the whole run.
  decode.bytes_read = r.decode.bytes_read;
  expect_same_counters(decode, r.decode, "decode");
}

TEST(CacheReplay, BudgetBuysSlotsLikeTheStore) {
  RoutingTraceHeader h;
  h.n_block = 3;
  h.n_expert = 16;
  h.k = 2;
  h.record_bytes = {1000, 0, 3000};
  CacheReplaySettings s;
  s.budget_bytes = 4000 * 5 + 3999;
  EXPECT_EQ(replay_slots_per_layer(h, s), 5);
  s.budget_bytes = 10;
  EXPECT_EQ(replay_slots_per_layer(h, s), 1);
  s.budget_bytes = 4000 * 100;
  EXPECT_EQ(replay_slots_per_layer(h, s), 16);
  s.slots_per_layer = 40;
  EXPECT_EQ(replay_slots_per_layer(h, s), 16);
}

}  // namespace
}  // namespace strata
