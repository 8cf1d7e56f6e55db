// GPU decode benchmark (strata bench gpu, bench_cuda_decode). Contract in gpu_bench.h.
#include "cli/gpu_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/backend_registry.h"
#include "cli/llama_bench_runner.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cuda/cuda_backend.h"
#include "compute/cuda/runtime.h"
#include "engine/session.h"
#include "experts/expert_store.h"
#include "model/model.h"
#include "quant/ggml_type.h"
#include "synth/synth.h"
#include "util/atomic_file.h"
#include "util/byte_size.h"
#include "util/error.h"
#include "util/svg.h"

namespace strata::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Run {
  double prefill_tps = 0, decode_tps = 0;
  std::vector<int32_t> tokens;
  // Decode windows replayed from a recorded graph, and the host's time in each from begin_window to
  // the first graph launch (GraphCounters): the part of a token the GPU waits for the host.
  int64_t replayed = 0;
  double host_before_ms = 0;
};

struct TierDelta {
  double hit_rate = 0, loaded_mib_per_token = 0, serve_ms_per_token = 0;
  // Per token: the handshake thread's parts and CPU time; the wait kernels spinning and copying.
  double resolve_ms = 0, source_ms = 0, job_ms = 0, cpu_ms = 0, gpu_wait_ms = 0, gpu_copy_ms = 0, token_ms = 0;
  // Per handshake (µs): the GPU's publish until its wait kernel saw the job ready, the GPU's own
  // work in between, the host's serve time (GpuTierStats).
  double round_trip_us = 0, before_wait_us = 0, serve_us = 0;
  // Read-ahead per token: the guesses copied in beside the previous layer (MiB), how many of its
  // loads a layer then used, and the side branch's kernels waiting for their job and copying.
  double ra_mib = 0, ra_issued = 0, ra_used = 0, ra_wait_ms = 0, ra_copy_ms = 0;
  // Of the handshakes, the share whose wait kernel released itself (all routed experts resident);
  // the GPU's count ÷ the host's (1 when they agree, as they must).
  double self_share = 0, self_agreement = 1;
  int slots = 0;
  bool staged = false;
  uint64_t arena_bytes = 0;
};

// store: the GPU tier's host tier when the entry has one of its own (/ram=), else the mapping.
Run run_once(const Model& model, compute::ThreadPool& pool, const std::string& backend, const std::vector<int32_t>& prompt,
             int n_tokens, int chunk, TierDelta* tier = nullptr, ExpertStore* store = nullptr) {
  Run r;
  const bool eager = backend == "cuda-eager";
  if (eager) setenv("STRATA_CUDA_GRAPH", "0", 1);
  const std::string name = eager || backend.rfind("cuda@", 0) == 0 ? "cuda" : backend;
  Session session(model, pool, store, name);
  if (eager) unsetenv("STRATA_CUDA_GRAPH");
  auto start = std::chrono::steady_clock::now();
  session.prefill(prompt, chunk);
  r.prefill_tps = double(prompt.size()) / seconds_since(start);
  (void)session.logits();
  const compute::cuda::GpuTierInfo before = compute::cuda::gpu_tier_info(*session.state().backend);
  const compute::cuda::GraphCounters graphs_before =
      compute::cuda::graph_counters(*session.state().backend);
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < n_tokens; ++i) {
    const std::vector<float>& logits = session.logits();
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.tokens.push_back(next);
    session.decode(next);
  }
  r.decode_tps = n_tokens / seconds_since(start);
  (void)session.logits();
  const compute::cuda::GraphCounters graphs_after =
      compute::cuda::graph_counters(*session.state().backend);
  r.replayed = graphs_after.replays_launched - graphs_before.replays_launched;
  if (r.replayed > 0)
    r.host_before_ms = (graphs_after.replay_host_before_s - graphs_before.replay_host_before_s) *
                       1e3 / double(r.replayed);
  const compute::cuda::GpuTierInfo after = compute::cuda::gpu_tier_info(*session.state().backend);
  if (tier && after.tiered) {
    const double needed = double(after.stats.needed - before.stats.needed);
    tier->hit_rate = needed > 0 ? double(after.stats.hits - before.stats.hits) / needed : 1.0;
    tier->loaded_mib_per_token = double(after.stats.loaded_bytes - before.stats.loaded_bytes) / (1 << 20) / n_tokens;
    tier->serve_ms_per_token = (after.stats.host_serve_ms - before.stats.host_serve_ms) / n_tokens;
    tier->resolve_ms = (after.stats.serve_resolve_ms - before.stats.serve_resolve_ms) / n_tokens;
    tier->source_ms = (after.stats.serve_source_ms - before.stats.serve_source_ms) / n_tokens;
    tier->job_ms = (after.stats.serve_job_ms - before.stats.serve_job_ms) / n_tokens;
    tier->cpu_ms = (after.stats.serve_cpu_ms - before.stats.serve_cpu_ms) / n_tokens;
    tier->gpu_wait_ms = (after.stats.gpu_wait_ms - before.stats.gpu_wait_ms) / n_tokens;
    tier->gpu_copy_ms = (after.stats.gpu_copy_ms - before.stats.gpu_copy_ms) / n_tokens;
    tier->token_ms = 1e3 / r.decode_tps;
    tier->ra_mib = double(after.stats.read_ahead_bytes - before.stats.read_ahead_bytes) / (1 << 20) / n_tokens;
    tier->ra_issued = double(after.stats.read_ahead_issued - before.stats.read_ahead_issued) / n_tokens;
    tier->ra_used = double(after.stats.read_ahead_used - before.stats.read_ahead_used) / n_tokens;
    tier->ra_wait_ms = (after.stats.gpu_read_ahead_wait_ms - before.stats.gpu_read_ahead_wait_ms) / n_tokens;
    tier->ra_copy_ms = (after.stats.gpu_read_ahead_copy_ms - before.stats.gpu_read_ahead_copy_ms) / n_tokens;
    const double handshakes = double(after.stats.handshakes - before.stats.handshakes);
    const double self_host = double(after.stats.self_released - before.stats.self_released);
    const double self_gpu = double(after.stats.gpu_self_released - before.stats.gpu_self_released);
    tier->self_share = handshakes > 0 ? self_host / handshakes : 0.0;
    tier->self_agreement = self_host > 0 ? self_gpu / self_host : (self_gpu == 0 ? 1.0 : 0.0);
    const double timed = double(after.stats.timed_handshakes - before.stats.timed_handshakes);
    if (timed > 0) {
      tier->round_trip_us = (after.stats.round_trip_ms - before.stats.round_trip_ms) * 1e3 / timed;
      tier->before_wait_us = (after.stats.before_wait_ms - before.stats.before_wait_ms) * 1e3 / timed;
      tier->serve_us = (after.stats.host_serve_ms - before.stats.host_serve_ms) * 1e3 /
                       double(after.stats.handshakes - before.stats.handshakes);
    }
    tier->slots = after.slots_per_layer;
    tier->staged = after.stats.staged;
    tier->arena_bytes = after.arena_bytes;
  }
  return r;
}

