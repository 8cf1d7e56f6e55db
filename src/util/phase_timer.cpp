#include "util/phase_timer.h"

namespace strata {

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::Mixer:
      return "mixer";
    case Phase::Router:
      return "router";
    case Phase::SharedExpert:
      return "shared expert";
    case Phase::ExpertFetch:
      return "expert fetch";
    case Phase::RoutedExperts:
      return "routed experts";
    case Phase::Head:
      return "head";
    case Phase::kCount:
      break;
  }
  return "?";
}

std::string_view part_name(Part part) {
  switch (part) {
    case Part::Embed:
      return "embed";
    case Part::HcIn:
      return "hc in";
    case Part::HcOut:
      return "hc out";
    case Part::GdnProj:
      return "gdn in-proj";
    case Part::GdnConv:
      return "gdn conv+gates";
    case Part::GdnDeltaRule:
      return "gdn delta rule+norm";
    case Part::GdnOut:
      return "gdn out-proj";
    case Part::AttnProj:
      return "attn in-proj";
    case Part::AttnPrep:
      return "attn norm+rope+kv";
    case Part::AttnCore:
      return "attn core";
    case Part::AttnOut:
      return "attn out-proj";
    case Part::Ple:
      return "ple";
    case Part::Router:
      return "router+shared gate/up";
    case Part::SharedExpert:
      return "shared down";
    case Part::ExpertFetch:
      return "expert fetch";
    case Part::RoutedExperts:
      return "routed experts";
    case Part::Combine:
      return "combine";
    case Part::Head:
      return "head";
    case Part::kCount:
      break;
  }
  return "?";
}

Phase part_phase(Part part) {
  switch (part) {
    case Part::GdnProj:
    case Part::GdnConv:
    case Part::GdnDeltaRule:
    case Part::GdnOut:
    case Part::AttnProj:
    case Part::AttnPrep:
    case Part::AttnCore:
    case Part::AttnOut:
      return Phase::Mixer;
    case Part::Router:
      return Phase::Router;
    case Part::SharedExpert:
      return Phase::SharedExpert;
    case Part::ExpertFetch:
      return Phase::ExpertFetch;
    case Part::RoutedExperts:
      return Phase::RoutedExperts;
    case Part::Head:
      return Phase::Head;
    default:
      return Phase::kCount;
  }
}

PhaseTimes*& active_phase_times() {
  static PhaseTimes* times = nullptr;
  return times;
}

namespace {
thread_local bool tls_phase_timing_off = false;
}  // namespace

bool phase_timing_off_here() {
  return tls_phase_timing_off;
}

PhaseTimingOff::PhaseTimingOff() : saved_(tls_phase_timing_off) {
  tls_phase_timing_off = true;
}
PhaseTimingOff::~PhaseTimingOff() {
  tls_phase_timing_off = saved_;
}

}  // namespace strata
