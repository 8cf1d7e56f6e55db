// Prompt-window matmul in cache: what the tile kernels (quant::dot_tile) cost per weight block and
// activation row, against the one-row kernel in the same run.
//
//   BM_ExpertWindow/<type>/rows:T   compute::matmul of T rows through one routed-expert projection
//                                   of mid-qwen4exp (1024 -> 512, cache-resident), 1 thread.
//                                   T = 1 is the decode path (one dot per weight row); T = 512
//                                   a whole prompt window (its activations no longer in L1).
//   BM_ExpertRowByRow/<type>/rows:T the same T rows as T separate one-row matmuls: the
//                                   matrix-vector way a window used to be computed.
// Counter ns/block/row: wall ns per (weight block × activation row); lower is better. The ratio of
// the two benchmarks at the same T is the gain of decoding a block once for several rows.
//
//   BM_PromptShape/<type>/<n_in>x<n_out>/rows:T/threads:N
//                                   compute::matmul of a prompt window over the matrix shapes
//                                   whose rate differs: mid-qwen4exp's hyper-connection down
//                                   (q4_K 4096 -> 128: few outputs, long rows) and up (q5_0
//                                   128 -> 4096: rows of four blocks), next to a DeltaNet-like
//                                   in-projection (q4_K 1024 -> 4096) with the same multiply-adds
//                                   per output row order of magnitude, a 2048-wide one
//                                   (rows of 8 Q4_K blocks: the longest the Q4_K tile stages) and
//                                   a routed expert's down projection (512 -> 1024: rows of two
//                                   Q4_K blocks, where a weight row's fixed costs weigh most).
//                                   Counter GMAC/s.
//
//   build/bench/bench_matmul_tile --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "quant/quant.h"

namespace strata::compute {
namespace {

constexpr int64_t kInputs = 1024;
constexpr int64_t kOutputs = 512;

struct Problem {
  std::vector<std::byte> weights;
  std::vector<float> x;
  std::vector<float> y;
  WeightMatrix matrix;
};

Problem make_problem(GgmlType type, int64_t n_rows, int64_t n_in = kInputs,
                     int64_t n_out = kOutputs) {
  Problem p;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.weights.resize(row_bytes(type, n_in) * size_t(n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    for (float& v : row) v = normal(rng);
    quant::quantize_row(type, row.data(), p.weights.data() + size_t(o) * row_bytes(type, n_in),
                        n_in);
  }
  p.x.resize(size_t(n_rows * n_in));
  for (float& v : p.x) v = normal(rng);
  p.y.resize(size_t(n_rows * n_out));
  p.matrix = WeightMatrix::dense(type, n_in, n_out, p.weights.data());
  return p;
}

void set_counters(benchmark::State& state, GgmlType type, int64_t n_rows) {
  const double blocks = double(kInputs / type_traits(type).block_elems) * double(kOutputs);
  state.counters["ns/block/row"] = benchmark::Counter(
      blocks * double(n_rows) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                          benchmark::Counter::kInvert);
  state.SetLabel(std::string(quant::kernel_level_name(quant::active_kernel_level())));
}

void BM_ExpertWindow(benchmark::State& state, GgmlType type) {
  const int64_t n_rows = state.range(0);
  Problem p = make_problem(type, n_rows);
  ThreadPool pool(1);
  for (auto _ : state) {
    matmul(pool, p.matrix, p.x.data(), n_rows, p.y.data());
    benchmark::DoNotOptimize(p.y.data());
  }
  set_counters(state, type, n_rows);
}

void BM_ExpertRowByRow(benchmark::State& state, GgmlType type) {
  const int64_t n_rows = state.range(0);
  Problem p = make_problem(type, n_rows);
  ThreadPool pool(1);
  for (auto _ : state) {
    for (int64_t t = 0; t < n_rows; ++t) {
      matmul(pool, p.matrix, p.x.data() + t * kInputs, 1, p.y.data() + t * kOutputs);
    }
    benchmark::DoNotOptimize(p.y.data());
  }
  set_counters(state, type, n_rows);
}

struct PromptShape {
  GgmlType type;
  int64_t n_in, n_out;
};

void BM_PromptShape(benchmark::State& state, PromptShape shape) {
  const int64_t n_rows = state.range(0);
  const int threads = int(state.range(1));
  Problem p = make_problem(shape.type, n_rows, shape.n_in, shape.n_out);
  ThreadPool pool(threads);
  for (auto _ : state) {
    matmul(pool, p.matrix, p.x.data(), n_rows, p.y.data());
    benchmark::DoNotOptimize(p.y.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(double(n_rows * shape.n_in * shape.n_out) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(quant::kernel_level_name(quant::active_kernel_level())));
}

int register_all() {
  const PromptShape prompt_shapes[] = {{GgmlType::Q4_K, 4096, 128},
                                       {GgmlType::Q5_0, 128, 4096},
                                       {GgmlType::Q8_0, 128, 4096},
                                       {GgmlType::Q4_K, 1024, 4096},
                                       {GgmlType::Q4_K, 2048, 2048},
                                       {GgmlType::Q4_K, 512, 1024}};
  for (const PromptShape& shape : prompt_shapes) {
    const std::string name = "BM_PromptShape/" + std::string(type_name(shape.type)) + "/" +
                             std::to_string(shape.n_in) + "x" + std::to_string(shape.n_out);
    benchmark::RegisterBenchmark(name.c_str(), BM_PromptShape, shape)
        ->ArgNames({"rows", "threads"})
        ->Args({512, 1})
        ->Args({512, 2})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::IQ2_XS, GgmlType::Q6_K,
                        GgmlType::Q5_0, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    const std::string name(type_name(type));
    using Bench = void (*)(benchmark::State&, GgmlType);
    const std::pair<std::string, Bench> benches[] = {{"BM_ExpertWindow/", BM_ExpertWindow},
                                                     {"BM_ExpertRowByRow/", BM_ExpertRowByRow}};
    for (const auto& [label, fn] : benches) {
      benchmark::RegisterBenchmark((label + name).c_str(), fn, type)
          ->ArgName("rows")
          ->Arg(1)
          ->Arg(4)
          ->Arg(8)
          ->Arg(32)
          ->Arg(512)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return 0;
}

[[maybe_unused]] const int kRegistered = register_all();

}  // namespace
}  // namespace strata::compute

BENCHMARK_MAIN();
