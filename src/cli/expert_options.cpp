#include "cli/expert_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>

#include "experts/gguf_reader.h"
#include "experts/profile.h"
#include "experts/sidecar_reader.h"
#include "experts/usage_history.h"
#include "gguf/mapping_advice.h"
#include "gguf/resident_weights.h"
#include "route/moce.h"
#ifdef STRATA_HAVE_CUDA
#include "compute/cuda/cuda_backend.h"
#endif
#include "util/byte_size.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {
namespace {

// A usage history shorter than this is not trusted for the fill or the hot pins (a few replies).
constexpr uint64_t kMinHistoryTokens = 256;

uint64_t mem_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

void pack_with_progress(const GgufFile& gguf, const std::string& sidecar_path) {
  ProgressBar bar("pack", 0, SidecarLayout::for_gguf(gguf).total_expert_bytes());
  uint64_t reported = 0;
  pack_sidecar(gguf, sidecar_path, [&](uint64_t done, uint64_t) {
    bar.advance(0, done - reported);
    reported = done;
  });
  bar.finish();
}

}  // namespace

void add_expert_options(CLI::App& cmd, ExpertOptions& o) {
  cmd.add_option("--ram-budget", o.ram_budget,
                 "RAM for routed experts: bytes (8G, 512M) or a share of the expert bytes (25%)");
  cmd.add_option("--slots-per-layer", o.slots_per_layer, "expert cache slots per layer (overrides --ram-budget)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--io-threads", o.io_threads, "expert reader threads")->check(CLI::Range(1, 256));
  cmd.add_flag("--no-read-ahead", o.no_read_ahead, "do not predict and prefetch the next layer's experts");
  cmd.add_option("--gpu-budget", o.gpu_budget,
                 "with --backend cuda: GPU memory for routed experts, bytes (8G) or a share of the expert bytes "
                 "(25%); the rest stays in RAM (--ram-budget) or on disk and is copied in per layer as routed. "
                 "Default: every expert in GPU memory");
  cmd.add_option("--gpu-slots-per-layer", o.gpu_slots_per_layer,
                 "with --backend cuda: exactly this many GPU expert slots per layer (overrides --gpu-budget)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_flag("--no-direct-io", o.no_direct_io, "read experts through the page cache");
  cmd.add_option("--io-backend", o.io_backend, "expert reads: uring (io_uring when available) or pread")
      ->check(CLI::IsMember({"uring", "pread"}));
  cmd.add_option("--experts-from", o.experts_from,
                 "where streamed experts are read: auto (the GGUF, or the sidecar with --pack), gguf (the model "
                 "file itself, no second copy), sidecar (MODEL.experts, `strata pack`)")
      ->check(CLI::IsMember({"auto", "gguf", "sidecar"}));
  cmd.add_flag("--pack", o.pack, "build MODEL.experts first when it is missing or stale (and stream from it)");
  cmd.add_flag("--mapped-experts", o.mapped, "read experts through the GGUF mapping (no store)");
  cmd.add_flag("--mapped-weights", o.mapped_weights,
               "CPU: read the weights through the file mapping (4 KiB pages, faulted in on first use) instead "
               "of copying them into huge-page memory at start (faster start, slower tokens)");
  cmd.add_option("--fill", o.fill_profile, "expert profile (strata profile) to fill the cache from at start");
  cmd.add_option("--pin", o.pin, "with --fill or --usage: pin this many top experts per layer")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--usage", o.usage,
                 "usage history: 'auto' (MODEL.usage) or a file; ranks the startup fill and hot pins, "
                 "saved at exit");
  cmd.add_option("--usage-alpha", o.usage_alpha, "weight of the usage history vs the profile/prompt (0..1)")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--usage-save-every", o.usage_save_every, "chat: save the usage history when idle after N tokens")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--pin-hot", o.pin_hot, "pin the N experts per layer each prompt uses most (at most half the slots)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--repin-swaps", o.repin_swaps, "hot pins changed per layer per prompt at most")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--repin-hysteresis", o.repin_hysteresis,
                 "a new hot expert replaces a pinned one only when it scores (1 + H) times higher")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--moce", o.moce_lambda,
                 "cache-aware routing (changes tokens): boost resident experts' probability by (1 + LAMBDA)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--moce-protect", o.moce_protect, "MoCE: the first R ranks are always the true ones")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--moce-max-rank", o.moce_max_rank, "MoCE: substitutes only from the true top-M (0 = any)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--moce-sample", o.moce_sample_every,
                 "MoCE: measure the output error vs exact routing on every N-th window per layer (0 = never)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--trace-routing", o.trace_routing,
                 "record each layer's routing and read-ahead predictions to FILE (for strata replay)");
}

