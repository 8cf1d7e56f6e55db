// Cache policy beyond plain LRU: the usage history file (counts, atomic writes that survive
// kill -9, refusing a foreign file, ignoring a damaged one), prompt-hot pins with bounded churn,
// and MoCE cache-aware routing (off = the exact model; all resident = exact; on = measured swaps,
// still a function of the tokens only).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <tuple>

#include "../common/fixture_models.h"
#include "../common/temp_dir.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "experts/expert_store.h"
#include "experts/profile.h"
#include "experts/sidecar.h"
#include "experts/usage_history.h"
#include "model/model.h"
#include "route/moce.h"
#include "util/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class TempDir : public test_support::ScratchDir {
 public:
  TempDir() : ScratchDir("cache-policy") {}
};

std::string fixture_gguf(const std::string& arch) {
  return test_support::fixture_model_gguf(arch);
}

Routing routing_of(int k, std::vector<int32_t> experts) {
  Routing r;
  r.k = k;
  r.weights.assign(experts.size(), 1.0f / float(k));
  r.experts = std::move(experts);
  return r;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// ---- usage history ----------------------------------------------------------------------------

TEST(UsageHistory, CountsDecayByHalfLifePerRow) {
  UsageHistory h(0x1234, 2, 4, /*half_life_tokens=*/2);
  h.record(0, routing_of(2, {0, 1, 0, 2}));  // 2 rows: decay 2^-1 first (of nothing), then +1 each
  h.record(1, routing_of(2, {3, 3}));        // 1 row of layer 1 (not the token-counting block)
  EXPECT_EQ(h.tokens(), 2u);
  EXPECT_FLOAT_EQ(h.heat(0)[0], 2.0f);
  EXPECT_FLOAT_EQ(h.heat(0)[1], 1.0f);
  EXPECT_FLOAT_EQ(h.heat(0)[2], 1.0f);
  EXPECT_FLOAT_EQ(h.heat(1)[3], 2.0f);
  h.record(0, routing_of(2, {3, 1}));  // 1 row: everything × 2^-0.5, then +1
  const float d = float(std::exp2(-0.5));
  EXPECT_FLOAT_EQ(h.heat(0)[0], 2.0f * d);
  EXPECT_FLOAT_EQ(h.heat(0)[1], 1.0f * d + 1.0f);
  EXPECT_FLOAT_EQ(h.heat(0)[3], 1.0f);
  EXPECT_EQ(h.tokens(), 3u);
}

TEST(UsageHistory, SaveLoadRoundTripsEverything) {
  TempDir dir;
  UsageHistory h(0xabcdef, 3, 5, 100);
  h.record(0, routing_of(2, {4, 1, 2, 1}));
  h.record(2, routing_of(2, {0, 3}));
  h.set_lru(0, {1, 4, 2});
  h.set_lru(2, {3});
  const std::string path = dir.file("m.usage");
  h.save(path);
  const UsageHistory::LoadResult r = UsageHistory::load(path, 0xabcdef, 3, 5);
  ASSERT_TRUE(r.history) << r.problem;
  EXPECT_EQ(r.problem, "");
  EXPECT_EQ(r.history->tokens(), 2u);
  EXPECT_EQ(r.history->half_life_tokens(), 100.0);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(std::vector<float>(r.history->heat(b).begin(), r.history->heat(b).end()),
              std::vector<float>(h.heat(b).begin(), h.heat(b).end()));
    EXPECT_EQ(r.history->lru(b), h.lru(b));
  }
}

TEST(UsageHistory, RefusesAFileMadeForAnotherModel) {
  TempDir dir;
  const std::string path = dir.file("m.usage");
  UsageHistory(0x1111, 2, 8).save(path);
  for (auto [identity, blocks, experts] : {std::tuple{0x2222ull, 2, 8}, {0x1111ull, 3, 8}, {0x1111ull, 2, 16}}) {
    try {
      UsageHistory::load(path, identity, blocks, experts);
      ADD_FAILURE() << "no error for identity " << identity << " shape " << blocks << "x" << experts;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find("another model"), std::string::npos) << what;
      EXPECT_NE(what.find("0000000000001111"), std::string::npos) << what;
    }
  }
}

