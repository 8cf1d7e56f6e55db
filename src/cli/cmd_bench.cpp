// `strata bench experts` — decode speed against the expert RAM budget, each next to its ceiling.
//
// One run measures, side by side on the same machine state, for each expert source of --sources
// (gguf: the three slices of each expert straight from the model file; sidecar: one record each):
//   1. the source's read bandwidth with the miss access pattern (random whole experts, O_DIRECT,
//      the store's own I/O pool), --disk-seconds in all, in --repeats rounds interleaved across
//      the sources (median of the rounds);
//   2. for every budget (default 100%, 50%, 25%, 10% of the expert bytes), --repeats cold runs of
//      a fixed prompt then -n greedy decode steps, interleaved across the sources: tok/s (median,
//      min, max), misses and bytes read per token, I/O wait per token, the arena size and the
//      process's RSS with the store alive (budgets run in the order given, default largest first,
//      so a smaller budget's RSS shows the memory really came back);
//   3. the I/O ceiling of each budget: measured bandwidth ÷ miss bytes per token (the reads a
//      token must wait for; read-ahead reads are shown too but can overlap compute).
// Prints a Markdown table; --svg draws tok/s and ceilings per budget; --json keeps the numbers.
//
// `strata bench cpu` — CPU decode and prompt time per part of the layer at several thread counts
// side by side; cli/cpu_bench.h says what it runs and reports.
//
// `strata bench gpu` (builds with the CUDA backend) — decode tok/s per GPU expert budget next to
// llama.cpp's CUDA backend on the same file; cli/gpu_bench.h says what it runs and reports.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <map>
#include <random>

#include "cli/commands.h"
#include "cli/cpu_bench.h"
#include "cli/cpu_bench_report.h"
#include "cli/expert_options.h"
#ifdef STRATA_HAVE_CUDA
#include "cli/gpu_bench.h"
#endif
#include "cli/model_options.h"
#include "engine/session.h"
#include "experts/block_reader.h"
#include "util/atomic_file.h"
#include "util/byte_size.h"
#include "util/error.h"
#include "util/progress.h"
#include "util/svg.h"