// Median GB/s of 5 timed copies (after one warm-up) of `bytes` from src to dst, counting
// `counted` bytes per copy (2x for device to device: read + write).
double copy_gbs(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, double counted) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> gbs;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(dst, src, bytes, kind);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) gbs.push_back(counted / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(gbs);
}

// Pinned host-to-device copy bandwidth (GB/s), 256 MiB copies.
double h2d_gbs() {
  using compute::cuda::DeviceBuffer;
  const size_t bytes = size_t(256) << 20;
  DeviceBuffer d(bytes);
  void* h = nullptr;
  cudaHostAlloc(&h, bytes, cudaHostAllocDefault);
  std::memset(h, 1, bytes);
  const double gbs = copy_gbs(d.data(), h, bytes, cudaMemcpyHostToDevice, double(bytes));
  cudaFreeHost(h);
  return gbs;
}

// "cuda@25%", "cuda@1G", "cuda@slots=4", then optionally "/nora" (no read-ahead), "/self" (a wait
// whose experts are all resident goes on without the host: GpuTierOptions::self_release) or
// "/noself" (every wait hears from the host), and "/ram=SIZE" (the host tier is a RAM arena of
// SIZE, bytes or a share of the expert bytes, that reads the rest from the GGUF on the disk with
// O_DIRECT — the SSD tier — instead of the page-cached mapping): an entry's tier.
struct TierEntry {
  compute::GpuTierOptions tier;
  std::string ram_budget;  // empty: the mapping is the host tier
};

TierEntry tier_for(const Model& model, const std::string& entry) {
  TierEntry e;
  compute::GpuTierOptions& tier = e.tier;
  std::string spec = entry.substr(entry.find('@') + 1);
  for (size_t slash; (slash = spec.rfind('/')) != std::string::npos; spec = spec.substr(0, slash)) {
    const std::string flag = spec.substr(slash + 1);
    if (flag == "nora") tier.read_ahead = false;
    else if (flag == "self" || flag == "noself") tier.self_release = flag == "self";
    else if (flag.rfind("ram=", 0) == 0 && flag.size() > 4) e.ram_budget = flag.substr(4);
    else fail("bench gpu: {}: expected '/nora', '/self', '/noself' or '/ram=SIZE' after the budget, found '/{}'", entry, flag);
  }
  tier.layers = model.expert_layouts();
  if (spec.rfind("slots=", 0) == 0) {
    tier.slots_per_layer = std::stoi(spec.substr(6));
    tier.budget_flag = fmt::format("--gpu-slots-per-layer {}", tier.slots_per_layer);
  } else if (spec != "all") {
    tier.budget_bytes =
        parse_byte_size(spec, tier.all_expert_bytes(model.hparams().n_expert), entry);
    tier.budget_flag = "--gpu-budget " + spec;
  }
  return e;
}