ExpertStoreOptions store_options(const ExpertOptions& o) {
  ExpertStoreOptions so;
  so.slots_per_layer = o.slots_per_layer;
  so.io_threads = o.io_threads;
  so.urgent_only_threads = o.io_threads > 1 ? 1 : 0;
  so.read_ahead = !o.no_read_ahead;
  so.direct_io = !o.no_direct_io;
  so.io_uring = o.io_backend == "uring";
  return so;
}

std::unique_ptr<ExpertReader> open_expert_reader(const Model& model, const std::string& model_path,
                                                 const ExpertOptions& o, const std::string& source,
                                                 const SidecarLayout* gguf_layout) {
  const ExpertStoreOptions so = store_options(o);
  const ReadOptions read{so.direct_io, so.io_uring, so.split_bytes};
  const std::string sidecar_path = sidecar_path_for(model_path);
  const bool exists = std::filesystem::exists(sidecar_path);
  // auto = the GGUF: the sidecar measured no faster on this project's disk (docs/expert-store.md),
  // so it is read only when asked for (--experts-from sidecar, or --pack).
  if (source == "gguf" || (source == "auto" && !o.pack)) {
    if (exists && source == "auto" && !o.quiet)
      fmt::print(stderr,
                 "strata: note: {} is not used: experts stream from the GGUF itself (--experts-from sidecar "
                 "reads it; deleting it frees {})\n",
                 sidecar_path, format_bytes(std::filesystem::file_size(sidecar_path)));
    return std::make_unique<GgufExpertReader>(model.file(), read, gguf_layout);
  }
  if (!exists && !o.pack)
    fail("{} is missing (--experts-from sidecar). Build it with `strata pack {}` (or add --pack), or stream "
         "from the GGUF itself with --experts-from gguf",
         sidecar_path, model_path);
  std::optional<Sidecar> sidecar;
  if (exists) {
    try {
      sidecar.emplace(Sidecar::open(sidecar_path, model.file()));
    } catch (const Error& e) {
      if (!o.pack)
        fail("{}\n(or delete it, or add --experts-from gguf, to stream experts from the GGUF itself)", e.what());
      fmt::print(stderr, "strata: {}\nstrata: rebuilding it (--pack)\n", e.what());
    }
  }
  if (!sidecar) {
    pack_with_progress(model.file(), sidecar_path);
    sidecar.emplace(Sidecar::open(sidecar_path, model.file()));
  }
  return std::make_unique<SidecarReader>(std::move(*sidecar), read);
}

void configure_gpu_tier(const Model& model, const ExpertOptions& o) {
  compute::GpuTierOptions& tier = model.backend_shared().gpu_tier;
  tier = compute::GpuTierOptions{};
  tier.read_ahead = !o.no_read_ahead;
  if (!wants_gpu_tier(o)) return;
  tier.layers = model.expert_layouts();
  tier.slots_per_layer = o.gpu_slots_per_layer;
  tier.moce_lambda = o.moce_lambda;
  tier.moce_protect = o.moce_protect;
  tier.moce_max_rank = o.moce_max_rank;
  if (!o.gpu_budget.empty() && o.gpu_slots_per_layer == 0) {
    tier.budget_bytes = parse_byte_size(o.gpu_budget, tier.all_expert_bytes(model.hparams().n_expert), "--gpu-budget");
    tier.budget_flag = "--gpu-budget " + o.gpu_budget;
  } else {
    tier.budget_flag = fmt::format("--gpu-slots-per-layer {}", o.gpu_slots_per_layer);
  }
}

