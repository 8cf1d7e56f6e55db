// DashboardRecorder — the engine thread's half of the dashboard (serve/dashboard.h): it watches
// the experts the forward asks for, keeps the decayed routing heat, times the generations, and
// publishes DashboardSnapshots to the hub.
//
// How it sees the experts: `source()` is an ExpertSource that the Generator hands to Session and
// SpecDecoder instead of the store (or the GGUF mapping). It passes every call to that inner source
// unchanged (the inner source sees exactly the calls it would see without it, so tokens, residency
// and every counter are the same) and on the way counts:
//   - heat[block][expert]: every routed (row, expert) adds 1; a block's values are multiplied by
//     kHeatDecayPerRow once per window row first (0.98: half-life ~34 tokens, about one sentence,
//     so the map follows what the current text routes to and forgets a prompt within a reply);
//   - per publish, the union's record bytes, and how many of the union were already resident
//     (the store's hits, counted independently: the test checks they agree).
//
// When it publishes: at a generation's start and end always; after prefill chunks and tokens when
// kPublishInterval has passed since the last snapshot (a snapshot copies n_block x n_expert heat
// values and residency codes: ~150 KB for a 48 x 512 model, so at most ~10 per second).
//
// Threads: every method runs on the engine thread (the scheduler's worker) except the constructor,
// which runs before that thread starts and publishes the first snapshot. With `profile`, it points
// the process's PhaseTimer (util/phase_timer.h, read by the forward under the engine lock) at its
// own PhaseTimes while any generation runs (with --parallel, from the first one's start to the
// last one's end: overlapping generations' windows count once).
#pragma once

#include <chrono>
#include <memory>
#include <string_view>

#include "experts/expert_source.h"
#include "serve/dashboard.h"
#include "serve/plan.h"
#include "spec/spec_decoder.h"

namespace strata::serve {

inline constexpr double kHeatDecayPerRow = 0.98;
inline constexpr std::chrono::milliseconds kPublishInterval{100};

class DashboardRecorder {
 public:
  DashboardRecorder(const ServedModel& served, DashboardHub& hub, const spec::SpecOptions& spec,
                    bool profile);
  ~DashboardRecorder();
  DashboardRecorder(const DashboardRecorder&) = delete;
  DashboardRecorder& operator=(const DashboardRecorder&) = delete;

  // What Session and SpecDecoder should fetch experts through.
  ExpertSource* source();

  void begin_generation(int64_t prompt_tokens, double queue_wait_s);
  void prefill_progress();                        // after a prefill chunk (throttled publish)
  void prefilled(double prefill_s);               // the prompt is in; decode starts
  void first_token(double ttft_s);                // request received -> first token sampled
  void token();                                   // a token was generated (throttled publish)
  void window(const spec::WindowReport& report);  // a speculative decode window
  // Always publishes. `gate`: the shared SpecGate (its forced/declined counts), or null.
  void end_generation(std::string_view finish_reason, const spec::SpecGate* gate);

 private:
  class Monitor;
  void publish(bool force);

  const ServedModel& served_;
  DashboardHub& hub_;
  std::shared_ptr<const DashboardStatic> fixed_;
  std::unique_ptr<Monitor> monitor_;
  const bool profile_;
  PhaseTimes phases_;
  DashboardGeneration generation_;
  std::optional<DashboardSpec> spec_;
  uint64_t generations_started_ = 0;
  int generations_running_ = 0;  // begun and not ended (several with --parallel)
  double busy_ms_done_ = 0;  // generations that ended
  std::chrono::steady_clock::time_point generation_started_, decode_started_, last_publish_;
};

}  // namespace strata::serve
