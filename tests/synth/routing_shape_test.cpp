// `strata synth` routing shapes, measured: synthesize tiny models with and without
// --routing-skew / --routing-correlation, run them over a fixed pseudo-random token sequence and
// record every token's routing. Skew must concentrate routing mass on the same few experts all
// along; correlation must make consecutive tokens share experts far above the random baseline
// k/n without favouring any expert for long; both must survive quantized weights. The numbers
// are printed (docs/synth.md quotes them; DISABLED_Table prints the full table).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "../common/temp_dir.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "experts/profile.h"
#include "model/model.h"
#include "synth/synth.h"
#include "util/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// A scratch directory per test (tests/common/temp_dir.h).
class TempDir : public test_support::ScratchDir {
 public:
  TempDir() : ScratchDir("synth") {}
};

// Keeps every token's expert ids per layer; forwards the rest to the file mapping.
class RoutingRecorder final : public ExpertSource {
 public:
  explicit RoutingRecorder(ExpertSource& inner) : inner_(inner) {}
  void observe_routing(int layer, const Routing& routing) override {
    if (layer >= int(rows_.size())) rows_.resize(size_t(layer + 1));
    k_ = routing.k;
    rows_[size_t(layer)].insert(rows_[size_t(layer)].end(), routing.experts.begin(),
                                routing.experts.end());
    inner_.observe_routing(layer, routing);
  }
  void publish(int layer, std::span<const int32_t> experts) override {
    inner_.publish(layer, experts);
  }
  std::span<const DeliveredExpert> wait() override { return inner_.wait(); }
  // [layer][token·k + j], ascending ids within a token.
  const std::vector<std::vector<int32_t>>& rows() const { return rows_; }
  int k() const { return k_; }

 private:
  ExpertSource& inner_;
  std::vector<std::vector<int32_t>> rows_;
  int k_ = 0;
};

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / double(v.size());
}

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double mx = mean(x), my = mean(y);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

std::string joined(const std::vector<double>& v) {
  std::string out;
  for (double x : v) out += fmt::format("{}{:.2f}", out.empty() ? "" : " ", x);
  return out;
}

// Per layer; the accessors average over layers.
struct RoutingStats {
  std::vector<double> top10_share;  // routing mass of the 10 % most used experts
  std::vector<double> zipf_slope;   // −slope of log(count) over log(rank), ranks with count > 0
  std::vector<double> overlap;      // |E(t) ∩ E(t+1)| / k, mean over tokens
  std::vector<double> persistence;  // correlation of expert counts, first half vs second half
  double baseline = 0;              // k / n_expert: the overlap of independent routing
  double top10() const { return mean(top10_share); }
  double slope() const { return mean(zipf_slope); }
  double neighbours() const { return mean(overlap); }
  double persistent() const { return mean(persistence); }
};

struct Config {
  std::string shape = "tiny-qwen4exp";
  int n_expert = 64;
  RoutingShape routing;
  int n_tokens = 512;
  GgmlType dense_type = GgmlType::F32, expert_type = GgmlType::F32;
  int64_t n_embd = 0, n_ff = 0;  // overrides, 0 = the shape's
  int d_state = 0;
  bool per_layer = false;
};

struct Measured {
  RoutingStats stats;
  std::vector<float> logits;
};

// Pseudo-random ids from a vocabulary much larger than the text, so repeated tokens (which route
// identically) barely correlate the two halves of the text.
constexpr int kVocab = 16384;