void check_gpu_tier_backend(const ExpertOptions& o, const std::string& backend) {
  if (wants_gpu_tier(o) && backend != "cuda")
    fail("--gpu-budget and --gpu-slots-per-layer hold experts in GPU memory: they need --backend cuda and a CUDA "
         "device (this session runs on '{}')",
         backend);
  // On CUDA, MoCE reads the GPU arena's residency: with every expert in VRAM nothing can miss.
  if (o.moce_lambda > 0 && backend == "cuda" && !wants_gpu_tier(o))
    fail("--moce on --backend cuda routes against the GPU expert arena: it needs --gpu-budget or "
         "--gpu-slots-per-layer (with every expert in VRAM routing is exact)");
}

namespace {
// The startup fill of the GPU arena: the same ranking the RAM arena is filled from, its first
// `pinned` experts per layer pinned (GpuTierOptions::fill_ranking).
void set_gpu_fill(const Model& model, const ExpertOptions& o, const std::vector<std::vector<int32_t>>& ranking,
                  int pinned) {
  if (!wants_gpu_tier(o)) return;
  compute::GpuTierOptions& tier = model.backend_shared().gpu_tier;
  tier.fill_ranking = ranking;
  tier.fill_pinned = pinned;
}
}  // namespace

namespace {
// Appends to each layer's ranking the experts it lacks, in id order (the ranking stays first).
void complete_ranking(std::vector<std::vector<int32_t>>& ranking, int n_block, int n_expert) {
  ranking.resize(size_t(n_block));
  for (std::vector<int32_t>& layer : ranking) {
    std::vector<char> listed(size_t(n_expert), 0);
    for (int32_t e : layer)
      if (e >= 0 && e < n_expert) listed[size_t(e)] = 1;
    for (int32_t e = 0; e < n_expert; ++e)
      if (!listed[size_t(e)]) layer.push_back(e);
  }
}
}  // namespace

void place_resident_weights(const Model& model, const ExpertStore* store, const std::string& backend,
                            const ExpertOptions& o) {
  if (backend != "cpu" || o.mapped_weights) return;
  const GgufFile& file = model.file();
  const std::vector<ByteRange> ranges = plan_resident_weights(file, /*experts_resident=*/store == nullptr);
  uint64_t total = 0;
  for (const ByteRange& r : ranges) total += r.length;
  const auto start = std::chrono::steady_clock::now();
  ProgressBar bar("weights into RAM", 0, total);
  if (o.quiet) bar.set_enabled(false);
  uint64_t shown = 0;
  const uint64_t copied = copy_resident_weights(file, ranges, /*threads=*/0, [&](uint64_t done, uint64_t) {
    bar.advance(0, done - shown);
    shown = done;
  });
  bar.finish();
  if (!o.quiet)
    fmt::print(stderr, "strata: weights in RAM: {} of {} copied into huge-page memory in {:.2f} s{}\n",
               format_bytes(copied), format_bytes(total),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               copied < total ? " (the rest stays mapped: the system refused memory)" : "");
}

