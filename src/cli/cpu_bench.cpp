#include "cli/cpu_bench.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "gguf/resident_weights.h"
#include "model/model.h"
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One timed run: seconds, per-part ms, pool hand-outs, all for `units` units (tokens or windows).
struct Sample {
  double seconds = 0;
  PhaseTimes times;
  uint64_t jobs = 0;
  uint64_t jobs_inline = 0;  // estimated hand-outs the pool's inline rule ran on the caller
};

// llama-bench's prompt and generation tok/s (avg_ts) at one thread count, one repetition each.
struct LlamaSample {
  double prompt_tps = 0, decode_tps = 0;
};

// What every round of one thread count gave.
struct PerThreads {
  std::vector<Sample> decode, prompt;
  std::vector<int32_t> decode_ids;   // the greedy tokens (first round)
  std::vector<float> decode_logits;  // the last step's logits (first round)
  std::vector<float> prompt_logits;  // the prompt's last row (first round)
  std::vector<LlamaSample> llama;
  std::string inline_rule;  // ThreadPool::describe_inline_rule of the first round's pool
  double inline_work_ns = 0;
};

int32_t argmax_token(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sample run_decode(const Model& model, compute::ThreadPool& pool, std::span<const int32_t> context,
                  int n_decode, int chunk_rows, std::vector<int32_t>& ids,
                  std::vector<float>& logits) {
  Session session(model, pool);
  session.prefill(context, chunk_rows);
  int32_t token = argmax_token(session.logits());
  session.decode(token);  // untimed: the first step sizes the decode scratch
  ids.clear();
  Sample s;
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

Sample run_prompt(const Model& model, compute::ThreadPool& pool, std::span<const int32_t> prompt,
                  int chunk_rows, std::vector<float>& logits) {
  Session session(model, pool);
  Sample s;
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

// Markdown table of ms per unit by part (medians over the rounds), one column per thread count.
void print_parts(const std::string& title, const std::vector<int>& counts,
                 const std::map<int, std::vector<Sample>>& samples, double units) {
  fmt::print("\n{}\n\n| part |", title);
  for (int n : counts) fmt::print(" {} t |", n);
  fmt::print(" {}→{} t |\n|---|", counts.front(), counts.back());
  for (size_t i = 0; i <= counts.size(); ++i) fmt::print("---|");
  fmt::print("\n");
  auto row = [&](const std::string& name, auto value) {
    std::vector<double> med;
    bool any = false;
    for (int n : counts) {
      std::vector<double> v;
      for (const Sample& s : samples.at(n)) v.push_back(value(s) / units);
      med.push_back(median(v));
      any = any || med.back() > 0.0005;
    }
    if (!any) return;
    fmt::print("| {} |", name);
    for (double m : med) fmt::print(" {:.3f} |", m);
    fmt::print(" {} |\n", med.back() > 0 ? fmt::format("{:.2f}x", med.front() / med.back()) : "-");
  };
  for (size_t p = 0; p < size_t(Part::kCount); ++p)
    row(std::string(part_name(Part(p))), [p](const Sample& s) { return s.times.part_ms[p]; });
  row("other", [](const Sample& s) {
    double parts = 0;
    for (double ms : s.times.part_ms) parts += ms;
    return s.seconds * 1e3 - parts;
  });
  row("**total**", [](const Sample& s) { return s.seconds * 1e3; });
  row("pool hand-outs (count)", [](const Sample& s) { return double(s.jobs); });
  row("run on the caller by the inline rule (count)",
      [](const Sample& s) { return double(s.jobs_inline); });
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// prompt_tokens 0: the generation test only.
LlamaSample run_llama_bench(const CpuBenchOptions& o, const std::string& path, int threads,
                            int prompt_tokens) {
  const std::string command = fmt::format(
      "{} -m {} -ngl 0 -t {} -p {} -n {} -r 1 -o json 2>/dev/null", shell_quote(o.llama_bench),
      shell_quote(path), threads, prompt_tokens, o.n_decode);
  std::FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) fail("bench cpu: cannot start {}: {}", o.llama_bench, std::strerror(errno));
  std::string out;
  std::array<char, 4096> buffer{};
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;)
    out.append(buffer.data(), n);
  const int status = pclose(pipe);
  if (status != 0)
    fail("bench cpu: `{}` failed (status {}): {}", command, status, out.substr(0, 400));
  const size_t open = out.find('[');
  const nlohmann::json j =
      open == std::string::npos
          ? nlohmann::json()
          : nlohmann::json::parse(out.substr(open), nullptr, /*allow_exceptions=*/false);
  LlamaSample r;
  if (j.is_array())
    for (const nlohmann::json& t : j) {
      if (!t.is_object() || !t.contains("avg_ts")) continue;
      if (t.value("n_prompt", 0) > 0 && t.value("n_gen", 0) == 0)
        r.prompt_tps = t["avg_ts"].get<double>();
      if (t.value("n_gen", 0) > 0 && t.value("n_prompt", 0) == 0)
        r.decode_tps = t["avg_ts"].get<double>();
    }
  if (r.decode_tps == 0)
    fail("bench cpu: llama-bench's output has no generation test: {}", out.substr(0, 400));
  return r;
}

nlohmann::json sample_json(const Sample& s) {
  nlohmann::json parts = nlohmann::json::object();
  for (size_t p = 0; p < size_t(Part::kCount); ++p)
    parts[std::string(part_name(Part(p)))] = s.times.part_ms[p];
  return {{"seconds", s.seconds},
          {"pool_jobs", s.jobs},
          {"pool_jobs_inline", s.jobs_inline},
          {"part_ms", parts}};
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
  std::vector<std::pair<int, double>> round_trips;
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
  std::map<int, PerThreads> results;
  auto report = [&](int rounds_done) {
    const int n_windows = (o.prompt_tokens + o.chunk_rows - 1) / o.chunk_rows;
    const bool peer = !o.llama_bench.empty();
    fmt::print("\n### After round {} of {}\n", rounds_done, o.repeats);
    fmt::print(
        "\n| threads | decode tok/s median (min-max) | speedup | pool hand-outs / token | prompt "
        "{} tok/s median (min-max) | speedup | pool hand-outs / window |{}\n",
        o.prompt_tokens,
        peer ? " llama.cpp decode | strata / llama.cpp | llama.cpp prompt | strata / llama.cpp |"
             : "");
    fmt::print("|---|---|---|---|---|---|---|{}\n", peer ? "---|---|---|---|" : "");
    const double base_decode = median([&] {
      std::vector<double> v;
      for (const Sample& s : results[counts.front()].decode) v.push_back(o.n_decode / s.seconds);
      return v;
    }());
    double base_prompt = 0;
    for (int n : counts) {
      const PerThreads& r = results[n];
      auto rates = [](const std::vector<Sample>& samples, double units) {
        std::vector<double> v;
        for (const Sample& s : samples) v.push_back(units / s.seconds);
        return v;
      };
      const std::vector<double> d = rates(r.decode, o.n_decode),
                                p = rates(r.prompt, o.prompt_tokens);
      std::vector<double> djobs, pjobs;
      for (const Sample& s : r.decode) djobs.push_back(double(s.jobs) / o.n_decode);
      for (const Sample& s : r.prompt) pjobs.push_back(double(s.jobs) / n_windows);
      if (base_prompt == 0 && !p.empty()) base_prompt = median(p);
      std::string llama;
      if (peer) {
        std::vector<double> ld, lp;
        for (const LlamaSample& l : r.llama) {
          ld.push_back(l.decode_tps);
          if (l.prompt_tps > 0) lp.push_back(l.prompt_tps);
        }
        llama = fmt::format(
            " {:.2f} | {:.2f}x | {} | {} |", median(ld), median(d) / median(ld),
            median(lp) > 0 ? fmt::format("{:.1f}", median(lp)) : "-",
            median(lp) > 0 && !p.empty() ? fmt::format("{:.2f}x", median(p) / median(lp)) : "-");
      }
      fmt::print("| {} | {:.2f} ({:.2f}-{:.2f}) | {:.2f}x | {:.0f} | {} | {} | {} |{}\n", n,
                 median(d), *std::min_element(d.begin(), d.end()),
                 *std::max_element(d.begin(), d.end()), median(d) / base_decode, median(djobs),
                 p.empty() ? "-"
                           : fmt::format("{:.1f} ({:.1f}-{:.1f})", median(p),
                                         *std::min_element(p.begin(), p.end()),
                                         *std::max_element(p.begin(), p.end())),
                 p.empty() ? "-" : fmt::format("{:.2f}x", median(p) / base_prompt),
                 p.empty() ? "-" : fmt::format("{:.0f}", median(pjobs)), llama);
    }
    std::map<int, std::vector<Sample>> decode, prompt_samples;
    std::vector<int> with_prompt;
    for (int n : counts) {
      decode[n] = results[n].decode;
      if (!results[n].prompt.empty()) {
        prompt_samples[n] = results[n].prompt;
        with_prompt.push_back(n);
      }
    }
    print_parts(fmt::format("Decode, ms per token by part (medians of {} rounds, {} steps each "
                            "after a {}-token prompt)",
                            rounds_done, o.n_decode, o.decode_context),
                counts, decode, o.n_decode);
    if (!with_prompt.empty())
      print_parts(
          fmt::format("Prompt, ms per {}-row window by part (medians of {} rounds, {} tokens)",
                      o.chunk_rows, prompt_samples.begin()->second.size(), o.prompt_tokens),
          with_prompt, prompt_samples, n_windows);
    // Thread count must never change a bit (the greedy tokens, the logits).
    bool same = true;
    for (int n : counts) {
      const PerThreads& r = results[n];
      const PerThreads& first = results[counts.front()];
      same = same && r.decode_ids == first.decode_ids && r.decode_logits == first.decode_logits;
      if (!r.prompt_logits.empty() && !results[with_prompt.front()].prompt_logits.empty())
        same = same && r.prompt_logits == results[with_prompt.front()].prompt_logits;
    }
    fmt::print("\ntokens and logits bitwise identical at every thread count: {}\n",
               same ? "yes" : "NO (a bug)");
    fmt::print("\nthe pools' inline rule (first round; each round's pool measures its own):\n");
    for (int n : counts) fmt::print("- {} threads: {}\n", n, results[n].inline_rule);
    if (!o.json.empty()) {
      nlohmann::json j;
      j["model"] = path;
      j["prompt_tokens"] = o.prompt_tokens;
      j["chunk_rows"] = o.chunk_rows;
      j["n_decode"] = o.n_decode;
      j["decode_context"] = o.decode_context;
      j["rounds"] = rounds_done;
      j["bitwise_identical"] = same;
      for (const auto& [cpu, ns] : round_trips)
        j["cache_line_round_trip_ns"][std::to_string(cpu)] = ns;
      for (int n : counts) {
        nlohmann::json t;
        t["inline_work_ns"] = results[n].inline_work_ns;
        for (const Sample& s : results[n].decode) t["decode"].push_back(sample_json(s));
        for (const Sample& s : results[n].prompt) t["prompt"].push_back(sample_json(s));
        for (const LlamaSample& l : results[n].llama)
          t["llama_cpp"].push_back(
              {{"decode_tok_s", l.decode_tps}, {"prompt_tok_s", l.prompt_tps}});
        j["threads"][std::to_string(n)] = t;
      }
      std::ofstream out(o.json);
      out << j.dump(2) << "\n";
      if (!out) fail("{}: cannot write the JSON", o.json);
    }
  };

  for (int round = 0; round < o.repeats; ++round) {
    for (int n : counts) {
      compute::ThreadPool pool(n);
      PerThreads& r = results[n];
      if (round == 0) {
        r.inline_rule = pool.describe_inline_rule();
        r.inline_work_ns = pool.inline_work_ns();
      }
      std::vector<int32_t> ids;
      std::vector<float> logits;
      r.decode.push_back(run_decode(*model, pool, context, o.n_decode, o.chunk_rows, ids, logits));
      if (round == 0) {
        r.decode_ids = ids;
        r.decode_logits = logits;
      }
      const bool prompt_round =
          round < prompt_repeats && o.prompt_tokens > 0 &&
          std::find(prompt_counts.begin(), prompt_counts.end(), n) != prompt_counts.end();
      if (prompt_round) {
        r.prompt.push_back(run_prompt(*model, pool, long_prompt, o.chunk_rows, logits));
        if (round == 0) r.prompt_logits = logits;
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
