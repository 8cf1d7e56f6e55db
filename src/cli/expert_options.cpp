#include "cli/expert_options.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <filesystem>
#include <fstream>

#include "experts/profile.h"
#include "util/byte_size.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {
namespace {

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
  cmd.add_flag("--no-direct-io", o.no_direct_io, "read the sidecar through the page cache");
  cmd.add_option("--io-backend", o.io_backend, "expert reads: uring (io_uring when available) or pread")
      ->check(CLI::IsMember({"uring", "pread"}));
  cmd.add_flag("--pack", o.pack, "build MODEL.experts first when it is missing or stale");
  cmd.add_flag("--mapped-experts", o.mapped, "read experts through the GGUF mapping (no sidecar)");
  cmd.add_option("--fill", o.fill_profile, "expert profile (strata profile) to fill the cache from at start");
  cmd.add_option("--pin", o.pin, "with --fill: pin this many top experts per layer")->check(CLI::NonNegativeNumber);
  cmd.add_option("--trace-routing", o.trace_routing,
                 "record each layer's routing and read-ahead predictions to FILE (for strata replay)");
}

std::unique_ptr<ExpertStore> open_expert_store(const Model& model, const std::string& model_path,
                                               const ExpertOptions& o) {
  const bool budget_given = !o.ram_budget.empty() || o.slots_per_layer > 0;
  if (o.mapped) {
    if (budget_given) fail("--mapped-experts cannot be combined with --ram-budget/--slots-per-layer");
    return nullptr;
  }
  const std::string sidecar_path = sidecar_path_for(model_path);
  const bool exists = std::filesystem::exists(sidecar_path);
  const SidecarLayout layout = SidecarLayout::for_gguf(model.file());
  const uint64_t expert_bytes = layout.total_expert_bytes();
  const uint64_t available = mem_available_bytes();
  if (!exists && !o.pack) {
    if (budget_given)
      fail("{} is missing: a RAM budget streams experts from it. Build it with `strata pack {}` "
           "(or add --pack)",
           sidecar_path, model_path);
    if (available > 0 && expert_bytes > available / 2 && !o.quiet)
      fmt::print(stderr,
                 "strata: note: the routed experts ({}) exceed half the available RAM ({}); reading "
                 "them through the file mapping will thrash. `strata pack {}` once, then run with "
                 "--ram-budget.\n",
                 format_bytes(expert_bytes), format_bytes(available), model_path);
    return nullptr;
  }
  std::optional<Sidecar> sidecar;
  if (exists) {
    try {
      sidecar.emplace(Sidecar::open(sidecar_path, model.file()));
    } catch (const Error& e) {
      if (!o.pack) throw;
      fmt::print(stderr, "strata: {}\nstrata: rebuilding it (--pack)\n", e.what());
    }
  }
  if (!sidecar) {
    pack_with_progress(model.file(), sidecar_path);
    sidecar.emplace(Sidecar::open(sidecar_path, model.file()));
  }

  ExpertStoreOptions so;
  so.slots_per_layer = o.slots_per_layer;
  so.io_threads = o.io_threads;
  so.urgent_only_threads = o.io_threads > 1 ? 1 : 0;
  so.read_ahead = !o.no_read_ahead;
  so.direct_io = !o.no_direct_io;
  so.io_uring = o.io_backend == "uring";
  if (!o.ram_budget.empty()) so.budget_bytes = parse_byte_size(o.ram_budget, expert_bytes, "--ram-budget");
  else if (o.slots_per_layer == 0)
    so.budget_bytes = available > 0 ? std::min(expert_bytes, available / 2) : expert_bytes;
  auto store = std::make_unique<ExpertStore>(model, std::move(*sidecar), so);
  // Experts now come from the sidecar: keep the mapping's page cache to the dense tensors.
  const GgufFile& gguf = model.file();
  gguf.advise(0, gguf.file_size(), MADV_RANDOM);
  for (const TensorInfo& t : gguf.tensors())
    if (t.name.find("_exps") == std::string::npos && t.name.rfind("per_layer_token_embd", 0) != 0)
      gguf.advise(t.file_offset, t.n_bytes, MADV_WILLNEED);
  if (!o.fill_profile.empty()) {
    const ExpertProfile profile = ExpertProfile::load(o.fill_profile, store->sidecar().layout().gguf_identity);
    store->fill(profile.ranking(), o.pin);
  } else if (o.pin > 0) {
    fail("--pin needs --fill PROFILE (the ranking that says which experts to pin)");
  }
  if (!o.quiet)
    fmt::print(stderr,
               "strata: experts from {}: {} slots/layer of {} ({} arena, {:.0f}% of {} expert bytes), "
               "{} I/O threads ({}), O_DIRECT {}, read-ahead {}\n",
               sidecar_path, store->slots_per_layer(), layout.n_expert, format_bytes(store->arena_bytes()),
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
      100.0 * s.read_ahead_recall(), s.read_ahead_issued, s.io_wait_ms, s.io_wait_ms * per_token);
}

}  // namespace strata::cli
