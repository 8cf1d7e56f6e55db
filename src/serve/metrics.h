// ServeMetrics — the server's counters, gauges and histograms, rendered in the Prometheus text
// exposition format (version 0.0.4) for GET /metrics.
//
// What is measured and where:
//   strata_http_requests_total{path,status}      every HTTP response (the access-log hook)
//   strata_generations_total{finish_reason}      stop | length | cancelled | error
//   strata_prompt_tokens_total, strata_completion_tokens_total
//   strata_prefill_seconds_total, strata_decode_seconds_total
//   strata_prompt_tokens_per_second, strata_decode_tokens_per_second   (the last generation)
//   strata_time_to_first_token_seconds           histogram: request received -> first token
//                                                sampled (queue wait + prefill + one sample)
//   strata_queue_wait_seconds                    histogram: received -> generation started
//   strata_request_duration_seconds              histogram: received -> generation ended
//   strata_queue_depth, strata_queue_capacity, strata_generation_running   (live gauges)
//   strata_expert_*                              the ExpertStore's counters (hits, misses, hit
//                                                ratio, bytes read, I/O wait, read-ahead), from
//                                                the latest dashboard snapshot (serve/dashboard.h,
//                                                published by the engine thread while it runs), so
//                                                they agree with GET /api/dashboard; absent when
//                                                experts are read through the GGUF mapping
// Thread safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include "serve/decode_batcher.h"
#include "serve/heap_policy.h"

#include "experts/expert_store.h"

namespace strata::serve {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines of `name`.
  void render(std::string& out, std::string_view name) const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;      // guards counts_, sum_, count_
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct LiveGauges {
  size_t queue_depth = 0;
  size_t queue_capacity = 0;
  bool running = false;
  size_t slots = 1;          // --parallel
  size_t running_count = 0;  // generations running now
  size_t busy_slots = 0;     // slots running a generation or a choice of another one
  BatchStats batch;          // batched decode steps (--parallel > 1)
  HeapTrimStats heap_trims;  // HeapPolicy's malloc_trim calls
};

class ServeMetrics {
 public:
  ServeMetrics();

  void count_response(std::string_view path, int status);
  // One generation that ran (or was cancelled while running).
  struct Generation {
    std::string_view finish_reason;  // "stop", "length", "cancelled", "error"
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    double queue_wait_s = 0;
    double prefill_s = 0;
    double decode_s = 0;
    double total_s = 0;  // received -> ended
  };
  void record_generation(const Generation& generation);
  void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
  // The totals /metrics reports, for the dashboard's "server" member.
  struct Totals {
    std::map<std::string, uint64_t> generations;  // by finish reason (all four present)
    uint64_t prompt_tokens = 0, completion_tokens = 0;
    double prefill_s = 0, decode_s = 0;
    double last_prompt_tps = 0, last_decode_tps = 0;
  };
  Totals totals() const;

  // `experts`: the store's counters from the latest dashboard snapshot (null: no store). The store
  // itself is only ever read on the engine thread.
  std::string render(const LiveGauges& live, const ExpertStoreStats* experts = nullptr) const;

 private:
  mutable std::mutex mutex_;  // guards the maps and the plain numbers below
  std::map<std::pair<std::string, int>, uint64_t> responses_;
  std::map<std::string, uint64_t> generations_;
  uint64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;
  double last_prompt_tps_ = 0, last_decode_tps_ = 0;
  Histogram ttft_, queue_wait_, duration_;
};

}  // namespace strata::serve
