// WindowGraph — runs a decode window as CUDA graph launches instead of eager kernel launches.
//
// Why: the eager backend issues ≈ 60 launches per layer (≈ 2900 per token on the 48-layer
// model); each costs the host ≈ 4 µs, more than the GPU spends on most of them, so eager decode
// is host-bound. A window of the same shape as an earlier one — same rows, same recorded flag,
// same logit rows, same attention bound, same QSA layers selecting, no state growth — launches
// the same kernels with the same arguments: everything that changes from token to token (token
// rows, positions, n_past, PLE rows; QSA's completed blocks and selections follow from n_past on
// the device) is read from device memory that a
// captured copy fills from pinned staging. Such a window is recorded once as graphs and then
// replayed: the ops only do their host bookkeeping and stage their inputs, and each `read`
// launches the next recorded graph.
//
// Modes of a window (plan(), called by the backend's describe_window before the first op)
// - Off (STRATA_CUDA_GRAPH=0): every call is a no-op; the backend is eager. On otherwise.
// - Eager: graphs on, but this window is not replayable (state growth, first windows): it runs
//   eagerly.
// - Record: replayable and no program for its key yet: the ops' launches are captured (stream
//   capture, relaxed mode) into segments cut at each `read` (and at the window's end); each
//   segment is instantiated and launched at once. A program is kept only if no other host sync
//   point (the backend's EagerScope: an allocation, a first upload) cut the window.
// - Replay: a program exists: ops skip their launches, and pause(read) launches the next segment.
// - Any other host sync point (an allocation: KV or log growth, new launch tables) drops every
//   recorded program, since they may name the buffers being replaced; later windows re-record.
// - Capture (STRATA_CUDA_PROFILE=1): every window captured, launched as graphs updated in place,
//   with event nodes between ops (mark()): the GPU time per op of kernels running back to back.
//
// Guarding replay: every op mixes its host arguments (op, rows, layer, tensor handles, flags)
// into a signature (sign()); a program stores the signature at each segment's end, and replay
// compares before launching a segment. A mismatch means the key missed something that changes
// the launches: the window's ops have already been skipped, so it is reported as a bug
// (strata::Error) rather than silently computing something else.
// Exactness: the same kernels with the same arguments in the same order, so replay, recording
// and eager give bitwise the same results (tests/cuda/backend_test.cpp).
//
// Contract
// - Host memory a captured copy reads must be pinned and unchanged until the segment has run
//   (PinnedStaging below: the backend alternates two per window, a replayed window uses the one
//   its program was recorded with, each reset only after an event says its readers are done).
// - No device allocation, free or stream synchronisation while capturing: callers pause() first.
// - Work forked onto another stream (the GPU expert tier's read-ahead branch) must not cross a
//   capture boundary: an unjoined branch cannot be captured, and a branch forked outside a capture
//   cannot be joined inside it. The backend's hook (set_capture_boundary) joins it at both.
// - Stats (STRATA_CUDA_GRAPH_STATS=1): printed to stderr when the backend is destroyed.
// - Not thread-safe; one per backend (one stream).
#pragma once

#include <cuda_runtime_api.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace strata::compute::cuda {

struct WindowGraphStats {
  int64_t windows = 0, replays = 0, records = 0, segments = 0, instantiations = 0, updates = 0, nodes = 0;
  int64_t forgotten = 0;  // times the recorded programs were dropped (a buffer was replaced)
  int64_t kernels = 0;    // kernel nodes of the profiled windows' graphs (Capture mode only)
  // Replayed windows: host time from begin_window to the first segment's launch (the ops'
  // bookkeeping, which the GPU waits for; always counted: two clock reads a window), and, timed
  // with events under STRATA_CUDA_GRAPH_STATS=1, GPU time from just before that launch to the end
  // of the window's last segment (idle gaps between segments, while the host reads and launches
  // the next, included).
  double replay_host_before_s = 0;
  int64_t replays_launched = 0;  // the replayed windows it sums (their first segment launched)
  int64_t timed_replays = 0;
  double replay_gpu_s = 0;
  double capture_s = 0, update_s = 0, launch_s = 0;  // host time
};

// What makes two windows launch the same kernels with the same arguments.
struct WindowKey {
  int64_t rows = 0;
  bool record = false;
  int logit_rows = 0;
  int64_t tokens_bound = 0;  // the attention kernels' shared-memory bound
  int staging = 0;           // the pinned staging buffer its copies read
  int qsa_selecting = 0;      // QSA layers selecting blocks (their last row over budget)
  auto operator<=>(const WindowKey&) const = default;
};

class WindowGraph {
 public:
  WindowGraph(cudaStream_t stream, bool enabled);
  ~WindowGraph();
  WindowGraph(const WindowGraph&) = delete;
  WindowGraph& operator=(const WindowGraph&) = delete;

  bool enabled() const { return enabled_; }
  bool capturing() const { return capturing_; }
  bool replaying() const { return mode_ == Mode::Replay; }
  bool profiling() const { return profiling_; }