// Bytes of weights one decode token reads: the dense weights the CUDA backend holds (every one is
// read each token: model/gpu_footprint.h), plus k experts per layer (their three matrices).
double bytes_per_token(const Model& model) {
  const HParams& hp = model.hparams();
  double per_expert = 0;
  for (const TensorInfo& t : model.file().tensors())
    if (std::string_view(t.name).find("_exps") != std::string_view::npos)
      per_expert += double(t.n_bytes) / double(hp.n_expert) / double(hp.n_layer + hp.n_nextn);
  return double(model.backend_shared().gpu_footprint.dense_weight_bytes) +
         double(hp.n_layer) * hp.n_expert_used * per_expert;
}

double device_copy_gbs() {
  using compute::cuda::DeviceBuffer;
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer a(bytes), b(bytes);
  return copy_gbs(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, 2.0 * double(bytes));
}


// One tier entry's medians over the rounds.
struct TierSummary {
  int slots = 0;
  bool staged = false;
  double hit = 0, mib = 0, serve = 0, resolve = 0, source = 0, job = 0, cpu = 0, wait = 0, copy = 0, token = 0;
  double round_trip = 0, before_wait = 0, serve_us = 0;
  double ra_mib = 0, ra_issued = 0, ra_used = 0, ra_wait = 0, ra_copy = 0;
  double self_share = 0, self_agreement = 1;
  double miss_mib = 0;          // copied on the critical path (mib minus read-ahead)
  double arena_share = 0;       // the arena ÷ all routed-expert bytes (the VRAM it holds)
};

TierSummary summarize(const std::vector<TierDelta>& runs, double arena_share) {
  TierSummary s;
  auto med = [&](double TierDelta::*field) {
    std::vector<double> v;
    for (const TierDelta& t : runs) v.push_back(t.*field);
    return median(v);
  };
  s.slots = runs.front().slots;
  s.staged = runs.front().staged;
  s.hit = med(&TierDelta::hit_rate);
  s.mib = med(&TierDelta::loaded_mib_per_token);
  s.serve = med(&TierDelta::serve_ms_per_token);
  s.resolve = med(&TierDelta::resolve_ms);
  s.source = med(&TierDelta::source_ms);
  s.job = med(&TierDelta::job_ms);
  s.cpu = med(&TierDelta::cpu_ms);
  s.wait = med(&TierDelta::gpu_wait_ms);
  s.copy = med(&TierDelta::gpu_copy_ms);
  s.token = med(&TierDelta::token_ms);
  s.round_trip = med(&TierDelta::round_trip_us);
  s.before_wait = med(&TierDelta::before_wait_us);
  s.serve_us = med(&TierDelta::serve_us);
  s.ra_mib = med(&TierDelta::ra_mib);
  s.ra_issued = med(&TierDelta::ra_issued);
  s.ra_used = med(&TierDelta::ra_used);
  s.ra_wait = med(&TierDelta::ra_wait_ms);
  s.ra_copy = med(&TierDelta::ra_copy_ms);
  s.self_share = med(&TierDelta::self_share);
  s.self_agreement = std::min_element(runs.begin(), runs.end(), [](const TierDelta& a, const TierDelta& b) {
                       return a.self_agreement < b.self_agreement;
                     })->self_agreement;
  s.miss_mib = std::max(0.0, s.mib - s.ra_mib);
  s.arena_share = arena_share;
  return s;
}

// The entries a budget row stands for: all in VRAM ("cuda") and each budget with read-ahead; the
// "/nora" entries fill that row's no-read-ahead column, and llama.cpp runs once per row.
bool is_budget_group(const std::string& b) {
  return b == "cuda" || (b.rfind("cuda@", 0) == 0 && b.find('/') == std::string::npos);
}

// llama.cpp's decode tok/s on the same file: llama-bench -p 0 -n TOKENS (-ngl 99, -ncmoe K).
struct LlamaResult {
  std::string setting;
  double tps = 0, stddev = 0;
};

// Throws strata::Error with llama-bench's stderr when it fails (a model it refuses, out of memory).
LlamaResult run_llama_bench(const GpuBenchOptions& o, int n_cpu_moe, int threads) {
  LlamaResult r;
  r.setting = n_cpu_moe > 0 ? fmt::format("-ngl 99 -ncmoe {}", n_cpu_moe) : "-ngl 99";
  std::vector<std::string> args = {"-m", o.path, "-ngl", "99"};
  if (n_cpu_moe > 0) args.insert(args.end(), {"-ncmoe", std::to_string(n_cpu_moe)});
  args.insert(args.end(), {"-p", "0", "-n", std::to_string(o.tokens), "-r", std::to_string(o.llama_repeats), "-t",
                           std::to_string(threads)});
  const nlohmann::json tests = run_llama_bench_json(o.llama_bench, args, "bench gpu");
  const auto decode = llama_test_tps(tests, /*has_prompt=*/false, /*has_gen=*/true);
  if (!decode) fail("bench gpu: llama-bench's output has no generation test with avg_ts: {}", tests.dump().substr(0, 400));
  r.tps = decode->tps;
  r.stddev = decode->stddev;
  return r;
}

