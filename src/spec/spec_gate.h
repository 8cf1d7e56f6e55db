// SpecGate — how many drafts a verify window carries (colibri's gate, shared/reference/
// prior-art.md §1.7, plus the drafter's own probabilities as in SVIP/AdaEDL-style draft-length
// control, calibrated online instead of trained as in SpecDec++/DISCO).
//
// For a proposal with drafter confidences c_1..c_n, the gate estimates a_j = P(draft j stands |
// drafts 1..j-1 stood) as c_j · (measured acceptance at position j) / (mean confidence at j), per
// drafter, clamped to [0, 0.98]; the two means are running averages with bounded memory (true
// means for the first `acceptance_memory` verifies, then EMAs), seeded with priors worth two
// observations. It then picks k in 0..n maximising value(k) = E(k)/cost(k):
//   E(k)    = 1 + a_1 + a_1·a_2 + … + a_1⋯a_k          (tokens a window of k drafts emits)
//   cost(k) = T(k+1)/T(1) + drafter seconds for k drafts / T(1)
// where T(n) is the measured wall time of an n-row window (verify + rollback: SSD waits and the
// larger expert union of more rows are inside it), or 1 + (n−1)·ρ before n is measured (ρ fitted
// from the measured windows, 0.5 before any). value(0) = 1: it drafts only when some k beats a
// plain step. Every 16th pick (4th while T(k*+2) has under 3 samples) probes one deeper; after 64
// windows without a plain step it forces one so T(1) stays measured.
// With the gate off, pick_depth returns the full depth (fixed-depth speculation). Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "spec/drafter.h"

namespace strata::spec {

struct SpecGateConfig {
  bool enabled = true;
  int max_depth = 3;
  int probe_every = 16;
  int probe_every_new = 4;  // while the deeper window has fewer than 3 timings
  int refresh = 64;         // windows without a plain step before one is forced
  int acceptance_memory = 16;
  int time_memory = 8;
};

// A running mean that becomes an EMA with weight 1/memory after `memory` observations.
struct RunningMean {
  double value = 0;
  double weight = 0;
  void add(double v, int memory) {
    if (weight < memory) weight += 1;
    value += (v - value) / weight;
  }
};

class SpecGate {
 public:
  static constexpr int kMaxDepth = 16;
  explicit SpecGate(const SpecGateConfig& config);
  const SpecGateConfig& config() const { return config_; }

  // Calibrated conditional acceptance a_1..a_n of a proposal.
  std::vector<double> acceptance(const Draft& draft) const;
  void acceptance(const Draft& draft, std::vector<double>& out) const;  // into out (reused)
  // value(k) for k = 0..a.size() given calibrated a and the drafter's seconds per draft.
  double value(std::span<const double> a, int k, double draft_seconds) const;
  // Best k (0 = plain step) and its value, without side effects.
  int best_depth(std::span<const double> a, double draft_seconds, double* best_value) const;
  // Whether drafting at all is worth its cost for this source now (the mean acceptance of the
  // source could beat a plain step, or a probe is due). Always true with the gate off.
  bool worth_drafting(DraftSource source, double draft_seconds);
  // The depth for this verify (counts picks, probes and declines). `available` = drafts at hand.
  int pick_depth(std::span<const double> a, int available, double draft_seconds);
  // Whether this step must be plain so T(1) stays measured (`refresh` windows since the last
  // plain one); counts it as a pick declined by force. The decoder asks before any drafter, so a
  // forced step costs no drafting. The count runs across generate calls, turns and requests for
  // as long as the gate lives. Always false with the gate off.
  bool force_plain();
  uint64_t forced_plain() const { return forced_plain_; }
  uint64_t declined() const { return declined_; }  // picks of depth 0, forced ones included
  uint64_t verifies() const { return verifies_; }

  // Measurements.
  void record_window(int n_rows, double seconds);
  // A verify of `drafted` drafts of which `accepted` stood.
  void record_verify(const Draft& draft, int drafted, int accepted);

  // "spec: T(1) … ms; T(n)/T(1) …; accepted by position …; drafts …; declined …".
  std::string summary() const;
  uint64_t drafts_proposed() const { return drafts_proposed_; }
  uint64_t drafts_accepted() const { return drafts_accepted_; }

 private:
  double window_cost(int n_rows) const;  // C(n) = T(n)/T(1) or the fitted estimate
  bool probe_due(int k_best, int max_k);

  SpecGateConfig config_;
  struct SourceStats {
    std::array<RunningMean, kMaxDepth> accepted;    // by position: P(stand | previous stood)
    std::array<RunningMean, kMaxDepth> confidence;  // by position: mean drafter confidence
    std::array<uint64_t, kMaxDepth> judged{}, stood{};
  };
  std::array<SourceStats, kDraftSources> sources_;
  std::array<RunningMean, kMaxDepth + 2> window_s_;  // by rows
  std::array<uint64_t, kMaxDepth + 2> window_count_{};
  RunningMean rho_;
  int since_plain_ = 0;
  uint64_t picks_ = 0, probes_ = 0, declined_ = 0, forced_plain_ = 0, skipped_drafting_ = 0;
  uint64_t worth_calls_ = 0;
  uint64_t drafts_proposed_ = 0, drafts_accepted_ = 0, verifies_ = 0;
  std::vector<double> worth_scratch_;  // worth_drafting's acceptance vector
};

}  // namespace strata::spec
