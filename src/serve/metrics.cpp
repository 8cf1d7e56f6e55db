#include "serve/metrics.h"

#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>

#include <cmath>

namespace strata::serve {
namespace {

// Latency buckets from 5 ms (a warm first token of a small model) to 2 min (a long queue).
std::vector<double> latency_buckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// Prometheus label values escape backslash, double quote and newline.
std::string label_value(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, std::string_view name) const {
  std::lock_guard lock(mutex_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, le, cumulative);
  }
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(sum_), name, count_);
}

ServeMetrics::ServeMetrics()
    : ttft_(latency_buckets()), queue_wait_(latency_buckets()), duration_(latency_buckets()) {}

void ServeMetrics::count_response(std::string_view path, int status) {
  std::lock_guard lock(mutex_);
  ++responses_[{std::string(path), status}];
}

void ServeMetrics::record_generation(const Generation& g) {
  queue_wait_.observe(g.queue_wait_s);
  duration_.observe(g.total_s);
  std::lock_guard lock(mutex_);
  ++generations_[std::string(g.finish_reason)];
  prompt_tokens_ += uint64_t(g.prompt_tokens);
  completion_tokens_ += uint64_t(g.completion_tokens);
  prefill_s_ += g.prefill_s;
  decode_s_ += g.decode_s;
  if (g.prefill_s > 0) last_prompt_tps_ = double(g.prompt_tokens) / g.prefill_s;
  // The first token comes from the prefill's logits; decode time covers the rest.
  if (g.decode_s > 0 && g.completion_tokens > 1)
    last_decode_tps_ = double(g.completion_tokens - 1) / g.decode_s;
}

ServeMetrics::Totals ServeMetrics::totals() const {
  Totals t;
  std::lock_guard lock(mutex_);
  for (const char* reason : {"stop", "length", "cancelled", "error"}) {
    const auto it = generations_.find(reason);
    t.generations[reason] = it == generations_.end() ? 0 : it->second;
  }
  t.prompt_tokens = prompt_tokens_;
  t.completion_tokens = completion_tokens_;
  t.prefill_s = prefill_s_;
  t.decode_s = decode_s_;
  t.last_prompt_tps = last_prompt_tps_;
  t.last_decode_tps = last_decode_tps_;
  return t;
}

