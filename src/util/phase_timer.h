// PhaseTimer — where a window's wall time goes (`strata run --profile`, `strata bench cpu`, the
// serve dashboard).
//
// Two granularities, filled by the same scopes:
// - Phase: the coarse split the dashboard shows (mixer, router, shared expert, fetching routed
//   experts, their compute, head; the rest is "other").
// - Part: the leaf work of a layer, finer (hyper-connections, each step of the token mixers, the
//   combine, PLE, ...), for finding what does not scale with threads. Every part belongs to at
//   most one phase (part_phase); a ScopedPart adds its wall time to its part and to that phase.
// Off by default and then nearly free (one branch per scope). Parts never nest (the forward marks
// leaf work only, and a part's time is counted once); work outside every part is "other".
// One window thread: not thread-safe by design (the scopes run on the thread that runs the
// window, around pool hand-outs, never inside a pool task; a second window thread turns its
// scopes off with PhaseTimingOff).
#pragma once

#include <array>
#include <chrono>
#include <string_view>

namespace strata {

enum class Phase { Mixer, Router, SharedExpert, ExpertFetch, RoutedExperts, Head, kCount };
std::string_view phase_name(Phase phase);

enum class Part {
  Embed,          // token embedding, stream copies
  HcIn,           // hyper-connection mixer in (norm, down, up, stream sums, inject)
  HcOut,          // X += inject·y
  GdnProj,        // Gated DeltaNet input projections (qkv, z, beta, alpha)
  GdnConv,        // its causal conv + SiLU, split, L2 norms, gates
  GdnDeltaRule,   // the delta rule per V head (recurrent or chunked), then its gated RMS norm
  GdnOut,         // output projection
  AttnProj,       // attention input projections (q, k, v, indexer)
  AttnPrep,       // q/k norms, RoPE, KV append, QSA index keys
  AttnCore,       // token selection, scores, softmax, weighted values, gate
  AttnOut,        // output projection
  Ple,            // the PLE layer
  Router,         // router matmul with the shared expert's gate and up (one hand-out), softmax,
                  // top-k (and the read-ahead guess)
  SharedExpert,   // the shared expert's silu(g)·u and down
  ExpertFetch,    // waiting for routed experts to be resident
  RoutedExperts,  // the routed experts' SwiGLUs
  Combine,        // Σ w·expert outputs + gated shared expert
  Head,           // final norm / head matmul / argmax
  kCount
};
std::string_view part_name(Part part);
// The coarse phase a part's time also counts in (Phase::kCount: none, "other" on the dashboard).
Phase part_phase(Part part);

struct PhaseTimes {
  std::array<double, size_t(Phase::kCount)> ms{};
  std::array<double, size_t(Part::kCount)> part_ms{};
};

// The times ScopedPart adds to (nullptr: profiling off).
PhaseTimes*& active_phase_times();

// While one lives, the scopes on its thread add nothing: a window that runs beside the one whose
// thread records the times (strata serve --batch-groups) would otherwise add to the same
// PhaseTimes from a second thread.
bool phase_timing_off_here();
class PhaseTimingOff {
 public:
  PhaseTimingOff();
  ~PhaseTimingOff();
  PhaseTimingOff(const PhaseTimingOff&) = delete;
  PhaseTimingOff& operator=(const PhaseTimingOff&) = delete;

 private:
  bool saved_;
};

class ScopedPart {
 public:
  explicit ScopedPart(Part part)
      : part_(part), times_(phase_timing_off_here() ? nullptr : active_phase_times()) {
    if (times_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedPart() {
    if (!times_) return;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count();
    times_->part_ms[size_t(part_)] += ms;
    if (const Phase phase = part_phase(part_); phase != Phase::kCount)
      times_->ms[size_t(phase)] += ms;
  }
  ScopedPart(const ScopedPart&) = delete;
  ScopedPart& operator=(const ScopedPart&) = delete;

 private:
  Part part_;
  PhaseTimes* times_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace strata
