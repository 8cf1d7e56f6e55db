// `strata replay TRACE` — simulates the expert cache over a routing trace (strata run/chat
// --trace-routing FILE) for one or many settings and prints what each would cost: hit rate,
// misses and bytes per token, read-ahead precision and recall. The counters are those a live
// ExpertStore with the same settings would report (route/cache_replay.h); no model is needed.
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "experts/profile.h"
#include "route/cache_replay.h"
#include "route/routing_trace.h"
#include "util/byte_size.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {
namespace {

struct ReplayOptions {
  std::string trace;
  int slots_per_layer = 0;
  std::string ram_budget;
  std::string sweep;  // comma-separated slots per layer
  bool no_read_ahead = false;
  std::string fill_profile;
  int pin = 0;
  bool json = false;
};

std::vector<int> parse_sweep(const std::string& text) {
  std::vector<int> slots;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || value < 1)
      fail("--sweep: expected comma-separated slot counts >= 1 (1,2,4,8), found '{}'", part);
    slots.push_back(value);
  }
  if (slots.empty()) fail("--sweep: no slot counts given");
  return slots;
}

nlohmann::json stats_json(const ExpertStoreStats& s, double tokens) {
  const double per_token = tokens > 0 ? 1.0 / tokens : 0.0;
  return {{"layer_visits", s.layer_visits},
          {"needed", s.needed},
          {"hits", s.hits},
          {"misses", s.misses},
          {"read_ahead_issued", s.read_ahead_issued},
          {"read_ahead_used", s.read_ahead_used},
          {"bytes_read", s.bytes_read},
          {"miss_bytes", s.miss_bytes},
          {"hit_rate", s.hit_rate()},
          {"misses_per_token", double(s.misses) * per_token},
          {"miss_bytes_per_token", double(s.miss_bytes) * per_token},
          {"bytes_read_per_token", double(s.bytes_read) * per_token},
          {"read_ahead_precision", s.read_ahead_precision()},
          {"read_ahead_recall", s.read_ahead_recall()}};
}