TEST(UsageHistory, DamagedFilesAreIgnoredWithAReason) {
  TempDir dir;
  const std::string path = dir.file("m.usage");
  UsageHistory h(0x77, 2, 8);
  h.record(0, routing_of(1, {3, 5}));
  h.set_lru(1, {2, 7});
  h.save(path);
  const std::vector<char> good = read_bytes(path);

  EXPECT_FALSE(UsageHistory::load(dir.file("missing.usage"), 0x77, 2, 8).history);
  EXPECT_EQ(UsageHistory::load(dir.file("missing.usage"), 0x77, 2, 8).problem, "");

  struct Damage {
    const char* what;
    std::vector<char> bytes;
  };
  std::vector<Damage> damages;
  damages.push_back({"empty", {}});
  damages.push_back({"truncated header", std::vector<char>(good.begin(), good.begin() + 20)});
  damages.push_back({"truncated body", std::vector<char>(good.begin(), good.end() - 13)});
  std::vector<char> magic = good;
  magic[0] = 'X';
  damages.push_back({"bad magic", magic});
  for (size_t at : {size_t(8), size_t(30), size_t(60), good.size() / 2, good.size() - 9}) {
    std::vector<char> flipped = good;
    flipped[at] = char(flipped[at] ^ 0x20);
    damages.push_back({"flipped byte", flipped});
  }
  std::vector<char> longer = good;
  longer.push_back(0);
  damages.push_back({"trailing byte", longer});
  for (const Damage& d : damages) {
    write_bytes(path, d.bytes);
    const UsageHistory::LoadResult r = UsageHistory::load(path, 0x77, 2, 8);
    EXPECT_FALSE(r.history) << d.what;
    EXPECT_NE(r.problem.find(path), std::string::npos) << d.what << ": " << r.problem;
    EXPECT_NE(r.problem.find("ignored"), std::string::npos) << d.what << ": " << r.problem;
  }
}

// A writer killed with SIGKILL at random points of a save leaves the old or the new file, never a
// torn one (AtomicFile: temp file, fsync, rename).
TEST(UsageHistory, KillNineDuringSaveLeavesAValidFile) {
  TempDir dir;
  const std::string path = dir.file("m.usage");
  constexpr int kBlocks = 48, kExperts = 4096;  // ~0.8 MB per save: a kill lands mid-write often
  UsageHistory(0x99, kBlocks, kExperts).save(path);
  for (int round = 0; round < 6; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      UsageHistory h(0x99, kBlocks, kExperts);
      for (int i = 0;; ++i) {
        h.record(0, routing_of(1, {int32_t(i % kExperts)}));  // tokens() = i + 1: the version
        h.save(path);
      }
    }
    usleep(useconds_t(20000 + round * 37000));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status));
    const UsageHistory::LoadResult r = UsageHistory::load(path, 0x99, kBlocks, kExperts);
    ASSERT_TRUE(r.history) << "round " << round << ": " << r.problem;
    EXPECT_EQ(r.problem, "");
    // Whole-file consistency: the version's own count is in it.
    if (r.history->tokens() > 0) {
      const int32_t last = int32_t((r.history->tokens() - 1) % kExperts);
      EXPECT_GT(r.history->heat(0)[size_t(last)], 0.0f) << "round " << round;
    }
  }
  // Temp files of killed writers may stay behind (named *.tmp.*); the target is never one of them.
  EXPECT_TRUE(fs::is_regular_file(path));
}

