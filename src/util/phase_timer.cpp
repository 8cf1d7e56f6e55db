#include "util/phase_timer.h"

namespace strata {

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::Mixer: return "mixer";
    case Phase::Router: return "router";
    case Phase::SharedExpert: return "shared expert";
    case Phase::ExpertFetch: return "expert fetch";
    case Phase::RoutedExperts: return "routed experts";
    case Phase::Head: return "head";
    case Phase::kCount: break;
  }
  return "?";
}

PhaseTimes*& active_phase_times() {
  static PhaseTimes* times = nullptr;
  return times;
}

}  // namespace strata