Measured measure(const Config& config) {
  TempDir dir;
  SynthOptions options;
  options.hparams = synth_shape(config.shape);
  options.hparams.n_expert = config.n_expert;
  options.hparams.n_vocab = kVocab;
  if (config.n_embd > 0) options.hparams.n_embd = config.n_embd;
  if (config.n_ff > 0) options.hparams.n_ff_exp = options.hparams.n_ff_shexp = config.n_ff;
  if (config.d_state > 0) options.hparams.ssm_d_state = config.d_state;
  options.dense_type = config.dense_type;
  options.expert_type = config.expert_type;
  options.seed = 3;
  options.routing = config.routing;
  const std::string path = dir.file("model.gguf");
  write_synthetic_model(options, path);

  const auto model = Model::load(path);
  const HParams& hp = model->hparams();
  RoutingRecorder recorder(model->mapped_experts());
  ExpertProfile profile;
  ProfilingSource profiling(recorder, profile, hp.n_layer, hp.n_expert);
  compute::ThreadPool pool(2);
  Session session(*model, pool, &profiling);
  const int T = config.n_tokens;
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  uint64_t state = 12345;
  for (int32_t& t : tokens) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = int32_t((state >> 33) % uint64_t(hp.n_vocab));
  }
  Measured out;
  out.logits = session.prefill(tokens, 64);

  RoutingStats& s = out.stats;
  const int k = recorder.k(), n = hp.n_expert, top = std::max(1, n / 10);
  s.baseline = double(k) / n;
  for (int l = 0; l < hp.n_layer; ++l) {
    std::vector<uint64_t> counts = profile.counts[size_t(l)];
    std::sort(counts.rbegin(), counts.rend());
    uint64_t total = 0, top_mass = 0;
    for (int i = 0; i < n; ++i) (i < top ? top_mass : total) += counts[size_t(i)];
    total += top_mass;
    s.top10_share.push_back(double(top_mass) / double(total));
    double sx = 0, sy = 0, sxx = 0, sxy = 0, m = 0;
    for (int i = 0; i < n && counts[size_t(i)] > 0; ++i) {
      const double x = std::log(i + 1.0), y = std::log(double(counts[size_t(i)]));
      sx += x, sy += y, sxx += x * x, sxy += x * y, m += 1;
    }
    s.zipf_slope.push_back(-(m * sxy - sx * sy) / (m * sxx - sx * sx));

    const std::vector<int32_t>& rows = recorder.rows()[size_t(l)];
    double shared = 0;
    for (int t = 0; t + 1 < T; ++t)
      for (int j = 0; j < k; ++j)
        shared += double(std::count(rows.begin() + (t + 1) * k, rows.begin() + (t + 2) * k,
                                    rows[size_t(t * k + j)]));
    s.overlap.push_back(shared / (double(T - 1) * k));

    std::vector<double> first(size_t(n), 0.0), second(size_t(n), 0.0);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j)
        (t < T / 2 ? first : second)[size_t(rows[size_t(t * k + j)])] += 1;
    s.persistence.push_back(pearson(first, second));
  }
  fmt::print(
      "{:<14} H={:<4} n={:<3} T={:<4} skew {:<5g} correlation {:<4g}: top-10% share {:.3f} "
      "(uniform {:.3f}), "
      "Zipf slope {:.2f}, overlap {:.3f} (random {:.3f}), persistence {:.2f}\n",
      config.shape, hp.n_embd, n, T, config.routing.skew, config.routing.correlation, s.top10(),
      double(top) / n, s.slope(), s.neighbours(), s.baseline, s.persistent());
  if (config.per_layer)
    fmt::print("    per layer: top-10% [{}]  overlap [{}]  persistence [{}]\n",
               joined(s.top10_share), joined(s.overlap), joined(s.persistence));
  return out;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

TEST(RoutingShape, SkewConcentratesRoutingMass) {
  for (const char* shape : {"tiny-qwen4exp", "tiny-qwen3moe"}) {
    SCOPED_TRACE(shape);
    const Measured plain = measure({.shape = shape});
    const Measured skewed = measure({.shape = shape, .routing = {.skew = 1.0}});
    const RoutingStats &p = plain.stats, &s = skewed.stats;
    EXPECT_GT(s.top10(), 0.45);  // uniform: 6/64 = 0.094
    EXPECT_GT(s.top10(), p.top10() + 0.05);
    EXPECT_GT(s.slope(), 1.0);
    EXPECT_GT(s.persistent(), 0.9);  // the same experts are popular all along
    EXPECT_TRUE(all_finite(skewed.logits));
  }
  // The subspace alone (skew ~0) routes evenly and independently: what skew adds is the bias.
  const RoutingStats even = measure({.routing = {.skew = 1e-9}}).stats;
  EXPECT_LT(even.top10(), 0.15);
  EXPECT_LT(even.neighbours(), 1.3 * even.baseline);
  EXPECT_LT(even.persistent(), 0.4);
}

TEST(RoutingShape, CorrelationMakesNeighboursShareExperts) {
  for (const char* shape : {"tiny-qwen4exp", "tiny-qwen3next"}) {
    SCOPED_TRACE(shape);
    const Measured plain = measure({.shape = shape});
    const Measured correlated = measure({.shape = shape, .routing = {.correlation = 0.9}});
    const RoutingStats &p = plain.stats, &c = correlated.stats;
    EXPECT_LT(p.neighbours(), 1.6 * p.baseline);
    EXPECT_GT(c.neighbours(), 0.5);  // random: k/n = 0.0625
    // Correlation alone favours no expert for long: the popular ones change over the text.
    EXPECT_LT(std::abs(c.persistent()), 0.3);
    EXPECT_TRUE(all_finite(correlated.logits));
  }
  // Monotone in R.
  const RoutingStats weak = measure({.routing = {.correlation = 0.5}}).stats;
  const RoutingStats strong = measure({.routing = {.correlation = 0.95}}).stats;
  EXPECT_GT(weak.neighbours(), 2.5 * weak.baseline);
  EXPECT_LT(weak.neighbours(), 0.4);
  EXPECT_GT(strong.neighbours(), 0.6);
}

