// Micro-benchmarks of the quant kernels: dot-product throughput in GB/s of weight bytes, for
// weights streamed from DRAM (a 1 GiB matrix, larger than this box's reported L3) and for
// weights resident in L2 (256 KiB), with 1 and 2 threads; plus a plain streaming-read baseline
// over the same buffer, and quantizer speeds.
//
//   build-quant/bench/bench_quant_dot --benchmark_filter='Dram' --benchmark_min_time=1
//
// Rows are 2560 weights (the qwen4exp hidden size); the activation row is quantized once.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "quant/quant.h"

namespace {

using strata::GgmlType;
namespace quant = strata::quant;

constexpr int64_t kRowElems = 2560;
constexpr size_t kDramBytes = size_t(1) << 30;
constexpr size_t kCacheBytes = size_t(256) << 10;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

// The weight matrix of the benchmark now running; rebuilt when the type or size changes so at
// most one large buffer is alive. Both threads of a 2-thread run ask for the same one.
struct Matrix {
  GgmlType type = GgmlType::F32;
  size_t total_bytes = 0;
  size_t row_bytes = 0;
  size_t rows = 0;
  std::unique_ptr<uint8_t, FreeDeleter> bytes;
  std::vector<uint8_t> activation;
};

std::mutex g_matrix_mutex;
Matrix g_matrix;

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

const Matrix& matrix_for(GgmlType type, size_t total_bytes) {
  std::lock_guard<std::mutex> lock(g_matrix_mutex);
  if (g_matrix.bytes && g_matrix.type == type && g_matrix.total_bytes == total_bytes) return g_matrix;
  g_matrix = Matrix{};
  g_matrix.type = type;
  g_matrix.total_bytes = total_bytes;
  g_matrix.row_bytes = strata::row_bytes(type, kRowElems);
  g_matrix.rows = total_bytes / g_matrix.row_bytes;
  const size_t size = (g_matrix.rows * g_matrix.row_bytes + 4095) / 4096 * 4096;
  g_matrix.bytes.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, size)));
  // Quantize 64 distinct rows of Gaussian weights and tile them over the matrix.
  constexpr size_t kDistinctRows = 64;
  const std::vector<float> weights = gaussian(kRowElems * kDistinctRows, 1);
  std::vector<uint8_t> tile(g_matrix.row_bytes * kDistinctRows);
  for (size_t r = 0; r < kDistinctRows; ++r) {
    quant::quantize_row(type, weights.data() + r * kRowElems, tile.data() + r * g_matrix.row_bytes,
                        kRowElems);
  }
  for (size_t r = 0; r < g_matrix.rows; ++r) {
    std::memcpy(g_matrix.bytes.get() + r * g_matrix.row_bytes,
                tile.data() + (r % kDistinctRows) * g_matrix.row_bytes, g_matrix.row_bytes);
  }
  const std::vector<float> x = gaussian(kRowElems, 2);
  g_matrix.activation.resize(quant::activation_row_bytes(type, kRowElems));
  quant::quantize_activation(type, x.data(), g_matrix.activation.data(), kRowElems);
  return g_matrix;
}

void dot_rows(benchmark::State& state, GgmlType type, size_t total_bytes) {
  const Matrix& m = matrix_for(type, total_bytes);
  const size_t begin = m.rows * size_t(state.thread_index()) / size_t(state.threads());
  const size_t end = m.rows * size_t(state.thread_index() + 1) / size_t(state.threads());
  const quant::DotKernel kernel = quant::dot_kernel(type);
  float sink = 0.0f;
  for (auto _ : state) {
    for (size_t r = begin; r < end; ++r) {
      sink += kernel(m.bytes.get() + r * m.row_bytes, m.activation.data(), kRowElems);
    }
    benchmark::DoNotOptimize(sink);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t((end - begin) * m.row_bytes));
}

__attribute__((target("avx2"))) uint64_t sum_bytes(const uint8_t* p, size_t n) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  for (size_t i = 0; i + 64 <= n; i += 64) {
    acc0 = _mm256_add_epi64(acc0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    acc1 = _mm256_add_epi64(acc1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(acc0, acc1));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// Streaming-read baseline: what DRAM gives a plain AVX2 read loop over the same buffer.
void BM_DramRead(benchmark::State& state) {
  const Matrix& m = matrix_for(GgmlType::Q8_0, kDramBytes);
  const size_t total = m.rows * m.row_bytes / 4096 * 4096;
  const size_t begin = total * size_t(state.thread_index()) / size_t(state.threads()) / 64 * 64;
  const size_t end = total * size_t(state.thread_index() + 1) / size_t(state.threads()) / 64 * 64;
  for (auto _ : state) benchmark::DoNotOptimize(sum_bytes(m.bytes.get() + begin, end - begin));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(end - begin));
}
BENCHMARK(BM_DramRead)->Threads(1)->Threads(2)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_DotDram(benchmark::State& state, GgmlType type) { dot_rows(state, type, kDramBytes); }
void BM_DotL2(benchmark::State& state, GgmlType type) { dot_rows(state, type, kCacheBytes); }

void BM_Quantize(benchmark::State& state, GgmlType type) {
  const int64_t n = 256 * 64;
  const std::vector<float> x = gaussian(n, 3);
  std::vector<uint8_t> out(strata::row_bytes(type, n));
  for (auto _ : state) {
    quant::quantize_row(type, x.data(), out.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * n);
}

void BM_QuantizeActivation(benchmark::State& state, GgmlType weight_type) {
  const std::vector<float> x = gaussian(kRowElems, 4);
  std::vector<uint8_t> out(quant::activation_row_bytes(weight_type, kRowElems));
  for (auto _ : state) {
    quant::quantize_activation(weight_type, x.data(), out.data(), kRowElems);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * kRowElems);
}

#define STRATA_QUANT_BENCH(TYPE)                                                          \
  BENCHMARK_CAPTURE(BM_DotDram, TYPE, GgmlType::TYPE)                                     \
      ->Threads(1)->Threads(2)->UseRealTime()->Unit(benchmark::kMillisecond);             \
  BENCHMARK_CAPTURE(BM_DotL2, TYPE, GgmlType::TYPE)->Unit(benchmark::kMicrosecond);

STRATA_QUANT_BENCH(F32)
STRATA_QUANT_BENCH(F16)
STRATA_QUANT_BENCH(BF16)
STRATA_QUANT_BENCH(Q8_0)
STRATA_QUANT_BENCH(Q4_0)
STRATA_QUANT_BENCH(Q2_K)
STRATA_QUANT_BENCH(Q4_K)
STRATA_QUANT_BENCH(Q6_K)
STRATA_QUANT_BENCH(IQ2_XS)

BENCHMARK_CAPTURE(BM_Quantize, Q8_0, GgmlType::Q8_0);
BENCHMARK_CAPTURE(BM_Quantize, Q4_0, GgmlType::Q4_0);
BENCHMARK_CAPTURE(BM_Quantize, Q2_K, GgmlType::Q2_K);
BENCHMARK_CAPTURE(BM_Quantize, Q4_K, GgmlType::Q4_K);
BENCHMARK_CAPTURE(BM_Quantize, Q6_K, GgmlType::Q6_K);
BENCHMARK_CAPTURE(BM_Quantize, IQ2_XS, GgmlType::IQ2_XS);
BENCHMARK_CAPTURE(BM_QuantizeActivation, Q8_0, GgmlType::Q8_0);
BENCHMARK_CAPTURE(BM_QuantizeActivation, Q8_K, GgmlType::Q4_K);

}  // namespace

BENCHMARK_MAIN();
