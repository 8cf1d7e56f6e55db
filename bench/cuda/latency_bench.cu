// bench_cuda_latency: microseconds per launch of the decode window's small kernels as a replayed
// window runs them: N launches back to back on one stream, captured into a CUDA graph (with the
// programmatic dependent launch the backend uses), the graph replayed and timed with events;
// medians of 15 replays divided by N. Shapes are mid-qwen4exp's (hidden 1024, expert width 512,
// 10 routed experts a token, IQ2_XS experts, Q8_0 dense), T = 1. The floor is the smallest
// kernel of the window (one row's Q8_0 activation quantizer): what any launch costs at least.
//   bench_cuda_latency [--launches 100] [--hidden 1024] [--expert-width 512] [--experts 10]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compute/cuda/matmul.h"
#include "compute/cuda/runtime.h"
#include "fill_random.cuh"
#include "quant/ggml_type.h"

using namespace strata;
using namespace strata::compute::cuda;

namespace {

// Median µs per launch of `launch` captured n times into one graph.
double us_per_launch(const std::function<void(cudaStream_t)>& launch, int n, cudaStream_t stream) {
  launch(stream);  // first launch outside capture: uploads tables, checks arguments
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < n; ++i) launch(stream);
  STRATA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  STRATA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  STRATA_CUDA_CHECK(cudaEventCreate(&start));
  STRATA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = 0; r < 18; ++r) {
    STRATA_CUDA_CHECK(cudaEventRecord(start, stream));
    STRATA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    STRATA_CUDA_CHECK(cudaEventRecord(stop, stream));
    STRATA_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (r >= 3) ms.push_back(t);  // three warm-up replays
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3 / n;
}

