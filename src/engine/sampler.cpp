#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compute/cpu/ops.h"
#include "util/error.h"

namespace strata {

Sampler::Sampler(const SamplerConfig& config) : config_(config), rng_(config.seed) {
  if (!(config.temperature >= 0.0f)) fail("sampler: temperature must be >= 0, got {}", config.temperature);
  if (config.top_k < 0) fail("sampler: top-k must be >= 0, got {}", config.top_k);
  if (!(config.top_p > 0.0f && config.top_p <= 1.0f))
    fail("sampler: top-p must be in (0, 1], got {}", config.top_p);
  if (!(config.min_p >= 0.0f && config.min_p < 1.0f))
    fail("sampler: min-p must be in [0, 1), got {}", config.min_p);
  if (!(config.repetition_penalty > 0.0f))
    fail("sampler: repetition penalty must be > 0, got {}", config.repetition_penalty);
}

double Sampler::uniform() { return double(rng_() >> 11) * (1.0 / 9007199254740992.0); }

TokenDistribution Sampler::distribution(std::span<const float> logits,
                                        std::span<const int32_t> history) const {
  Scratch scratch;
  distribution_into(logits, history, scratch);
  return std::move(scratch.out);
}

void Sampler::distribution_into(std::span<const float> logits, std::span<const int32_t> history,
                                Scratch& scratch) const {
  TokenDistribution& out = scratch.out;
  out.ids.clear();
  out.probs.clear();
  if (constraint_) {
    scratch.masked.assign(logits.begin(), logits.end());
    constraint_->mask(scratch.masked);
    logits = scratch.masked;
  }
  if (greedy()) {
    out.ids.push_back(int32_t(compute::argmax(logits.data(), int64_t(logits.size()))));
    out.probs.push_back(1.0f);
    return;
  }
  // Every vector at its largest size once, so their sizes changing from token to token (the
  // history window filling up, top-p / min-p keeping more or fewer) never reallocates.
  const size_t max_keep = config_.top_k > 0 ? std::min(logits.size(), size_t(config_.top_k))
                                            : logits.size();
  scratch.recent.reserve(size_t(std::max(config_.repeat_last_n, 0)));
  out.ids.reserve(max_keep);
  out.probs.reserve(max_keep);
  std::vector<float>& adjusted = scratch.adjusted;
  adjusted.assign(logits.begin(), logits.end());
  if (config_.repetition_penalty != 1.0f && config_.repeat_last_n > 0) {
    const size_t n = std::min(history.size(), size_t(config_.repeat_last_n));
    std::vector<int32_t>& recent = scratch.recent;
    recent.assign(history.end() - ptrdiff_t(n), history.end());
    std::sort(recent.begin(), recent.end());
    recent.erase(std::unique(recent.begin(), recent.end()), recent.end());
    for (int32_t id : recent) {
      if (id < 0 || size_t(id) >= adjusted.size()) continue;
      float& v = adjusted[size_t(id)];
      v = v > 0 ? v / config_.repetition_penalty : v * config_.repetition_penalty;
    }
  }
  // Candidates sorted by logit (desc, then id asc) — a stable order makes draws reproducible.
  std::vector<int32_t>& order = scratch.order;
  order.resize(adjusted.size());
  std::iota(order.begin(), order.end(), 0);
  size_t keep = order.size();
  if (config_.top_k > 0) keep = std::min(keep, size_t(config_.top_k));
  auto better = [&](int32_t a, int32_t b) {
    return adjusted[size_t(a)] != adjusted[size_t(b)] ? adjusted[size_t(a)] > adjusted[size_t(b)]
                                                      : a < b;
  };
  std::partial_sort(order.begin(), order.begin() + ptrdiff_t(keep), order.end(), better);
  order.resize(keep);

  std::vector<double>& probs = scratch.probs;
  probs.assign(keep, 0.0);
  const double max_logit = adjusted[size_t(order[0])] / config_.temperature;
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(double(adjusted[size_t(order[i])]) / config_.temperature - max_logit);
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  // Masked tokens (-inf) sort last with probability 0: never candidates.
  if (constraint_)
    while (keep > 1 && probs[keep - 1] == 0.0) --keep;
  if (config_.top_p < 1.0f) {
    double mass = 0;
    size_t n = 0;
    while (n < keep && mass < config_.top_p) mass += probs[n++];
    keep = std::max<size_t>(n, 1);
  }
  if (config_.min_p > 0.0f) {
    const double floor = config_.min_p * probs[0];
    size_t n = 1;
    while (n < keep && probs[n] >= floor) ++n;
    keep = n;
  }
  total = 0;
  for (size_t i = 0; i < keep; ++i) total += probs[i];
  out.ids.assign(order.begin(), order.begin() + ptrdiff_t(keep));
  out.probs.resize(keep);
  for (size_t i = 0; i < keep; ++i) out.probs[i] = float(probs[i] / total);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const int32_t token = draw(logits, history);
  if (constraint_) constraint_->accept(token);
  return token;
}

int32_t Sampler::draw(std::span<const float> logits, std::span<const int32_t> history) {
  distribution_into(logits, history, scratch_);
  const TokenDistribution& dist = scratch_.out;
  if (dist.ids.size() == 1) return dist.ids[0];
  const double r = uniform();
  double cumulative = 0;
  for (size_t i = 0; i < dist.ids.size(); ++i) {
    cumulative += dist.probs[i];
    if (r < cumulative) return dist.ids[i];
  }
  return dist.ids.back();
}

}  // namespace strata
