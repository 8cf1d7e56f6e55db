// Decode (and prefill) speed of one GGUF on each compute backend, side by side in one run:
// `repeats` rounds, each running every backend once (interleaved, so drift hits all alike), a
// fresh sequence per run: prefill `prompt` synthetic tokens in windows of `chunk` rows, then
// `tokens` greedy decode steps. Reports the median tok/s per backend, whether the backends'
// greedy tokens agree (and where they first part), and for CUDA the ceiling: the weight bytes
// one decode step must read (dense weights + n_layer · k routed experts) over the device's
// measured copy bandwidth. The first run of each backend is a warm-up (page cache, weight upload)
// and is not counted. No tokenizer is needed (so the binary links no ICU).
// Backend "cuda" runs window graphs (compute/cuda/window_graph.h, the default); "cuda-eager" is
// the same backend with STRATA_CUDA_GRAPH=0 (one launch per kernel), so the two compare in one run;
// STRATA_CUDA_PROFILE=1 prints the GPU time per op of the graphs. --synth LAYERS:EXPERTS first writes FILE (if
// it does not exist) as the mid-qwen4exp shape with that many layers and experts, Q8_0 dense and
// IQ2_XS experts (issue 15's 48:512 file), with --synth-tokenizer DIR's vocabulary if given.
// GPU expert tiers (compute/cuda/expert_tier.h): a backend "cuda@BUDGET" runs the CUDA backend with
// routed experts under that GPU budget (bytes like 1G, a share like 25%, or slots=N per layer;
// append "/nora" for no read-ahead), the rest read from the GGUF mapping (pinned host memory);
// each such entry has its own copy of the model, so they interleave like the others. Reported per
// entry: the tier's hit rate, bytes copied in per token, the host's serve time per token, and the
// PCIe ceiling: copied bytes per token over the pinned host-to-device bandwidth measured here.
//   bench_cuda_decode -m FILE [--backends cpu,cuda,cuda-eager] [--prompt 64] [--tokens 128]
//                     [--chunk 64] [--repeats 3] [--threads N] [--json out.json]
//                     [--synth LAYERS:EXPERTS [--synth-tokenizer DIR]]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "compute/backend_registry.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cuda/cuda_backend.h"
#include "compute/cuda/runtime.h"
#include "engine/session.h"
#include "model/model.h"
#include "quant/ggml_type.h"
#include "synth/synth.h"
#include "util/byte_size.h"
#include "util/error.h"

namespace {

using namespace strata;

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
  int slots = 0;
  bool staged = false;
};

Run run_once(const Model& model, compute::ThreadPool& pool, const std::string& backend, const std::vector<int32_t>& prompt,
             int n_tokens, int chunk, TierDelta* tier = nullptr) {
  Run r;
  const bool eager = backend == "cuda-eager";
  if (eager) setenv("STRATA_CUDA_GRAPH", "0", 1);
  const std::string name = eager || backend.rfind("cuda@", 0) == 0 ? "cuda" : backend;
  Session session(model, pool, nullptr, name);
  if (eager) unsetenv("STRATA_CUDA_GRAPH");
  auto start = std::chrono::steady_clock::now();
  session.prefill(prompt, chunk);
  r.prefill_tps = double(prompt.size()) / seconds_since(start);
  (void)session.logits();
  const compute::cuda::GpuTierInfo before = compute::cuda::gpu_tier_info(*session.state().backend);
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < n_tokens; ++i) {
    const std::vector<float>& logits = session.logits();
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.tokens.push_back(next);
    session.decode(next);
  }
  r.decode_tps = n_tokens / seconds_since(start);
  (void)session.logits();
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
    const double timed = double(after.stats.timed_handshakes - before.stats.timed_handshakes);
    if (timed > 0) {
      tier->round_trip_us = (after.stats.round_trip_ms - before.stats.round_trip_ms) * 1e3 / timed;
      tier->before_wait_us = (after.stats.before_wait_ms - before.stats.before_wait_ms) * 1e3 / timed;
      tier->serve_us = (after.stats.host_serve_ms - before.stats.host_serve_ms) * 1e3 /
                       double(after.stats.handshakes - before.stats.handshakes);
    }
    tier->slots = after.slots_per_layer;
    tier->staged = after.stats.staged;
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

