#include "serve/dashboard.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "serve/openai_format.h"

namespace strata::serve {
namespace {

using json = Json;

// Heat values travel as integers 0..kHeatScale of the snapshot's largest value: the map is drawn
// relative to it anyway, and a 48 x 512 map stays ~100 KB of JSON instead of ~300 KB of floats.
constexpr int kHeatScale = 1000;

std::string phase_key(Phase phase) {
  std::string key(phase_name(phase));
  std::replace(key.begin(), key.end(), ' ', '_');
  return key;
}

// Finite doubles only (JSON has no NaN/Inf); rounded to 6 significant digits so the text stays
// short.
double finite(double value) {
  if (!std::isfinite(value)) return 0;
  if (value == 0) return 0;
  const double digits = 6 - std::ceil(std::log10(std::fabs(value)));
  const double scale = std::pow(10.0, digits);
  return std::round(value * scale) / scale;
}

json experts_json(const ExpertStoreStats& e) {
  return json{{"layer_visits", e.layer_visits},
              {"needed", e.needed},
              {"hits", e.hits},
              {"misses", e.misses},
              {"read_ahead_issued", e.read_ahead_issued},
              {"read_ahead_used", e.read_ahead_used},
              {"bytes_read", e.bytes_read},
              {"miss_bytes", e.miss_bytes},
              {"pin_changes", e.pin_changes},
              {"io_wait_ms", finite(e.io_wait_ms)},
              {"hit_rate", finite(e.hit_rate())},
              {"read_ahead_precision", finite(e.read_ahead_precision())},
              {"read_ahead_recall", finite(e.read_ahead_recall())}};
}

json build_json(const DashboardSnapshot& s) {
  const DashboardStatic& f = *s.fixed;
  const size_t n_block = f.blocks.size();
  const size_t n_expert = size_t(f.n_expert);

  json blocks = json::array();
  size_t resident = 0, pinned = 0, gpu = 0;
  for (size_t b = 0; b < n_block; ++b) {
    blocks.push_back(json{{"index", b},
                          {"present", f.blocks[b].present},
                          {"mtp", f.blocks[b].mtp},
                          {"record_bytes", f.blocks[b].record_bytes}});
  }
  for (const char code : s.residency) {
    resident += code == kResidencyRam || code == kResidencyPinned;
    pinned += code == kResidencyPinned;
    gpu += code == kResidencyGpu;
  }

  float heat_max = 0;
  for (const float h : s.heat) heat_max = std::max(heat_max, h);
  json heat_rows = json::array();
  json residency_rows = json::array();
  for (size_t b = 0; b < n_block; ++b) {
    json row = json::array();
    if (f.blocks[b].present && s.heat.size() >= (b + 1) * n_expert) {
      for (size_t e = 0; e < n_expert; ++e) {
        const float h = s.heat[b * n_expert + e];
        row.push_back(heat_max > 0 ? int(std::lround(h / heat_max * kHeatScale)) : 0);
      }
    }
    heat_rows.push_back(std::move(row));
    residency_rows.push_back(s.residency.size() >= (b + 1) * n_expert
                                 ? s.residency.substr(b * n_expert, n_expert)
                                 : std::string());
  }

  json phases = json::object();
  double phases_sum = 0;
  for (size_t p = 0; p < size_t(Phase::kCount); ++p) {
    phases[phase_key(Phase(p))] = finite(s.phases.ms[p]);
    phases_sum += s.phases.ms[p];
  }
  phases["other"] = f.profile ? finite(std::max(0.0, s.busy_ms - phases_sum)) : 0.0;

  json experts = s.experts ? experts_json(*s.experts) : json(nullptr);
  // Tiers, fastest first. GPU: no CUDA backend yet. RAM: experts the arena already held when a
  // layer asked (hits) and the record bytes they saved reading; through the mapping every expert
  // counts as RAM (the page cache decides). SSD: the sidecar reads.
  const uint64_t ram_hits = s.experts ? s.experts->hits : s.ram_hit_count;
  json tiers =
      json{{"gpu", json{{"available", false}, {"hits", 0}, {"bytes_served", 0}}},
           {"ram", json{{"hits", ram_hits}, {"bytes_served", s.ram_hit_bytes}}},
           {"ssd", json{{"misses", s.experts ? s.experts->misses : 0},
                        {"read_ahead_issued", s.experts ? s.experts->read_ahead_issued : 0},
                        {"bytes_read", s.experts ? s.experts->bytes_read : 0},
                        {"miss_bytes", s.experts ? s.experts->miss_bytes : 0},
                        {"io_wait_ms", s.experts ? finite(s.experts->io_wait_ms) : 0.0}}}};

  const DashboardGeneration& g = s.generation;
  json generation = json{
      {"id", g.id},
      {"running", g.running},
      {"prompt_tokens", g.prompt_tokens},
      {"completion_tokens", g.completion_tokens},
      {"queue_wait_ms", finite(g.queue_wait_ms)},
      {"ttft_ms", g.ttft_ms < 0 ? json(nullptr) : json(finite(g.ttft_ms))},
      {"prefill_ms", finite(g.prefill_ms)},
      {"decode_ms", finite(g.decode_ms)},
      {"prompt_tokens_per_second",
       g.prefill_ms > 0 ? finite(1e3 * double(g.prompt_tokens) / g.prefill_ms) : 0.0},
      {"decode_tokens_per_second", g.decode_ms > 0 && g.completion_tokens > 1
                                       ? finite(1e3 * double(g.completion_tokens - 1) / g.decode_ms)
                                       : 0.0},
      {"finish_reason", g.finish_reason.empty() ? json(nullptr) : json(g.finish_reason)}};

  json spec = nullptr;
  if (s.spec) {
    const DashboardSpec& sp = *s.spec;
    spec = json{{"mode", f.spec_mode},
                {"windows", sp.windows},
                {"verifies", sp.verifies},
                {"drafted", sp.drafted},
                {"accepted", sp.accepted},
                {"acceptance", sp.drafted ? finite(double(sp.accepted) / double(sp.drafted)) : 0.0},
                {"last_depth", sp.last_depth},
                {"depth_counts", sp.depth_counts},
                {"forced_plain", sp.forced_plain},
                {"declined", sp.declined}};
  }
  json moce = nullptr;
  if (s.moce) {
    const MoceStats& m = *s.moce;
    moce = json{{"lambda", finite(f.moce_lambda)},
                {"rows", m.rows},
                {"swaps", m.swaps},
                {"agreement", finite(m.agreement())},
                {"kl", finite(m.kl())},
                {"relmse", finite(m.relmse())},
                {"mse_samples", m.mse_samples}};
  }

  json out =
      json{{"version", s.version},
           {"time_unix_ms", s.time_unix_ms},
           {"uptime_s", finite(s.uptime_s)},
           {"model", json{{"id", f.model_id},
                          {"path", f.model_path},
                          {"arch", f.arch},
                          {"n_layer", f.n_layer},
                          {"n_nextn", f.n_nextn},
                          {"n_embd", f.n_embd},
                          {"n_vocab", f.n_vocab},
                          {"n_ctx", f.n_ctx},
                          {"n_expert", f.n_expert},
                          {"n_expert_used", f.n_expert_used},
                          {"n_ff_exp", f.n_ff_exp},
                          {"n_ff_shexp", f.n_ff_shexp}}},
           {"bytes",
            json{{"file", f.file_bytes}, {"dense", f.dense_bytes}, {"experts", f.expert_bytes}}},
           {"placement",
            json{{"source", f.store ? "store" : "mapped"},
                 {"gpu", json{{"available", false},
                              {"arena_bytes", f.gpu_arena_bytes},
                              {"resident_experts", gpu},
                              {"note", "no CUDA backend yet: the GPU tier is empty"}}},
                 {"ram", json{{"arena_bytes", f.ram_arena_bytes},
                              {"slots_per_layer", f.slots_per_layer},
                              {"resident_experts", resident},
                              {"pinned_experts", pinned},
                              {"dense_bytes", f.dense_bytes}}},
                 {"ssd", json{{"sidecar_path", f.store ? json(f.sidecar_path) : json(nullptr)},
                              {"sidecar_bytes", f.sidecar_bytes},
                              {"direct_io", f.direct_io},
                              {"io_uring", f.io_uring},
                              {"read_ahead", f.read_ahead}}}}},
           {"blocks", std::move(blocks)},
           {"heat", json{{"decay_per_row", finite(f.heat_decay_per_row)},
                         {"max", finite(heat_max)},
                         {"scale", kHeatScale},
                         {"rows", std::move(heat_rows)}}},
           {"residency", json{{"rows", std::move(residency_rows)}}},
           {"experts", std::move(experts)},
           {"tiers", std::move(tiers)},
           {"engine", json{{"rows_routed", s.rows_routed},
                           {"expert_bytes_computed", s.expert_bytes_computed},
                           {"busy_ms", finite(s.busy_ms)},
                           {"profile", f.profile},
                           {"phases_ms", std::move(phases)}}},
           {"generation", std::move(generation)},
           {"spec", std::move(spec)},
           {"moce", std::move(moce)}};
  return out;
}

}  // namespace

const std::string& DashboardSnapshot::json() const {
  std::call_once(json_once_, [this] { json_ = dump_json(build_json(*this)); });
  return json_;
}

DashboardHub::DashboardHub() : started_(std::chrono::steady_clock::now()) {}

void DashboardHub::publish(std::shared_ptr<DashboardSnapshot> snapshot) {
  snapshot->time_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  snapshot->uptime_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  {
    std::lock_guard lock(mutex_);
    snapshot->version = latest_ ? latest_->version + 1 : 1;
    latest_ = std::move(snapshot);
  }
  changed_.notify_all();
}

std::shared_ptr<const DashboardSnapshot> DashboardHub::latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

std::shared_ptr<const DashboardSnapshot> DashboardHub::wait_newer(
    uint64_t version, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout,
                    [&] { return closed_ || (latest_ && latest_->version > version); });
  return latest_;
}

void DashboardHub::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}

bool DashboardHub::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

}  // namespace strata::serve