namespace strata::cli {
namespace {

struct BenchOptions {
  ModelOptions model;
  ExpertOptions experts;
  std::string budgets = "100%,50%,25%,10%";
  std::string sources = "auto";  // comma-separated: auto | gguf | sidecar
  int n_decode = 32;
  int n_prompt = 16;
  int repeats = 3;
  double disk_seconds = 2.0;
  std::string svg;
  std::string json;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    if (comma > pos) items.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return items;
}

struct BudgetResult {
  std::string label;
  std::string source;  // gguf | sidecar
  uint64_t budget_bytes = 0;
  int slots = 0;
  std::vector<double> tps;
  double misses_per_token = 0, mb_per_token = 0, miss_mb_per_token = 0, io_wait_ms_per_token = 0, hit_rate = 0;
  double rss_mib = 0, arena_mib = 0;  // after the last run, store alive
  double ceiling = 0;                 // I/O ceiling tok/s (0: no misses)
  double median() const { return median_of(tps); }
};

// Resident set of this process now (VmRSS), in MiB.
double rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      double kib = 0;
      status >> kib;
      return kib / 1024.0;
    }
    std::getline(status, key);
  }
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Bytes/s reading random whole experts through the store's miss path (checksums included for the
// sidecar, no compute), with 4 experts per I/O thread in flight, for `seconds`.
double measure_read_bandwidth(const Model& model, const std::string& path, const ExpertOptions& experts,
                              const std::string& source, double seconds, uint64_t seed, bool& direct) {
  ExpertStoreOptions s = store_options(experts);
  s.slots_per_layer = 1;
  s.read_ahead = false;
  s.stream_slots = 4 * experts.io_threads;  // enough experts in flight to keep every thread busy
  ExpertStore store(model, open_expert_reader(model, path, experts, source), s);
  direct = store.direct_io();
  const SidecarLayout& layout = store.layout();
  std::vector<int> blocks;
  for (uint32_t b = 0; b < layout.n_block; ++b)
    if (layout.layers[b].present) blocks.push_back(int(b));
  std::mt19937_64 rng(seed);
  const int k = std::min<int>(int(layout.n_expert), s.stream_slots + 1);
  const auto start = std::chrono::steady_clock::now();
  while (seconds_since(start) < seconds) {
    const int b = blocks[rng() % blocks.size()];
    std::vector<int32_t> ids;
    while (int(ids.size()) < k) {
      const int32_t e = int32_t(rng() % layout.n_expert);
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    std::sort(ids.begin(), ids.end());
    store.publish(b, ids);
    while (!store.wait().empty()) {
    }
  }
  return double(store.stats().bytes_read) / seconds_since(start);
}

std::string svg_plot(const std::vector<BudgetResult>& results, const std::string& title) {
  const double width = 640, height = 360, left = 60, bottom = 50, top = 40;
  double max_y = 0;
  for (const auto& r : results) {
    for (double t : r.tps) max_y = std::max(max_y, t);
  }
  max_y = max_y > 0 ? max_y * 1.25 : 1;
  const double plot_h = height - top - bottom, slot_w = (width - left - 20) / double(results.size());
  std::string svg = svg::open(width, height, title, left);
  for (int i = 0; i <= 4; ++i)
    svg += svg::gridline(top + plot_h * (1 - i / 4.0), left, width - 20, 8,
                         fmt::format("{:.1f}", max_y * i / 4.0));
  for (size_t i = 0; i < results.size(); ++i) {
    const BudgetResult& r = results[i];
    const double x = left + slot_w * double(i) + slot_w * 0.2, w = slot_w * 0.6;
    const double h = plot_h * r.median() / max_y;
    svg += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='#4a7bd0'/>\n", x,
                       top + plot_h - h, w, h);
    double lo = 1e300, hi = 0;
    for (double t : r.tps) lo = std::min(lo, t), hi = std::max(hi, t);
    svg += fmt::format("<line x1='{0:.1f}' x2='{0:.1f}' y1='{1:.1f}' y2='{2:.1f}' stroke='black'/>\n", x + w / 2,
                       top + plot_h * (1 - lo / max_y), top + plot_h * (1 - hi / max_y));
    svg += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{:.1f}</text>\n", x + w / 2,
                       top + plot_h - h - 6, r.median());
    svg += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{}</text>\n", x + w / 2,
                       height - bottom + 18, r.label + " " + r.source);
    if (r.ceiling > 0) {  // the I/O ceiling: a red tick, clipped to the top with its value written
      const double cy = top + plot_h * (1 - std::min(r.ceiling, max_y) / max_y);
      svg += fmt::format("<line x1='{:.1f}' x2='{:.1f}' y1='{:.1f}' y2='{:.1f}' stroke='#d04a4a' stroke-width='3'/>"
                         "<text x='{:.1f}' y='{:.1f}' fill='#d04a4a' text-anchor='middle'>ceiling {:.1f}</text>\n",
                         x - 4, x + w + 4, cy, cy, x + w / 2, cy - 6, r.ceiling);
    }
  }
  svg += fmt::format("<text x='{}' y='{}'>budget (share of expert bytes); bars: median tok/s, whiskers: min-max, red: I/O ceiling</text>\n",
                     left, height - 12);
  return svg + std::string(svg::kClose);
}