std::unique_ptr<ExpertStore> open_expert_store(const Model& model, const std::string& model_path,
                                               const ExpertOptions& o) {
  configure_gpu_tier(model, o);
  const bool budget_given = !o.ram_budget.empty() || o.slots_per_layer > 0;
  const bool store_only = !o.usage.empty() || o.pin_hot > 0 || o.moce_lambda > 0;
  if (o.mapped) {
    if (budget_given) fail("--mapped-experts cannot be combined with --ram-budget/--slots-per-layer");
    if (store_only) fail("--usage, --pin-hot and --moce need the expert store; drop --mapped-experts");
    return nullptr;
  }
  const SidecarLayout layout = SidecarLayout::for_gguf(model.file());
  const uint64_t expert_bytes = layout.total_expert_bytes();
  const uint64_t available = mem_available_bytes();
  const bool exceed_half_ram = available > 0 && expert_bytes > available / 2;
  // Through the mapping (like llama.cpp's mmap) only when nothing asks for a store and the experts
  // fit comfortably: then the page cache holds them all and reads cost nothing after the first.
  if (!budget_given && !store_only && !o.pack && o.experts_from == "auto" && !exceed_half_ram) {
    if (!o.fill_profile.empty() && wants_gpu_tier(o))  // the GPU arena's fill, from the mapping
      set_gpu_fill(model, o, ExpertProfile::load(o.fill_profile, layout.gguf_identity).ranking(), o.pin);
    return nullptr;
  }

  // Experts now come from reads, never the mapping: the mapping serves the dense tensors only. Start
  // reading them in now, so the first token's prefill finds them in the page cache.
  auto dense_prefetch = std::make_unique<DensePrefetch>(model.file());
  std::unique_ptr<ExpertReader> reader = open_expert_reader(model, model_path, o, o.experts_from, &layout);
  const uint64_t all_bytes = reader->all_experts_bytes();  // what 100% means
  ExpertStoreOptions so = store_options(o);
  if (!o.ram_budget.empty()) so.budget_bytes = parse_byte_size(o.ram_budget, all_bytes, "--ram-budget");
  else if (o.slots_per_layer == 0)
    so.budget_bytes = available > 0 ? std::min(all_bytes, available / 2) : all_bytes;
  auto store = std::make_unique<ExpertStore>(model, std::move(reader), so);
  store->attach_dense_prefetch(std::move(dense_prefetch));
  if (!budget_given && exceed_half_ram && !o.quiet)
    fmt::print(stderr,
               "strata: note: the routed experts ({}) exceed half the available RAM ({}): streaming them "
               "with a budget of that half (set it with --ram-budget)\n",
               format_bytes(expert_bytes), format_bytes(available));
  const SidecarLayout& sl = store->layout();
  std::optional<std::vector<std::vector<int32_t>>> fill_ranking;  // what the store reads at start
  std::unique_ptr<UsageHistory> history;
  if (!o.usage.empty()) {
    const std::string usage_path = o.usage == "auto" ? usage_path_for(model_path) : o.usage;
    UsageHistory::LoadResult loaded = UsageHistory::load(usage_path, sl.gguf_identity, int(sl.n_block), int(sl.n_expert));
    if (!loaded.problem.empty()) fmt::print(stderr, "strata: warning: {}\n", loaded.problem);
    if (loaded.history) {
      history = std::make_unique<UsageHistory>(std::move(*loaded.history));
      if (!o.quiet)
        fmt::print(stderr, "strata: usage history {}: {} tokens\n", usage_path, history->tokens());
    } else {
      history = std::make_unique<UsageHistory>(sl.gguf_identity, int(sl.n_block), int(sl.n_expert));
    }
    std::optional<ExpertProfile> profile;
    if (!o.fill_profile.empty()) profile = ExpertProfile::load(o.fill_profile, sl.gguf_identity);
    const bool trusted = history->tokens() >= kMinHistoryTokens;
    if (profile || trusted) {
      std::vector<std::vector<int32_t>> ranking =
          rank_experts(history.get(), profile ? &*profile : nullptr, o.usage_alpha, kMinHistoryTokens,
                       int(sl.n_block), int(sl.n_expert));
      // Pins by score first, then the last session's working set (most recent first), then the rest.
      if (trusted)
        for (size_t b = 0; b < ranking.size(); ++b) {
          const size_t n_pin = std::min(ranking[b].size(), size_t(o.pin));
          std::vector<int32_t> order(ranking[b].begin(), ranking[b].begin() + ptrdiff_t(n_pin));
          for (int32_t e : history->lru(int(b))) order.push_back(e);
          order.insert(order.end(), ranking[b].begin() + ptrdiff_t(n_pin), ranking[b].end());
          std::vector<char> seen(size_t{sl.n_expert}, 0);
          ranking[b].clear();
          for (int32_t e : order)
            if (!seen[size_t(e)]) {
              seen[size_t(e)] = 1;
              ranking[b].push_back(e);
            }
        }
      fill_ranking = ranking;
      set_gpu_fill(model, o, ranking, o.pin);
    } else if (o.pin > 0) {
      fail("--pin needs a ranking: --fill PROFILE, or a usage history of at least {} tokens", kMinHistoryTokens);
    }
    store->attach_history(std::move(history), usage_path);
  } else if (!o.fill_profile.empty()) {
    const ExpertProfile profile = ExpertProfile::load(o.fill_profile, sl.gguf_identity);
    fill_ranking = profile.ranking();
    set_gpu_fill(model, o, profile.ranking(), o.pin);
  } else if (o.pin > 0) {
    fail("--pin needs --fill PROFILE or --usage (the ranking that says which experts to pin)");
  }
  // A store with a slot for every expert that nobody sized (it exists for --usage, --pin-hot or
  // --moce, and the experts fit in half the RAM) reads them all now, ranked ones first, instead
  // of one cold read per expert at its first use: as the GPU tier's host tier it served 15.6 tok/s
  // where the page-cached mapping served 136 (docs/bench-cuda.md, session 32).
  if (!budget_given && store->slots_per_layer() >= int(sl.n_expert)) {
    if (!fill_ranking) fill_ranking.emplace(size_t(sl.n_block));
    complete_ranking(*fill_ranking, int(sl.n_block), int(sl.n_expert));
  }
  if (fill_ranking) store->fill(*fill_ranking, o.pin);
  if (o.moce_lambda > 0) {
    auto policy = std::make_unique<MocePolicy>();
    policy->options = MoceOptions{o.moce_lambda, o.moce_protect, o.moce_max_rank, o.moce_sample_every};
    policy->exact_source = &model.mapped_experts();
    store->set_moce(std::move(policy));
    if (!o.quiet)
      fmt::print(stderr, "strata: MoCE on (changes tokens): lambda {}, protect {}, max rank {}\n", o.moce_lambda,
                 o.moce_protect, o.moce_max_rank > 0 ? std::to_string(o.moce_max_rank) : std::string("any"));
  }
  if (!o.quiet)
    fmt::print(stderr,
               "strata: experts from {} ({}): {} slots/layer of {} ({} arena, {:.0f}% of {} expert bytes), "
               "{} I/O threads ({}), O_DIRECT {}, read-ahead {}\n",
               store->reader().path(), store->reader().kind(), store->slots_per_layer(), layout.n_expert, format_bytes(store->arena_bytes()),
               100.0 * double(store->slots_per_layer()) / layout.n_expert, format_bytes(expert_bytes),
               o.io_threads, store->io_uring() ? "io_uring" : "pread", store->direct_io() ? "on" : "off", store->read_ahead_enabled() ? "on" : "off");
  return store;
}