namespace {

void render_memory(std::string& out, const HeapTrimStats& trims) {
  // glibc's heap over all arenas: what the program holds (small chunks in the arenas and large
  // mmapped ones) and what the allocator keeps free inside them. RSS rising while in_use stays
  // flat is the allocator's (fragmentation, free memory not returned), not a leak.
  const struct mallinfo2 heap = mallinfo2();
  header(out, "strata_heap_in_use_bytes", "gauge",
         "malloc: bytes allocated and not yet freed (in the arenas, and mmapped chunks)");
  out += fmt::format("strata_heap_in_use_bytes{{kind=\"arena\"}} {}\n", heap.uordblks);
  out += fmt::format("strata_heap_in_use_bytes{{kind=\"mmap\"}} {}\n", heap.hblkhd);
  header(out, "strata_heap_free_bytes", "gauge",
         "malloc: free bytes held inside its arenas (not returned to the system)");
  out += fmt::format("strata_heap_free_bytes {}\n", heap.fordblks);
  header(out, "strata_heap_trims_total", "counter",
         "malloc_trim calls after generations (at most one a second)");
  out += fmt::format("strata_heap_trims_total {}\n", trims.trims);
  header(out, "strata_heap_trim_seconds_total", "counter", "Time spent in those calls");
  out += fmt::format("strata_heap_trim_seconds_total {}\n", number(trims.trim_seconds));
  header(out, "strata_heap_trim_checks_total", "counter",
         "Generations (jobs, and choices run on other slots) after which a trim was considered");
  out += fmt::format("strata_heap_trim_checks_total {}\n", trims.checks);
  long pages = 0, resident = 0;
  if (std::FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  header(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes");
  out += fmt::format("process_resident_memory_bytes {}\n", resident * sysconf(_SC_PAGESIZE));
}

}  // namespace

std::string ServeMetrics::render(const LiveGauges& live, const ExpertStoreStats* experts) const {
  std::string out;
  std::lock_guard lock(mutex_);
  header(out, "strata_http_requests_total", "counter", "HTTP responses by path and status code");
  for (const auto& [key, count] : responses_)
    out += fmt::format("strata_http_requests_total{{path=\"{}\",status=\"{}\"}} {}\n",
                       label_value(key.first), key.second, count);
  header(out, "strata_generations_total", "counter", "Generations by how they ended");
  for (const char* reason : {"stop", "length", "cancelled", "error"}) {
    const auto it = generations_.find(reason);
    out += fmt::format("strata_generations_total{{finish_reason=\"{}\"}} {}\n", reason,
                       it == generations_.end() ? 0 : it->second);
  }
  header(out, "strata_prompt_tokens_total", "counter", "Prompt tokens prefilled");
  out += fmt::format("strata_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "strata_completion_tokens_total", "counter", "Tokens generated");
  out += fmt::format("strata_completion_tokens_total {}\n", completion_tokens_);
  header(out, "strata_prefill_seconds_total", "counter", "Time spent in prompt prefill");
  out += fmt::format("strata_prefill_seconds_total {}\n", number(prefill_s_));
  header(out, "strata_decode_seconds_total", "counter",
         "Time spent generating after the first token");
  out += fmt::format("strata_decode_seconds_total {}\n", number(decode_s_));
  header(out, "strata_prompt_tokens_per_second", "gauge", "Prefill speed of the last generation");
  out += fmt::format("strata_prompt_tokens_per_second {}\n", number(last_prompt_tps_));
  header(out, "strata_decode_tokens_per_second", "gauge", "Decode speed of the last generation");
  out += fmt::format("strata_decode_tokens_per_second {}\n", number(last_decode_tps_));
  header(out, "strata_time_to_first_token_seconds", "histogram",
         "Request received to first token sampled (queue wait + prefill)");
  ttft_.render(out, "strata_time_to_first_token_seconds");
  header(out, "strata_queue_wait_seconds", "histogram", "Request received to generation start");
  queue_wait_.render(out, "strata_queue_wait_seconds");
  header(out, "strata_request_duration_seconds", "histogram", "Request received to generation end");
  duration_.render(out, "strata_request_duration_seconds");
  header(out, "strata_queue_depth", "gauge", "Generation requests waiting");
  out += fmt::format("strata_queue_depth {}\n", live.queue_depth);
  header(out, "strata_queue_capacity", "gauge", "Waiting requests allowed (--max-queue)");
  out += fmt::format("strata_queue_capacity {}\n", live.queue_capacity);
  header(out, "strata_generation_running", "gauge", "1 while a generation runs");
  out += fmt::format("strata_generation_running {}\n", live.running ? 1 : 0);
  header(out, "strata_slots", "gauge", "Generations that may run at once (--parallel)");
  out += fmt::format("strata_slots {}\n", live.slots);
  header(out, "strata_generations_running", "gauge", "Generations running now");
  out += fmt::format("strata_generations_running {}\n", live.running_count);
  header(out, "strata_slots_busy", "gauge",
         "Slots running a generation or a choice of another one (n > 1)");
  out += fmt::format("strata_slots_busy {}\n", live.busy_slots);
  header(out, "strata_batch_steps_total", "counter",
         "Batched windows (--parallel > 1; one row per decoding slot, plus joining slots' prompt "
         "windows)");
  out += fmt::format("strata_batch_steps_total {}\n", live.batch.steps);
  header(out, "strata_batch_rows_total", "counter", "Tokens decoded through batched windows");
  out += fmt::format("strata_batch_rows_total {}\n", live.batch.rows);
  header(out, "strata_batch_layer_steps_total", "counter",
         "Routed layers of the batched decode windows");
  out += fmt::format("strata_batch_layer_steps_total {}\n", live.batch.layer_steps);
  header(out, "strata_batch_expert_union_total", "counter",
         "Experts fetched by those layers (each the union over the window's rows)");
  out += fmt::format("strata_batch_expert_union_total {}\n", live.batch.expert_union);
  header(out, "strata_batch_prefill_windows_total", "counter",
         "Prompt windows of joining requests that ran inside batched windows");
  out += fmt::format("strata_batch_prefill_windows_total {}\n", live.batch.prefill_windows);
  header(out, "strata_batch_prefill_rows_total", "counter",
         "Prompt tokens processed inside batched windows");
  out += fmt::format("strata_batch_prefill_rows_total {}\n", live.batch.prefill_rows);
  header(out, "strata_batch_group_windows_total", "counter",
         "Windows of the batched steps cut into groups (--batch-groups), run side by side");
  out += fmt::format("strata_batch_group_windows_total {}\n", live.batch.group_windows);
  header(out, "strata_batch_max_rows", "gauge", "The largest batched decode window so far");
  out += fmt::format("strata_batch_max_rows {}\n", live.batch.max_rows);
  render_memory(out, live.heap_trims);
  if (experts) {
    const ExpertStoreStats& e = *experts;
    struct Counter {
      const char* name;
      uint64_t value;
      const char* help;
    };
    const Counter counters[] = {
        {"needed", e.needed, "Routed experts the forward asked for (per layer and window)"},
        {"hits", e.hits, "Asked-for experts that were resident"},
        {"misses", e.misses, "Asked-for experts read urgently"},
        {"read_ahead_issued", e.read_ahead_issued, "Read-ahead reads started"},
        {"read_ahead_used", e.read_ahead_used, "Read-ahead reads the layer then needed"},
        {"bytes_read", e.bytes_read, "Bytes read from the expert sidecar"}};
    for (const Counter& c : counters) {
      const std::string name = fmt::format("strata_expert_{}_total", c.name);
      header(out, name, "counter", c.help);
      out += fmt::format("{} {}\n", name, c.value);
    }
    header(out, "strata_expert_io_wait_seconds_total", "counter",
           "ExpertStore: time the forward waited for reads");
    out += fmt::format("strata_expert_io_wait_seconds_total {}\n", number(e.io_wait_ms / 1000.0));
    header(out, "strata_expert_hit_ratio", "gauge", "ExpertStore: hits / needed since start");
    out += fmt::format("strata_expert_hit_ratio {}\n", number(e.hit_rate()));
  }
  return out;
}

}  // namespace strata::serve
