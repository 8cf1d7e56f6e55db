// The chunked Gated DeltaNet form of prefill windows on the CPU: one V head alone, and the V
// heads of a layer handed out over a pool as the layer does (layers/gated_deltanet.cpp
// deltanet_core). On the 16-core Xeon the prompt's "gdn delta rule+norm" part read 551 ms per
// 512-row window at 16 threads (docs/bench-cpu-scaling.md, session 47), about what its 12 heads
// would take one after another, while on the 2-vCPU EPYC VM one head takes ~0.9 ms and two
// threads run the 12 heads 2.2x faster than one: this bench says, on any machine, how long one
// head takes and how the heads scale with threads.
//
//   BM_DeltaRuleHead/decay:D         one head, 512 rows (dk = dv = 128, the mid and flagship
//                                    shapes), per-token log-decay g in -D/10 x [0.5, 1.5]
//                                    (D = 20: g around -2, the chunk's e^γ factors reach the
//                                    subnormal range ~44 rows apart)
//   BM_DeltaRuleHeads/threads:N/strong:S
//                                    12 heads of 512 rows (each its own inputs) over a pool of
//                                    N threads; S of them (every fourth: 0, 4, 8) with decay 20,
//                                    the others decay 5. A layer waits for its slowest head, so
//                                    strong:3 shows a straggler where strong:0 cannot.
// delta_rule_chunked_head flushes subnormals itself (compute/cpu/subnormals.h): before that,
// an Intel core took a microcode assist per subnormal operand or result, and a decay-20 head has
// millions of them. For the before/after, build this file against the older tree (it uses only
// delta_rule_chunked_head and ThreadPool) and compare decay:20 with decay:5 in each.
// Counters: heads/s (heads finished per second of wall time), GFLOP/s (~4.8 M multiply-adds per
// head and 64-row chunk, the products of delta_rule_chunked_head).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "compute/cpu/thread_pool.h"
#include "layers/gated_deltanet.h"

namespace strata {
namespace {

constexpr int kDk = 128, kDv = 128, kHeads = 12;
constexpr int64_t kRows = 512;
constexpr double kMacsPerHeadChunk = 4.8e6;

// One head's inputs: q̂, k̂ of unit norm (as the layer's l2-normalised rows), v, β in (0, 1),
// log-decay g ≈ −decay/10 per token.
struct HeadInputs {
  std::vector<float> q, k, v, beta, g;
  HeadInputs(double decay, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    auto unit_rows = [&](std::vector<float>& rows) {
      rows.resize(size_t(kRows) * kDk);
      for (int64_t t = 0; t < kRows; ++t) {
        float norm = 0.0f;
        for (int i = 0; i < kDk; ++i) norm += (rows[size_t(t * kDk + i)] = normal(rng)) * rows[size_t(t * kDk + i)];
        for (int i = 0; i < kDk; ++i) rows[size_t(t * kDk + i)] /= std::sqrt(norm);
      }
    };
    unit_rows(q);
    unit_rows(k);
    v.resize(size_t(kRows) * kDv);
    for (float& x : v) x = normal(rng);
    beta.resize(size_t(kRows));
    g.resize(size_t(kRows));
    for (int64_t t = 0; t < kRows; ++t) {
      beta[size_t(t)] = unit(rng);
      g[size_t(t)] = -float(decay / 10.0) * (0.5f + unit(rng));
    }
  }
  DeltaRuleHeadRows rows() const {
    return {q.data(), k.data(), kDk, v.data(), kDv, beta.data(), g.data(), 1, kRows, kDk, kDv};
  }
};

void report(benchmark::State& state, double heads_per_iteration) {
  const double macs = heads_per_iteration * (kRows / 64) * kMacsPerHeadChunk;
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * macs, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["heads/s"] =
      benchmark::Counter(heads_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DeltaRuleHead(benchmark::State& state) {
  const HeadInputs in(double(state.range(0)), 1);
  std::vector<float> head_state(size_t(kDk) * kDv), out(size_t(kRows) * kDv);
  for (auto _ : state) {
    std::fill(head_state.begin(), head_state.end(), 0.0f);
    delta_rule_chunked_head(in.rows(), head_state.data(), out.data(), kDv);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 1);
}

void BM_DeltaRuleHeads(benchmark::State& state) {
  const int strong = int(state.range(1));
  std::vector<HeadInputs> inputs;
  for (int h = 0; h < kHeads; ++h)
    inputs.emplace_back(h % 4 == 0 && h / 4 < strong ? 20 : 5, uint32_t(2 + h));
  compute::ThreadPool pool(int(state.range(0)));
  std::vector<std::vector<float>> states(kHeads, std::vector<float>(size_t(kDk) * kDv));
  std::vector<std::vector<float>> outs(kHeads, std::vector<float>(size_t(kRows) * kDv));
  const auto heads = [&](int64_t begin, int64_t end, int) {
    for (int64_t h = begin; h < end; ++h) {
      std::fill(states[size_t(h)].begin(), states[size_t(h)].end(), 0.0f);
      delta_rule_chunked_head(inputs[size_t(h)].rows(), states[size_t(h)].data(),
                              outs[size_t(h)].data(), kDv);
    }
  };
  for (auto _ : state) pool.parallel_for(kHeads, heads);
  report(state, kHeads);
}

BENCHMARK(BM_DeltaRuleHead)
    ->ArgName("decay")
    ->Arg(1)
    ->Arg(5)
    ->Arg(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_DeltaRuleHeads)
    ->ArgNames({"threads", "strong"})
    ->ArgsProduct({{1, 2, 4, 8, 16}, {0, 3}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