TEST(UsageHistory, RankBlendsHistoryAndProfileByAlpha) {
  UsageHistory h(1, 1, 4);
  for (int i = 0; i < 10; ++i) h.record(0, routing_of(1, {3}));  // history: all on expert 3
  ExpertProfile p;
  p.counts = {{0, 6, 4, 0}};  // profile: 1 then 2
  auto rank = [&](double alpha, uint64_t min_tokens) {
    return rank_experts(&h, &p, alpha, min_tokens, 1, 4)[0];
  };
  EXPECT_EQ(rank(1.0, 0), (std::vector<int32_t>{3}));
  EXPECT_EQ(rank(0.0, 0), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(rank(0.5, 0), (std::vector<int32_t>{3, 1, 2}));  // 0.5 vs 0.3 vs 0.2
  EXPECT_EQ(rank(0.5, 11), (std::vector<int32_t>{1, 2}));    // history too short: profile only
  EXPECT_EQ(rank_experts(&h, nullptr, 0.2, 0, 1, 4)[0], (std::vector<int32_t>{3}));
}

// prompt_hot_pins: the one rule both arenas pin by (the RAM arena here, the GPU arena in
// compute/cuda/expert_tier.h). Prompt counts alone below min_history_tokens, blended with the
// history's shares at alpha once it is trusted; experts the startup fill pinned are no candidates;
// the first call of a block takes n_hot, later ones swap at most max_swaps.
TEST(HotPins, PromptHotPinsBlendThePromptWithTheHistory) {
  UsageHistory h(0x42, 1, 6);
  Routing r{1, {5, 5, 5, 5, 4, 4}, std::vector<float>(6, 1.0f)};  // history: 5 hot, then 4
  h.record(0, r);
  const std::vector<uint64_t> prompt = {0, 6, 3, 0, 1, 0};  // this prompt: 1, then 2
  std::vector<double> score;
  const auto none_pinned = [](int32_t) { return false; };
  HotPinOptions o{.n_hot = 2, .max_swaps = 1, .hysteresis = 0.25, .alpha = 0.5, .min_history_tokens = 100};
  // The history (6 tokens) is below min_history_tokens: the prompt alone.
  EXPECT_EQ(prompt_hot_pins(prompt, &h, 0, o, 2, {}, none_pinned, score), (std::vector<int32_t>{1, 2}));
  // Trusted at alpha 0.5: 1 = 0.5·0.6 = 0.30, 5 = 0.5·4/6 = 0.33, 2 = 0.15, 4 = 0.5·0.1 + 0.5·2/6 = 0.22.
  o.min_history_tokens = 0;
  EXPECT_EQ(prompt_hot_pins(prompt, &h, 0, o, 2, {}, none_pinned, score), (std::vector<int32_t>{1, 5}));
  EXPECT_NEAR(score[5], 0.5 * 4.0 / 6.0, 1e-12);
  // 5 pinned by the startup fill: not a candidate.
  EXPECT_EQ(prompt_hot_pins(prompt, &h, 0, o, 2, {}, [](int32_t e) { return e == 5; }, score),
            (std::vector<int32_t>{1, 4}));
  // Held {2, 3}: one swap per call, the weakest (3, score 0) goes first.
  EXPECT_EQ(prompt_hot_pins(prompt, &h, 0, o, 2, std::vector<int32_t>{2, 3}, none_pinned, score),
            (std::vector<int32_t>{2, 5}));
}

TEST(HotPins, FillSwapBoundAndHysteresis) {
  const std::vector<double> score = {0.0, 0.30, 0.05, 0.20, 0.25, 0.10, 0.08, 0.02};
  // From nothing: the top 3.
  EXPECT_EQ(choose_hot_pins({}, score, 3, 0, 0.25), (std::vector<int32_t>{1, 3, 4}));
  // Current {2, 6, 7}: candidates 1, 4, 3 beat them; at most 2 swaps: 7 and 2 go.
  EXPECT_EQ(choose_hot_pins(std::vector<int32_t>{2, 6, 7}, score, 3, 2, 0.25), (std::vector<int32_t>{1, 4, 6}));
  // Hysteresis: 0.10 does not beat 0.08 × 1.5, so 5 never replaces 6; 0.13 does.
  EXPECT_EQ(choose_hot_pins(std::vector<int32_t>{6}, std::vector<double>{0, 0, 0, 0, 0, 0.10, 0.08}, 1, 5, 0.5),
            (std::vector<int32_t>{6}));
  EXPECT_EQ(choose_hot_pins(std::vector<int32_t>{6}, std::vector<double>{0, 0, 0, 0, 0, 0.13, 0.08}, 1, 5, 0.5),
            (std::vector<int32_t>{5}));
  // A pin the new scores do not use at all still waits for a swap (churn stays bounded).
  EXPECT_EQ(choose_hot_pins(std::vector<int32_t>{0, 1}, score, 2, 0, 0.25), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(choose_hot_pins(std::vector<int32_t>{0, 1}, score, 2, 1, 0.25), (std::vector<int32_t>{1, 4}));
  // Fewer pins wanted than held: the weakest go.
  EXPECT_EQ(choose_hot_pins(std::vector<int32_t>{1, 3, 4}, score, 1, 0, 0.25), (std::vector<int32_t>{1}));
}

// ---- MoCE selection -----------------------------------------------------------------------------

std::vector<float> softmax_of(std::vector<float> logits) {
  float m = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (float& v : logits) sum += (v = std::exp(v - m));
  for (float& v : logits) v /= sum;
  return logits;
}

TEST(Moce, SelectsWithinTheMaxRankWindowAndKeepsProtectedRanks) {
  // True order: 5, 2, 7, 0, 1, 3, 4, 6.
  const std::vector<float> p = softmax_of({1.0f, 0.8f, 2.0f, 0.5f, 0.2f, 3.0f, 0.1f, 1.5f});
  std::vector<int32_t> scratch, ids(3);
  std::vector<float> w(3);
  auto pick = [&](MoceOptions o, std::vector<int32_t> resident) {
    MoceStats stats;
    moce_select(p, 3, o, [&](int32_t e) { return std::find(resident.begin(), resident.end(), e) != resident.end(); },
                scratch, ids.data(), w.data(), &stats);
    return std::pair{ids, stats};
  };
  // Resident 0 (rank 3) and 4 (rank 6). lambda 1 doubles: p0·2 beats p7 (rank 2), p4·2 beats nothing.
  auto [a, sa] = pick({1.0, 1, 0, 0}, {0, 4});
  EXPECT_EQ(a, (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(sa.swaps, 1u);
  EXPECT_DOUBLE_EQ(sa.agreement(), 2.0 / 3.0);
  // Max rank 3: expert 0 (rank 3) is outside the window: exact routing.
  EXPECT_EQ(pick({1.0, 1, 3, 0}, {0, 4}).first, (std::vector<int32_t>{2, 5, 7}));
  // Protect 3 = k: nothing can move.
  EXPECT_EQ(pick({100.0, 3, 0, 0}, {0, 1, 3, 4, 6}).first, (std::vector<int32_t>{2, 5, 7}));
  // Huge lambda, protect 1: the two best residents of the window fill ranks 1 and 2.
  EXPECT_EQ(pick({1000.0, 1, 0, 0}, {3, 6, 1}).first, (std::vector<int32_t>{1, 3, 5}));
  // Weights: the chosen experts' true p renormalised.
  pick({1.0, 1, 0, 0}, {0, 4});
  const float sum = p[0] + p[2] + p[5];
  EXPECT_FLOAT_EQ(w[0], p[0] / sum);
  EXPECT_FLOAT_EQ(w[2], p[5] / sum);
}

TEST(Moce, AllOrNoneResidentIsBitwiseTheExactTopK) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(64);
    for (float& v : logits) v = normal(rng);
    const std::vector<float> p = softmax_of(logits);
    std::vector<int32_t> order(64);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    float sum = 0;
    for (int j = 0; j < 6; ++j) sum += p[size_t(order[size_t(j)])];
    std::vector<int32_t> expect(order.begin(), order.begin() + 6);
    std::sort(expect.begin(), expect.end());
    for (bool all : {true, false}) {
      std::vector<int32_t> scratch, ids(6);
      std::vector<float> w(6);
      moce_select(p, 6, {2.0, 1, 16, 0}, [&](int32_t) { return all; }, scratch, ids.data(), w.data(), nullptr);
      EXPECT_EQ(ids, expect);
      for (int j = 0; j < 6; ++j) EXPECT_EQ(w[size_t(j)], p[size_t(expect[size_t(j)])] / sum);
    }
  }
}

TEST(Moce, KlIsTheDivergenceFromTheBoostedDistribution) {
  const std::vector<float> p = softmax_of({0.3f, 1.2f, -0.4f, 0.9f, 0.0f, 0.5f});
  const MoceOptions o{1.5, 1, 5, 0};
  const std::vector<int32_t> resident = {0, 3, 4};
  MoceStats stats;
  std::vector<int32_t> scratch, ids(2);
  std::vector<float> w(2);
  moce_select(p, 2, o, [&](int32_t e) { return std::count(resident.begin(), resident.end(), e) > 0; }, scratch,
              ids.data(), w.data(), &stats);
  // Directly: ranks 1..4 of the true order (3, 5, 0, 4) are eligible; residents among them 3, 0, 4.
  std::vector<double> q(p.begin(), p.end());
  for (int e : {3, 0, 4}) q[size_t(e)] *= 2.5;
  const double z = std::accumulate(q.begin(), q.end(), 0.0);
  double kl = 0;
  for (size_t e = 0; e < p.size(); ++e) kl += double(p[e]) * std::log(double(p[e]) / (q[e] / z));
  EXPECT_NEAR(stats.kl(), kl, 1e-6);
}

// ---- with a model and a store ------------------------------------------------------------------

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

GreedyRun greedy(const Model& model, ExpertSource* source, const std::vector<int32_t>& prompt, int n,
           ExpertStore* pin_store = nullptr, int n_hot = 0) {
  compute::ThreadPool pool(2);
  Session session(model, pool, source);
  if (pin_store) pin_store->reset_prompt_heat();
  session.prefill(prompt, 4);
  if (pin_store && n_hot > 0) pin_store->pin_prompt_hot(HotPinOptions{.n_hot = n_hot});
  GreedyRun run;
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& logits = session.logits();
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.tokens.push_back(next);
    session.decode(next);
  }
  return run;
}

const std::vector<int32_t> kPrompt = {1, 17, 5, 42, 9, 3, 11, 23, 8, 8, 30, 2, 14};

std::unique_ptr<ExpertStore> open_store(const Model& model, const std::string& sidecar, int slots, int io = 2) {
  ExpertStoreOptions options;
  options.slots_per_layer = slots;
  options.io_threads = io;
  options.urgent_only_threads = io > 1 ? 1 : 0;
  return std::make_unique<ExpertStore>(model, Sidecar::open(sidecar, model.file()), options);
}

class CachePolicy : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = Model::load(fixture_gguf(GetParam()));
    sidecar_ = dir_.file("m.experts");
    pack_sidecar(model_->file(), sidecar_);
  }
  TempDir dir_;
  std::unique_ptr<Model> model_;
  std::string sidecar_;
};

