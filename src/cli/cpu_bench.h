// `strata bench cpu` — where a CPU decode token and a prompt's windows spend their time, per part
// of the layer (util/phase_timer.h Part), at several thread counts side by side.
//
// One run, on one model (the routed experts through the file mapping, as `run` uses them when they
// fit in RAM; the mapping is populated first so no page fault is timed):
//   for each of --repeats rounds, for each thread count of --threads (interleaved, so drift on a
//   shared machine hits every count alike):
//     decode: a fresh session, a --decode-context token prompt (untimed), one untimed step, then
//             -n greedy steps timed, with the time of every part and the pool's hand-outs
//             (ThreadPool::jobs_run: synchronisation points) per token;
//     prompt: a fresh session, a --prompt-tokens prompt in windows of --chunk rows, timed the
//             same way (only in the first --prompt-repeats rounds, and skipped for thread counts
//             not in --prompt-threads, when given).
// With --llama-bench PATH (llama.cpp's llama-bench, a CPU build), each round also runs it at each
// thread count right after strata's runs there (`-t N -p PROMPT -n STEPS -r 1 -ngl 0`, the same
// file) and the first table shows its decode and prompt tok/s and strata's ratio beside them.
// After every round (so a run cut short by a time limit keeps the rounds so far) prints Markdown:
// tok/s per thread count (median, min–max, speedup over the fewest threads),
// then ms per decode token and per prompt window by part (medians) with the hand-outs and the
// hand-outs the pool's inline rule ran on the caller (compute/cpu/thread_pool.h), whether the
// greedy tokens and the logits were bitwise identical at every thread count (they must be: a "no"
// is a bug), and the first round's inline threshold per thread count (every round's pool measures
// its own; each round's progress line on stderr names it). --json keeps every round and --svg
// draws them (decode and prompt tok/s against the thread count, llama.cpp's beside strata's),
// both rewritten after each round (cli/cpu_bench_report.h). `--from-json FILE` runs nothing: it
// prints the tables of a JSON written earlier and, with --svg, draws its plot.
#pragma once

#include <string>

#include "cli/model_options.h"

namespace strata::cli {

struct CpuBenchOptions {
  ModelOptions model;
  std::string threads = "1,2";
  std::string prompt_threads;  // empty: every count of `threads`
  int prompt_tokens = 512;
  int chunk_rows = kCpuPrefillRows;  // cli/model_options.h says why
  int decode_context = 16;
  int n_decode = 32;
  int repeats = 3;
  int prompt_repeats = 0;  // rounds (the first ones) that also run the prompt; 0: every round
  std::string json;
  std::string svg;
  std::string from_json;        // not empty: report this JSON (and plot it), run nothing
  std::string llama_bench;      // empty: no peer
  bool mapped_weights = false;  // read the weights through the mapping (else the resident copy)
};

void run_cpu_bench(const CpuBenchOptions& options);

}  // namespace strata::cli
