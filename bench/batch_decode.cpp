// Batched decode steps (Session::decode_together, serve --parallel): one step of N sequences
// on the default model (or STRATA_BENCH_MODEL), N = 1, 2, 4, 8, 16, 32, against N separate
// decode calls. Counters: tok/s (N tokens per step), ms per step of each part of the layer and
// (DecodeTogether) hand-outs to the pool's workers per step.
//   ninja -C build bench_batch_decode && build/bench/bench_batch_decode
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "model/model.h"
#include "util/phase_timer.h"

namespace {

using namespace strata;

const Model& model() {
  static const std::unique_ptr<Model> m = [] {
    const char* path = std::getenv("STRATA_BENCH_MODEL");
    return Model::load(path ? path : STRATA_DEFAULT_MODEL);
  }();
  return *m;
}

// STRATA_BENCH_THREADS (default 2: the build box's cores) sets the pool's size.
compute::ThreadPool& pool() {
  static compute::ThreadPool p([] {
    const char* threads = std::getenv("STRATA_BENCH_THREADS");
    return threads ? std::max(1, std::atoi(threads)) : 2;
  }());
  return p;
}

struct Sequences {
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> pointers;
  std::vector<int32_t> tokens;
  explicit Sequences(int n) {
    for (int i = 0; i < n; ++i) {
      sessions.push_back(std::make_unique<Session>(model(), pool()));
      const std::vector<int32_t> prompt = {int32_t(1 + i), int32_t(7 + 3 * i), int32_t(11 + i)};
      sessions.back()->prefill(prompt);
      pointers.push_back(sessions.back().get());
      tokens.push_back(int32_t(20 + i));
    }
  }
};

void BM_DecodeTogether(benchmark::State& state) {
  Sequences seqs(int(state.range(0)));
  BatchWindow batch;
  PhaseTimes phases;
  active_phase_times() = &phases;
  const uint64_t jobs_before = pool().jobs_run();
  for (auto _ : state) Session::decode_together(seqs.pointers, seqs.tokens, batch);
  // Hand-outs to the pool's workers per step: the step's synchronisation points.
  state.counters["hand-outs"] =
      double(pool().jobs_run() - jobs_before) / double(state.iterations());
  active_phase_times() = nullptr;
  state.counters["tok/s"] =
      benchmark::Counter(double(state.iterations() * state.range(0)), benchmark::Counter::kIsRate);
  // ms per step of each part of the layer (util/phase_timer.h): which parts grow with the rows.
  for (size_t p = 0; p < size_t(Part::kCount); ++p)
    if (phases.part_ms[p] > 0)
      state.counters[std::string(part_name(Part(p)))] =
          phases.part_ms[p] / double(state.iterations());
}
BENCHMARK(BM_DecodeTogether)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->UseRealTime();

// The step cut into two groups of consecutive sequences run side by side (strata serve
// --batch-groups 2): each group on its own thread with a 1-thread pool, its own window buffers and
// its own view of the mapping's experts, the first group on the benchmark's thread.
void BM_DecodeInTwoGroups(benchmark::State& state) {
  Sequences seqs(int(state.range(0)));
  struct Group {
    compute::ThreadPool pool{1};
    std::unique_ptr<ExpertSource> experts = model().new_mapped_experts();
    BatchWindow batch;
    std::vector<Session*> sessions;
    std::vector<std::span<const int32_t>> rows;
  };
  Group groups[2];
  const size_t half = seqs.pointers.size() / 2;
  for (size_t i = 0; i < seqs.pointers.size(); ++i) {
    Group& g = groups[i < half ? 0 : 1];
    g.sessions.push_back(seqs.pointers[i]);
    g.rows.push_back(std::span<const int32_t>(&seqs.tokens[i], 1));
  }
  compute::ThreadPool runner(2);
  for (auto _ : state)
    runner.parallel_for_each_task(2, [&](int64_t begin, int64_t end, int) {
      for (int64_t g = begin; g < end; ++g)
        Session::feed_together(groups[g].sessions, groups[g].rows, groups[g].batch,
                               groups[g].experts.get(), &groups[g].pool);
    });
  state.counters["tok/s"] =
      benchmark::Counter(double(state.iterations() * state.range(0)), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeInTwoGroups)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->UseRealTime();

void BM_DecodeOneByOne(benchmark::State& state) {
  Sequences seqs(int(state.range(0)));
  for (auto _ : state)
    for (size_t i = 0; i < seqs.pointers.size(); ++i) seqs.pointers[i]->decode(seqs.tokens[i]);
  state.counters["tok/s"] =
      benchmark::Counter(double(state.iterations() * state.range(0)), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeOneByOne)->Arg(1)->Arg(16)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