// "cuda@25%", "cuda@1G", "cuda@slots=4", optionally "/nora": the tier settings of an entry.
compute::GpuTierOptions tier_for(const Model& model, const std::string& entry) {
  compute::GpuTierOptions tier;
  std::string spec = entry.substr(entry.find('@') + 1);
  if (const size_t comma = spec.find('/'); comma != std::string::npos) {
    if (spec.substr(comma + 1) != "nora") fail("bench_cuda_decode: {}: expected '/nora' after the budget", entry);
    tier.read_ahead = false;
    spec = spec.substr(0, comma);
  }
  tier.layers = model.expert_layouts();
  if (spec.rfind("slots=", 0) == 0) tier.slots_per_layer = std::stoi(spec.substr(6));
  else if (spec != "all") tier.budget_bytes = parse_byte_size(spec, tier.all_expert_bytes(model.hparams().n_expert), entry);
  return tier;
}

// Bytes of weights one decode token reads: every tensor except the routed experts, plus k experts
// per layer (their three matrices). The embedding reads one row; the PLE table a few rows.
double bytes_per_token(const Model& model) {
  const HParams& hp = model.hparams();
  double dense = 0, per_expert = 0;
  for (const TensorInfo& t : model.file().tensors()) {
    const std::string name = t.name;
    const double bytes = double(t.n_bytes);
    if (name.find("_exps") != std::string::npos) {
      per_expert += bytes / double(hp.n_expert) / double(hp.n_layer + hp.n_nextn);
    } else if (name.rfind("token_embd", 0) == 0 || name.rfind("per_layer_token_embd", 0) == 0) {
      continue;
    } else if (name.find("nextn") != std::string::npos || name.rfind("blk." + std::to_string(hp.n_layer) + ".", 0) == 0) {
      continue;  // the MTP head does not run in plain decode
    } else {
      dense += bytes;
    }
  }
  return dense + double(hp.n_layer) * hp.n_expert_used * per_expert;
}

