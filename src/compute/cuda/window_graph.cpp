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
  mode_ = enabled_ ? Mode::Eager : Mode::Off;
  const char* stats = std::getenv("STRATA_CUDA_GRAPH_STATS");
  timing_ = enabled_ && !profiling_ && stats && std::strcmp(stats, "1") == 0;
  if (timing_) {
    STRATA_CUDA_CHECK(cudaEventCreate(&replay_start_));
    STRATA_CUDA_CHECK(cudaEventCreate(&replay_end_));
  }
}

WindowGraph::~WindowGraph() {
  abandon();
  destroy(recording_);
  for (auto& [key, program] : programs_) destroy(program);
  for (auto& [key, exec] : execs_) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (replay_start_) cudaEventDestroy(replay_start_);
  if (replay_end_) cudaEventDestroy(replay_end_);
}

void WindowGraph::collect_replay_timing() {
  if (!timing_pending_) return;
  timing_pending_ = false;
  float ms = 0;
  STRATA_CUDA_CHECK(cudaEventSynchronize(replay_end_));
  STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, replay_start_, replay_end_));
  stats_.replay_gpu_s += double(ms) * 1e-3;
  ++stats_.timed_replays;
}

void WindowGraph::destroy(Program& program) {
  for (Segment& s : program.segments)
    if (s.exec) cudaGraphExecDestroy(s.exec);
  program.segments.clear();
}

void WindowGraph::forget_programs() {
  if (programs_.empty()) return;
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // none of them may still be running
  for (auto& [key, program] : programs_) destroy(program);
  programs_.clear();
  ++stats_.forgotten;
}

void WindowGraph::drop_programs_below(int64_t tokens_bound) {
  bool synchronised = false;
  for (auto it = programs_.begin(); it != programs_.end();) {
    if (it->first.tokens_bound >= tokens_bound) {
      ++it;
      continue;
    }
    if (!synchronised) {
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // none of them may still be running
      synchronised = true;
    }
    destroy(it->second);
    it = programs_.erase(it);
  }
}

void WindowGraph::begin_window() {
  if (!enabled_) return;
  finish_window();
  if (profiling_) {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    collect_profile();
  }
  if (timing_) collect_replay_timing();
  window_begun_ = now_s();  // two clock reads a window: always (bench gpu's time split)
  mode_ = profiling_ ? Mode::Capture : Mode::Eager;
  segment_ = 0;
  rows_ = 0;
  signature_ = 0xcbf29ce484222325ull;
  ++stats_.windows;
}

void WindowGraph::finish_window() {
  if (!enabled_) return;
  switch (mode_) {
    case Mode::Record:
      end_segment(false);  // the window's end (a clean cut, like a read)
      if (recording_.clean) {
        auto it = programs_.find(key_);
        if (it != programs_.end()) destroy(it->second);
        programs_[key_] = std::move(recording_);
        ++stats_.records;
      } else {
        destroy(recording_);
      }
      recording_ = Program{};
      break;
    case Mode::Replay:
      while (replay_next_ < replay_->segments.size()) replay_segment();
      replay_ = nullptr;
      ++stats_.replays;
      if (timing_) {
        STRATA_CUDA_CHECK(cudaEventRecord(replay_end_, stream_));
        timing_pending_ = true;
      }
      break;
    case Mode::Capture:
      end_segment(false);
      break;
    case Mode::Off:
    case Mode::Eager:
      break;
  }
  mode_ = enabled_ ? Mode::Eager : Mode::Off;
}

void WindowGraph::plan(const WindowKey& key, bool replayable) {
  if (profiling_) ++profiled_rows_[key.rows];
  if (!enabled_ || profiling_) return;
  if (!replayable) {
    mode_ = Mode::Eager;
    return;
  }
  key_ = key;
  // Past the attention bound of the kept programs (it grows every 1024 tokens) the shorter
  // bounds' programs are dead: a sequence only grows, and a rollback stays inside its last window.
  if (key.tokens_bound > largest_bound_) {
    if (largest_bound_ > 0) drop_programs_below(key.tokens_bound);
    largest_bound_ = key.tokens_bound;
  }
  auto it = programs_.find(key);
  if (it != programs_.end()) {
    mode_ = Mode::Replay;
    replay_ = &it->second;
    replay_next_ = 0;
  } else {
    mode_ = Mode::Record;
    recording_ = Program{};
  }
}

void WindowGraph::ensure_capturing() {
  if ((mode_ != Mode::Record && mode_ != Mode::Capture) || capturing_) return;
  if (capture_boundary_) capture_boundary_();  // nothing forked outside the capture is joined inside it
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  capture_started_ = now_s();
}

void WindowGraph::pause(bool read) {
  switch (mode_) {
    case Mode::Replay:
      if (!read) cuda_fail("cuda backend: graph replay: a host sync point inside a replayed window (a bug)");
      replay_segment();
      return;
    case Mode::Record:
      if (!read) recording_.clean = false;  // eager work between segments: not replayable
      end_segment(read);
      if (!read) forget_programs();  // after the capture ends: it synchronises the stream
      return;
    case Mode::Capture:
      end_segment(read);
      return;
    case Mode::Eager:
      if (!read) forget_programs();
      return;
    case Mode::Off:
      return;
  }
}

