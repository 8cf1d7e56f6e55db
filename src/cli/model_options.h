// Options shared by the commands that load a model (run, chat, serve, bench): the model path with
// the embedded default, thread count, and sampling settings; plus helpers to resolve them.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/prefill_window.h"
#include "engine/sampler.h"

namespace strata::cli {

struct ModelOptions {
  std::string model_path;  // empty = the embedded default
  int threads = 0;         // 0 = hardware concurrency
  std::string backend = "auto";  // --backend: cpu, cuda, auto
  int64_t ctx = 0;               // --ctx: the context length in tokens (0 = the model's)
  SamplerConfig sampling;
};

// with_backend: also --backend and --ctx (the commands whose sessions run on a chosen backend:
// run, chat, serve; bench and profile measure the CPU expert store and leave them out).
void add_model_options(CLI::App& cmd, ModelOptions& options, bool with_backend = true);
void add_sampling_options(CLI::App& cmd, SamplerConfig& sampling);
// The model to load: -m, else the embedded default shipped in models/ (searched next to the
// executable and in the current directory). Throws naming the paths tried.
std::string resolve_model_path(const ModelOptions& options);
int resolve_threads(const ModelOptions& options);
// The compute backend to run on: --backend as given, or for "auto" the GPU when one is usable and
// every expert can live in it (no --ram-budget expert store: GPU tiers are not built yet), else
// the CPU. Throws naming the backend when an explicit one is missing or unusable.
std::string resolve_backend(const ModelOptions& options, bool streams_experts);

// --chunk ROWS (run, profile, bench cpu): the prefill window; `rows` 0 = the backend's
// default_prefill_rows (engine/prefill_window.h: 512 rows on the CPU, 64 on CUDA).
CLI::Option* add_chunk_option(CLI::App& cmd, int& rows);

// --chunk ROWS (chat, serve): the longest prefill window, a multiple of kPrefillAlignRows (their
// state cache resumes at multiples of it, exact only in windows of such lengths:
// decode/state_cache.h); `rows` 0 = the default (default_prefill_rows; serve: 64 with
// --parallel > 1).
CLI::Option* add_cached_chunk_option(CLI::App& cmd, int& rows, bool serve);

// --cache-ram SIZE (chat, serve): the conversation state cache's RAM bound
// (decode/state_cache.h); 2G, 512M, bytes, or a share of physical memory (10%); 0 disables.
void add_cache_ram_option(CLI::App& cmd, std::string& text);
// The bound in bytes ("" = StateCache::kDefaultMaxBytes). Throws naming --cache-ram and the
// expected form.
uint64_t resolve_cache_ram(const std::string& text);

}  // namespace strata::cli