// Both at once, with the weight types of a real run: Q8_0 dense, Q4_K or IQ2_XS experts (IQ2_XS
// carries the zeroed subspace rows as zero blocks; the wider model gives it 256-wide rows).
TEST(RoutingShape, SurvivesQuantizedWeights) {
  const RoutingShape both{.skew = 1.0, .correlation = 0.9};
  const RoutingStats exact = measure({.routing = both}).stats;
  const RoutingStats q4k =
      measure({.routing = both, .dense_type = GgmlType::Q8_0, .expert_type = GgmlType::Q4_K}).stats;
  const RoutingStats iq2 = measure({.shape = "tiny-qwen3next",
                                    .routing = both,
                                    .dense_type = GgmlType::Q8_0,
                                    .expert_type = GgmlType::IQ2_XS,
                                    .n_embd = 256,
                                    .n_ff = 256})
                               .stats;
  for (const RoutingStats* s : {&exact, &q4k, &iq2}) {
    EXPECT_GT(s->top10(), 0.45);
    EXPECT_GT(s->persistent(), 0.7);
    EXPECT_GT(s->neighbours(), 0.6);
  }
  EXPECT_NEAR(q4k.top10(), exact.top10(), 0.05);
  EXPECT_NEAR(q4k.neighbours(), exact.neighbours(), 0.05);
}

TEST(RoutingShape, RefusesWhatItCannotBuild) {
  TempDir dir;
  SynthOptions options;
  options.hparams = synth_shape("tiny-qwen3moe");
  options.routing.correlation = 0.5;
  try {
    write_synthetic_model(options, dir.file("model.gguf"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--routing-correlation needs a Gated DeltaNet layer 0"),
              std::string::npos)
        << e.what();
  }
  options.hparams = synth_shape("tiny-qwen4exp");
  options.routing.correlation = 1.0;
  EXPECT_THROW(write_synthetic_model(options, dir.file("model.gguf")), Error);
  options.routing = {.skew = -1.0};
  EXPECT_THROW(write_synthetic_model(options, dir.file("model.gguf")), Error);
}

// The table in docs/synth.md:
//   build-synth/tests/synth/routing_shape_test --gtest_also_run_disabled_tests
//   --gtest_filter='*Table*'
TEST(RoutingShape, DISABLED_Table) {
  for (const char* shape : {"tiny-qwen4exp", "tiny-qwen3next", "tiny-qwen3moe"})
    measure({.shape = shape, .n_tokens = 4096, .per_layer = true});
  measure({.routing = {.skew = 1e-9}, .n_tokens = 4096});
  for (double skew : {0.5, 1.0, 1.5, 2.0}) measure({.routing = {.skew = skew}, .n_tokens = 4096});
  for (double correlation : {0.25, 0.5, 0.8, 0.9, 0.95, 0.99})
    measure({.routing = {.correlation = correlation}, .n_tokens = 4096});
  measure({.routing = {.skew = 1.0, .correlation = 0.9}, .n_tokens = 4096});
  // Wide enough for full-rank token and context parts (n_embd 640, d_state 64, 128 experts).
  for (RoutingShape routing :
       {RoutingShape{}, RoutingShape{.skew = 1e-9}, RoutingShape{.skew = 1.0},
        RoutingShape{.correlation = 0.9}, RoutingShape{.skew = 1.0, .correlation = 0.9}})
    measure({.shape = "tiny-qwen3next",
             .n_expert = 128,
             .routing = routing,
             .n_tokens = 4096,
             .dense_type = GgmlType::Q8_0,
             .expert_type = GgmlType::Q8_0,
             .n_embd = 640,
             .d_state = 64});
}

// The mid shape (n_embd 1024, 128 experts, top-8, d_state 128) as `strata synth` writes it for
// cache experiments: Q8_0 dense, IQ2_XS experts, 0.9 GB per file; a few minutes on 2 cores.
TEST(RoutingShape, DISABLED_TableMid) {
  for (RoutingShape routing :
       {RoutingShape{}, RoutingShape{.skew = 1e-9}, RoutingShape{.skew = 1.0},
        RoutingShape{.correlation = 0.9}, RoutingShape{.skew = 1.0, .correlation = 0.9}})
    measure({.shape = "mid-qwen4exp",
             .n_expert = 128,
             .routing = routing,
             .n_tokens = 1024,
             .dense_type = GgmlType::Q8_0,
             .expert_type = GgmlType::IQ2_XS,
             .per_layer = true});
}

}  // namespace
}  // namespace strata
