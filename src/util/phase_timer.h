// PhaseTimer — where a window's wall time goes (`strata run --profile`): mixer, router, shared
// expert, fetching routed experts (waiting for their reads), their compute, head, and the rest. Off by default and then nearly free (one
// branch per scope); when on, each ScopedPhase adds its wall time to the active PhaseTimes.
// Phases nest only as the code nests them (a phase inside another is counted in both), so the
// forward marks leaf work only. One window thread: not thread-safe by design.
#pragma once

#include <array>
#include <chrono>
#include <string_view>

namespace strata {

enum class Phase { Mixer, Router, SharedExpert, ExpertFetch, RoutedExperts, Head, kCount };
std::string_view phase_name(Phase phase);

struct PhaseTimes {
  std::array<double, size_t(Phase::kCount)> ms{};
};

// The times ScopedPhase adds to (nullptr: profiling off).
PhaseTimes*& active_phase_times();

class ScopedPhase {
 public:
  explicit ScopedPhase(Phase phase) : phase_(phase), times_(active_phase_times()) {
    if (times_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedPhase() {
    if (times_)
      times_->ms[size_t(phase_)] +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  Phase phase_;
  PhaseTimes* times_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace strata