std::unique_ptr<TracingSource> open_routing_trace(const Model& model, ExpertStore* store,
                                                  const ExpertOptions& o) {
  if (o.trace_routing.empty()) return nullptr;
  ExpertSource& inner = store ? static_cast<ExpertSource&>(*store) : model.mapped_experts();
  return std::make_unique<TracingSource>(inner, o.trace_routing,
                                         RoutingTraceHeader::for_model(model.file(), model.hparams().n_expert_used));
}

std::string format_expert_stats(const ExpertStoreStats& s, double tokens) {
  const double per_token = tokens > 0 ? 1.0 / tokens : 0.0;
  return fmt::format(
      "experts: hit {:.1f}% ({} hits, {} misses, {:.1f} misses/token), read {} ({:.2f} MB/token, misses {:.2f}), "
      "read-ahead precision {:.1f}% recall {:.1f}% ({} issued), I/O wait {:.0f} ms ({:.2f} ms/token)",
      100.0 * s.hit_rate(), s.hits, s.misses, double(s.misses) * per_token, format_bytes(s.bytes_read),
      double(s.bytes_read) * per_token / 1e6, double(s.miss_bytes) * per_token / 1e6, 100.0 * s.read_ahead_precision(),
      100.0 * s.read_ahead_recall(), s.read_ahead_issued, s.io_wait_ms, s.io_wait_ms * per_token) +
         (s.pin_changes ? fmt::format(", {} hot-pin changes", s.pin_changes) : std::string());
}