  // Finishes the previous window (launches what it left captured, or the rest of its replayed
  // program; keeps a recorded program that completed cleanly) and opens a new one, eager until
  // plan() says otherwise (profiling: captured).
  void begin_window();
  // How this window runs (see the modes above). A program recorded for `key` is replayed when
  // `replayable`; without one, the window records it.
  void plan(const WindowKey& key, bool replayable);
  // Whether a program for `key` exists (the backend picks the staging buffer by it).
  bool has_program(const WindowKey& key) const { return programs_.count(key) > 0; }
  // The window's row count, part of the profiling capture's key (set by the first op).
  void set_rows(int64_t rows) { rows_ = rows; }
  // Begins a capture segment if this window captures and none is being captured.
  void ensure_capturing();
  // A host sync point. `read`: the window's results are read next (in replay, the next recorded
  // segment is launched); otherwise an eager section inside an op (a recording is then dropped;
  // in replay this is a bug and throws).
  void pause(bool read);
  // Mixes one host argument of an op into the window's signature.
  void sign(uint64_t value) { signature_ = (signature_ ^ value) * 0x100000001b3ull; }
  // Launches what the window left captured (or the rest of its replayed program) and keeps a
  // clean recording; the stream then runs eagerly until the next begin_window.
  void finish_window();
  // Drops a broken capture (after an exception inside an op) without launching it.
  void abandon();
  // Runs just before every capture segment begins and ends (the backend joins side branches).
  void set_capture_boundary(std::function<void()> hook) { capture_boundary_ = std::move(hook); }
  const WindowGraphStats& stats() const { return stats_; }
  // Profiling only: the GPU time from here to the next mark goes to `label` (a string literal).
  void mark(const char* label);
  // "label  calls  nodes  ms/window  us/call  share" rows, largest first, and the kernel launches
  // per window (profiling only), under a heading that gives the windows profiled and their rows
  // (a backend that ran a prompt and its decode prints one table for both: 64 rows + 1 row ...).
  // `nodes`: graph nodes captured per call of the op (kernels, copies, memsets, side branches'
  // events), counted where CUDA reports the capture's graph.
  std::string profile_table();

 private:
  enum class Mode { Off, Eager, Record, Replay, Capture };
  struct Segment {
    cudaGraphExec_t exec = nullptr;  // null: nothing was captured
    uint64_t signature = 0;          // the window's signature at the segment's end
  };
  struct Program {
    std::vector<Segment> segments;
    bool clean = true;
  };

  // Host sync points inside an op allocate or replace device buffers (state growth, new launch
  // tables): the recorded programs may name the old ones, so all of them are dropped there.
  void forget_programs();
  // Drops the programs recorded for attention bounds below `tokens_bound`.
  void drop_programs_below(int64_t tokens_bound);
  void end_segment(bool read);
  cudaGraphExec_t instantiate(cudaGraph_t graph);
  void launch(cudaGraphExec_t exec);
  void launch_profiled(cudaGraph_t graph);
  void replay_segment();
  void collect_profile();  // REQUIRES: the stream is idle
  static void destroy(Program& program);

  cudaStream_t stream_;
  bool enabled_;
  std::function<void()> capture_boundary_;
  Mode mode_ = Mode::Off;
  bool capturing_ = false;
  int64_t rows_ = 0;
  int segment_ = 0;
  uint64_t signature_ = 0;
  double capture_started_ = 0;
  WindowKey key_;
  int64_t largest_bound_ = 0;  // the largest attention bound planned so far
  Program recording_;
  std::map<WindowKey, Program> programs_;
  const Program* replay_ = nullptr;
  size_t replay_next_ = 0;
  // Capture mode (profiling): executable graphs per (rows, segment), updated in place.
  std::map<std::pair<int64_t, int>, cudaGraphExec_t> execs_;
  WindowGraphStats stats_;
  // Profiling: events recorded this window, with their labels and segments.
  bool profiling_ = false;
  // Replay timing: the host part always, the GPU part with STRATA_CUDA_GRAPH_STATS=1 (timing_).
  bool timing_ = false, timing_pending_ = false;
  double window_begun_ = 0;
  cudaEvent_t replay_start_ = nullptr, replay_end_ = nullptr;
  void collect_replay_timing();
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> labels_;
  std::vector<int> event_segments_;
  std::vector<int64_t> mark_nodes_;  // the capture graph's node count when each mark was made
  size_t n_marks_ = 0;
  struct OpProfile {
    int64_t intervals = 0, nodes = 0;
    double seconds = 0;
  };
  std::map<std::string, OpProfile> profile_;  // label → totals
  std::map<int64_t, int64_t> profiled_rows_;  // rows a window → windows profiled with them
};

// Page-locked host memory for the host → device copies a window makes (token embeddings,
// positions, n_past, PLE rows, QSA token lists): a bump allocator over chunks that are kept,
// reset per window. Captured copies read it when the graph runs, so it must not be reused before
// then; the same sequence of stage() calls after a reset returns the same addresses, which is
// what lets a replayed graph's copies find this window's inputs.
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