TEST_P(CachePolicy, HotPinsAreThePromptsTopExpertsAndNeverChangeTokens) {
  const GreedyRun reference = greedy(*model_, nullptr, kPrompt, 10);
  auto store = open_store(*model_, sidecar_, 4);
  const GreedyRun run = greedy(*model_, store.get(), kPrompt, 10, store.get(), 2);
  EXPECT_EQ(run.tokens, reference.tokens);
  EXPECT_EQ(std::memcmp(run.logits.data(), reference.logits.data(), run.logits.size() * sizeof(float)), 0);

  // The pins are the prompt's two most routed experts per layer (counted by a profiling pass).
  ExpertProfile profile;
  ProfilingSource profiling(model_->mapped_experts(), profile, int(model_->layers().size()),
                            model_->hparams().n_expert);
  {
    compute::ThreadPool pool(2);
    Session session(*model_, pool, &profiling);
    session.prefill(kPrompt, 4);
  }
  const auto ranking = profile.ranking();
  int layers = 0;
  for (size_t b = 0; b < model_->layers().size(); ++b) {
    if (profile.counts.size() <= b || profile.counts[b].empty()) continue;
    std::vector<int32_t> top(ranking[b].begin(), ranking[b].begin() + 2);
    std::sort(top.begin(), top.end());
    EXPECT_EQ(store->hot_pins(int(b)), top) << "block " << b;
    for (int32_t e : top) EXPECT_TRUE(store->pinned(int(b), e));
    ++layers;
  }
  EXPECT_GT(layers, 0);
  EXPECT_GT(store->stats().pin_changes, 0u);

  // A second, different prompt: at most max_swaps (2) changes per layer, each a drop plus an add.
  const uint64_t before = store->stats().pin_changes;
  store->reset_prompt_heat();
  {
    compute::ThreadPool pool(2);
    Session session(*model_, pool, store.get());
    session.prefill(std::vector<int32_t>{40, 41, 2, 7, 7, 19, 33, 4}, 4);
  }
  HotPinOptions pins{.n_hot = 2, .max_swaps = 1, .hysteresis = 0.0};
  store->pin_prompt_hot(pins);
  EXPECT_LE(store->stats().pin_changes - before, uint64_t(2 * layers));
}

