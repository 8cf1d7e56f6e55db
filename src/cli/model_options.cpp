#include "cli/model_options.h"

#include <unistd.h>

#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <thread>

#include "backends/backend_registry.h"
#include "decode/state_cache.h"
#include "util/byte_size.h"
#include "util/error.h"

namespace strata::cli {
namespace {

constexpr const char* kDefaultModel = "models/strata-default.gguf";

std::filesystem::path executable_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path(".") : exe.parent_path();
}

}  // namespace

void add_model_options(CLI::App& cmd, ModelOptions& options, bool with_backend) {
  cmd.add_option("-m,--model", options.model_path,
                 "GGUF model (default: the embedded model, models/strata-default.gguf)");
  cmd.add_option("-t,--threads", options.threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  if (!with_backend) return;
  cmd.add_option("--backend", options.backend,
                 "compute backend: cpu, cuda (every expert in GPU memory, or --gpu-budget of them), or auto "
                 "(cuda when a GPU is usable and either no --ram-budget or a --gpu-budget is set, else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd.add_option("--ctx", options.ctx,
                 "context length in tokens (default: the model's). Every state (KV caches, "
                 "recurrent states, PLE history) is reserved for exactly this many at start and "
                 "nothing grows; a longer sequence is refused. Without it, up to 32768 tokens are "
                 "reserved and the caches grow past that")
      ->check(CLI::PositiveNumber);
}

void add_sampling_options(CLI::App& cmd, SamplerConfig& sampling) {
  cmd.add_option("--temp", sampling.temperature, "temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd.add_option("--top-k", sampling.top_k, "keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--top-p", sampling.top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--min-p", sampling.min_p, "drop tokens below min-p x the top probability")->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--repeat-penalty", sampling.repetition_penalty, "repetition penalty (1 = off)")->check(CLI::PositiveNumber);
  cmd.add_option("--repeat-last-n", sampling.repeat_last_n, "tokens the penalty looks back over")->check(CLI::NonNegativeNumber);
  cmd.add_option("--seed", sampling.seed, "sampling seed (same seed, same output)");
}

std::string resolve_model_path(const ModelOptions& options) {
  if (!options.model_path.empty()) return options.model_path;
  const std::filesystem::path candidates[] = {executable_dir() / ".." / kDefaultModel,
                                              executable_dir() / kDefaultModel,
                                              std::filesystem::path(kDefaultModel)};
  for (const auto& path : candidates)
    if (std::filesystem::exists(path)) return path.lexically_normal().string();
  fail("no -m MODEL given and the embedded default model {} was not found (looked next to the "
       "executable and in the current directory)",
       kDefaultModel);
}

std::string resolve_backend(const ModelOptions& options, bool streams_experts) {
  if (options.backend == "auto" && streams_experts) return "cpu";
  return compute::resolve_backend(options.backend);
}

CLI::Option* add_chunk_option(CLI::App& cmd, int& rows) {
  return cmd
      .add_option("--chunk", rows,
                  fmt::format("prefill window rows (default: {} on the CPU, {} on CUDA)",
                              kCpuPrefillRows, kCudaPrefillRows))
      ->check(CLI::Range(1, 4096));
}

CLI::Option* add_cached_chunk_option(CLI::App& cmd, int& rows, bool serve) {
  return cmd
      .add_option("--chunk", rows,
                  fmt::format("longest prefill window in rows, a multiple of {} (the state cache "
                              "resumes at multiples of {}; on the CPU every multiple gives the "
                              "same tokens) (default: {} on the CPU, {} on CUDA{})",
                              kPrefillAlignRows, kPrefillAlignRows, kCpuPrefillRows,
                              kCudaPrefillRows, serve ? " and with --parallel > 1" : ""))
      ->check(CLI::Range(kPrefillAlignRows, 4096) &
              CLI::Validator(
                  [](std::string& text) -> std::string {
                    int value = 0;
                    const auto [end, error] =
                        std::from_chars(text.data(), text.data() + text.size(), value);
                    if (error != std::errc() || end != text.data() + text.size()) return {};
                    if (value % kPrefillAlignRows == 0) return {};  // (Range names the rest)
                    return fmt::format("expected a multiple of {}, found {}", kPrefillAlignRows,
                                       text);
                  },
                  fmt::format("MULTIPLE OF {}", kPrefillAlignRows)));
}

int resolve_threads(const ModelOptions& options) {
  if (options.threads > 0) return options.threads;
  return std::max(1, int(std::thread::hardware_concurrency()));
}

void add_cache_ram_option(CLI::App& cmd, std::string& text) {
  cmd.add_option("--cache-ram", text,
                 "RAM for cached conversation states (KV, DeltaNet, PLE, MTP) that later prompts "
                 "continue from, e.g. 2G, 512M, 10% of memory; 0 disables (default 4G)");
}

uint64_t resolve_cache_ram(const std::string& text) {
  if (text.empty()) return StateCache::kDefaultMaxBytes;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const uint64_t physical = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  return parse_byte_size(text, physical, "--cache-ram");
}

}  // namespace strata::cli