double device_copy_gbs() {
  using compute::cuda::DeviceBuffer;
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer a(bytes), b(bytes);
  return copy_gbs(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, 2.0 * double(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    compute::cuda::register_cuda_backend();
    std::string path, backends_arg = "cpu,cuda", json_path, synth, synth_tokenizer;
    int prompt_n = 64, n_tokens = 128, chunk = 64, repeats = 3, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string key = argv[i], value = argv[i + 1];
      if (key == "-m") path = value;
      else if (key == "--backends") backends_arg = value;
      else if (key == "--prompt") prompt_n = std::stoi(value);
      else if (key == "--tokens") n_tokens = std::stoi(value);
      else if (key == "--chunk") chunk = std::stoi(value);
      else if (key == "--repeats") repeats = std::stoi(value);
      else if (key == "--threads") threads = std::stoi(value);
      else if (key == "--json") json_path = value;
      else if (key == "--synth") synth = value;
      else if (key == "--synth-tokenizer") synth_tokenizer = value;
      else fail("bench_cuda_decode: unknown option {}", key);
    }
    if (path.empty()) fail("bench_cuda_decode: -m FILE is required");
    std::vector<std::string> backends;
    for (size_t pos = 0; pos <= backends_arg.size();) {
      const size_t comma = std::min(backends_arg.find(',', pos), backends_arg.size());
      const std::string name = backends_arg.substr(pos, comma - pos);
      if (comma > pos)
        backends.push_back(name == "cuda-eager" || name.rfind("cuda@", 0) == 0 ? name : compute::resolve_backend(name));
      pos = comma + 1;
    }
    if (!synth.empty() && !std::filesystem::exists(path)) {
      const size_t colon = synth.find(':');
      if (colon == std::string::npos) fail("bench_cuda_decode: --synth expects LAYERS:EXPERTS, found {}", synth);
      SynthOptions options;
      options.hparams = synth_shape("mid-qwen4exp");
      resize_synth_shape(options.hparams, std::stoi(synth.substr(0, colon)), std::stoi(synth.substr(colon + 1)));
      options.dense_type = GgmlType::Q8_0;
      options.expert_type = GgmlType::IQ2_XS;
      options.n_threads = 0;
      if (!synth_tokenizer.empty()) {
        options.tokenizer_dir = synth_tokenizer;
        options.hparams.n_vocab = hf_tokenizer_vocab_size(synth_tokenizer);
      }
      const auto start = std::chrono::steady_clock::now();
      write_synthetic_model(options, path);
      std::fprintf(stderr, "wrote %s (%s) in %.1f s\n", path.c_str(), synth.c_str(), seconds_since(start));
    }
    const auto model = Model::load(path);
    const HParams& hp = model->hparams();
    compute::ThreadPool pool(threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency())));
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_n));
    for (int i = 0; i < prompt_n; ++i) prompt[size_t(i)] = int32_t((uint64_t(i) * 7919 + 13) % uint64_t(hp.n_vocab));

    std::map<std::string, std::unique_ptr<Model>> tier_models;  // one model (and device copy) per tier entry
    for (const std::string& b : backends)
      if (b.rfind("cuda@", 0) == 0) {
        tier_models[b] = Model::load(path);
        tier_models[b]->backend_shared().gpu_tier = tier_for(*tier_models[b], b);
      }
    auto model_for = [&](const std::string& b) -> const Model& {
      auto it = tier_models.find(b);
      return it == tier_models.end() ? *model : *it->second;
    };
    std::map<std::string, std::vector<double>> decode, prefill;
    std::map<std::string, std::vector<int32_t>> tokens;
    std::map<std::string, std::vector<TierDelta>> tiers;
    for (const std::string& b : backends)
      tokens[b] = run_once(model_for(b), pool, b, prompt, std::min(n_tokens, 8), chunk).tokens;
    for (int rep = 0; rep < repeats; ++rep)
      for (const std::string& b : backends) {
        TierDelta t;
        const Run r = run_once(model_for(b), pool, b, prompt, n_tokens, chunk, &t);
        if (t.slots > 0) tiers[b].push_back(t);
        decode[b].push_back(r.decode_tps);
        prefill[b].push_back(r.prefill_tps);
        tokens[b] = r.tokens;
        std::fprintf(stderr, "  run %d %-5s prefill %8.1f tok/s  decode %8.2f tok/s\n", rep, b.c_str(), r.prefill_tps,
                     r.decode_tps);
      }
    const double bytes = bytes_per_token(*model);
    const bool have_cuda = std::find(backends.begin(), backends.end(), "cuda") != backends.end();
    const double pcie = tiers.empty() ? 0.0 : h2d_gbs();
    const double bw = have_cuda ? device_copy_gbs() : 0.0;
    fmt::print("model {}: {} layers, {} experts top-{}; {} threads; prompt {} (chunks of {}), {} decode tokens, {} "
               "repeats\n",
               path, hp.n_layer, hp.n_expert, hp.n_expert_used, pool.size(), prompt_n, chunk, n_tokens, repeats);
    fmt::print("weights read per decode token: {:.1f} MiB\n", bytes / (1 << 20));
    std::string json = fmt::format("{{\"model\": \"{}\", \"bytes_per_token\": {:.0f}", path, bytes);
    for (const std::string& b : backends) {
      const double d = median(decode[b]), p = median(prefill[b]);
      fmt::print("{:5s}  decode {:8.2f} tok/s (median)   prefill {:8.1f} tok/s   {:.1f} GB/s of weights\n", b, d, p,
                 d * bytes / 1e9);
      json += fmt::format(", \"{}\": {{\"decode_tps\": {:.3f}, \"prefill_tps\": {:.2f}", b, d, p);
      if (auto it = tiers.find(b); it != tiers.end() && !it->second.empty()) {
        std::vector<double> hit, mib, serve, resolve, source, job, cpu, wait, copy, token, round_trip, before_wait,
            serve_us, ra_mib, ra_issued, ra_used, ra_wait, ra_copy;
        for (const TierDelta& t : it->second) {
          hit.push_back(t.hit_rate);
          mib.push_back(t.loaded_mib_per_token);
          serve.push_back(t.serve_ms_per_token);
          resolve.push_back(t.resolve_ms);
          source.push_back(t.source_ms);
          job.push_back(t.job_ms);
          cpu.push_back(t.cpu_ms);
          wait.push_back(t.gpu_wait_ms);
          copy.push_back(t.gpu_copy_ms);
          token.push_back(t.token_ms);
          round_trip.push_back(t.round_trip_us);
          before_wait.push_back(t.before_wait_us);
          serve_us.push_back(t.serve_us);
          ra_mib.push_back(t.ra_mib);
          ra_issued.push_back(t.ra_issued);
          ra_used.push_back(t.ra_used);
          ra_wait.push_back(t.ra_wait_ms);
          ra_copy.push_back(t.ra_copy_ms);
        }
        const double m = median(mib), ceiling = m > 0 ? pcie * 1e9 / (m * (1 << 20)) : 0.0;
        fmt::print("       gpu tier: {} slots per layer, hit rate {:.3f}, {:.1f} MiB copied in per token, host serve "
                   "{:.3f} ms per token; PCIe ceiling {:.0f} tok/s ({:.1f} GB/s pinned H2D), reached {:.2f}\n",
                   it->second.front().slots, median(hit), m, median(serve), ceiling, pcie,
                   ceiling > 0 ? d / ceiling : 0.0);
        fmt::print("       host tier {}\n", it->second.front().staged ? "staged through the bounce buffer" : "read in place");
        fmt::print("       per token (ms): {:.3f} in all; host serve {:.3f} = resolve {:.3f} + host tier {:.3f} + job "
                   "{:.3f}, its CPU time {:.3f}; GPU waiting for jobs {:.3f}, copying misses {:.3f} ({:.1f} GB/s)\n",
                   median(token), median(serve), median(resolve), median(source), median(job), median(cpu),
                   median(wait), median(copy), median(copy) > 0 ? m * (1 << 20) / (median(copy) * 1e6) : 0.0);
        fmt::print("       per handshake (us): GPU publish -> GPU sees the job ready {:.1f}, of it the host serving {:.1f} "
                   "and the GPU's own work (shared expert) {:.1f}\n",
                   median(round_trip), median(serve_us), median(before_wait));
        fmt::print("       read-ahead per token: {:.1f} loads issued, {:.1f} of them used ({:.2f}), {:.1f} MiB; side "
                   "branch waiting {:.3f} ms, copying {:.3f} ms\n",
                   median(ra_issued), median(ra_used), median(ra_issued) > 0 ? median(ra_used) / median(ra_issued) : 0.0,
                   median(ra_mib), median(ra_wait), median(ra_copy));
        json += fmt::format(", \"slots\": {}, \"hit_rate\": {:.4f}, \"mib_per_token\": {:.2f}, \"serve_ms\": {:.4f}, "
                            "\"pcie_ceiling_tps\": {:.2f}, \"gpu_wait_ms\": {:.4f}, \"gpu_copy_ms\": {:.4f}, "
                            "\"round_trip_us\": {:.2f}, \"before_wait_us\": {:.2f}, \"read_ahead_mib\": {:.2f}, "
                            "\"read_ahead_issued\": {:.2f}, \"read_ahead_used\": {:.2f}, \"read_ahead_copy_ms\": {:.4f}",
                            it->second.front().slots, median(hit), m, median(serve), ceiling, median(wait), median(copy),
                            median(round_trip), median(before_wait), median(ra_mib), median(ra_issued), median(ra_used),
                            median(ra_copy));
      }
      json += "}";
    }
    if (have_cuda) {
      fmt::print("cuda device {}; device copy bandwidth {:.0f} GB/s (r+w) -> ceiling {:.0f} tok/s; cuda reaches {:.2f} of "
                 "it\n",
                 compute::cuda::describe_device(), bw, bw * 1e9 / bytes, median(decode["cuda"]) / (bw * 1e9 / bytes));
      json += fmt::format(", \"copy_gbs\": {:.1f}, \"ceiling_tps\": {:.2f}", bw, bw * 1e9 / bytes);
    }
    for (size_t i = 1; i < backends.size(); ++i) {
      const auto& a = tokens[backends[0]];
      const auto& b = tokens[backends[i]];
      size_t same = 0;
      while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
      fmt::print("greedy tokens: {} and {} agree on the first {} of {}\n", backends[0], backends[i], same, a.size());
      json += fmt::format(", \"tokens_agree_{}\": {}", backends[i], same);
    }
    json += "}\n";
    if (!json_path.empty()) {
      std::FILE* f = std::fopen(json_path.c_str(), "w");
      if (!f) fail("{}: cannot open for writing", json_path);
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_decode: %s\n", e.what());
    return 1;
  }
}
