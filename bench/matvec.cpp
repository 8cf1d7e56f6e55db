// Matrix × vector throughput against the machine's DRAM read bandwidth.
//
//   BM_DramRead/threads:N       streaming 64-bit integer sum over a 1 GiB buffer (N threads, each a
//                               contiguous share): the bandwidth a matvec can hope for.
//   BM_Matvec/<type>/threads:N  compute::matvec over ~384 MiB of weights (n_in = 4096, n_out chosen
//                               per type), far larger than every cache: weight bytes streamed per
//                               s.
//   BM_MatvecPrefetch/<type>/threads:N/bytes:B  BM_Matvec with the decode row's software prefetch
//                               B bytes ahead (compute/cpu/matmul.h; 0 = off).
//   BM_MatvecInCache/<type>     the same kernel on a 512 KiB matrix that stays in L2, one thread:
//                               the dot kernel's compute ceiling. If it is below BM_DramRead, the
//                               type is compute-bound and no memory trick helps. GB/s_cpu (1-thread
//                               runs) divides by the thread's CPU time instead of wall time.
//   BM_MatmulWindow/<type>/rows:T  matmul of T rows on the streamed matrix, 2 threads (GB/s counts
//                               the weight bytes once per call).
//   BM_MatvecExpert/<type>/threads:N/spin_us:S  a 2560 -> 640 expert projection (cache-resident):
//                               the share of a small call that goes to waking the workers, with
//                               the workers' poll-before-sleep off (0) and at the default.
//   BM_ParallelForEmpty/threads:N  cost of one parallel_for with no work.
//   BM_ParallelForWake/threads:N/spin_us:S  8 tasks of 5 µs: the wake-up cost a short job pays.
// Counters: GB/s (1e9 bytes per second of wall time) and frac_dram (GB/s over the best of three
// 1 GiB streaming passes with the same thread count, taken at the start of the same run; for
// BM_DramRead itself that is mean over best). The context line quant_kernels names the dot kernels'
// level (STRATA_QUANT_MAX=avx2 or scalar reruns the bench on the slower paths). See
// docs/bench-matvec.md for the command.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "quant/quant.h"
#include "util/fp16.h"

namespace strata::compute {
namespace {

constexpr size_t kDramBufferBytes = size_t(1) << 30;
constexpr size_t kStreamedWeightBytes = size_t(384) << 20;
constexpr size_t kInCacheWeightBytes = size_t(512) << 10;
constexpr int64_t kInputs = 4096;

// Anonymous mapping with transparent huge pages requested (the host arena will be one big
// anonymous mapping too); every page is written before use.
struct Mapping {
  explicit Mapping(size_t bytes) : size(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);
    data = static_cast<std::byte*>(p);
  }
  ~Mapping() { munmap(data, size); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::byte* data = nullptr;
  size_t size = 0;
};

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + double(now.tv_nsec) * 1e-9;
}

ThreadPool& pool_with(int n_threads, int worker_spin_us = ThreadPool::kDefaultWorkerSpinMicros) {
  static std::map<std::pair<int, int>, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[{n_threads, worker_spin_us}];
  if (!pool) pool = std::make_unique<ThreadPool>(n_threads, worker_spin_us);
  return *pool;
}

// One pass: every thread sums its contiguous share of the buffer as 64-bit integers (integer adds
// vectorise without reassociation concerns, so the loop is never the bottleneck).
uint64_t stream_sum(ThreadPool& pool, const Mapping& buffer) {
  const size_t n_words = buffer.size / sizeof(uint64_t);
  const auto* words = reinterpret_cast<const uint64_t*>(buffer.data);
  const int n_threads = pool.size();
  std::vector<uint64_t> partial(size_t(n_threads) * 8, 0);
  pool.parallel_for(n_threads * 64, [&](int64_t begin, int64_t end, int thread_index) {
    const size_t first = n_words * size_t(begin) / size_t(n_threads * 64);
    const size_t last = n_words * size_t(end) / size_t(n_threads * 64);
    uint64_t sums[4] = {0, 0, 0, 0};
    for (size_t i = first; i + 4 <= last; i += 4) {
      for (int lane = 0; lane < 4; ++lane) sums[lane] += words[i + size_t(lane)];
    }
    partial[size_t(thread_index) * 8] += sums[0] + sums[1] + sums[2] + sums[3];
  });
  uint64_t total = 0;
  for (uint64_t value : partial) total += value;
  return total;
}

Mapping& dram_buffer() {
  static const std::unique_ptr<Mapping> buffer = [] {
    auto mapping = std::make_unique<Mapping>(kDramBufferBytes);
    std::memset(mapping->data, 1, mapping->size);
    return mapping;
  }();
  return *buffer;
}

// Best-of-3 streaming bandwidth (GB/s) with n threads. Measured afresh at the start of every
// benchmark run (not once per process): the build machine is shared, so the ratio is only
// meaningful against a bandwidth taken under the same background load.
double measure_dram_gbps(int n_threads) {
  ThreadPool& pool = pool_with(n_threads);
  Mapping& buffer = dram_buffer();
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(stream_sum(pool, buffer));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, double(buffer.size) / seconds / 1e9);
  }
  return best;
}