// Bars per entry group (a budget): strata, strata without read-ahead, llama.cpp; whiskers min–max
// of strata's rounds; the PCIe ceiling as a red tick (an arrow and its number when off the scale).
struct PlotGroup {
  std::string label;
  double strata = 0, strata_lo = 0, strata_hi = 0, nora = 0, llama = 0, ceiling = 0;
  std::string llama_setting;
};

std::string svg_plot(const std::vector<PlotGroup>& groups, const std::string& title) {
  const int width = 140 + 150 * int(groups.size()), height = 380, left = 60, top = 40, bottom = 300;
  double top_value = 1;
  for (const PlotGroup& g : groups) top_value = std::max({top_value, g.strata_hi, g.nora, g.llama});
  top_value *= 1.25;
  auto y = [&](double v) { return double(bottom) - (std::min(v, top_value) / top_value) * double(bottom - top); };
  std::string svg = svg::open(width, height, title, left);
  for (int i = 0; i <= 4; ++i) {
    const double v = top_value * i / 4;
    svg += svg::gridline(y(v), left, width - 20, 8, fmt::format("{:.0f}", v));
  }
  const double bar = 36;
  for (size_t i = 0; i < groups.size(); ++i) {
    const PlotGroup& g = groups[i];
    const double x0 = left + 20 + 150.0 * double(i);
    const struct {
      double value;
      const char* color;
    } bars[] = {{g.strata, "#3b6fd0"}, {g.nora, "#9bb8ec"}, {g.llama, "#e08a2c"}};
    for (int b = 0; b < 3; ++b) {
      if (bars[b].value <= 0) continue;
      const double x = x0 + b * (bar + 4);
      svg += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='{}'/>\n", x, y(bars[b].value),
                         bar, double(bottom) - y(bars[b].value), bars[b].color);
      svg += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle' font-size='11'>{:.0f}</text>\n", x + bar / 2,
                         y(bars[b].value) - 4, bars[b].value);
    }
    if (g.strata_hi > g.strata_lo)
      svg += fmt::format("<line x1='{0:.1f}' x2='{0:.1f}' y1='{1:.1f}' y2='{2:.1f}' stroke='black'/>\n", x0 + bar / 2,
                         y(g.strata_lo), y(g.strata_hi));
    if (g.ceiling > 0) {
      const double cx0 = x0 - 4, cx1 = x0 + 3 * bar + 12;
      if (g.ceiling <= top_value)
        svg += fmt::format("<line x1='{:.1f}' x2='{:.1f}' y1='{:.1f}' y2='{:.1f}' stroke='#d04a4a' stroke-width='3'/>\n",
                           cx0, cx1, y(g.ceiling), y(g.ceiling));
      else
        svg += fmt::format("<text x='{:.1f}' y='{}' fill='#d04a4a' font-size='11'>PCIe ceiling {:.0f} &#8593;</text>\n",
                           cx0, top + 10, g.ceiling);
    }
    svg += fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle'>{}</text>\n", x0 + 1.5 * bar + 4, bottom + 18,
                       g.label);
    if (!g.llama_setting.empty())
      svg += fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle' font-size='10' fill='#a05a10'>llama.cpp {}</text>\n",
                         x0 + 1.5 * bar + 4, bottom + 34, g.llama_setting);
  }
  svg += fmt::format(
      "<rect x='{0}' y='{1}' width='12' height='12' fill='#3b6fd0'/><text x='{2}' y='{3}'>strata (median, whiskers "
      "min-max)</text>\n<rect x='{4}' y='{1}' width='12' height='12' fill='#9bb8ec'/><text x='{5}' y='{3}'>strata, no "
      "read-ahead</text>\n<rect x='{6}' y='{1}' width='12' height='12' fill='#e08a2c'/><text x='{7}' y='{3}'>llama.cpp "
      "CUDA</text>\n<line x1='{8}' x2='{9}' y1='{10}' y2='{10}' stroke='#d04a4a' stroke-width='3'/><text x='{11}' "
      "y='{3}'>PCIe ceiling</text>\n",
      left, height - 34, left + 16, height - 24, left + 240, left + 256, left + 400, left + 416, left + 540, left + 560,
      height - 28, left + 566);
  svg += fmt::format("<text x='{}' y='{}'>decode tok/s per GPU expert budget (share of routed-expert bytes in VRAM; the "
                     "rest in pinned host RAM)</text>\n",
                     left, height - 6);
  return svg + std::string(svg::kClose);
}

}  // namespace

