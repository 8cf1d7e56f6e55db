// Options shared by the commands that stream experts (run, chat, serve, bench, profile): where
// routed experts come from and how much RAM they may use, and the helper that builds the store.
//
// Where streamed experts are read (--experts-from): auto = straight from the GGUF, or from the
// sidecar MODEL.gguf.experts with --pack (which builds it when missing or stale); gguf; sidecar
// (required then). An existing sidecar that auto does not use gets a note (the sidecar measured no
// faster here: docs/expert-store.md).
// Without --ram-budget/--slots-per-layer: with --pack or --experts-from, or with experts larger
// than half the available RAM, experts stream with a budget of all expert bytes if they fit in
// half the available RAM, else that half (a note says so); otherwise they are read through the
// GGUF mapping (like llama.cpp's mmap). With a budget (or --usage/--pin-hot/--moce) they always
// stream.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "experts/expert_store.h"
#include "model/model.h"
#include "route/routing_trace.h"

namespace strata::compute {
class Backend;
}

namespace strata::cli {

struct ExpertOptions {
  std::string ram_budget;  // BYTES or PCT of the expert bytes; empty = automatic
  int slots_per_layer = 0;
  int io_threads = 4;
  bool no_read_ahead = false;
  bool no_direct_io = false;
  std::string io_backend = "uring";  // uring (when the kernel allows) | pread
  std::string experts_from = "auto";  // auto | gguf | sidecar
  bool pack = false;       // build/rebuild the sidecar when missing or stale
  bool mapped = false;     // force the GGUF mapping (no store)
  bool mapped_weights = false;  // --mapped-weights: no resident copy (gguf/resident_weights.h)
  std::string fill_profile;
  int pin = 0;
  std::string trace_routing;  // write a routing trace here (route/routing_trace.h)
  // Usage history (experts/usage_history.h): "" = off, "auto" = MODEL.usage, else a path.
  std::string usage;
  double usage_alpha = 0.5;
  uint64_t usage_save_every = 512;  // chat: save while idle once this many tokens passed
  // Prompt-hot pins (ExpertStore::pin_prompt_hot), after each prompt's prefill.
  int pin_hot = 0;
  int repin_swaps = 2;
  double repin_hysteresis = 0.25;
  // MoCE (route/moce.h): lambda 0 = off.
  // GPU expert tier (compute/expert_tier.h), with --backend cuda: "" = every expert in VRAM.
  std::string gpu_budget;
  int gpu_slots_per_layer = 0;
  double moce_lambda = 0.0;
  int moce_protect = 1;
  int moce_max_rank = 0;
  int moce_sample_every = 8;
  bool quiet = false;
};

void add_expert_options(CLI::App& cmd, ExpertOptions& options);

// The store's settings the options ask for (threads, read-ahead, O_DIRECT, io_uring, slots).
ExpertStoreOptions store_options(const ExpertOptions& options);
// The reader for `source` (auto | gguf | sidecar, as --experts-from): validates the sidecar, or
// builds it with --pack. `gguf_layout`: SidecarLayout::for_gguf of the model when the caller has it
// already (it hashes the model's identity, 0.24 s on the flagship). Throws strata::Error naming the sidecar when it is missing or stale.
std::unique_ptr<ExpertReader> open_expert_reader(const Model& model, const std::string& model_path,
                                                 const ExpertOptions& options, const std::string& source,
                                                 const SidecarLayout* gguf_layout = nullptr);
// The store the options ask for, or nullptr for the GGUF mapping. Prints one line describing it.
// Also sets the model's GPU expert tier from --gpu-budget / --gpu-slots-per-layer (configure_gpu_tier).
std::unique_ptr<ExpertStore> open_expert_store(const Model& model, const std::string& model_path,
                                               const ExpertOptions& options);

// On the CPU backend, copies the weights every token reads into huge-page memory at their mapped
// addresses (gguf/resident_weights.h): the dense tensors, and the routed experts too when `store` is
// null (they are read through the mapping). Nothing on another backend (its weights live in device
// memory) or with --mapped-weights. Shows progress on a terminal and prints one line unless quiet.
// Call it after open_expert_store and before the first session runs.
void place_resident_weights(const Model& model, const ExpertStore* store, const std::string& backend,
                            const ExpertOptions& options);

// model.backend_shared().gpu_tier from the options (before the model's first GPU sequence).
void configure_gpu_tier(const Model& model, const ExpertOptions& options);
// Whether the options ask for a GPU expert tier (then --backend auto means cuda even with a store).
inline bool wants_gpu_tier(const ExpertOptions& o) { return !o.gpu_budget.empty() || o.gpu_slots_per_layer > 0; }
// Throws strata::Error when --gpu-budget / --gpu-slots-per-layer is given but the session's
// backend is not cuda (they would be ignored silently otherwise).
void check_gpu_tier_backend(const ExpertOptions& options, const std::string& backend);

// With --trace-routing: a TracingSource over `store` (the GGUF mapping when null) that writes the
// trace when destroyed; else nullptr. The session then uses it instead of the store.
std::unique_ptr<TracingSource> open_routing_trace(const Model& model, ExpertStore* store,
                                                  const ExpertOptions& options);

// One summary line of the store's counters ("experts: hit 93.1% ...").
std::string format_expert_stats(const ExpertStoreStats& stats, double tokens);
// One line of the GPU expert tier's counters ("gpu experts: hit 84.1% ..."), or "" for a backend
// without one (or a build without CUDA).
std::string format_gpu_tier_stats(const compute::Backend& backend, double tokens);
// One line of the CPU router's MoCE telemetry ("moce: 0.42 swaps/token ..."), or "" when MoCE is
// off or routed nothing on the CPU (under --backend cuda the "gpu experts:" line carries it).
std::string format_moce_stats(ExpertStore* store, double tokens);

// Around a prompt's prefill: count its routing, then pin its hottest experts (--pin-hot) in the
// RAM arena (store) and, under --gpu-budget, in the GPU arena of the sequence's backend (either
// may be null). Call end_prompt between windows (after the prefill's logits were read).
void begin_prompt(ExpertStore* store, compute::Backend* backend);
// Returns the number of pins added or dropped in both arenas (0 without --pin-hot).
int end_prompt(ExpertStore* store, compute::Backend* backend, const ExpertOptions& options);
// Writes the usage history (if any); a failure is a warning, never fatal. With `only_if_due`,
// only once --usage-save-every tokens have passed since the last save.
void save_usage(ExpertStore* store, const ExpertOptions& options, bool only_if_due = false);

}  // namespace strata::cli
