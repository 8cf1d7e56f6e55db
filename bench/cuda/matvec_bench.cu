// bench_cuda_matvec: GB/s of weights streamed by the CUDA quantized matmul (compute/cuda/matmul.h)
// per type and window size, next to the HBM bandwidth measured in the same run (a read-only
// kernel over 4 GiB, and cudaMemcpy device-to-device counting read + write). Matrices rotate
// through ≥ 1 GiB per type so the 60 MB L2 never holds them. Times are medians of 9 CUDA-event
// timed batches (one call per matrix copy, back to back) after a warm-up, divided per call. Prints a table; --json FILE writes the numbers.
//   bench_cuda_matvec [--types q8_0,q4_K,iq2_xs] [--rows 1,2,4,8] [--n-in 8192 --n-out 16384] [--sweep] [--json out.json]
// --compare: the direct kernel against the staged one (MatmulTuning::staging, session 37) in one
// process, per shape (--shapes, default 8192x16384,2560x10240: the models' widths), type (default
// q8_0,q4_K,iq4_nl,q3_K,iq2_xs) and window (default 1,4): direct, staged with 2 stages,
// with 2 stages and the activations in shared memory, with 3 stages and them; --sweep adds every
// rows-per-warp shape of both and reports the best. Each staged result is checked bitwise against
// the direct one (same weights, same activations); the path actually taken is printed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compute/cuda/matmul.h"
#include "compute/cuda/runtime.h"
#include "fill_random.cuh"

using namespace strata;
using namespace strata::compute::cuda;

