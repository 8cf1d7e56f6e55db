// What `strata bench cpu` measured (CpuBenchRecord) and what it makes of it: the JSON it keeps
// (--json), the Markdown tables it prints and the plot it draws (--svg). A run builds the record
// and reports it after every round (cli/cpu_bench.h); `--from-json FILE` reads a record a run
// wrote earlier and reports it again without running anything.
//
// The plot: two panels side by side, decode tok/s and prompt tok/s against the thread count (the
// counts evenly spaced as categories, in the record's order): strata's medians as a line with
// markers and min–max whiskers over the rounds, llama.cpp's medians as a second line where the
// record has them, and strata ÷ llama.cpp written over each thread count that has both. A record
// with no prompt runs (strata's or llama.cpp's) gets the decode panel alone.
//
// Errors: a JSON that is not one, or lacks a field the report needs or has it of the wrong type,
// throws strata::Error naming the file, the field (its path, e.g. threads.16.decode[2].seconds)
// and what was expected vs found. No state: every function is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/phase_timer.h"

namespace strata::cli {

// One timed run: seconds, ms per part, pool hand-outs, for all of its units (tokens or windows).
struct CpuBenchSample {
  double seconds = 0;
  PhaseTimes times;
  uint64_t jobs = 0;
  uint64_t jobs_inline = 0;  // estimated hand-outs the pool's inline rule ran on the caller
};

// llama-bench's prompt and generation tok/s (avg_ts) at one thread count, one repetition each;
// prompt_tps 0: no prompt test that round.
struct LlamaSample {
  double prompt_tps = 0, decode_tps = 0;
};

// Every round of one thread count.
struct CpuBenchThreads {
  std::vector<CpuBenchSample> decode, prompt;
  std::vector<LlamaSample> llama;
  std::string inline_rule;  // ThreadPool::describe_inline_rule of the first round's pool (JSON
                            // written before it was kept: empty, inline_work_ns stands for it)
  double inline_work_ns = 0;
};

struct CpuBenchRecord {
  std::string model;  // the GGUF's path
  std::string date;   // when the run started ("2026-12-05 15:07 UTC"); may be empty
  int prompt_tokens = 0, chunk_rows = 64, n_decode = 0, decode_context = 0;
  int rounds = 0;                         // rounds done
  int repeats = 0;                        // rounds planned (the rounds done, read from JSON)
  std::optional<bool> bitwise_identical;  // greedy tokens and logits the same at every count
  std::vector<std::pair<int, double>> round_trips;  // (cpu, ns) cache-line round trips from cpu 0
  std::vector<int> counts;                          // the thread counts, in run order
  std::map<int, CpuBenchThreads> threads;           // one per count
};

// "2026-12-05 15:07 UTC": a record's date.
std::string utc_minute(std::chrono::system_clock::time_point time);

// The JSON --json writes (every round's numbers).
nlohmann::json cpu_bench_json(const CpuBenchRecord& record);

// The record `json` holds; `file` names it in errors. Thread counts in ascending order.
CpuBenchRecord cpu_bench_record_from_json(const nlohmann::json& json, const std::string& file);

// Reads and parses `path`; a record without a date gets the file's modification time, marked
// "(file time)".
CpuBenchRecord read_cpu_bench_json(const std::string& path);

// The Markdown tables a run prints after each round, under `heading` (e.g. "### After round 2 of
// 3"): tok/s per count (with llama.cpp's where the record has them), ms by part for decode and
// prompt, the bitwise check and the pools' inline rule.
std::string cpu_bench_tables(const CpuBenchRecord& record, const std::string& heading);

// The plot (900 px wide), an SVG document.
std::string cpu_bench_svg(const CpuBenchRecord& record);

// `strata bench cpu --from-json JSON [--svg SVG]`: prints the tables of the record in `json_path`
// and, when svg_path is not empty, writes its plot there.
void redraw_cpu_bench(const std::string& json_path, const std::string& svg_path);

}  // namespace strata::cli