TEST_P(CachePolicy, MoceOffOrAllResidentIsTheExactModel) {
  const GreedyRun reference = greedy(*model_, nullptr, kPrompt, 10);
  const int n_expert = model_->hparams().n_expert;
  for (auto [lambda, slots] : {std::pair{0.0, 2}, std::pair{4.0, n_expert}}) {
    auto store = open_store(*model_, sidecar_, slots);
    auto policy = std::make_unique<MocePolicy>();
    policy->options.lambda = lambda;
    policy->options.max_rank = 0;
    policy->exact_source = &model_->mapped_experts();
    MocePolicy* moce = policy.get();
    store->set_moce(std::move(policy));
    if (slots == n_expert) {  // make everything resident first, so every expert gets the boost
      std::vector<std::vector<int32_t>> all(model_->layers().size());
      for (auto& ids : all)
        for (int e = 0; e < n_expert; ++e) ids.push_back(e);
      store->fill(all, 0);
    }
    const GreedyRun run = greedy(*model_, store.get(), kPrompt, 10);
    EXPECT_EQ(run.tokens, reference.tokens) << "lambda " << lambda;
    EXPECT_EQ(std::memcmp(run.logits.data(), reference.logits.data(), run.logits.size() * sizeof(float)), 0)
        << "lambda " << lambda;
    if (lambda > 0) {
      EXPECT_EQ(moce->stats.swaps, 0u);
      EXPECT_DOUBLE_EQ(moce->stats.agreement(), 1.0);
      EXPECT_GT(moce->stats.mse_samples, 0u);
      EXPECT_EQ(moce->stats.relmse(), 0.0);
    } else {
      EXPECT_EQ(moce->stats.rows, 0u);  // off: never consulted
    }
  }
}