namespace {

__global__ void read_kernel(const uint4* data, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads alive
}

template <typename Fn>
float median_ms(Fn&& fn, int warmup, int reps) {
  cudaEvent_t start, stop;
  STRATA_CUDA_CHECK(cudaEventCreate(&start));
  STRATA_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    STRATA_CUDA_CHECK(cudaEventRecord(start));
    fn(warmup + i);
    STRATA_CUDA_CHECK(cudaEventRecord(stop));
    STRATA_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Copies of a random n_in x n_out matrix of `type`, ≥ 1 GiB of them so that the L2 (50-60 MB)
// never holds the next one: each timed sample is a batch of back-to-back calls, one per copy.
// The random words make valid blocks of every type except that scale fields may be huge or NaN:
// harmless for timing (no data-dependent control flow in the kernels).
struct WeightCopies {
  size_t stride = 0, matrix_bytes = 0;
  int copies = 0;
  DeviceBuffer weights;
};
WeightCopies random_weight_copies(GgmlType type, int64_t n_in, int64_t n_out) {
  WeightCopies w;
  w.stride = row_bytes(type, n_in);
  w.matrix_bytes = w.stride * size_t(n_out);
  w.copies = int(std::max<size_t>(2, (size_t(1) << 30) / w.matrix_bytes + 1));
  w.weights = DeviceBuffer(w.matrix_bytes * size_t(w.copies));
  fill_random_kernel<<<4096, 256>>>(w.weights.as<uint32_t>(), w.weights.bytes() / 4, 7);
  return w;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

const char* path_name(MatvecPath path) {
  return path == MatvecPath::Direct ? "direct" : path == MatvecPath::Staged ? "staged" : "staged+act";
}

std::string tuning_name(const MatmulTuning& t) {
  if (t.staging == 2) return "direct rw" + (t.rows_per_warp ? std::to_string(t.rows_per_warp) : std::string("=def"));
  return "staged D" + std::to_string(t.stages) + (t.act_shared == 1 ? " act" : "") + " rw" +
         (t.rows_per_warp ? std::to_string(t.rows_per_warp) : std::string("=def"));
}

struct Timing {
  MatmulTuning tuning;
  MatvecPath path;
  double us, gbs;
  bool bitwise;  // y equal to the direct default's, bit for bit
};

// --compare (see the top of the file). Returns 1 when a staged result differs from the direct one.
int run_compare(const std::vector<std::string>& types, const std::vector<std::string>& windows,
                const std::vector<std::string>& shapes, bool sweep, double read_gbs, const std::string& json_path) {
  std::vector<MatmulTuning> variants = {{0, 2, 0, 0, 0}, {0, 1, 0, 2, 2}, {0, 1, 0, 2, 1}, {0, 1, 0, 3, 1}};
  if (sweep) {
    for (const int rw : {1, 2, 4}) variants.push_back({rw, 2, 0, 0, 0});
    for (const int rw : {1, 2, 4})
      for (const int stages : {2, 3})
        for (const int act : {2, 1}) variants.push_back({rw, 1, 0, stages, act});
  }
  std::string json = "{\"hbm_read_gbs\": " + std::to_string(read_gbs) + ", \"compare\": [";
  std::string summary;
  bool all_bitwise = true, first_json = true;
  char line[512];
  std::printf("\n%-11s %-8s %2s  %-24s %-10s %9s %8s %7s %7s %s\n", "shape", "type", "T", "variant", "path", "us/call",
              "GB/s", "÷read", "×direct", "bits");
  for (const auto& shape : shapes) {
    const size_t x_at = shape.find('x');
    const int64_t n_in = std::stoll(shape.substr(0, x_at)), n_out = std::stoll(shape.substr(x_at + 1));
    for (const auto& name : types) {
      const auto type = type_from_name(name);
      if (!type || !has_cuda_kernel(*type)) { std::fprintf(stderr, "skip %s: no CUDA kernel\n", name.c_str()); continue; }
      WeightCopies matrix = random_weight_copies(*type, n_in, n_out);
      const size_t stride = matrix.stride, matrix_bytes = matrix.matrix_bytes;
      const int copies = matrix.copies;
      const DeviceBuffer& weights = matrix.weights;
      for (const auto& window : windows) {
        const int64_t t = std::stoll(window);
        std::vector<float> x_host(size_t(t * n_in));
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (float& v : x_host) v = dist(rng);
        DeviceBuffer x(x_host.size() * 4), y(size_t(t * n_out) * 4);
        x.upload(x_host.data(), x_host.size() * 4);
        const ActivationLayout layout = activation_layout(*type, n_in, t);
        DeviceBuffer scratch(layout.total_bytes);
        quantize_activations(layout, x.as<float>(), scratch.data(), nullptr);
        STRATA_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<Timing> timings;
        std::vector<float> reference;
        for (const MatmulTuning& tuning : variants) {
          const float ms = median_ms([&](int) {
            for (int c = 0; c < copies; ++c) {
              const DeviceMatrix m{*type, n_in, n_out, weights.as<uint8_t>() + size_t(c) * matrix_bytes, stride};
              matmul_quantized(m, layout, scratch.data(), t, y.as<float>(), nullptr, &tuning);
            }
          }, 2, 9) / float(copies);
          std::vector<float> got(size_t(t * n_out));
          y.download(got.data(), got.size() * 4);  // the last copy's result, the same matrix for every variant
          if (reference.empty()) reference = got;
          const bool wide = tuning.warps_per_row == 4;
          const bool bitwise = std::memcmp(got.data(), reference.data(), got.size() * 4) == 0;
          if (!wide) all_bitwise = all_bitwise && bitwise;
          const double gbs = double(matrix_bytes) / ms / 1e6;
          timings.push_back({tuning, matvec_path(*type, n_in, t, &tuning), ms * 1e3, gbs, bitwise});
          const Timing& r = timings.back();
          std::printf("%-11s %-8s %2lld  %-24s %-10s %9.2f %8.0f %7.3f %7.3f %s\n", shape.c_str(), name.c_str(),
                      (long long)t, tuning_name(tuning).c_str(), wide ? "wide" : path_name(r.path), r.us, gbs, gbs / read_gbs,
                      gbs / timings[0].gbs, wide ? "(own order)" : bitwise ? "=" : "DIFF");
          json += std::string(first_json ? "" : ", ") + "{\"shape\": \"" + shape + "\", \"type\": \"" + name +
                  "\", \"rows\": " + std::to_string(t) + ", \"variant\": \"" + tuning_name(tuning) + "\", \"path\": \"" +
                  path_name(r.path) + "\", \"us\": " + std::to_string(r.us) + ", \"gbs\": " + std::to_string(gbs) +
                  ", \"bitwise\": " + (bitwise ? "true" : "false") + "}";
          first_json = false;
        }
        // Summary line: the four default variants, then the best staged of all that ran.
        const Timing* best = nullptr;
        for (const Timing& r : timings)
          if (r.tuning.staging == 1 && (!best || r.gbs > best->gbs)) best = &r;
        std::snprintf(line, sizeof(line), "%-11s %-7s %2lld | %5.0f %.2f | %5.0f %.2f %4.2fx | %5.0f %.2f %4.2fx | %5.0f %.2f %4.2fx | %-22s %4.2fx | %s\n",
                      shape.c_str(), name.c_str(), (long long)t, timings[0].gbs, timings[0].gbs / read_gbs, timings[1].gbs,
                      timings[1].gbs / read_gbs, timings[1].gbs / timings[0].gbs, timings[2].gbs, timings[2].gbs / read_gbs,
                      timings[2].gbs / timings[0].gbs, timings[3].gbs, timings[3].gbs / read_gbs,
                      timings[3].gbs / timings[0].gbs, best ? tuning_name(best->tuning).c_str() : "-",
                      best ? best->gbs / timings[0].gbs : 0.0,
                      std::all_of(timings.begin(), timings.end(), [](const Timing& r) { return r.bitwise || r.tuning.warps_per_row == 4; }) ? "bitwise" : "DIFF");
        summary += line;
      }
    }
  }
  std::printf("\nGB/s of weights, ÷ the read-only ceiling (%.0f GB/s), × the direct kernel; best = best staged shape\n", read_gbs);
  std::printf("%-11s %-7s %2s | %-10s | %-16s | %-16s | %-16s | %-28s | %s\n", "shape", "type", "T", "direct", "staged D2",
              "staged D2 act", "staged D3 act", "best staged", "bits");
  std::fputs(summary.c_str(), stdout);
  json += "]}\n";
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) { std::fputs(json.c_str(), f); std::fclose(f); }
  }
  if (!all_bitwise) std::printf("\nbench_cuda_matvec: a staged result differs from the direct kernel's\n");
  return all_bitwise ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string types_arg = "f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,iq4_nl,q2_K,q3_K,q4_K,q5_K,q6_K,iq4_xs,iq2_xxs,iq2_xs,iq2_s,iq3_xxs,iq3_s,iq1_s,iq1_m", rows_arg = "1,2,4,8", json_path;
  std::string shapes_arg = "8192x16384,2560x10240";
  int64_t n_in = 8192, n_out = 16384;
  bool sweep = false;    // --sweep: also every rows-per-warp launch shape, not just the default
  bool compare = false;  // --compare: direct against staged (see the top of the file)
  bool types_given = false, rows_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--sweep") { sweep = true; continue; }
    if (key == "--compare") { compare = true; continue; }
    if (i + 1 >= argc) { std::fprintf(stderr, "bench_cuda_matvec: %s needs a value\n", key.c_str()); return 2; }
    const std::string value = argv[++i];
    if (key == "--types") { types_arg = value; types_given = true; }
    else if (key == "--rows") { rows_arg = value; rows_given = true; }
    else if (key == "--shapes") shapes_arg = value;
    else if (key == "--n-in") n_in = std::stoll(value);
    else if (key == "--n-out") n_out = std::stoll(value);
    else if (key == "--json") json_path = value;
    else { std::fprintf(stderr, "bench_cuda_matvec: unknown option %s\n", key.c_str()); return 2; }
  }
  if (!usable_device()) {
    std::fprintf(stderr, "bench_cuda_matvec: %s\n", describe_device().c_str());
    return 1;
  }
  std::printf("device: %s\n", describe_device().c_str());
  unsigned* sink;
  STRATA_CUDA_CHECK(cudaMalloc(&sink, 4));
  // HBM ceilings, same run.
  const size_t big = size_t(4) << 30;
  DeviceBuffer a(big), b(big / 2);
  fill_random_kernel<<<4096, 256>>>(a.as<uint32_t>(), big / 4, 1);
  STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  const float read_ms = median_ms([&](int) { read_kernel<<<132 * 16, 256>>>(a.as<uint4>(), big / 16, sink); }, 3, 15);
  const float copy_ms = median_ms([&](int) { STRATA_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), big / 2, cudaMemcpyDeviceToDevice)); }, 3, 15);
  const double read_gbs = double(big) / read_ms / 1e6, copy_gbs = double(big) / copy_ms / 1e6;  // copy: r + w
  std::printf("HBM read-only kernel: %.0f GB/s   device-to-device copy (read + write): %.0f GB/s\n", read_gbs, copy_gbs);
  b = DeviceBuffer();
  if (compare) {
    const int rc = run_compare(split(types_given ? types_arg : "q8_0,q4_K,iq4_nl,q3_K,iq2_xs"),
                               split(rows_given ? rows_arg : "1,4"), split(shapes_arg), sweep, read_gbs, json_path);
    cudaFree(sink);
    return rc;
  }

  std::vector<int64_t> rows;
  for (const auto& r : split(rows_arg)) rows.push_back(std::stoll(r));
  const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  std::vector<float> x_host(size_t(max_rows * n_in));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x_host) v = dist(rng);
  DeviceBuffer x(x_host.size() * 4), y(size_t(max_rows * n_out) * 4);
  x.upload(x_host.data(), x_host.size() * 4);

  std::string json = "{\"device\": \"" + describe_device() + "\", \"hbm_read_gbs\": " + std::to_string(read_gbs) +
                     ", \"hbm_copy_gbs\": " + std::to_string(copy_gbs) + ", \"n_in\": " + std::to_string(n_in) +
                     ", \"n_out\": " + std::to_string(n_out) + ", \"results\": [";
  std::printf("\n%-8s %10s %6s %4s %5s %10s %10s %8s\n", "type", "MB/matrix", "rows", "r/w", "stage", "us/call", "GB/s", "÷read");
  bool first = true;
  for (const auto& name : split(types_arg)) {
    const auto type = type_from_name(name);
    if (!type || !has_cuda_kernel(*type)) { std::fprintf(stderr, "skip %s: no CUDA kernel\n", name.c_str()); continue; }
    WeightCopies matrix = random_weight_copies(*type, n_in, n_out);
    const size_t stride = matrix.stride, matrix_bytes = matrix.matrix_bytes;
    const int copies = matrix.copies;
    const DeviceBuffer& weights = matrix.weights;
    const ActivationLayout layout = activation_layout(*type, n_in, max_rows);
    DeviceBuffer scratch(layout.total_bytes);
    quantize_activations(layout, x.as<float>(), scratch.data(), nullptr);
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
    for (const int64_t t : rows) for (const int rw : {0, 1, 2, 4}) for (const int staging : {0, 1, 2}) {
      if (rw > 2 && t > 4) continue;
      if ((rw != 0 || staging != 0) && !sweep) continue;
      const MatmulTuning tuning{rw, staging, 0, 0, 0};
      // Each timed sample is a batch of `copies` back-to-back calls, one per matrix copy, so the
      // few microseconds of launch latency around one event pair do not count as slowness.
      const float ms = median_ms([&](int) {
        for (int c = 0; c < copies; ++c) {
          const DeviceMatrix m{*type, n_in, n_out, weights.as<uint8_t>() + size_t(c) * matrix_bytes, stride};
          matmul_quantized(m, layout, scratch.data(), t, y.as<float>(), nullptr, &tuning);
        }
      }, 2, 9) / float(copies);
      const double gbs = double(matrix_bytes) / ms / 1e6;
      std::printf("%-8s %10.1f %6lld %4s %5s %10.1f %10.0f %8.2f\n", name.c_str(), matrix_bytes / 1e6, (long long)t,
                  rw == 0 ? "def" : std::to_string(rw).c_str(), staging == 0 ? "def" : staging == 1 ? "on" : "off",
                  ms * 1e3, gbs, gbs / read_gbs);
      json += std::string(first ? "" : ", ") + "{\"type\": \"" + name + "\", \"rows\": " + std::to_string(t) +
              ", \"rows_per_warp\": " + std::to_string(rw) + ", \"staging\": " + std::to_string(staging) +
              ", \"us\": " + std::to_string(ms * 1e3) + ", \"gbs\": " + std::to_string(gbs) + "}";
      first = false;
    }
  }
  json += "]}\n";
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) { std::fputs(json.c_str(), f); std::fclose(f); }
  }
  cudaFree(sink);
  return 0;
}
