// DashboardSnapshot and DashboardHub — what the web dashboard (GET /, GET /api/dashboard) shows
// about the engine: the experts' routing heat and residency per tier, the ExpertStore's counters,
// the time split of the engine's windows, the running generation, SpecGate and MoCE.
//
// Threads (the rule this file exists for): the engine thread (the scheduler's worker, which runs
// every forward) owns the ExpertStore, the SpecGate and the DashboardRecorder's counters. It alone
// reads them, builds a complete, immutable DashboardSnapshot at fixed points (a generation's start
// and end, after prefill chunks, after tokens at most every kPublishInterval) and publishes it
// with one pointer swap under the hub's mutex. HTTP threads only ever take the latest published
// snapshot (a shared_ptr to const data) and serialize it; they never see the live structures, so
// nothing the engine does is ever read half-updated and no engine lock is held while a slow
// client is written to.
//
// The JSON form is documented in docs/serve.md ("Dashboard data") and, as a JSON Schema, in
// docs/serve-dashboard.schema.json; /metrics takes its strata_expert_* counters from the same
// latest snapshot, so the two always agree.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "experts/expert_store.h"
#include "route/moce.h"
#include "util/phase_timer.h"

namespace strata::serve {

// Residency codes, one character per (block, expert) in DashboardSnapshot::residency.
inline constexpr char kResidencySsd = 's';     // only in the sidecar on disk
inline constexpr char kResidencyRam = 'r';     // in the RAM arena (a read in flight counts)
inline constexpr char kResidencyPinned = 'p';  // in the RAM arena, pinned (fill or prompt-hot)
inline constexpr char kResidencyGpu = 'g';     // in the GPU arena (no CUDA backend yet: unused)
inline constexpr char kResidencyMapped = 'm';  // read through the GGUF mapping (no store)
inline constexpr char kResidencyNone = '-';    // the block has no routed experts

// Set once at start: the model's shape, the budgets and where the bytes live.
struct DashboardStatic {
  std::string model_id, model_path, arch;
  int n_layer = 0, n_nextn = 0, n_expert = 0, n_expert_used = 0;
  int64_t n_embd = 0, n_vocab = 0, n_ctx = 0, n_ff_exp = 0, n_ff_shexp = 0;
  uint64_t file_bytes = 0;    // the GGUF
  uint64_t expert_bytes = 0;  // routed experts, all blocks (sidecar records, padding included)
  uint64_t dense_bytes = 0;   // file_bytes - the experts' tensor bytes: mapped, stays in RAM
  struct Block {
    bool present = false;  // has routed experts
    bool mtp = false;      // the MTP (nextn) block after the trunk
    uint64_t record_bytes = 0;
  };
  std::vector<Block> blocks;  // [n_block]: trunk then MTP
  // Placement.
  bool store = false;  // true: the ExpertStore (RAM arena <- SSD sidecar); false: the mapping
  uint64_t ram_arena_bytes = 0;
  int slots_per_layer = 0;
  std::string sidecar_path;  // the file routed experts stream from (the sidecar or the GGUF)
  uint64_t sidecar_bytes = 0;
  bool direct_io = false, io_uring = false, read_ahead = false;
  // The GPU tier waits for the CUDA backend; its budget is 0 until then.
  uint64_t gpu_arena_bytes = 0;
  double heat_decay_per_row = 0;
  bool profile = false;   // phases measured (strata serve --profile, on by default)
  std::string spec_mode;  // "off", "mtp", "suffix", "both"
  double moce_lambda = 0;
};

struct DashboardGeneration {
  uint64_t id = 0;  // 0: none yet; then 1, 2, ... in the order generations ran
  bool running = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double queue_wait_ms = 0;
  double ttft_ms = -1;  // request received -> first token sampled; -1 before it
  double prefill_ms = 0;
  double decode_ms = 0;       // after the first token
  std::string finish_reason;  // "" while running; stop, length, cancelled, error
};

struct DashboardSpec {
  uint64_t windows = 0;   // decode windows: plain steps and verifies
  uint64_t verifies = 0;  // windows that carried drafts
  uint64_t drafted = 0, accepted = 0;
  int last_depth = 0;                  // drafts in the last window (SpecGate's pick)
  std::vector<uint64_t> depth_counts;  // [k]: windows with k drafts
  uint64_t forced_plain = 0, declined = 0;
};

struct DashboardSnapshot {
  uint64_t version = 0;  // set by DashboardHub::publish: 1, 2, ...
  int64_t time_unix_ms = 0;
  double uptime_s = 0;
  std::shared_ptr<const DashboardStatic> fixed;
  std::vector<float> heat;             // [n_block * n_expert], decayed routing counts
  std::string residency;               // [n_block * n_expert], kResidency* codes
  uint64_t rows_routed = 0;            // window rows through the trunk (prefill, decode, verify)
  uint64_t expert_bytes_computed = 0;  // Σ record bytes of every expert a layer used
  // Of those, the ones already in RAM when the layer asked (the store's hits; through the mapping
  // every expert counts) and their record bytes.
  uint64_t ram_hit_count = 0, ram_hit_bytes = 0;
  double busy_ms = 0;                       // engine time inside generations
  PhaseTimes phases;                        // cumulative (when fixed->profile)
  std::optional<ExpertStoreStats> experts;  // with a store
  std::optional<MoceStats> moce;            // with --moce
  DashboardGeneration generation;           // the running or the last generation
  std::optional<DashboardSpec> spec;        // with --spec

  // The JSON object (docs/serve.md), without the "server" member that the route appends from the
  // live ServeMetrics. Built on first use, once, by whichever thread asks first.
  const std::string& json() const;

 private:
  mutable std::once_flag json_once_;
  mutable std::string json_;
};

class DashboardHub {
 public:
  DashboardHub();
  // Engine thread (or before it starts). Stamps the version.
  void publish(std::shared_ptr<DashboardSnapshot> snapshot);
  // Any thread. Never null once the first snapshot was published (HttpServer does so at start).
  std::shared_ptr<const DashboardSnapshot> latest() const;
  // Any thread: waits until a snapshot newer than `version` exists, close() is called or
  // `timeout` passes; returns the latest.
  std::shared_ptr<const DashboardSnapshot> wait_newer(uint64_t version,
                                                      std::chrono::milliseconds timeout) const;
  // Wakes every waiter for good (shutdown), so event streams can end.
  void close();
  bool closed() const;

 private:
  mutable std::mutex mutex_;  // guards latest_, closed_
  mutable std::condition_variable changed_;
  std::shared_ptr<const DashboardSnapshot> latest_;
  bool closed_ = false;
  const std::chrono::steady_clock::time_point started_;
};

}  // namespace strata::serve