std::string format_moce_stats(ExpertStore* store, double tokens) {
  const MocePolicy* policy = store ? store->moce() : nullptr;
  if (!policy || policy->stats.rows == 0) return "";  // on the GPU path the tier's line has it
  const MoceStats& m = policy->stats;
  return fmt::format("moce: {:.2f} swaps/token, agreement {:.1f}%, KL {:.4f} nats/row, relMSE {:.2e} ({} samples)",
                     double(m.swaps) / std::max(tokens, 1.0), 100.0 * m.agreement(), m.kl(), m.relmse(),
                     m.mse_samples);
}

std::string format_gpu_tier_stats([[maybe_unused]] const compute::Backend& backend, [[maybe_unused]] double tokens) {
#ifdef STRATA_HAVE_CUDA
  const compute::cuda::GpuTierInfo info = compute::cuda::gpu_tier_info(backend);
  if (!info.tiered) return "";
  const compute::cuda::GpuTierStats& s = info.stats;
  const double per_token = tokens > 0 ? 1.0 / tokens : 0.0;
  return fmt::format(
      "gpu experts: {} slots/layer ({}), hit {:.1f}%, {:.1f} misses/token, copied in {} ({:.2f} MB/token, read-ahead "
      "{:.1f}% used), {:.1f}% of the layers went on without the host, startup fill {} experts, hot pins {} ({} changes), "
      "fill pins {}",
      info.slots_per_layer, format_bytes(info.arena_bytes), 100.0 * s.hit_rate(), double(s.misses) * per_token,
      format_bytes(s.loaded_bytes + s.policy_bytes), double(s.loaded_bytes) * per_token / 1e6,
      s.read_ahead_issued ? 100.0 * double(s.read_ahead_used) / double(s.read_ahead_issued) : 0.0,
      s.handshakes ? 100.0 * double(s.self_released) / double(s.handshakes) : 0.0, s.fill_loads, s.hot_pins,
      s.pin_changes, s.fill_pins) +
         (s.moce_rows > 0 ? fmt::format("; moce: {:.2f} swaps/token, agreement {:.1f}%, KL {:.4f} nats/row",
                                        s.moce_swaps * per_token, 100.0 * s.moce_agreement_sum / s.moce_rows,
                                        s.moce_kl_sum / s.moce_rows)
                          : std::string());
#else
  return "";
#endif
}

void begin_prompt(ExpertStore* store, [[maybe_unused]] compute::Backend* backend) {
  if (store) store->reset_prompt_heat();
#ifdef STRATA_HAVE_CUDA
  if (backend) compute::cuda::gpu_tier_reset_prompt_heat(*backend);
#endif
}

int end_prompt(ExpertStore* store, [[maybe_unused]] compute::Backend* backend, const ExpertOptions& o) {
  if (o.pin_hot <= 0) return 0;
  HotPinOptions pins;
  pins.n_hot = o.pin_hot;
  pins.max_swaps = o.repin_swaps;
  pins.hysteresis = o.repin_hysteresis;
  pins.alpha = o.usage_alpha;
  pins.min_history_tokens = kMinHistoryTokens;
  int changes = store ? store->pin_prompt_hot(pins) : 0;
#ifdef STRATA_HAVE_CUDA
  if (backend) changes += compute::cuda::gpu_tier_pin_prompt_hot(*backend, pins, store ? store->history() : nullptr);
#endif
  return changes;
}

void save_usage(ExpertStore* store, const ExpertOptions& o, bool only_if_due) {
  if (!store || !store->history()) return;
  if (only_if_due && store->history_tokens_since_save() < o.usage_save_every) return;
  try {
    store->save_history();
  } catch (const Error& e) {
    fmt::print(stderr, "strata: warning: usage history not saved: {}\n", e.what());
  }
}

}  // namespace strata::cli
