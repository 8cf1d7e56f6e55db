// Options shared by the commands that load a model (run, chat, serve, bench): the model path with
// the embedded default, thread count, and sampling settings; plus helpers to resolve them.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

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

// The prefill window of a one-shot prompt (run, bench cpu, profile) when --chunk is not given:
// 512 rows on the CPU, where a 512-expert layer gives each routed expert ~10 rows of the window
// (~1 of a 64-row one), so the grouped expert kernels decode its weights once for many rows
// (docs/bench-cpu-scaling.md, session 46: the 48 x 512 file's 512-token prompt 1.65x faster
// than in 64-row windows at 2 threads, the same greedy tokens; llama.cpp's batch is 512 too).
// 64 on CUDA, whose prefill is measured at 64 (docs/bench-cuda.md). chat and serve keep 64
// (kPrefillChunk): their state cache resumes at multiples of its window.
inline constexpr int kCpuPrefillRows = 512;
inline constexpr int kCudaPrefillRows = 64;
int default_prefill_rows(const std::string& backend);
// --chunk ROWS (run, profile, bench cpu): `rows` 0 = default_prefill_rows of the backend.
CLI::Option* add_chunk_option(CLI::App& cmd, int& rows);

// --cache-ram SIZE (chat, serve): the conversation state cache's RAM bound
// (decode/state_cache.h); 2G, 512M, bytes, or a share of physical memory (10%); 0 disables.
void add_cache_ram_option(CLI::App& cmd, std::string& text);
// The bound in bytes ("" = StateCache::kDefaultMaxBytes). Throws naming --cache-ram and the
// expected form.
uint64_t resolve_cache_ram(const std::string& text);

}  // namespace strata::cli