void replay(const ReplayOptions& o) {
  const auto load_start = std::chrono::steady_clock::now();
  const RoutingTrace trace = RoutingTrace::load(o.trace);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const RoutingTraceHeader& h = trace.header;

  CacheReplaySettings base;
  base.read_ahead = !o.no_read_ahead;
  if (!o.fill_profile.empty()) {
    base.fill_ranking = ExpertProfile::load(o.fill_profile, h.model_identity).ranking();
    base.n_pinned = o.pin;
  } else if (o.pin > 0) {
    fail("--pin needs --fill PROFILE (the ranking that says which experts to pin)");
  }
  std::vector<CacheReplaySettings> settings;
  if (!o.sweep.empty()) {
    for (int slots : parse_sweep(o.sweep)) {
      settings.push_back(base);
      settings.back().slots_per_layer = slots;
    }
  } else if (o.slots_per_layer > 0 || !o.ram_budget.empty()) {
    settings.push_back(base);
    settings.back().slots_per_layer = o.slots_per_layer;
    if (!o.ram_budget.empty())
      settings.back().budget_bytes =
          parse_byte_size(o.ram_budget, h.expert_bytes(), "--ram-budget");
  } else {
    // Default: powers of two up to every expert resident.
    for (int slots = 1;; slots *= 2) {
      settings.push_back(base);
      settings.back().slots_per_layer = std::min<int>(slots, int(h.n_expert));
      if (uint32_t(slots) >= h.n_expert) break;
    }
  }

  const auto start = std::chrono::steady_clock::now();
  std::vector<CacheReplayResult> results;
  for (const CacheReplaySettings& s : settings) results.push_back(replay_cache(trace, s));
  const double replay_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const double tokens = double(trace.tokens()), decode_tokens = double(trace.tokens(true));
  int n_moe_blocks = 0;
  for (uint64_t b : h.record_bytes) n_moe_blocks += b > 0;
  if (o.json) {
    nlohmann::json j;
    j["trace"] = o.trace;
    j["model_identity"] = fmt::format("{:016x}", h.model_identity);
    j["n_expert"] = h.n_expert;
    j["k"] = h.k;
    j["moe_blocks"] = n_moe_blocks;
    j["windows"] = trace.windows.size();
    j["tokens"] = trace.tokens();
    j["decode_tokens"] = trace.tokens(true);
    j["load_seconds"] = load_s;
    j["replay_seconds"] = replay_s;
    for (size_t i = 0; i < results.size(); ++i) {
      const CacheReplayResult& r = results[i];
      j["results"].push_back({{"slots_per_layer", r.slots_per_layer},
                              {"cache_bytes", r.cache_bytes},
                              {"read_ahead", settings[i].read_ahead},
                              {"fill", o.fill_profile},
                              {"pinned", settings[i].n_pinned},
                              {"all", stats_json(r.stats, tokens)},
                              {"decode", stats_json(r.decode, decode_tokens)}});
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "{}: {} tokens ({} in decode steps), {} windows; {} MoE blocks x {} experts, top-{}; "
      "read-ahead {}{}\n",
      o.trace, trace.tokens(), trace.tokens(true), trace.windows.size(), n_moe_blocks, h.n_expert,
      h.k, base.read_ahead ? "on" : "off",
      o.fill_profile.empty() ? "" : fmt::format("; fill {} (pin {})", o.fill_profile, o.pin));
  fmt::print(
      "| slots/layer | cache | hit % | misses/token | miss MB/token | read MB/token | read-ahead "
      "precision % | "
      "recall % | decode misses/token | decode miss MB/token |\n");
  fmt::print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const CacheReplayResult& r : results) {
    const ExpertStoreStats& s = r.stats;
    const double per = tokens > 0 ? 1.0 / tokens : 0.0,
                 per_decode = decode_tokens > 0 ? 1.0 / decode_tokens : 0.0;
    fmt::print(
        "| {} | {} | {:.1f} | {:.2f} | {:.3f} | {:.3f} | {:.1f} | {:.1f} | {:.2f} | {:.3f} |\n",
        r.slots_per_layer, format_bytes(r.cache_bytes), 100.0 * s.hit_rate(),
        double(s.misses) * per, double(s.miss_bytes) * per / 1e6, double(s.bytes_read) * per / 1e6,
        100.0 * s.read_ahead_precision(), 100.0 * s.read_ahead_recall(),
        double(r.decode.misses) * per_decode, double(r.decode.miss_bytes) * per_decode / 1e6);
  }
  fmt::print(stderr, "strata: loaded the trace in {:.3f} s; replayed {} settings in {:.3f} s\n",
             load_s, results.size(), replay_s);
}

}  // namespace

void register_replay(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Simulate the expert cache over a routing trace (--trace-routing)");
  cmd->add_option("trace", o->trace, "routing trace file")->required();
  auto* slots =
      cmd->add_option("--slots-per-layer", o->slots_per_layer, "expert cache slots per layer")
          ->check(CLI::Range(1, 1 << 20));
  auto* budget =
      cmd->add_option(
             "--ram-budget", o->ram_budget,
             "RAM for routed experts: bytes (8G, 512M) or a share of the expert bytes (25%)")
          ->excludes(slots);
  cmd->add_option("--sweep", o->sweep,
                  "comma-separated slots per layer to compare (default: 1,2,4,... all)")
      ->excludes(slots)
      ->excludes(budget);
  cmd->add_flag("--no-read-ahead", o->no_read_ahead, "simulate without read-ahead");
  cmd->add_option("--fill", o->fill_profile,
                  "expert profile (strata profile) the cache is filled from first");
  cmd->add_option("--pin", o->pin, "with --fill: pin this many top experts per layer")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", o->json, "print the results as JSON");
  cmd->callback([o] { replay(*o); });
}

}  // namespace strata::cli