void set_rate_counters(benchmark::State& state, double bytes_per_iteration, double seconds,
                       double dram_gbps) {
  const double gbps = bytes_per_iteration * double(state.iterations()) / seconds / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["frac_dram"] = gbps / dram_gbps;
}

void BM_DramRead(benchmark::State& state) {
  const int n_threads = int(state.range(0));
  ThreadPool& pool = pool_with(n_threads);
  Mapping& buffer = dram_buffer();
  const double dram_gbps = measure_dram_gbps(n_threads);
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(stream_sum(pool, buffer));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  set_rate_counters(state, double(buffer.size), seconds, dram_gbps);
}

// Weights for `type` filling about `bytes`: 64 distinct random rows repeated (values do not change
// the kernels' speed; repeating them keeps set-up to a fraction of a second).
struct BenchMatrix {
  std::unique_ptr<Mapping> storage;
  WeightMatrix view;
};

BenchMatrix make_matrix(GgmlType type, int64_t n_in, int64_t n_out) {
  const size_t row_size = row_bytes(type, n_in);
  constexpr int64_t kDistinctRows = 64;
  std::vector<std::byte> rows(row_size * kDistinctRows);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<float> values(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < kDistinctRows; ++r) {
    std::byte* dst = rows.data() + size_t(r) * row_size;
    if (type == GgmlType::IQ2_XS) {  // no quantizer without an imatrix: random valid blocks
      for (size_t i = 0; i < row_size; ++i) dst[i] = std::byte(byte(rng));
      for (size_t block = 0; block < row_size; block += type_traits(type).block_bytes) {
        const uint16_t d = f32_to_f16(0.01f);
        std::memcpy(dst + block, &d, 2);
      }
    } else {
      for (float& value : values) value = normal(rng);
      quant::quantize_row(type, values.data(), dst, n_in);
    }
  }
  auto storage = std::make_unique<Mapping>(row_size * size_t(n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    std::memcpy(storage->data + size_t(o) * row_size,
                rows.data() + size_t(o % kDistinctRows) * row_size, row_size);
  }
  const WeightMatrix view = WeightMatrix::dense(type, n_in, n_out, storage->data);
  return BenchMatrix{std::move(storage), view};
}

// Times matmul of an n_in x n_out matrix of `type` with n_rows input rows (1: matvec); counters as
// described at the top (bytes = weight bytes, counted once per call whatever n_rows is).
void run_matmul(benchmark::State& state, GgmlType type, int64_t n_in, int64_t n_out, int64_t n_rows,
                int n_threads, int worker_spin_us = ThreadPool::kDefaultWorkerSpinMicros) {
  ThreadPool& pool = pool_with(n_threads, worker_spin_us);
  const double dram_gbps = measure_dram_gbps(n_threads);
  // Keep the last matrix: Google Benchmark calls this function several times per benchmark
  // (iteration-count probing, repetitions), and building 384 MiB each time is slow.
  struct Key {
    GgmlType type;
    int64_t n_in;
    int64_t n_out;
    bool operator==(const Key&) const = default;
  };
  static Key cached_key{};
  static BenchMatrix cached;
  const Key key{type, n_in, n_out};
  if (!cached.storage || !(cached_key == key)) {
    cached = BenchMatrix{};  // free the old one first: two big matrices need not coexist
    cached = make_matrix(type, n_in, n_out);
    cached_key = key;
  }
  const WeightMatrix& w = cached.view;
  std::vector<float> x(static_cast<size_t>(n_in * n_rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& value : x) value = normal(rng);
  std::vector<float> y(static_cast<size_t>(n_out * n_rows));
  matmul(pool, w, x.data(), n_rows, y.data());  // warm-up: scratch sized, pages touched
  double seconds = 0;
  const double cpu_start = thread_cpu_seconds();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    matmul(pool, w, x.data(), n_rows, y.data());
    benchmark::ClobberMemory();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double cpu_seconds = thread_cpu_seconds() - cpu_start;
  const double bytes = double(w.row_stride_bytes) * double(n_out);
  set_rate_counters(state, bytes, seconds, dram_gbps);
  if (n_threads == 1) {
    // Bytes per second of this thread's own CPU time: unlike wall time it does not drop when
    // other processes take the core, so it is the robust compute ceiling on a shared machine.
    state.counters["GB/s_cpu"] = bytes * double(state.iterations()) / cpu_seconds / 1e9;
  }
  state.counters["weight_MiB"] = bytes / double(1 << 20);
}

// Outputs giving about `bytes` of weights at n_in inputs.
int64_t outputs_for(GgmlType type, int64_t n_in, size_t bytes) {
  return std::max<int64_t>(1, int64_t(bytes / row_bytes(type, n_in)));
}

void BM_ParallelForEmpty(benchmark::State& state) {
  ThreadPool& pool = pool_with(int(state.range(0)));
  for (auto _ : state) {
    pool.parallel_for(pool.size(), [](int64_t, int64_t, int) {});
  }
}

// 8 tasks of 5 µs busy work: ideal 40 µs on 1 thread, 20 µs on 2; the excess over 20 µs with 2
// threads is what a sleeping worker's wake-up costs a short job.
void BM_ParallelForWake(benchmark::State& state) {
  ThreadPool& pool = pool_with(int(state.range(0)), int(state.range(1)));
  for (auto _ : state) {
    pool.parallel_for(8, [](int64_t begin, int64_t end, int) {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(5 * (end - begin));
      while (std::chrono::steady_clock::now() < until) {
      }
    });
  }
}

constexpr GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,
                               GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K,
                               GgmlType::Q6_K, GgmlType::Q2_K, GgmlType::IQ2_XS};

int register_benchmarks() {
  // Which dot kernels ran (CPU check, capped by STRATA_QUANT_MAX): printed in the run's context.
  benchmark::AddCustomContext("quant_kernels",
                              std::string(quant::kernel_level_name(quant::active_kernel_level())));
  benchmark::RegisterBenchmark("BM_DramRead", BM_DramRead)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (GgmlType type : kTypes) {
    benchmark::RegisterBenchmark(("BM_Matvec/" + std::string(type_name(type))).c_str(),
                                 [type](benchmark::State& state) {
                                   run_matmul(state, type, kInputs,
                                              outputs_for(type, kInputs, kStreamedWeightBytes), 1,
                                              int(state.range(0)));
                                 })
        ->ArgName("threads")
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  // The decode row's software prefetch distance (compute/cpu/matmul.h weight_prefetch_bytes) on
  // the streamed matrix, 0 = off, for the types whose decode rows take the one-row dot.
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::IQ2_XS, GgmlType::Q6_K, GgmlType::Q8_0}) {
    benchmark::RegisterBenchmark(("BM_MatvecPrefetch/" + std::string(type_name(type))).c_str(),
                                 [type](benchmark::State& state) {
                                   const size_t saved = weight_prefetch_bytes();
                                   set_weight_prefetch_bytes(size_t(state.range(1)));
                                   run_matmul(state, type, kInputs,
                                              outputs_for(type, kInputs, kStreamedWeightBytes), 1,
                                              int(state.range(0)));
                                   set_weight_prefetch_bytes(saved);
                                 })
        ->ArgNames({"threads", "bytes"})
        ->ArgsProduct({{1, 2}, {0, 512, 1024, 2048, 4096, 8192, 32768}})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (GgmlType type : kTypes) {
    benchmark::RegisterBenchmark(
        ("BM_MatvecInCache/" + std::string(type_name(type))).c_str(),
        [type](benchmark::State& state) {
          run_matmul(state, type, kInputs, outputs_for(type, kInputs, kInCacheWeightBytes), 1, 1);
        })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  // One expert projection of the flagship (2560 -> 640): small enough that waking a worker is a
  // visible share of the call; compares 1 and 2 threads on a cache-resident matrix.
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::IQ2_XS}) {
    benchmark::RegisterBenchmark(("BM_MatvecExpert/" + std::string(type_name(type))).c_str(),
                                 [type](benchmark::State& state) {
                                   run_matmul(state, type, 2560, 640, 1, int(state.range(0)),
                                              int(state.range(1)));
                                 })
        ->ArgNames({"threads", "spin_us"})
        ->Args({1, ThreadPool::kDefaultWorkerSpinMicros})
        ->Args({2, 0})
        ->Args({2, ThreadPool::kDefaultWorkerSpinMicros})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  // Verify windows: T rows against the streamed matrix, 2 threads. With 1x1 dot kernels the cost
  // grows with T once the kernel, not DRAM, is the limit (SpecGate's T(n) on the CPU backend);
  // IQ2_XS's multi-activation kernel decodes each weight block once for up to 8 rows.
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::IQ2_XS}) {
    benchmark::RegisterBenchmark(("BM_MatmulWindow/" + std::string(type_name(type))).c_str(),
                                 [type](benchmark::State& state) {
                                   run_matmul(state, type, kInputs,
                                              outputs_for(type, kInputs, kStreamedWeightBytes),
                                              state.range(0), 2);
                                 })
        ->ArgName("rows")
        ->Arg(1)
        ->Arg(2)
        ->Arg(4)
        ->Arg(8)
        ->Arg(16)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_ParallelForEmpty", BM_ParallelForEmpty)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_ParallelForWake", BM_ParallelForWake)
      ->ArgNames({"threads", "spin_us"})
      ->Args({1, ThreadPool::kDefaultWorkerSpinMicros})
      ->Args({2, 0})
      ->Args({2, ThreadPool::kDefaultWorkerSpinMicros})
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  return 0;
}

const int registered = register_benchmarks();

}  // namespace
}  // namespace strata::compute

BENCHMARK_MAIN();
