// bench_cuda_decode — the GPU decode benchmark of `strata bench gpu` (src/cli/gpu_bench.h: what it
// runs and reports) as a binary that links no ICU, so it runs with the GPU box's slim kit.
//   bench_cuda_decode -m FILE [--backends cpu,cuda,cuda-eager,cuda@50%,cuda@1G/nora,cuda@25%/self,
//                     cuda@25%/ram=10%] [--prompt 64]
//                     [--tokens 128] [--chunk 64] [--repeats 3] [--threads N] [--json out.json]
//                     [--svg out.svg] [--llama-bench PATH [--llama-repeats 3]] [--idle-ttft SECONDS]
//                     [--synth [SHAPE:]LAYERS:EXPERTS[:SKEW:CORR] [--synth-tokenizer DIR]]
// STRATA_CUDA_PROFILE=1 prints the GPU time per op of the graphs.
#include <cstdio>
#include <exception>
#include <string>

#include "cli/gpu_bench.h"
#include "util/error.h"

int main(int argc, char** argv) {
  using namespace strata;
  try {
    cli::GpuBenchOptions o;
    for (int i = 1; i < argc; i += 2) {
      const std::string key = argv[i];
      if (i + 1 >= argc) fail("bench_cuda_decode: {} expects a value", key);
      const std::string value = argv[i + 1];
      if (key == "-m") o.path = value;
      else if (key == "--backends") o.backends = cli::parse_gpu_bench_backends(value);
      else if (key == "--prompt") o.prompt = std::stoi(value);
      else if (key == "--tokens") o.tokens = std::stoi(value);
      else if (key == "--chunk") o.chunk = std::stoi(value);
      else if (key == "--repeats") o.repeats = std::stoi(value);
      else if (key == "--threads") o.threads = std::stoi(value);
      else if (key == "--json") o.json = value;
      else if (key == "--svg") o.svg = value;
      else if (key == "--llama-bench") o.llama_bench = value;
      else if (key == "--llama-repeats") o.llama_repeats = std::stoi(value);
      else if (key == "--synth") o.synth = value;
      else if (key == "--idle-ttft") o.idle_ttft_s = std::stoi(value);
      else if (key == "--synth-tokenizer") o.synth_tokenizer = value;
      else fail("bench_cuda_decode: unknown option {}", key);
    }
    cli::run_gpu_bench(o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_decode: %s\n", e.what());
    return 1;
  }
}
