#include "cli/cpu_bench.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/cpu_bench_report.h"
#include "cli/llama_bench_runner.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "gguf/resident_weights.h"
#include "model/model.h"
#include "util/atomic_file.h"
#include "util/core_latency.h"
#include "util/error.h"
#include "util/phase_timer.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

namespace strata::cli {
namespace {

std::vector<int> parse_threads(const std::string& list, const char* option) {
  std::vector<int> counts;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    if (comma > pos) {
      const std::string item = list.substr(pos, comma - pos);
      int n = 0;
      try {
        n = std::stoi(item);
      } catch (const std::exception&) {
        n = 0;
      }
      if (n < 1 || n > 1024) fail("{}: expected thread counts 1..1024, found '{}'", option, item);
      if (std::find(counts.begin(), counts.end(), n) == counts.end()) counts.push_back(n);
    }
    pos = comma + 1;
  }
  if (counts.empty()) fail("{}: expected at least one thread count", option);
  return counts;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What strata's runs at one thread count gave beyond the record: the bitwise check's inputs.
struct Outputs {
  std::vector<int32_t> decode_ids;   // the greedy tokens (first round)
  std::vector<float> decode_logits;  // the last step's logits (first round)
  std::vector<float> prompt_logits;  // the prompt's last row (first round)
};

int32_t argmax_token(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

CpuBenchSample run_decode(const Model& model, compute::ThreadPool& pool,
                          std::span<const int32_t> context, int n_decode, int chunk_rows,
                          std::vector<int32_t>& ids, std::vector<float>& logits) {
  Session session(model, pool);
  session.prefill(context, chunk_rows);
  int32_t token = argmax_token(session.logits());
  session.decode(token);  // untimed: the first step sizes the decode scratch
  ids.clear();
  CpuBenchSample s;
  active_phase_times() = &s.times;
  const uint64_t jobs_before = pool.jobs_run(), inline_before = pool.jobs_inline();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n_decode; ++i) {
    token = argmax_token(session.logits());
    ids.push_back(token);
    session.decode(token);
  }
  s.seconds = seconds_since(start);
  s.jobs = pool.jobs_run() - jobs_before;
  s.jobs_inline = pool.jobs_inline() - inline_before;
  active_phase_times() = nullptr;
  logits = session.logits();
  return s;
}

CpuBenchSample run_prompt(const Model& model, compute::ThreadPool& pool,
                          std::span<const int32_t> prompt, int chunk_rows,
                          std::vector<float>& logits) {
  Session session(model, pool);
  CpuBenchSample s;
  active_phase_times() = &s.times;
  const uint64_t jobs_before = pool.jobs_run(), inline_before = pool.jobs_inline();
  const auto start = std::chrono::steady_clock::now();
  session.prefill(prompt, chunk_rows);
  s.seconds = seconds_since(start);
  s.jobs = pool.jobs_run() - jobs_before;
  s.jobs_inline = pool.jobs_inline() - inline_before;
  active_phase_times() = nullptr;
  logits = session.logits();
  return s;
}

// prompt_tokens 0: the generation test only.
LlamaSample run_llama_bench(const CpuBenchOptions& o, const std::string& path, int threads,
                            int prompt_tokens) {
  const nlohmann::json tests = run_llama_bench_json(
      o.llama_bench,
      {"-m", path, "-ngl", "0", "-t", std::to_string(threads), "-p", std::to_string(prompt_tokens), "-n",
       std::to_string(o.n_decode), "-r", "1"},
      "bench cpu");
  LlamaSample r;
  if (const auto prompt = llama_test_tps(tests, /*has_prompt=*/true, /*has_gen=*/false)) r.prompt_tps = prompt->tps;
  if (const auto decode = llama_test_tps(tests, /*has_prompt=*/false, /*has_gen=*/true)) r.decode_tps = decode->tps;
  if (r.decode_tps == 0) fail("bench cpu: llama-bench's output has no generation test: {}", tests.dump().substr(0, 400));
  return r;
}

}  // namespace

void run_cpu_bench(const CpuBenchOptions& o) {
  const std::vector<int> counts = parse_threads(o.threads, "--threads");
  const std::vector<int> prompt_counts =
      o.prompt_threads.empty() ? counts : parse_threads(o.prompt_threads, "--prompt-threads");
  const std::string path = resolve_model_path(o.model);
  const auto load_start = std::chrono::steady_clock::now();
  const auto model = Model::load(path);
  // The weights as run, chat and serve hold them: copied into huge-page memory
  // (gguf/resident_weights.h), experts included (they are read through the mapping here). With
  // --mapped-weights every page of the mapping is faulted in before anything is timed instead (a
  // first-touch fault inside a timed step would be counted as compute).
  const GgufFile& file = model->file();
  if (o.mapped_weights)
    file.advise(0, file.file_size(), MADV_POPULATE_READ);
  else
    copy_resident_weights(file, plan_resident_weights(file, /*experts_resident=*/true));
  const HParams& hp = model->hparams();
  fmt::print("model {} ({}), {} layers, {} experts top-{}; loaded in {:.1f} s ({})\n", path,
             arch_name(hp.arch), hp.n_layer, hp.n_expert, hp.n_expert_used,
             seconds_since(load_start), o.mapped_weights ? "mapped, every page faulted in" : "weights in huge-page memory");
  // What a hand-out and a shared output cost between cores (util/core_latency.h): from the first
  // allowed CPU to each of the next ones (at most 15 pairs), before anything is timed.
  CpuBenchRecord record;
  record.model = path;
  record.date = utc_minute(std::chrono::system_clock::now());
  record.prompt_tokens = o.prompt_tokens;
  record.chunk_rows = o.chunk_rows;
  record.n_decode = o.n_decode;
  record.decode_context = o.decode_context;
  record.repeats = o.repeats;
  record.counts = counts;
  std::vector<std::pair<int, double>>& round_trips = record.round_trips;
  {
    const std::vector<int> cpus = allowed_cpus();
    for (size_t k = 1; k < cpus.size() && k <= 15; ++k)
      if (const std::optional<double> ns = cache_line_round_trip_ns(cpus[0], cpus[k]))
        round_trips.emplace_back(cpus[k], *ns);
    if (!round_trips.empty()) {
      std::string line;
      for (const auto& [cpu, ns] : round_trips)
        line += fmt::format("{}{}: {:.0f}", line.empty() ? "" : ", ", cpu, ns);
      fmt::print("cache-line round trip from cpu {}, ns: {}\n", cpus[0], line);
    }
  }
  std::vector<int32_t> prompt(size_t(std::max(o.prompt_tokens, o.decode_context)));
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = int32_t((i * 7919 + 13) % uint64_t(hp.n_vocab));
  const std::span<const int32_t> context = std::span(prompt).first(size_t(o.decode_context));
  const std::span<const int32_t> long_prompt = std::span(prompt).first(size_t(o.prompt_tokens));

  const int prompt_repeats =
      o.prompt_repeats > 0 ? std::min(o.prompt_repeats, o.repeats) : o.repeats;
  std::map<int, Outputs> outputs;
  auto report = [&](int rounds_done) {
    record.rounds = rounds_done;
    // Thread count must never change a bit (the greedy tokens, the logits).
    bool same = true;
    const Outputs& first = outputs[counts.front()];
    const Outputs* first_prompt = nullptr;
    for (int n : counts)
      if (!first_prompt && !outputs[n].prompt_logits.empty()) first_prompt = &outputs[n];
    for (int n : counts) {
      const Outputs& r = outputs[n];
      same = same && r.decode_ids == first.decode_ids && r.decode_logits == first.decode_logits;
      if (!r.prompt_logits.empty()) same = same && r.prompt_logits == first_prompt->prompt_logits;
    }
    record.bitwise_identical = same;
    fmt::print("{}", cpu_bench_tables(
                         record, fmt::format("### After round {} of {}", rounds_done, o.repeats)));
    if (!o.json.empty()) write_text_file(o.json, cpu_bench_json(record).dump(2) + "\n");
    if (!o.svg.empty()) write_text_file(o.svg, cpu_bench_svg(record));
  };

  for (int round = 0; round < o.repeats; ++round) {
    for (int n : counts) {
      compute::ThreadPool pool(n);
      CpuBenchThreads& r = record.threads[n];
      Outputs& out = outputs[n];
      if (round == 0) {
        r.inline_rule = pool.describe_inline_rule();
        r.inline_work_ns = pool.inline_work_ns();
      }
      std::vector<int32_t> ids;
      std::vector<float> logits;
      r.decode.push_back(run_decode(*model, pool, context, o.n_decode, o.chunk_rows, ids, logits));
      if (round == 0) {
        out.decode_ids = ids;
        out.decode_logits = logits;
      }
      const bool prompt_round =
          round < prompt_repeats && o.prompt_tokens > 0 &&
          std::find(prompt_counts.begin(), prompt_counts.end(), n) != prompt_counts.end();
      if (prompt_round) {
        r.prompt.push_back(run_prompt(*model, pool, long_prompt, o.chunk_rows, logits));
        if (round == 0) out.prompt_logits = logits;
      }
      if (!o.llama_bench.empty())
        r.llama.push_back(run_llama_bench(o, path, n, prompt_round ? o.prompt_tokens : 0));
      fmt::print(
          stderr, "round {}/{}, {} threads (inline under {:.1f} µs): decode {:.2f} tok/s{}{}\n",
          round + 1, o.repeats, n, pool.inline_work_ns() * 1e-3,
          o.n_decode / r.decode.back().seconds,
          r.prompt.size() > size_t(round)
              ? fmt::format(", prompt {:.1f} tok/s", o.prompt_tokens / r.prompt.back().seconds)
              : "",
          r.llama.empty() ? ""
                          : fmt::format("; llama.cpp decode {:.2f}, prompt {:.1f} tok/s",
                                        r.llama.back().decode_tps, r.llama.back().prompt_tps));
    }
    // The tables after every round: a run cut short (a time limit) still leaves the rounds so far.
    report(round + 1);
  }
}

}  // namespace strata::cli
