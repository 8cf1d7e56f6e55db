#include "spec/spec_gate.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/error.h"

namespace strata::spec {
namespace {

// colibri's priors: MTP 0.8, 0.6, then 0.5; prompt lookup 0.5 everywhere; worth 2 observations.
double prior(DraftSource source, int position) {
  if (source == DraftSource::Suffix) return 0.5;
  return position == 0 ? 0.8 : position == 1 ? 0.6 : 0.5;
}

}  // namespace

SpecGate::SpecGate(const SpecGateConfig& config) : config_(config) {
  if (config.max_depth < 0 || config.max_depth > kMaxDepth)
    fail("--draft-max: expected 0..{}, got {}", kMaxDepth, config.max_depth);
  for (int s = 0; s < kDraftSources; ++s)
    for (int j = 0; j < kMaxDepth; ++j) {
      const double p = prior(DraftSource(s), j);
      sources_[size_t(s)].accepted[size_t(j)] = {p, 2};
      sources_[size_t(s)].confidence[size_t(j)] = {p, 2};
    }
  rho_ = {0.5, 1};
}

std::vector<double> SpecGate::acceptance(const Draft& draft) const {
  std::vector<double> a;
  acceptance(draft, a);
  return a;
}

void SpecGate::acceptance(const Draft& draft, std::vector<double>& a) const {
  const SourceStats& s = sources_[size_t(draft.source)];
  a.assign(std::min<size_t>(draft.tokens.size(), kMaxDepth), 0.0);
  for (size_t j = 0; j < a.size(); ++j) {
    const double mean_conf = std::max(s.confidence[j].value, 1e-3);
    a[j] = std::clamp(double(draft.confidence[j]) * s.accepted[j].value / mean_conf, 0.0, 0.98);
  }
}

double SpecGate::window_cost(int n_rows) const {
  const size_t n = size_t(n_rows);
  if (n_rows <= 1 || window_count_[1] == 0) return 1.0 + (n_rows - 1) * rho_.value;
  if (n < window_count_.size() && window_count_[n] > 0)
    return window_s_[n].value / window_s_[1].value;
  return 1.0 + (n_rows - 1) * rho_.value;
}

double SpecGate::value(std::span<const double> a, int k, double draft_seconds) const {
  if (k == 0) return 1.0;
  double expected = 1, run = 1;
  for (int j = 0; j < k; ++j) expected += run *= a[size_t(j)];
  double cost = window_cost(k + 1);
  if (k > 1 && draft_seconds > 0 && window_count_[1] > 0)
    cost += (k - 1) * draft_seconds / window_s_[1].value;
  return expected / cost;
}

int SpecGate::best_depth(std::span<const double> a, double draft_seconds,
                         double* best_value) const {
  int best = 0;
  double best_v = 1.0;
  const int max_k = std::min<int>(int(a.size()), config_.max_depth);
  for (int k = 1; k <= max_k; ++k) {
    const double v = value(a, k, draft_seconds);
    if (v > best_v) best_v = v, best = k;
  }
  if (best_value) *best_value = best_v;
  return best;
}

bool SpecGate::probe_due(int k_best, int max_k) {
  if (k_best >= max_k) return false;
  const size_t deeper = size_t(k_best + 2);
  const bool new_shape = deeper < window_count_.size() && window_count_[deeper] < 3;
  const int every = new_shape ? config_.probe_every_new : config_.probe_every;
  return picks_ % uint64_t(every) == 0;
}

bool SpecGate::force_plain() {
  if (!config_.enabled || since_plain_ < config_.refresh) return false;
  ++picks_, ++forced_plain_, ++declined_;
  return true;
}

bool SpecGate::worth_drafting(DraftSource source, double draft_seconds) {
  if (!config_.enabled) return true;
  if (since_plain_ >= config_.refresh) return false;
  const SourceStats& s = sources_[size_t(source)];
  std::vector<double>& a = worth_scratch_;  // reused: a warm gate allocates nothing
  a.assign(size_t(config_.max_depth), 0.0);
  for (size_t j = 0; j < a.size(); ++j) a[j] = std::clamp(s.accepted[j].value, 0.0, 0.98);
  double best = 1;
  best_depth(a, draft_seconds, &best);
  ++worth_calls_;
  if (best > 1.0 || worth_calls_ % uint64_t(config_.probe_every) == 0) return true;
  ++skipped_drafting_;
  return false;
}

int SpecGate::pick_depth(std::span<const double> a, int available, double draft_seconds) {
  const int max_k = std::min(available, config_.max_depth);
  if (!config_.enabled) return max_k;
  ++picks_;
  if (since_plain_ >= config_.refresh) {
    ++forced_plain_, ++declined_;
    return 0;
  }
  int k = best_depth(a.first(size_t(max_k)), draft_seconds, nullptr);
  if (probe_due(k, max_k)) ++k, ++probes_;
  if (k == 0) ++declined_;
  return k;
}

void SpecGate::record_window(int n_rows, double seconds) {
  const size_t n = size_t(std::min<int>(n_rows, int(window_s_.size()) - 1));
  window_s_[n].add(seconds, config_.time_memory);
  ++window_count_[n];
  if (n_rows == 1) {
    since_plain_ = 0;
  } else {
    ++since_plain_;
    if (window_count_[1] > 0)
      rho_.add(std::clamp((seconds / window_s_[1].value - 1.0) / (n_rows - 1), 0.0, 4.0),
               config_.time_memory);
  }
}

void SpecGate::record_verify(const Draft& draft, int drafted, int accepted) {
  SourceStats& s = sources_[size_t(draft.source)];
  ++verifies_;
  drafts_proposed_ += uint64_t(drafted);
  drafts_accepted_ += uint64_t(accepted);
  // Positions judged: those up to the first rejection (all, when every draft stood).
  const int judged = std::min(accepted < drafted ? accepted + 1 : drafted, kMaxDepth);
  for (int j = 0; j < judged; ++j) {
    const bool stood = j < accepted;
    s.accepted[size_t(j)].add(stood ? 1.0 : 0.0, config_.acceptance_memory);
    s.confidence[size_t(j)].add(draft.confidence[size_t(j)], config_.acceptance_memory);
    ++s.judged[size_t(j)];
    s.stood[size_t(j)] += stood;
  }
}

std::string SpecGate::summary() const {
  std::string line = "spec:";
  if (window_count_[1] > 0)
    line += fmt::format(" T(1) {:.2f} ms;", window_s_[1].value * 1e3);
  else
    line += " T(1) unmeasured;";
  line += " T(n)/T(1)";
  bool any = false;
  for (size_t n = 2; n < window_s_.size(); ++n)
    if (window_count_[n] > 0) {
      line += fmt::format(" {}:{:.2f}", n, window_cost(int(n)));
      any = true;
    }
  if (!any) line += " -";
  line += ";";
  for (int s = 0; s < kDraftSources; ++s) {
    const SourceStats& st = sources_[size_t(s)];
    if (st.judged[0] == 0) continue;
    line += fmt::format(" {} accepted by position", draft_source_name(DraftSource(s)));
    for (int j = 0; j < kMaxDepth && st.judged[size_t(j)] > 0; ++j)
      line += fmt::format(" {:.0f}%",
                          100.0 * double(st.stood[size_t(j)]) / double(st.judged[size_t(j)]));
    line += ";";
  }
  line += fmt::format(
      " drafts proposed {} accepted {} ({:.0f}%) in {} verifies;", drafts_proposed_,
      drafts_accepted_,
      drafts_proposed_ ? 100.0 * double(drafts_accepted_) / double(drafts_proposed_) : 0.0,
      verifies_);
  if (config_.enabled)
    line += fmt::format(
        " gate on: {} picks, {} declined ({} forced plain), {} probes, {} drafting skipped", picks_,
        declined_, forced_plain_, probes_, skipped_drafting_);
  else
    line += fmt::format(" gate off: fixed depth {}", config_.max_depth);
  return line;
}

}  // namespace strata::spec
