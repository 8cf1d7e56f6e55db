// Expert matvecs read through the GGUF mapping vs from the resident copy (gguf/resident_weights.h).
//
// A GGUF of one Q4_K expert tensor (ne = {1024, 512, E}, ~1 GiB; STRATA_BENCH_RESIDENT_MIB sets
// another size) is written to the temp directory once per process. Each iteration runs
// compute::matvec on 8 experts picked at random (a decode token's routed gate projections of one
// layer), so the weights come from DRAM, as in decode:
//   BM_ExpertMatvecs/mapped/threads:N    through the file mapping, every page faulted in first
//                                        (MADV_POPULATE_READ): what is left is the 4 KiB pages'
//                                        TLB misses (a two-level page walk under a hypervisor).
//   BM_ExpertMatvecs/resident/threads:N  the same file after copy_resident_weights: the same bytes
//                                        at the same addresses, in transparent huge pages.
// Counter GB/s: weight bytes per second of wall time. See docs/bench-cpu-decode.md.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf/resident_weights.h"
#include "quant/ggml_type.h"

namespace strata::compute {
namespace {

constexpr int64_t kInputs = 1024, kOutputs = 512, kExpertsPerToken = 8;

struct ExpertFile {
  std::string path;
  std::unique_ptr<GgufFile> file;
  int64_t n_expert = 0;
  size_t expert_bytes = 0;
  ~ExpertFile() {
    file.reset();
    std::filesystem::remove(path);
  }
};

// Writes the file (random bytes with valid f16 scales: every byte pattern of Q4_K decodes) once.
std::unique_ptr<ExpertFile> write_expert_file() {
  auto out = std::make_unique<ExpertFile>();
  const char* mib_text = std::getenv("STRATA_BENCH_RESIDENT_MIB");
  const size_t total = size_t(mib_text ? std::atoll(mib_text) : 1024) << 20;
  out->expert_bytes = row_bytes(GgmlType::Q4_K, kInputs) * kOutputs;
  out->n_expert = std::max<int64_t>(1, int64_t(total / out->expert_bytes));
  out->path = (std::filesystem::temp_directory_path() / ("strata-bench-resident-" + std::to_string(getpid()) + ".gguf"))
                  .string();
  GgufWriter writer;
  writer.add_string("general.architecture", "bench");
  writer.add_tensor("blk.0.ffn_gate_exps.weight", GgmlType::Q4_K, {kInputs, kOutputs, out->n_expert});
  std::mt19937_64 rng(1);
  writer.write_file(out->path, [&](const GgufTensorDecl&, GgufTensorSink& sink) {
    std::vector<uint8_t> chunk(size_t(144) << 16);  // whole Q4_K blocks
    for (uint64_t left = uint64_t(out->n_expert) * out->expert_bytes; left > 0;) {
      const size_t n = size_t(std::min<uint64_t>(left, chunk.size()));
      for (size_t i = 0; i < n; i += 8) {
        const uint64_t r = rng();
        std::memcpy(&chunk[i], &r, std::min<size_t>(8, n - i));
      }
      // d and dmin of each 144-byte block: small positive halves (0x1000 ~ 2^-11), no NaN/inf.
      for (size_t b = 0; b + 4 <= n; b += 144) {
        chunk[b + 1] = 0x10;
        chunk[b + 3] = 0x10;
      }
      sink.write(std::span(chunk.data(), n));
      left -= n;
    }
  });
  out->file = GgufFile::open(out->path);
  return out;
}

ExpertFile& expert_file(bool resident) {
  static std::map<bool, std::unique_ptr<ExpertFile>> files;
  auto& f = files[resident];
  if (!f) {
    f = write_expert_file();
    const GgufFile& g = *f->file;
    if (resident)
      copy_resident_weights(g, plan_resident_weights(g.tensors(), g.file_size(), uint64_t(sysconf(_SC_PAGESIZE)), true),
                            2);
    else
      g.advise(0, g.file_size(), MADV_POPULATE_READ);
  }
  return *f;
}

ThreadPool& pool_with(int n_threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[n_threads];
  if (!pool) pool = std::make_unique<ThreadPool>(n_threads);
  return *pool;
}

void BM_ExpertMatvecs(benchmark::State& state, bool resident) {
  ExpertFile& f = expert_file(resident);
  ThreadPool& pool = pool_with(int(state.range(0)));
  const uint8_t* experts = f.file->tensor_data(f.file->tensor("blk.0.ffn_gate_exps.weight"));
  std::vector<float> x(kInputs), y(kOutputs);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (auto _ : state) {
    for (int k = 0; k < kExpertsPerToken; ++k) {
      const int64_t e = int64_t(rng() % uint64_t(f.n_expert));
      const WeightMatrix w = WeightMatrix::dense(GgmlType::Q4_K, kInputs, kOutputs, experts + size_t(e) * f.expert_bytes);
      matvec(pool, w, x.data(), y.data());
      benchmark::DoNotOptimize(y.data());
    }
  }
  state.counters["GB/s"] = benchmark::Counter(double(state.iterations()) * kExpertsPerToken * double(f.expert_bytes) / 1e9,
                                              benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_ExpertMatvecs, mapped, false)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_ExpertMatvecs, resident, true)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace strata::compute

BENCHMARK_MAIN();