void bench_experts(const BenchOptions& o) {
  const std::string path = resolve_model_path(o.model);
  const auto model = Model::load(path);
  // The sources, resolved ("auto" is what `run` would use) and opened once: builds the sidecar
  // with --pack, validates it otherwise.
  std::vector<std::string> sources;
  for (const std::string& name : split_list(o.sources)) {
    if (name != "auto" && name != "gguf" && name != "sidecar")
      fail("--sources: expected gguf, sidecar or auto, found '{}'", name);
    const std::string kind = open_expert_reader(*model, path, o.experts, name)->kind();
    if (std::find(sources.begin(), sources.end(), kind) == sources.end()) sources.push_back(kind);
  }
  if (sources.empty()) fail("--sources: expected at least one of gguf, sidecar, auto");
  ExpertOptions experts = o.experts;  // the notes were printed once above
  experts.quiet = true;
  const SidecarLayout layout = SidecarLayout::for_gguf(model->file());
  const uint64_t expert_bytes = layout.total_expert_bytes();
  compute::ThreadPool pool(resolve_threads(o.model));

  // Read bandwidth: rounds interleaved across the sources, so drift in the disk hits all alike.
  std::map<std::string, std::vector<double>> bandwidths;
  std::map<std::string, bool> direct;
  const int rounds = std::max(1, o.repeats);
  for (int round = 0; round < rounds; ++round)
    for (const std::string& source : sources)
      bandwidths[source].push_back(measure_read_bandwidth(*model, path, experts, source, o.disk_seconds / rounds,
                                                          1234 + uint64_t(round), direct[source]));
  fmt::print("model {} ({}), experts {} in {} layers, {} threads, {} I/O threads ({})\n", path,
             arch_name(model->hparams().arch), format_bytes(expert_bytes), layout.n_block, pool.size(),
             o.experts.io_threads, o.experts.io_backend == "uring" && io_uring_available() ? "io_uring" : "pread");
  std::map<std::string, double> bandwidth;
  for (const std::string& source : sources) {
    bandwidth[source] = median_of(bandwidths[source]);
    std::string rounds_text;
    for (double b : bandwidths[source]) rounds_text += fmt::format("{}{:.2f}", rounds_text.empty() ? "" : " ", b / 1e9);
    fmt::print("{} read bandwidth (random experts, {}): {:.2f} GB/s median of {} rounds ({})\n", source,
               direct[source] ? "O_DIRECT" : "page cache", bandwidth[source] / 1e9, rounds, rounds_text);
  }
  fmt::print("\n");

  std::vector<int32_t> prompt(size_t(o.n_prompt));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % uint64_t(model->hparams().n_vocab));
  std::vector<BudgetResult> results;
  for (const std::string& label : split_list(o.budgets)) {
    const size_t first = results.size();
    for (const std::string& source : sources) {
      BudgetResult r;
      r.label = label;
      r.source = source;
      // A share is of this source's all-resident arena, so both sources get the same slots.
      r.budget_bytes = parse_byte_size(label, open_expert_reader(*model, path, experts, source)->all_experts_bytes(),
                                       "--budgets");
      results.push_back(r);
    }
    std::vector<ExpertStoreStats> totals(sources.size());
    int steps = 0;
    for (int rep = 0; rep < o.repeats; ++rep) {
      for (size_t i = 0; i < sources.size(); ++i) {  // interleaved: each repeat runs every source
        BudgetResult& r = results[first + i];
        ExpertStoreOptions s = store_options(experts);
        s.slots_per_layer = 0;
        s.budget_bytes = r.budget_bytes;
        ExpertStore store(*model, open_expert_reader(*model, path, experts, sources[i]), s);
        r.slots = store.slots_per_layer();
        Session session(*model, pool, &store);
        session.prefill(prompt);
        const ExpertStoreStats before = store.stats();
        const auto start = std::chrono::steady_clock::now();
        for (int t = 0; t < o.n_decode; ++t) {
          const std::vector<float>& logits = session.logits();
          session.decode(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
        }
        r.tps.push_back(o.n_decode / seconds_since(start));
        r.rss_mib = std::max(r.rss_mib, rss_mib());
        r.arena_mib = double(store.arena_bytes()) / (1 << 20);
        const ExpertStoreStats d = store.stats() - before;
        ExpertStoreStats& total = totals[i];
        total.misses += d.misses;
        total.hits += d.hits;
        total.needed += d.needed;
        total.bytes_read += d.bytes_read;
        total.miss_bytes += d.miss_bytes;
        total.io_wait_ms += d.io_wait_ms;
      }
      steps += o.n_decode;
    }
    for (size_t i = 0; i < sources.size(); ++i) {
      BudgetResult& r = results[first + i];
      const ExpertStoreStats& total = totals[i];
      r.misses_per_token = double(total.misses) / steps;
      r.mb_per_token = double(total.bytes_read) / steps / 1e6;
      r.miss_mb_per_token = double(total.miss_bytes) / steps / 1e6;
      r.ceiling = r.miss_mb_per_token > 0 ? bandwidth[r.source] / (r.miss_mb_per_token * 1e6) : 0;
      r.io_wait_ms_per_token = total.io_wait_ms / steps;
      r.hit_rate = total.hit_rate();
    }
  }

  fmt::print("| budget | source | slots/layer | tok/s median (min-max) | hit rate | misses/token | MB/token: misses (all reads) | I/O wait ms/token | I/O ceiling tok/s | of ceiling | arena MiB | RSS MiB |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BudgetResult& r : results) {
    const double lo = *std::min_element(r.tps.begin(), r.tps.end());
    const double hi = *std::max_element(r.tps.begin(), r.tps.end());
    const double ceiling = r.ceiling;
    fmt::print("| {} ({}) | {} | {} | {:.2f} ({:.2f}-{:.2f}) | {:.1f}% | {:.2f} | {:.2f} ({:.2f}) | {:.2f} | {} | {} | {:.0f} | {:.0f} |\n", r.label,
               format_bytes(r.budget_bytes), r.source, r.slots, r.median(), lo, hi, 100 * r.hit_rate, r.misses_per_token,
               r.miss_mb_per_token, r.mb_per_token, r.io_wait_ms_per_token, ceiling > 0 ? fmt::format("{:.2f}", ceiling) : "-",
               ceiling > 0 ? fmt::format("{:.0f}%", 100 * r.median() / ceiling) : "-", r.arena_mib, r.rss_mib);
  }
  if (!o.svg.empty()) {
    write_text_file(
        o.svg,
        svg_plot(results, fmt::format("strata decode tok/s vs expert RAM budget ({})", path)));
    fmt::print("\nplot: {}\n", o.svg);
  }
  if (!o.json.empty()) {
    nlohmann::json j;
    j["model"] = path;
    j["expert_bytes"] = expert_bytes;
    for (const std::string& source : sources) {
      j["read_bandwidth_bytes_per_s"][source] = bandwidth[source];
      j["read_bandwidth_rounds"][source] = bandwidths[source];
      j["direct_io"][source] = direct[source];
    }
    for (const BudgetResult& r : results)
      j["budgets"].push_back({{"budget", r.label}, {"source", r.source}, {"budget_bytes", r.budget_bytes}, {"slots_per_layer", r.slots},
                              {"tok_s", r.tps}, {"median_tok_s", r.median()}, {"hit_rate", r.hit_rate},
                              {"misses_per_token", r.misses_per_token}, {"mb_per_token", r.mb_per_token},
                              {"miss_mb_per_token", r.miss_mb_per_token}, {"rss_mib", r.rss_mib}, {"arena_mib", r.arena_mib},
                              {"io_wait_ms_per_token", r.io_wait_ms_per_token}});
    write_text_file(o.json, j.dump(2) + "\n");
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (measured side by side in one run)");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = bench->add_subcommand("experts", "Decode tok/s vs expert RAM budget, next to the I/O ceiling");
  add_model_options(*cmd, o->model, /*with_backend=*/false);
  add_expert_options(*cmd, o->experts);
  cmd->add_option("--budgets", o->budgets, "comma-separated budgets (bytes or % of expert bytes)");
  cmd->add_option("--sources", o->sources,
                  "comma-separated expert sources to compare, runs interleaved: gguf, sidecar, auto (what run uses)");
  cmd->add_option("-n,--n-decode", o->n_decode, "decode steps per run")->check(CLI::Range(1, 100000));
  cmd->add_option("--prompt-tokens", o->n_prompt, "prompt length")->check(CLI::Range(1, 100000));
  cmd->add_option("--repeats", o->repeats, "cold runs per budget")->check(CLI::Range(1, 1000));
  cmd->add_option("--disk-seconds", o->disk_seconds, "time spent measuring read bandwidth")->check(CLI::Range(0.1, 600.0));
  cmd->add_option("--svg", o->svg, "write a plot of tok/s per budget");
  cmd->add_option("--json", o->json, "write the numbers as JSON");
  cmd->callback([o] { bench_experts(*o); });

  auto c = std::make_shared<CpuBenchOptions>();
  CLI::App* cpu = bench->add_subcommand(
      "cpu",
      "CPU decode and prompt time per part of the layer at several thread counts, side by side");
  cpu->add_option("-m,--model", c->model.model_path, "GGUF model (default: the embedded model)");
  cpu->add_option("--threads", c->threads,
                  "comma-separated thread counts, run interleaved (e.g. 1,2,4,8,16)");
  cpu->add_option("--prompt-threads", c->prompt_threads,
                  "thread counts that also run the prompt (default: all of --threads)");
  cpu->add_option("--prompt-tokens", c->prompt_tokens, "prompt length (0: no prompt runs)")
      ->check(CLI::Range(0, 32768));
  add_chunk_option(*cpu, c->chunk_rows);
  cpu->add_option("--decode-context", c->decode_context, "tokens before the timed decode steps")
      ->check(CLI::Range(1, 32768));
  cpu->add_option("-n,--n-decode", c->n_decode, "timed decode steps per run")
      ->check(CLI::Range(1, 100000));
  cpu->add_option("--repeats", c->repeats, "interleaved rounds (medians)")
      ->check(CLI::Range(1, 1000));
  cpu->add_option("--prompt-repeats", c->prompt_repeats,
                  "rounds (the first ones) that also run the prompt (0: all)")
      ->check(CLI::Range(0, 1000));
  CLI::Option* cpu_json = cpu->add_option("--json", c->json, "write every round's numbers as JSON");
  cpu->add_option("--svg", c->svg,
                  "plot decode and prompt tok/s against the thread count (llama.cpp's too), "
                  "rewritten after every round");
  CLI::Option* cpu_llama = cpu->add_option(
      "--llama-bench", c->llama_bench,
      "llama.cpp's llama-bench (a CPU build): run it on the same file at each thread "
      "count, side by side");
  cpu->add_flag("--mapped-weights", c->mapped_weights,
                "read the weights through the file mapping (every page faulted in first) instead of the "
                "huge-page copy that run, chat and serve make");
  cpu->add_option("--from-json", c->from_json,
                  "run nothing: print the tables of a JSON an earlier run wrote (--json) and, with "
                  "--svg, draw its plot")
      ->check(CLI::ExistingFile)
      ->excludes(cpu_json)
      ->excludes(cpu_llama);
  cpu->callback([c] {
    if (!c->from_json.empty())
      redraw_cpu_bench(c->from_json, c->svg);
    else
      run_cpu_bench(*c);
  });
#ifdef STRATA_HAVE_CUDA
  struct GpuCommand {
    GpuBenchOptions bench;
    std::string budgets = "all,50%,25%,1G";
    bool no_read_ahead_too = false;
  };
  auto g = std::make_shared<GpuCommand>();
  CLI::App* gpu = bench->add_subcommand(
      "gpu", "CUDA decode tok/s per GPU expert budget (the rest in pinned RAM), next to the PCIe and HBM ceilings and "
             "llama.cpp");
  gpu->add_option("-m,--model", g->bench.path, "GGUF file")->required();
  gpu->add_option("--budgets", g->budgets,
                  "comma-separated GPU expert budgets: all, a share of the routed-expert bytes (50%), bytes (1G) or "
                  "slots=N per layer; each may add /self or /noself (a layer whose experts are all resident goes on "
                  "without the host, or not) and /ram=SIZE (the host tier a RAM arena of SIZE reading the rest from "
                  "the disk, instead of the page-cached file)");
  gpu->add_flag("--no-read-ahead-too", g->no_read_ahead_too, "also run every budget without read-ahead");
  gpu->add_option("--prompt-tokens", g->bench.prompt, "prompt length")->check(CLI::Range(1, 100000));
  gpu->add_option("-n,--n-decode", g->bench.tokens, "decode steps per run")->check(CLI::Range(1, 100000));
  gpu->add_option("--chunk", g->bench.chunk, "prefill window rows")->check(CLI::Range(1, 4096));
  gpu->add_option("--repeats", g->bench.repeats, "interleaved rounds (medians)")->check(CLI::Range(1, 1000));
  gpu->add_option("-t,--threads", g->bench.threads, "host threads (default: all cores)")->check(CLI::Range(0, 1024));
  gpu->add_option("--llama-bench", g->bench.llama_bench,
                  "llama.cpp's llama-bench (CUDA build): runs the same file, -ngl 99 and -ncmoe K at each budget's VRAM");
  gpu->add_option("--llama-repeats", g->bench.llama_repeats, "llama-bench -r")->check(CLI::Range(1, 100));
  gpu->add_option("--idle-ttft", g->bench.idle_ttft_s,
                  "after the rounds: time to first token of a turn, hot and after this many seconds idle (0 = off)")
      ->check(CLI::Range(0, 3600));
  gpu->add_option("--svg", g->bench.svg, "write a plot of tok/s per budget");
  gpu->add_option("--json", g->bench.json, "write the numbers as JSON");
  gpu->callback([g] {
    g->bench.backends.clear();
    for (const std::string& b : split_list(g->budgets)) {
      const std::string entry = b == "all" ? "cuda" : "cuda@" + b;
      g->bench.backends.push_back(entry);
      if (g->no_read_ahead_too && b != "all") g->bench.backends.push_back(entry + "/nora");
    }
    if (g->bench.backends.empty()) fail("bench gpu: --budgets is empty");
    run_gpu_bench(g->bench);
  });
#endif
}

}  // namespace strata::cli
