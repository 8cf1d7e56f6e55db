// How fast `strata synth` makes rows of each type, per thread, in bytes of output per second:
// what bounds a synthetic file's writing on a machine whose disk is faster than that times its
// cores. Two ways of making a row (synth/synth.h SynthCodes):
//   Quantize/<type>  draw 2560 floats as synth does (Irwin–Hall normals) and quantize_row them
//   Pool/<type>      assemble the row from a BlockPool of 2^14 quantized blocks (memcpy per block)
//   GridCodes/iq2_xs IQ2_XS random grid codes (what synth writes for IQ2_XS by default)
//   Floats/f32       the float draw alone Single-threaded: synth's row blocks are independent,
// so a file is made at about threads × this rate until the writer thread or the disk binds.
//
//   build/bench/bench_synth_rows --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include "quant/quant.h"
#include "synth/block_pool.h"
#include "synth/synth_random.h"

namespace {

using strata::GgmlType;
using strata::synth_detail::BlockPool;
using strata::synth_detail::Random;
namespace quant = strata::quant;

constexpr int64_t kRowElems = 2560;  // the flagship's hidden size
constexpr int64_t kRowsPerIteration = 16;

const float kScale = 1.0f / std::sqrt(float(kRowElems));

void draw_floats(Random& rng, std::vector<float>& values) {
  for (float& v : values) v = kScale * rng.normal();
}

void BM_Floats(benchmark::State& state) {
  Random rng(1);
  std::vector<float> values(static_cast<size_t>(kRowElems));
  for (auto _ : state) {
    for (int64_t r = 0; r < kRowsPerIteration; ++r) draw_floats(rng, values);
    benchmark::DoNotOptimize(values.data());
  }
  state.SetBytesProcessed(state.iterations() * kRowsPerIteration * kRowElems * 4);
}
BENCHMARK(BM_Floats)->Name("Floats/f32");

void BM_Quantize(benchmark::State& state, GgmlType type) {
  Random rng(1);
  std::vector<float> values(static_cast<size_t>(kRowElems));
  const size_t row_bytes = strata::row_bytes(type, kRowElems);
  std::vector<uint8_t> out(row_bytes);
  for (auto _ : state) {
    for (int64_t r = 0; r < kRowsPerIteration; ++r) {
      draw_floats(rng, values);
      quant::quantize_row(type, values.data(), out.data(), kRowElems);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * kRowsPerIteration * int64_t(row_bytes));
}

void BM_Pool(benchmark::State& state, GgmlType type) {
  const BlockPool pool(type, kScale, 1, BlockPool::kMaxBlocks, 1);
  Random rng(1);
  const size_t row_bytes = strata::row_bytes(type, kRowElems);
  std::vector<uint8_t> out(size_t(kRowsPerIteration) * row_bytes);
  for (auto _ : state) {
    for (int64_t r = 0; r < kRowsPerIteration; ++r)
      pool.fill_row(rng, out.data() + size_t(r) * row_bytes, kRowElems);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * kRowsPerIteration * int64_t(row_bytes));
}

// IQ2_XS random grid codes as synth writes them.
void BM_GridCodes(benchmark::State& state) {
  Random rng(1);
  const size_t row_bytes = strata::row_bytes(GgmlType::IQ2_XS, kRowElems);
  std::vector<uint8_t> out(size_t(kRowsPerIteration) * row_bytes);
  for (auto _ : state) {
    for (size_t b = 0; b < out.size(); b += 74)
      strata::synth_detail::random_iq2xs_block(rng, &out[b]);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * int64_t(out.size()));
}
BENCHMARK(BM_GridCodes)->Name("GridCodes/iq2_xs");

const GgmlType kTypes[] = {GgmlType::F16,  GgmlType::BF16,  GgmlType::Q8_0, GgmlType::Q4_0,
                           GgmlType::Q4_1, GgmlType::Q5_0,  GgmlType::Q5_1, GgmlType::IQ4_NL,
                           GgmlType::Q2_K, GgmlType::Q3_K,  GgmlType::Q4_K, GgmlType::Q5_K,
                           GgmlType::Q6_K, GgmlType::IQ4_XS};

const bool kRegistered = [] {
  for (GgmlType type : kTypes) {
    const std::string name(strata::type_traits(type).name);
    benchmark::RegisterBenchmark(("Quantize/" + name).c_str(), BM_Quantize, type);
    if (strata::type_traits(type).block_elems > 1)
      benchmark::RegisterBenchmark(("Pool/" + name).c_str(), BM_Pool, type);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
