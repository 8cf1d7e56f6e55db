// GPU decode benchmark — `strata bench gpu` and bench/cuda's bench_cuda_decode (the same code; the
// bench binary links no ICU, so it runs with the GPU box's slim kit).
//
// One GGUF, several backends side by side in one run: `repeats` rounds, each running every entry
// once (interleaved, so drift hits all alike; a warm-up run of each first), a fresh sequence per
// run: prefill `prompt` synthetic tokens in windows of `chunk` rows, then `tokens` greedy decode
// steps. Entries: "cpu", "cuda" (window graphs), "cuda-eager" (STRATA_CUDA_GRAPH=0), and
// "cuda@BUDGET" — routed experts under a GPU budget (bytes like 1G, a share like 25 %, or slots=N
// per layer; "/nora" appended: no read-ahead), the rest read from the GGUF mapping in pinned host
// memory; each tier entry has its own copy of the model.
//
// Reported: median tok/s per entry and whether the greedy tokens agree; for CUDA the HBM ceiling
// (weight bytes a decode token reads ÷ the device copy bandwidth measured here) and the host's
// time per replayed decode window before its first graph launch (GraphCounters: the ops' host
// bookkeeping and input staging, which the GPU waits for); per tier entry the hit rate, bytes
// copied in per token, the PCIe ceiling (those bytes ÷ the pinned host → device bandwidth
// measured here), the time split per token (host before the window, waiting for the host's jobs,
// copying misses on the critical path, read-ahead copies on the side branch, the host's serve
// time) and the read-ahead's precision. With `llama_bench` (the path of llama.cpp's llama-bench,
// built with CUDA) the same file runs through llama.cpp after strata's rounds: -ngl 99 for the
// all-resident entry, and for each budget -ncmoe K with K the MoE layers whose experts llama.cpp
// keeps on the CPU so that its VRAM for experts matches strata's arena (K = n_moe − round(arena ÷
// all expert bytes × n_moe)). Then a Markdown table, --json and an --svg plot (bars per budget:
// strata, strata without read-ahead, llama.cpp; the PCIe ceiling marked).
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

struct GpuBenchOptions {
  std::string path;
  std::vector<std::string> backends = {"cpu", "cuda"};
  int prompt = 64, tokens = 128, chunk = 64, repeats = 3, threads = 0;
  std::string json, svg;
  std::string llama_bench;  // llama.cpp's llama-bench binary; empty: strata only
  int llama_repeats = 3;
  // > 0: after the rounds, each entry's time to first token of a 16-token turn on a warm sequence,
  // hot and after this many seconds idle.
  int idle_ttft_s = 0;
  // Write `path` first when it does not exist: [SHAPE:]LAYERS:EXPERTS[:SKEW:CORRELATION] (a
  // `strata synth` shape, mid-qwen4exp by default, with that many layers and experts and, if
  // given, skewed + correlated routing), Q8_0 dense and IQ2_XS experts (issue 15's file is 48:512),
  // with the tokenizer dir's vocabulary if given.
  std::string synth, synth_tokenizer;
};

// "cpu,cuda@50%,cuda@50%/nora" → entries (cpu/cuda resolved like --backend). A tier entry may
// add /nora (no read-ahead), /self or /noself (GpuTierOptions::self_release) and /ram=SIZE (a RAM
// arena of SIZE as the host tier, reading the rest from the GGUF with O_DIRECT: the SSD tier).
// Throws strata::Error naming an unknown entry.
std::vector<std::string> parse_gpu_bench_backends(const std::string& list);

// Runs the benchmark and prints its report to stdout. Throws strata::Error (bad options, a model
// that does not load, llama-bench failing or printing no result).
void run_gpu_bench(const GpuBenchOptions& options);

}  // namespace strata::cli
