// Options shared by the commands that stream experts (run, chat, serve, bench, profile): where
// routed experts come from and how much RAM they may use, and the helper that builds the store.
//
// Without --ram-budget/--slots-per-layer: when MODEL.gguf.experts exists, experts stream from it
// with a budget of all expert bytes if they fit in half the available RAM, else that half; when it
// does not, experts are read through the GGUF mapping (like llama.cpp's mmap) and a note says how
// to pack if the experts are larger than RAM. With a budget, the sidecar is required (--pack
// builds it when missing or stale).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "experts/expert_store.h"
#include "model/model.h"
#include "route/routing_trace.h"

namespace strata::cli {

struct ExpertOptions {
  std::string ram_budget;  // BYTES or PCT of the expert bytes; empty = automatic
  int slots_per_layer = 0;
  int io_threads = 4;
  bool no_read_ahead = false;
  bool no_direct_io = false;
  std::string io_backend = "uring";  // uring (when the kernel allows) | pread
  bool pack = false;       // build/rebuild the sidecar when missing or stale
  bool mapped = false;     // force the GGUF mapping (no store)
  std::string fill_profile;
  int pin = 0;
  std::string trace_routing;  // write a routing trace here (route/routing_trace.h)
  bool quiet = false;
};

void add_expert_options(CLI::App& cmd, ExpertOptions& options);

// The store the options ask for, or nullptr for the GGUF mapping. Prints one line describing it.
std::unique_ptr<ExpertStore> open_expert_store(const Model& model, const std::string& model_path,
                                               const ExpertOptions& options);

// With --trace-routing: a TracingSource over `store` (the GGUF mapping when null) that writes the
// trace when destroyed; else nullptr. The session then uses it instead of the store.
std::unique_ptr<TracingSource> open_routing_trace(const Model& model, ExpertStore* store,
                                                  const ExpertOptions& options);

// One summary line of the store's counters ("experts: hit 93.1% ...").
std::string format_expert_stats(const ExpertStoreStats& stats, double tokens);

}  // namespace strata::cli