std::vector<std::string> parse_gpu_bench_backends(const std::string& list) {
  compute::cuda::register_cuda_backend();  // before resolve_backend: "auto" and "cuda" must find it
  std::vector<std::string> backends;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    if (comma > pos)
      backends.push_back(name == "cuda-eager" || name.rfind("cuda@", 0) == 0 ? name : compute::resolve_backend(name));
    pos = comma + 1;
  }
  if (backends.empty()) fail("bench gpu: expected a comma-separated list of backends, found \"{}\"", list);
  return backends;
}

// Time to first token of a follow-up turn (prefill `turn` new tokens, read the logits) on a warm
// sequence: three times back to back ("hot"), then once after `idle_s` seconds in which neither
// the GPU nor the host did anything (issue 20 item 5: whether a warm-up after an idle gap pays).
void idle_ttft(const Model& model, compute::ThreadPool& pool, const std::string& backend,
               const std::vector<int32_t>& prompt, int chunk, int idle_s, nlohmann::json& json) {
  const std::string name = backend.rfind("cuda@", 0) == 0 || backend == "cuda-eager" ? "cuda" : backend;
  Session session(model, pool, nullptr, name);
  session.prefill(prompt, chunk);
  for (int i = 0; i < 8; ++i) {
    const std::vector<float>& logits = session.logits();
    session.decode(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  (void)session.logits();
  const int64_t vocab = model.hparams().n_vocab;
  int turn_index = 0;
  auto turn = [&] {
    std::vector<int32_t> ids(16);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((uint64_t(turn_index) * 104729 + i * 7919 + 5) % uint64_t(vocab));
    ++turn_index;
    const auto start = std::chrono::steady_clock::now();
    session.prefill(ids, chunk);
    const std::vector<float>& logits = session.logits();
    (void)std::max_element(logits.begin(), logits.end());
    return seconds_since(start) * 1e3;
  };
  std::vector<double> hot;
  for (int i = 0; i < 3; ++i) hot.push_back(turn());
  std::this_thread::sleep_for(std::chrono::seconds(idle_s));
  const double idle = turn();
  const double again = turn();
  std::sort(hot.begin(), hot.end());
  fmt::print("{:5s}  TTFT of a 16-token turn: hot {:.2f} ms (median of 3: {:.2f} / {:.2f} / {:.2f}), after {} s idle "
             "{:.2f} ms ({:.2f}x), the turn after that {:.2f} ms\n",
             backend, hot[1], hot[0], hot[1], hot[2], idle_s, idle, idle / hot[1], again);
  json["idle_ttft"][backend] = {{"hot_ms", hot}, {"idle_s", idle_s}, {"after_idle_ms", idle}, {"next_ms", again}};
}

void run_gpu_bench(const GpuBenchOptions& o) {
  compute::cuda::register_cuda_backend();
  if (o.path.empty()) fail("bench gpu: a model file is required (-m FILE)");
  if (o.prompt < 1 || o.tokens < 1 || o.chunk < 1 || o.repeats < 1)
    fail("bench gpu: --prompt, --tokens, --chunk and --repeats must be >= 1");
  const std::vector<std::string>& backends = o.backends;
  if (!o.synth.empty() && !std::filesystem::exists(o.path)) {
    // [SHAPE:]LAYERS:EXPERTS[:SKEW:CORRELATION]; SHAPE defaults to mid-qwen4exp.
    std::vector<std::string> parts;
    for (size_t at = 0;;) {
      const size_t colon = o.synth.find(':', at);
      parts.push_back(o.synth.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
    const bool named = !parts.empty() && !parts[0].empty() && !std::isdigit(static_cast<unsigned char>(parts[0][0]));
    const size_t first = named ? 1 : 0;
    if (parts.size() != first + 2 && parts.size() != first + 4)
      fail("bench gpu: --synth expects [SHAPE:]LAYERS:EXPERTS[:SKEW:CORRELATION], found {}", o.synth);
    SynthOptions options;
    options.hparams = synth_shape(named ? parts[0] : "mid-qwen4exp");
    resize_synth_shape(options.hparams, std::stoi(parts[first]), std::stoi(parts[first + 1]));
    if (parts.size() == first + 4) {
      options.routing.skew = std::stod(parts[first + 2]);
      options.routing.correlation = std::stod(parts[first + 3]);
    }
    options.dense_type = GgmlType::Q8_0;
    options.expert_type = GgmlType::IQ2_XS;
    options.n_threads = 0;
    if (!o.synth_tokenizer.empty()) {
      options.tokenizer_dir = o.synth_tokenizer;
      options.hparams.n_vocab = hf_tokenizer_vocab_size(o.synth_tokenizer);
    }
    const auto start = std::chrono::steady_clock::now();
    write_synthetic_model(options, o.path);
    std::fprintf(stderr, "wrote %s (%s) in %.1f s\n", o.path.c_str(), o.synth.c_str(), seconds_since(start));
  }
  const auto model = Model::load(o.path);
  const HParams& hp = model->hparams();
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  compute::ThreadPool pool(threads);
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
  for (int i = 0; i < o.prompt; ++i) prompt[size_t(i)] = int32_t((uint64_t(i) * 7919 + 13) % uint64_t(hp.n_vocab));

  std::map<std::string, std::unique_ptr<Model>> tier_models;  // one model (and device copy) per tier entry
  std::map<std::string, std::unique_ptr<ExpertStore>> host_tiers;  // the entries with /ram=: one store each, kept
  for (const std::string& b : backends)
    if (b.rfind("cuda@", 0) == 0) {
      tier_models[b] = Model::load(o.path);
      TierEntry entry = tier_for(*tier_models[b], b);
      tier_models[b]->backend_shared().gpu_tier = std::move(entry.tier);
      if (!entry.ram_budget.empty()) {
        ExpertStoreOptions so;
        so.budget_bytes = parse_byte_size(
            entry.ram_budget, tier_models[b]->backend_shared().gpu_tier.all_expert_bytes(hp.n_expert), b);
        host_tiers[b] = std::make_unique<ExpertStore>(*tier_models[b], so);
        fmt::print("{}: host tier a RAM arena of {} slots per layer ({:.1f} MiB), the rest read from {} (O_DIRECT {})\n",
                   b, host_tiers[b]->slots_per_layer(), double(host_tiers[b]->arena_bytes()) / (1 << 20),
                   host_tiers[b]->reader().path(), host_tiers[b]->direct_io() ? "on" : "off");
      }
    }
  auto host_tier_for = [&](const std::string& b) -> ExpertStore* {
    auto it = host_tiers.find(b);
    return it == host_tiers.end() ? nullptr : it->second.get();
  };
  auto model_for = [&](const std::string& b) -> const Model& {
    auto it = tier_models.find(b);
    return it == tier_models.end() ? *model : *it->second;
  };
  std::map<std::string, std::vector<double>> decode, prefill, host_before;
  std::map<std::string, int64_t> replayed;  // decode windows replayed in the last round
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<TierDelta>> tiers;
  std::map<std::string, double> arena_share;
  for (const std::string& b : backends)
    tokens[b] = run_once(model_for(b), pool, b, prompt, std::min(o.tokens, 8), o.chunk, nullptr, host_tier_for(b)).tokens;
  for (int rep = 0; rep < o.repeats; ++rep)
    for (const std::string& b : backends) {
      TierDelta t;
      const Run r = run_once(model_for(b), pool, b, prompt, o.tokens, o.chunk, &t, host_tier_for(b));
      fmt::print("  run {} {:5s} prefill {:8.1f} tok/s  decode {:8.2f} tok/s\n", rep, b, r.prefill_tps, r.decode_tps);
      std::fflush(stdout);
      decode[b].push_back(r.decode_tps);
      prefill[b].push_back(r.prefill_tps);
      host_before[b].push_back(r.host_before_ms);
      replayed[b] = r.replayed;
      if (t.slots > 0) tiers[b].push_back(t);
      if (rep == 0) tokens[b] = r.tokens;
    }
  // Each tier's arena (cache + transient slots) as a share of all routed-expert bytes: the VRAM
  // it holds for experts, which llama.cpp's -ncmoe is matched to.
  for (auto& [b, m] : tier_models)
    if (tiers.count(b)) {
      const double all = double(m->backend_shared().gpu_tier.all_expert_bytes(hp.n_expert));
      arena_share[b] = all > 0 ? double(tiers[b].front().arena_bytes) / all : 0.0;
    }

  const double bytes = bytes_per_token(*model);
  const bool have_cuda = std::find(backends.begin(), backends.end(), "cuda") != backends.end();
  const double pcie = tiers.empty() ? 0.0 : h2d_gbs();
  const double bw = have_cuda ? device_copy_gbs() : 0.0;
  fmt::print("model {}: {} layers, {} experts top-{}; {} threads; prompt {} (chunks of {}), {} decode tokens, {} "
             "repeats\n",
             o.path, hp.n_layer, hp.n_expert, hp.n_expert_used, pool.size(), o.prompt, o.chunk, o.tokens, o.repeats);
  fmt::print("weights read per decode token: {:.1f} MiB\n", bytes / (1 << 20));
  nlohmann::json json;
  json["model"] = o.path;
  json["bytes_per_token"] = bytes;
  json["pinned_h2d_gbs"] = pcie;
  std::map<std::string, TierSummary> summaries;
  for (const std::string& b : backends) {
    const double d = median(decode[b]), p = median(prefill[b]);
    fmt::print("{:5s}  decode {:8.2f} tok/s (median)   prefill {:8.1f} tok/s   {:.1f} GB/s of weights\n", b, d, p,
               d * bytes / 1e9);
    nlohmann::json& e = json["backends"][b];
    e["decode_tps"] = d;
    e["decode_runs"] = decode[b];
    e["prefill_tps"] = p;
    const double before = median(host_before[b]);
    if (replayed[b] > 0) {
      fmt::print(
          "       host before the window's first launch {:.3f} ms per token ({} of {} decode "
          "windows replayed)\n",
          before, replayed[b], o.tokens);
      e["host_before_ms"] = before;
      e["replayed_windows"] = replayed[b];
    }
    if (auto it = tiers.find(b); it != tiers.end() && !it->second.empty()) {
      const TierSummary s = summaries[b] = summarize(it->second, arena_share[b]);
      const double ceiling = s.mib > 0 ? pcie * 1e9 / (s.mib * (1 << 20)) : 0.0;
      fmt::print("       gpu tier: {} slots per layer (arena {:.2f} of the expert bytes), hit rate {:.3f}, {:.1f} MiB "
                 "copied in per token ({:.1f} of them misses), host serve {:.3f} ms per token; PCIe ceiling {:.0f} "
                 "tok/s ({:.1f} GB/s pinned H2D), reached {:.2f}\n",
                 s.slots, s.arena_share, s.hit, s.mib, s.miss_mib, s.serve, ceiling, pcie, ceiling > 0 ? d / ceiling : 0.0);
      fmt::print("       host tier {}\n", s.staged ? "staged through the bounce buffer" : "read in place");
      fmt::print(
          "       per token (ms): {:.3f} in all; host before the window's first launch {:.3f}; "
          "host serve {:.3f} = resolve {:.3f} + host tier {:.3f} + job {:.3f}, its CPU time "
          "{:.3f}; GPU waiting for jobs {:.3f}, copying misses {:.3f} ({:.1f} GB/s)\n",
          s.token, before, s.serve, s.resolve, s.source, s.job, s.cpu, s.wait, s.copy,
          s.copy > 0 ? s.miss_mib * (1 << 20) / (s.copy * 1e6) : 0.0);
      fmt::print("       per handshake (us): GPU publish -> GPU sees the job ready {:.1f}, of it the host serving {:.1f} "
                 "and the GPU's own work (shared expert) {:.1f}; released by the GPU itself (all resident): {:.3f} of "
                 "the handshakes (GPU count / host count {:.3f})\n",
                 s.round_trip, s.serve_us, s.before_wait, s.self_share, s.self_agreement);
      fmt::print("       read-ahead per token: {:.1f} loads issued, {:.1f} of them used ({:.2f}), {:.1f} MiB; side "
                 "branch waiting {:.3f} ms, copying {:.3f} ms ({:.1f} GB/s)\n",
                 s.ra_issued, s.ra_used, s.ra_issued > 0 ? s.ra_used / s.ra_issued : 0.0, s.ra_mib, s.ra_wait, s.ra_copy,
                 s.ra_copy > 0 ? s.ra_mib * (1 << 20) / (s.ra_copy * 1e6) : 0.0);
      e["slots"] = s.slots;
      e["arena_share"] = s.arena_share;
      e["hit_rate"] = s.hit;
      e["mib_per_token"] = s.mib;
      e["miss_mib_per_token"] = s.miss_mib;
      e["serve_ms"] = s.serve;
      e["pcie_ceiling_tps"] = ceiling;
      e["token_ms"] = s.token;
      e["gpu_wait_ms"] = s.wait;
      e["gpu_copy_ms"] = s.copy;
      e["round_trip_us"] = s.round_trip;
      e["before_wait_us"] = s.before_wait;
      e["read_ahead_mib"] = s.ra_mib;
      e["read_ahead_issued"] = s.ra_issued;
      e["read_ahead_used"] = s.ra_used;
      e["read_ahead_copy_ms"] = s.ra_copy;
      e["self_released_share"] = s.self_share;
      e["self_released_gpu_over_host"] = s.self_agreement;
    }
  }
  if (have_cuda) {
    fmt::print("cuda device {}; device copy bandwidth {:.0f} GB/s (r+w) -> ceiling {:.0f} tok/s; cuda reaches {:.2f} of "
               "it\n",
               compute::cuda::describe_device(), bw, bw * 1e9 / bytes, median(decode["cuda"]) / (bw * 1e9 / bytes));
    json["copy_gbs"] = bw;
    json["ceiling_tps"] = bw * 1e9 / bytes;
  }
  for (size_t i = 1; i < backends.size(); ++i) {
    const auto& a = tokens[backends[0]];
    const auto& b = tokens[backends[i]];
    size_t same = 0;
    while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
    fmt::print("greedy tokens: {} and {} agree on the first {} of {}\n", backends[0], backends[i], same, a.size());
    json["tokens_agree"][backends[i]] = same;
  }

  if (o.idle_ttft_s > 0)
    for (const std::string& b : backends) idle_ttft(model_for(b), pool, b, prompt, o.chunk, o.idle_ttft_s, json);

  // llama.cpp on the same file, after strata's rounds (never sharing the machine with them).
  std::map<std::string, LlamaResult> llama;
  int n_moe = 0;
  for (const compute::ExpertLayerLayout& l : model->expert_layouts()) n_moe += l.present;
  if (!o.llama_bench.empty()) {
    // strata's device copies and pinned host tiers go first: llama.cpp loads its own copy of the
    // model, and on a file of half the GPU's memory (the full flagship shape, 48 GiB on an 80 GiB
    // H100) both copies do not fit (session 44's llama-bench failed that way, status 256).
    host_tiers.clear();
    tier_models.clear();
    {
      std::lock_guard<std::mutex> lock(model->backend_shared().mutex);
      model->backend_shared().by_backend.clear();
    }
    for (const std::string& b : backends) {
      if (!is_budget_group(b)) continue;
      const int k = b == "cuda" ? 0 : n_moe - int(std::lround(std::min(1.0, arena_share[b]) * n_moe));
      // A failed llama.cpp run is reported and leaves its cell empty; strata's rounds are kept.
      try {
        llama[b] = run_llama_bench(o, k, threads);
      } catch (const Error& e) {
        fmt::print(stderr, "llama.cpp {}: {}\n", k > 0 ? fmt::format("-ncmoe {}", k) : "-ngl 99", e.what());
        json["llama_cpp"][b] = {{"error", e.what()}};
        continue;
      }
      fmt::print("llama.cpp {}: decode {:.2f} ± {:.2f} tok/s (tg{}, {} repetitions)\n", llama[b].setting, llama[b].tps,
                 llama[b].stddev, o.tokens, o.llama_repeats);
      json["llama_cpp"][b] = {{"setting", llama[b].setting}, {"decode_tps", llama[b].tps}, {"stddev", llama[b].stddev}};
    }
  }

  // The table and the plot: one row per budget (the all-resident "cuda" entry first).
  std::vector<PlotGroup> groups;
  fmt::print(
      "\n| GPU budget | arena ÷ expert bytes | hit rate | MiB in / token (misses) | PCIe ceiling "
      "tok/s | strata tok/s | no read-ahead | llama.cpp | strata ÷ llama.cpp | ms / token: all / "
      "host before the window / waiting / miss copy / read-ahead copy (side) |\n"
      "|---|---:|---:|---:|---:|---:|---:|---|---:|---|\n");
  for (const std::string& b : backends) {
    if (!is_budget_group(b)) continue;
    PlotGroup g;
    g.label = b == "cuda" ? "all in VRAM" : b.substr(5);
    g.strata = median(decode[b]);
    g.strata_lo = *std::min_element(decode[b].begin(), decode[b].end());
    g.strata_hi = *std::max_element(decode[b].begin(), decode[b].end());
    const std::string nora = b + "/nora";
    if (decode.count(nora)) g.nora = median(decode[nora]);
    if (llama.count(b)) {
      g.llama = llama[b].tps;
      g.llama_setting = llama[b].setting;
    }
    const auto s = summaries.find(b);
    if (s != summaries.end() && s->second.mib > 0) g.ceiling = pcie * 1e9 / (s->second.mib * (1 << 20));
    const std::string llama_cell = g.llama > 0 ? fmt::format("{:.1f} (`{}`)", g.llama, g.llama_setting) : "—";
    const std::string ratio = g.llama > 0 ? fmt::format("{:.2f}×", g.strata / g.llama) : "—";
    const std::string nora_cell = g.nora > 0 ? fmt::format("{:.1f}", g.nora) : "—";
    const std::string before_cell =
        replayed[b] > 0 ? fmt::format("{:.2f}", median(host_before[b])) : "—";
    if (s == summaries.end())
      fmt::print("| {} | 1 | 1 | 0 | — | {:.1f} | {} | {} | {} | {:.2f} / {} / — / — / — |\n",
                 g.label, g.strata, nora_cell, llama_cell, ratio, 1e3 / g.strata, before_cell);
    else
      fmt::print(
          "| {} | {:.2f} | {:.3f} | {:.1f} ({:.1f}) | {:.0f} | {:.1f} | {} | {} | {} | {:.2f} "
          "/ {} / {:.2f} / {:.2f} / {:.2f} |\n",
          g.label, s->second.arena_share, s->second.hit, s->second.mib, s->second.miss_mib,
          g.ceiling, g.strata, nora_cell, llama_cell, ratio, s->second.token, before_cell,
          s->second.wait, s->second.copy, s->second.ra_copy);
    groups.push_back(g);
  }
  if (!o.svg.empty() && !groups.empty()) {
    write_text_file(
        o.svg,
        svg_plot(groups,
                 fmt::format("strata vs llama.cpp, CUDA decode on {} ({} layers x {} experts)",
                             std::filesystem::path(o.path).filename().string(), hp.n_layer,
                             hp.n_expert)));
    fmt::print("\nplot: {}\n", o.svg);
  }
  if (!o.json.empty()) write_text_file(o.json, json.dump(2) + "\n");
}

}  // namespace strata::cli
