// WindowGraph — turns the eager launches of one decode window into CUDA graph launches.
//
// Why: the eager backend issues ≈ 60 launches per layer (≈ 2900 per token on the 48-layer
// model), and each costs the host a few µs and the GPU a launch gap; a graph of the same kernels
// replays with ≈ 0.7 µs per kernel (../shared/device/README.md). The backend's ops keep launching
// on their stream exactly as before; this class captures those launches (stream capture, relaxed
// mode) and launches them as one graph when the window reaches a host sync point.
//
// How a window runs
// - begin_window() opens the window: the next op calls ensure_capturing(), which begins a
//   capture on the stream. Everything the ops enqueue (kernels, device copies, memsets, copies
//   from pinned host memory) becomes a node of the current segment's graph.
// - pause() ends the current segment: the captured graph is launched on the stream (updating
//   the executable graph kept for this (window rows, segment) in place when its topology is the
//   same, instantiating otherwise). The stream then runs eagerly: the caller may synchronize,
//   read back, allocate. The next op's ensure_capturing() starts the next segment.
//   Host sync points inside a window (first-time weight uploads, growth of state buffers, QSA's
//   over-budget block selection) are pauses; a steady decode step is one or two segments (the
//   window runner reads the trunk rows before the head on models with an MTP head).
// - Stream order is kept across segments and eager work, so a window's results do not depend on
//   where it was cut: graph replay is bitwise the eager path (tests/cuda/backend_test.cpp).
//
// Contract
// - Off unless STRATA_CUDA_GRAPH=1 (enabled = false): every call is a no-op and the backend runs
//   eagerly, as issue 15 built it. Off by default because capturing every window costs the host
//   about as much as launching eagerly (1.9 µs per node on the H200 box, plus the update; see
//   docs/bench-cuda.md): the payoff needs replay without re-capture (device-side n_past), the
//   next step of issue 20.
// - Profiling (STRATA_CUDA_PROFILE=1, implies capture): mark(label) records an event node in the
//   graph; the GPU time between consecutive marks of a segment is charged to the earlier mark's
//   label, measured on the graph running back to back (no host launch gaps). The table is
//   printed with the stats.
// - Host memory a captured copy reads must be pinned and stay unchanged until the segment has
//   run (PinnedStaging below: the backend alternates two per window and resets one only after
//   an event says the work that read it is done).
// - No allocation or free of device memory, and no synchronisation of this stream, while
//   capturing: callers pause() first (the backend's EagerScope).
// - Stats (STRATA_CUDA_GRAPH_STATS=1): printed to stderr when the backend is destroyed.
// - Not thread-safe; one per backend (one stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace strata::compute::cuda {

struct WindowGraphStats {
  int64_t windows = 0, segments = 0, instantiations = 0, updates = 0, nodes = 0;
  double capture_s = 0, update_s = 0, launch_s = 0;  // host time
};

class WindowGraph {
 public:
  WindowGraph(cudaStream_t stream, bool enabled);
  ~WindowGraph();
  WindowGraph(const WindowGraph&) = delete;
  WindowGraph& operator=(const WindowGraph&) = delete;

  bool enabled() const { return enabled_; }
  bool capturing() const { return capturing_; }
  // Launches what an earlier window left captured, then opens a new window.
  void begin_window();
  // The window's row count, part of the key of its executable graphs (set by the first op).
  void set_rows(int64_t rows) { rows_ = rows; }
  // Begins a capture segment if a window is open and none is being captured.
  void ensure_capturing();
  // Ends the current segment (if any) and launches it; the stream then runs eagerly.
  void pause();
  // Drops a broken capture (after an exception inside an op) without launching it.
  void abandon();
  const WindowGraphStats& stats() const { return stats_; }
  // Profiling only: the GPU time from here to the next mark goes to `label` (a string literal).
  void mark(const char* label);
  bool profiling() const { return profiling_; }
  // "label  calls  total ms  us/call  share" rows, largest first (profiling only).
  std::string profile_table();

 private:
  void launch_segment(cudaGraph_t graph);
  void collect_profile();  // REQUIRES: the stream is idle

  cudaStream_t stream_;
  bool enabled_;
  bool window_open_ = false, capturing_ = false;
  int64_t rows_ = 0;
  int segment_ = 0;
  double capture_started_ = 0;
  std::map<std::pair<int64_t, int>, cudaGraphExec_t> execs_;
  WindowGraphStats stats_;
  // Profiling: events recorded this window, with their labels and segments.
  bool profiling_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> labels_;
  std::vector<int> event_segments_;
  size_t n_marks_ = 0;
  std::map<std::string, std::pair<int64_t, double>> profile_;  // label → (intervals, seconds)
};

// Page-locked host memory for the host → device copies a window makes (token embeddings,
// positions, PLE rows, QSA token lists): a bump allocator over chunks that are kept, reset per
// window. Captured copies read it when the graph runs, so it must not be reused before then.
class PinnedStaging {
 public:
  // before_alloc runs before a new chunk is allocated (the backend pauses its capture there).
  explicit PinnedStaging(std::function<void()> before_alloc) : before_alloc_(std::move(before_alloc)) {}
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  // REQUIRES: no enqueued work still reads the staged bytes.
  void reset() {
    chunk_ = 0;
    offset_ = 0;
  }
  // A copy of `bytes` bytes of `src` in pinned memory, valid until the next reset().
  void* stage(const void* src, size_t bytes);

 private:
  struct Chunk {
    void* data = nullptr;
    size_t bytes = 0;
  };
  std::function<void()> before_alloc_;
  std::vector<Chunk> chunks_;
  size_t chunk_ = 0, offset_ = 0;
};

}  // namespace strata::compute::cuda
