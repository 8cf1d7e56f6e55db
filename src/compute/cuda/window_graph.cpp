// WindowGraph and PinnedStaging. Contract in window_graph.h.
#include "compute/cuda/window_graph.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "compute/cuda/runtime.h"

namespace strata::compute::cuda {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr size_t kStagingChunk = size_t(4) << 20;

}  // namespace

WindowGraph::WindowGraph(cudaStream_t stream, bool enabled) : stream_(stream), enabled_(enabled) {
  const char* v = std::getenv("STRATA_CUDA_PROFILE");
  profiling_ = v && std::strcmp(v, "1") == 0;
  if (profiling_) enabled_ = true;
}

WindowGraph::~WindowGraph() {
  if (capturing_) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    capturing_ = false;
  }
  for (auto& [key, exec] : execs_) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void WindowGraph::begin_window() {
  if (!enabled_) return;
  pause();
  if (profiling_) {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    collect_profile();
  }
  window_open_ = true;
  segment_ = 0;
  rows_ = 0;
  ++stats_.windows;
}

void WindowGraph::ensure_capturing() {
  if (!enabled_ || !window_open_ || capturing_) return;
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  capture_started_ = now_s();
}

void WindowGraph::pause() {
  if (!capturing_) return;
  if (profiling_) mark(nullptr);  // closes the segment's last interval
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t code = cudaStreamEndCapture(stream_, &graph);
  stats_.capture_s += now_s() - capture_started_;
  if (code != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    STRATA_CUDA_CHECK(code);
  }
  try {
    launch_segment(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphDestroy(graph);
  ++segment_;
}

void WindowGraph::abandon() {
  if (capturing_) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    capturing_ = false;
  }
  window_open_ = false;
}

void WindowGraph::launch_segment(cudaGraph_t graph) {
  size_t n_nodes = 0;
  STRATA_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n_nodes));
  if (n_nodes == 0) return;
  ++stats_.segments;
  stats_.nodes += int64_t(n_nodes);
  const double t0 = now_s();
  cudaGraphExec_t& exec = execs_[{rows_, segment_}];
  if (exec) {
    // Same window shape as before: the kernels are the same, their arguments (positions, KV
    // lengths) may differ. Updating in place is much cheaper than instantiating.
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec, graph, &info) == cudaSuccess) {
      ++stats_.updates;
    } else {
      cudaGetLastError();  // a topology change is not an error: instantiate anew
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
  }
  if (!exec) {
    STRATA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    ++stats_.instantiations;
  }
  const double t1 = now_s();
  STRATA_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  stats_.update_s += t1 - t0;
  stats_.launch_s += now_s() - t1;
}

void WindowGraph::mark(const char* label) {
  if (!profiling_ || !capturing_) return;
  if (n_marks_ == events_.size()) {
    cudaEvent_t e;
    STRATA_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    labels_.push_back(nullptr);
    event_segments_.push_back(0);
  }
  STRATA_CUDA_CHECK(cudaEventRecordWithFlags(events_[n_marks_], stream_, cudaEventRecordExternal));
  labels_[n_marks_] = label;
  event_segments_[n_marks_] = segment_;
  ++n_marks_;
}

void WindowGraph::collect_profile() {
  for (size_t i = 0; i + 1 < n_marks_; ++i) {
    if (!labels_[i] || event_segments_[i] != event_segments_[i + 1]) continue;
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    auto& [count, seconds] = profile_[labels_[i]];
    ++count;
    seconds += double(ms) * 1e-3;
  }
  n_marks_ = 0;
}

std::string WindowGraph::profile_table() {
  if (!profiling_) return {};
  cudaStreamSynchronize(stream_);
  collect_profile();
  std::vector<std::pair<double, std::string>> order;
  double total = 0;
  for (const auto& [label, entry] : profile_) {
    order.emplace_back(entry.second, label);
    total += entry.second;
  }
  std::sort(order.rbegin(), order.rend());
  const double w = double(std::max<int64_t>(stats_.windows, 1));
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %9s %12s %10s %7s\n", "GPU time by op", "calls/win", "ms/window",
                "us/call", "share");
  out += line;
  for (const auto& [seconds, label] : order) {
    const auto& [count, s] = profile_[label];
    std::snprintf(line, sizeof line, "%-22s %9.1f %12.3f %10.2f %6.1f%%\n", label.c_str(), double(count) / w,
                  s / w * 1e3, s / double(count) * 1e6, 100.0 * s / total);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-22s %9s %12.3f\n", "total", "", total / w * 1e3);
  out += line;
  return out;
}

PinnedStaging::~PinnedStaging() {
  for (Chunk& c : chunks_) cudaFreeHost(c.data);
}

void* PinnedStaging::stage(const void* src, size_t n) {
  const size_t bytes = std::max<size_t>((n + 255) / 256 * 256, 256);
  while (chunk_ < chunks_.size() && offset_ + bytes > chunks_[chunk_].bytes) {
    ++chunk_;
    offset_ = 0;
  }
  if (chunk_ == chunks_.size()) {
    if (before_alloc_) before_alloc_();
    Chunk c;
    c.bytes = std::max(bytes, kStagingChunk);
    STRATA_CUDA_CHECK(cudaHostAlloc(&c.data, c.bytes, cudaHostAllocDefault));
    chunks_.push_back(c);
  }
  void* p = static_cast<uint8_t*>(chunks_[chunk_].data) + offset_;
  offset_ += bytes;
  std::memcpy(p, src, n);
  return p;
}

}  // namespace strata::compute::cuda