TEST_P(CachePolicy, MoceSwapsUnderASmallBudgetAndStaysAFunctionOfTheTokens) {
  std::vector<int32_t> first_tokens;
  uint64_t first_misses = 0;
  for (int io : {1, 4}) {
    auto store = open_store(*model_, sidecar_, 2, io);
    auto policy = std::make_unique<MocePolicy>();
    policy->options = MoceOptions{8.0, 1, 0, 1};
    policy->exact_source = &model_->mapped_experts();
    MocePolicy* moce = policy.get();
    store->set_moce(std::move(policy));
    const GreedyRun run = greedy(*model_, store.get(), kPrompt, 12);
    EXPECT_GT(moce->stats.swaps, 0u) << "io " << io;
    EXPECT_LT(moce->stats.agreement(), 1.0);
    EXPECT_GT(moce->stats.kl(), 0.0);
    EXPECT_GT(moce->stats.relmse(), 0.0);
    EXPECT_LT(moce->stats.relmse(), 1.0);
    if (first_tokens.empty()) {
      first_tokens = run.tokens;
      first_misses = store->stats().misses;
    } else {
      EXPECT_EQ(run.tokens, first_tokens) << "MoCE tokens depend on I/O threads";
      EXPECT_EQ(store->stats().misses, first_misses);
    }
  }
  // And it pays: fewer misses than exact routing at the same budget.
  auto exact = open_store(*model_, sidecar_, 2);
  greedy(*model_, exact.get(), kPrompt, 12);
  EXPECT_LT(first_misses, exact->stats().misses);
}

TEST_P(CachePolicy, HistoryCountsWhatTheStoreRoutedAndSurvivesARestart) {
  const SidecarLayout layout = Sidecar::open(sidecar_, model_->file()).layout();
  const std::string usage = dir_.file("m.usage");
  {
    auto store = open_store(*model_, sidecar_, 3);
    store->attach_history(std::make_unique<UsageHistory>(layout.gguf_identity, int(layout.n_block),
                                                         int(layout.n_expert)),
                          usage);
    greedy(*model_, store.get(), kPrompt, 6);  // the prompt, then 6 decode steps
    EXPECT_EQ(store->history()->tokens(), kPrompt.size() + 6);
    EXPECT_EQ(store->history_tokens_since_save(), kPrompt.size() + 6);
    store->save_history();
    EXPECT_EQ(store->history_tokens_since_save(), 0u);
  }
  const UsageHistory::LoadResult r = UsageHistory::load(usage, layout.gguf_identity, int(layout.n_block),
                                                        int(layout.n_expert));
  ASSERT_TRUE(r.history) << r.problem;
  EXPECT_EQ(r.history->tokens(), kPrompt.size() + 6);
  for (uint32_t b = 0; b < uint32_t(model_->hparams().n_layer); ++b) {  // trunk blocks (no MTP run here)
    if (!layout.layers[b].present) continue;
    EXPECT_EQ(r.history->lru(int(b)).size(), 3u) << "block " << b;
    const auto heat = r.history->heat(int(b));
    EXPECT_GT(std::accumulate(heat.begin(), heat.end(), 0.0), 0.0) << "block " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CachePolicy, testing::Values("qwen3moe", "qwen3next", "qwen4exp"));

}  // namespace
}  // namespace strata