DeviceBuffer random_buffer(size_t bytes, uint32_t seed) {
  DeviceBuffer b(bytes);
  fill_random_kernel<<<1024, 256>>>(b.as<uint32_t>(), bytes / 4, seed, 0x3bff3bffu);  // f16 scales finite
  STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

DeviceBuffer ints(const std::vector<int32_t>& v) {
  DeviceBuffer b(v.size() * 4);
  b.upload(v.data(), v.size() * 4);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 100, hidden = 1024, width = 512, k = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const int value = std::stoi(argv[i + 1]);
    if (key == "--launches") n = value;
    else if (key == "--hidden") hidden = value;
    else if (key == "--expert-width") width = value;
    else if (key == "--experts") k = value;
    else { std::fprintf(stderr, "bench_cuda_latency: unknown option %s\n", key.c_str()); return 2; }
  }
  if (!usable_device()) {
    std::fprintf(stderr, "bench_cuda_latency: %s\n", describe_device().c_str());
    return 1;
  }
  std::printf("device: %s; %d launches per graph, T = 1, hidden %d, %d experts of width %d\n",
              describe_device().c_str(), n, hidden, k, width);
  Stream stream;
  DeviceBuffer x = random_buffer(size_t(std::max(hidden, width)) * 8 * 4, 5);  // floats, finite-ish
  {
    std::vector<float> host(size_t(std::max(hidden, width)) * 8);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    for (float& v : host) v = d(rng);
    x.upload(host.data(), host.size() * 4);
  }
  DeviceBuffer y(size_t(8) << 20);
  struct Row {
    std::string what;
    double us;
  };
  std::vector<Row> rows;
  auto add = [&](std::string what, const std::function<void(cudaStream_t)>& f) {
    rows.push_back({std::move(what), us_per_launch(f, n, stream.get())});
    std::printf("%-64s %8.2f us\n", rows.back().what.c_str(), rows.back().us);
  };

  // Floor: one row's Q8_0 quantizer.
  const ActivationLayout q8 = activation_layout(GgmlType::Q8_0, hidden, 1);
  DeviceBuffer q8_scratch(q8.total_bytes);
  add("Q8_0 activation quantizer, 1 row (floor)", [&](cudaStream_t s) {
    quantize_activations(q8, x.as<float>(), q8_scratch.data(), s);
  });

  // Dense Q8_0 matvecs: one matrix, and three of one input in one launch (DeltaNet's projections).
  const size_t q8_row = size_t(hidden / 32) * 34;
  DeviceBuffer dense = random_buffer(q8_row * size_t(hidden) * 4, 9);
  quantize_activations(q8, x.as<float>(), q8_scratch.data(), stream.get());
  for (const int rw : {0, 1, 2, 4}) {
    const MatmulTuning tuning{rw, 0, 0};
    const DeviceMatrix m{GgmlType::Q8_0, hidden, hidden, dense.data(), q8_row};
    add("Q8_0 " + std::to_string(hidden) + " -> " + std::to_string(hidden) + ", rows/warp " +
            (rw ? std::to_string(rw) : std::string("default")),
        [&](cudaStream_t s) { matmul_quantized(m, q8, q8_scratch.data(), 1, y.as<float>(), s, &tuning); });
  }
  {
    std::vector<DenseOutput> three;
    for (int j = 0; j < 3; ++j)
      three.push_back({DeviceMatrix{GgmlType::Q8_0, hidden, hidden, dense.as<uint8_t>() + size_t(j) * q8_row * hidden,
                                    q8_row},
                       y.as<float>() + size_t(j) * hidden});
    add("Q8_0 three " + std::to_string(hidden) + " -> " + std::to_string(hidden) + " in one launch",
        [&](cudaStream_t s) { matmul_quantized_many(three, q8, q8_scratch.data(), 1, s); });
  }

  // Routed experts, IQ2_XS, through the slot map: k experts of one token.
  const int n_expert = 64;
  const size_t iq_gate_row = size_t(hidden / 256) * 74, iq_down_row = size_t(width / 256) * 74;
  const size_t gate_bytes = iq_gate_row * width, down_bytes = iq_down_row * hidden;
  const size_t slot_bytes = (2 * gate_bytes + down_bytes + 255) / 256 * 256;
  DeviceBuffer arena = random_buffer(slot_bytes * n_expert, 11);
  std::vector<uint32_t> smap(n_expert);
  std::iota(smap.begin(), smap.end(), 0u);
  DeviceBuffer smap_d(smap.size() * 4);
  smap_d.upload(smap.data(), smap.size() * 4);
  std::vector<int32_t> ids(k), zeros(k, 0), ones(k, 1), identity(k);
  for (int j = 0; j < k; ++j) ids[j] = (j * 7 + 3) % n_expert, identity[j] = j;
  DeviceBuffer ids_d = ints(ids), zeros_d = ints(zeros), ones_d = ints(ones), identity_d = ints(identity);
  const ExpertArenaView view{arena.as<uint8_t>(), slot_bytes, smap_d.as<uint32_t>(), n_expert};
  const ExpertMatrixShape gate{GgmlType::IQ2_XS, hidden, width, 0, iq_gate_row};
  const ExpertMatrixShape up{GgmlType::IQ2_XS, hidden, width, gate_bytes, iq_gate_row};
  const ExpertMatrixShape down{GgmlType::IQ2_XS, width, hidden, 2 * gate_bytes, iq_down_row};
  const ActivationLayout q8k = activation_layout(GgmlType::IQ2_XS, hidden, 1);
  const ActivationLayout q8k_down = activation_layout(GgmlType::IQ2_XS, width, k);
  DeviceBuffer q8k_scratch(q8k.total_bytes), q8k_down_scratch(q8k_down.total_bytes);
  quantize_activations(q8k, x.as<float>(), q8k_scratch.data(), stream.get());
  {
    std::vector<float> host(size_t(width) * k, 0.25f);
    DeviceBuffer xd(host.size() * 4);
    xd.upload(host.data(), host.size() * 4);
    quantize_activations(q8k_down, xd.as<float>(), q8k_down_scratch.data(), stream.get());
    stream.synchronize();
  }
  float* g = y.as<float>();
  float* u = y.as<float>() + size_t(k) * width;
  float* out = y.as<float>() + size_t(2 * k) * width;
  // lanes 32: a full warp per weight row (before narrow rows took fewer lanes); 0: the default.
  for (const auto [rw, lanes] : {std::pair{0, 32}, std::pair{0, 0}, std::pair{1, 0}, std::pair{2, 0}}) {
    const MatmulTuning tuning{rw, 0, lanes};
    const std::string shape = (rw ? std::to_string(rw) : std::string("default")) +
                              (lanes == 32 ? ", a full warp per row" : "");
    add("IQ2_XS experts gate+up pair, " + std::to_string(k) + " x " + std::to_string(hidden) + " -> " +
            std::to_string(width) + ", rows/warp " + shape,
        [&](cudaStream_t s) {
          expert_matmul_quantized_pair(view, 0, gate, up, ids_d.as<int32_t>(), k, zeros_d.as<int32_t>(),
                                       ones_d.as<int32_t>(), 1, q8k, q8k_scratch.data(), g, u, s, &tuning);
        });
    add("IQ2_XS experts down, " + std::to_string(k) + " x " + std::to_string(width) + " -> " + std::to_string(hidden) +
            ", rows/warp " + shape,
        [&](cudaStream_t s) {
          expert_matmul_quantized(view, 0, down, ids_d.as<int32_t>(), k, identity_d.as<int32_t>(), ones_d.as<int32_t>(),
                                  1, q8k_down, q8k_down_scratch.data(), out, s, &tuning);
        });
  }
  // What the expert launches' time is made of: the same bytes as one dense IQ2_XS matrix (no slot
  // map, full-width rows for the gate shape), one expert alone, and Q8_0 experts of the same shape.
  {
    const DeviceMatrix gate_flat{GgmlType::IQ2_XS, hidden, int64_t(2) * k * width, arena.data(), iq_gate_row};
    add("IQ2_XS dense " + std::to_string(hidden) + " -> " + std::to_string(2 * k * width) + " (the pair's bytes)",
        [&](cudaStream_t s) { matmul_quantized(gate_flat, q8k, q8k_scratch.data(), 1, y.as<float>(), s); });
    const ActivationLayout q8k_narrow = activation_layout(GgmlType::IQ2_XS, width, 1);
    const DeviceMatrix down_flat{GgmlType::IQ2_XS, width, int64_t(k) * hidden, arena.data(), iq_down_row};
    add("IQ2_XS dense " + std::to_string(width) + " -> " + std::to_string(k * hidden) + " (the down's bytes)",
        [&](cudaStream_t s) { matmul_quantized(down_flat, q8k_narrow, q8k_down_scratch.data(), 1, y.as<float>(), s); });
    add("IQ2_XS experts gate+up pair, 1 expert",
        [&](cudaStream_t s) {
          expert_matmul_quantized_pair(view, 0, gate, up, ids_d.as<int32_t>(), 1, zeros_d.as<int32_t>(),
                                       ones_d.as<int32_t>(), 1, q8k, q8k_scratch.data(), g, u, s);
        });
    const size_t q8_gate_row = size_t(hidden / 32) * 34;
    const ExpertMatrixShape q8_gate{GgmlType::Q8_0, hidden, width, 0, q8_gate_row};
    const ExpertMatrixShape q8_up{GgmlType::Q8_0, hidden, width, q8_gate_row * width, q8_gate_row};
    const size_t q8_slot = (2 * q8_gate_row * width + 255) / 256 * 256;
    DeviceBuffer q8_arena = random_buffer(q8_slot * n_expert, 13);
    const ExpertArenaView q8_view{q8_arena.as<uint8_t>(), q8_slot, smap_d.as<uint32_t>(), n_expert};
    add("Q8_0 experts gate+up pair, " + std::to_string(k) + " x " + std::to_string(hidden) + " -> " +
            std::to_string(width),
        [&](cudaStream_t s) {
          expert_matmul_quantized_pair(q8_view, 0, q8_gate, q8_up, ids_d.as<int32_t>(), k, zeros_d.as<int32_t>(),
                                       ones_d.as<int32_t>(), 1, q8, q8_scratch.data(), g, u, s);
        });
  }
  return 0;
}