void WindowGraph::end_segment(bool) {
  if (!capturing_) {
    // Record: a cut with nothing captured since the last one still marks a segment boundary,
    // so replay launches the same number of segments at the same reads.
    if (mode_ == Mode::Record) recording_.segments.push_back(Segment{nullptr, signature_});
    return;
  }
  if (capture_boundary_) capture_boundary_();
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
    size_t n_nodes = 0;
    STRATA_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n_nodes));
    if (mode_ == Mode::Capture) {
      if (n_nodes > 0) launch_profiled(graph);
    } else {
      Segment segment{nullptr, signature_};
      if (n_nodes > 0) {
        segment.exec = instantiate(graph);
        stats_.nodes += int64_t(n_nodes);
        launch(segment.exec);
      }
      recording_.segments.push_back(segment);
    }
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphDestroy(graph);
  ++segment_;
}

void WindowGraph::replay_segment() {
  if (replay_next_ >= replay_->segments.size())
    cuda_fail("cuda backend: graph replay: more reads than the recorded window had (a bug)");
  if (replay_next_ == 0) {
    stats_.replay_host_before_s += now_s() - window_begun_;
    ++stats_.replays_launched;
    if (timing_) STRATA_CUDA_CHECK(cudaEventRecord(replay_start_, stream_));
  }
  const Segment& segment = replay_->segments[replay_next_++];
  if (segment.signature != signature_)
    cuda_fail("cuda backend: graph replay: the window's ops differ from the recorded window's (a bug in the "
              "replay key)");
  if (segment.exec) launch(segment.exec);
}

cudaGraphExec_t WindowGraph::instantiate(cudaGraph_t graph) {
  const double t0 = now_s();
  cudaGraphExec_t exec = nullptr;
  STRATA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  ++stats_.instantiations;
  stats_.update_s += now_s() - t0;
  return exec;
}

void WindowGraph::launch(cudaGraphExec_t exec) {
  const double t0 = now_s();
  STRATA_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  ++stats_.segments;
  stats_.launch_s += now_s() - t0;
}

void WindowGraph::launch_profiled(cudaGraph_t graph) {
  size_t n_nodes = 0;
  STRATA_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n_nodes));
  stats_.nodes += int64_t(n_nodes);
  std::vector<cudaGraphNode_t> nodes(n_nodes);
  STRATA_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n_nodes));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    STRATA_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) ++stats_.kernels;
  }
  const double t0 = now_s();
  cudaGraphExec_t& exec = execs_[{rows_, segment_}];
  if (exec) {
    // Same window shape as before: the kernels are the same, their arguments may differ.
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
  stats_.update_s += now_s() - t0;
  launch(exec);
}

void WindowGraph::abandon() {
  if (capturing_) {
    if (capture_boundary_) try {
        capture_boundary_();
      } catch (...) {
      }
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    capturing_ = false;
  }
  if (mode_ == Mode::Record) destroy(recording_);
  replay_ = nullptr;
  mode_ = enabled_ ? Mode::Eager : Mode::Off;
}

namespace {
// Nodes in the graph `stream` is capturing into; -1 where this CUDA cannot say.
int64_t captured_nodes(cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  cudaStreamCaptureStatus status{};
  cudaGraph_t graph = nullptr;
  if (cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph) != cudaSuccess || !graph) {
    cudaGetLastError();
    return -1;
  }
  size_t n = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return int64_t(n);
#else
  (void)stream;
  return -1;
#endif
}
}  // namespace

void WindowGraph::mark(const char* label) {
  if (!profiling_ || !capturing_) return;
  if (n_marks_ == events_.size()) {
    cudaEvent_t e;
    STRATA_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    labels_.push_back(nullptr);
    event_segments_.push_back(0);
    mark_nodes_.push_back(0);
  }
  mark_nodes_[n_marks_] = captured_nodes(stream_);
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
    OpProfile& op = profile_[labels_[i]];
    ++op.intervals;
    op.seconds += double(ms) * 1e-3;
    // Less the event node of mark i itself.
    if (mark_nodes_[i] >= 0 && mark_nodes_[i + 1] > mark_nodes_[i]) op.nodes += mark_nodes_[i + 1] - mark_nodes_[i] - 1;
  }
  n_marks_ = 0;
}

std::string WindowGraph::profile_table() {
  if (!profiling_) return {};
  finish_window();
  cudaStreamSynchronize(stream_);
  collect_profile();
  std::vector<std::pair<double, std::string>> order;
  double total = 0;
  for (const auto& [label, op] : profile_) {
    order.emplace_back(op.seconds, label);
    total += op.seconds;
  }
  std::sort(order.rbegin(), order.rend());
  const double w = double(std::max<int64_t>(stats_.windows, 1));
  std::string out = "profiled windows (rows x windows):";
  char line[256];
  for (const auto& [rows, n] : profiled_rows_) {
    std::snprintf(line, sizeof line, " %lld x %lld", (long long)rows, (long long)n);
    out += line;
  }
  out += "; the table's columns are per window of all of them\n";
  std::snprintf(line, sizeof line, "%-22s %9s %9s %12s %10s %7s\n", "GPU time by op", "calls/win", "nodes/call",
                "ms/window", "us/call", "share");
  out += line;
  for (const auto& [seconds, label] : order) {
    const OpProfile& op = profile_[label];
    std::snprintf(line, sizeof line, "%-22s %9.1f %9.1f %12.3f %10.2f %6.1f%%\n", label.c_str(),
                  double(op.intervals) / w, double(op.nodes) / double(op.intervals), op.seconds / w * 1e3,
                  op.seconds / double(op.intervals) * 1e6, 100.0 * op.seconds / total);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-22s %9s %9s %12.3f\n", "total", "", "", total / w * 1e3);
  out += line;
  std::snprintf(line, sizeof line, "kernel launches per window: %.1f\n", double(stats_.kernels) / w);
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
