#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  if (!std::isfinite(config.frequency_penalty) || !std::isfinite(config.presence_penalty))
    fail("sampler: frequency and presence penalties must be finite, got {} and {}",
         config.frequency_penalty, config.presence_penalty);
  for (const auto& [id, bias] : config.logit_bias)
    if (!std::isfinite(bias)) fail("sampler: logit bias of token {} must be finite, got {}", id, bias);
}

bool Sampler::has_logit_rules() const {
  return !config_.logit_bias.empty() || config_.frequency_penalty != 0.0f ||
         config_.presence_penalty != 0.0f;
}

void Sampler::adjust_into(std::span<const float> logits, std::span<const int32_t> history,
                          bool repetition, Scratch& scratch) const {
  std::vector<float>& adjusted = scratch.adjusted;
  adjusted.assign(logits.begin(), logits.end());
  for (const auto& [id, bias] : config_.logit_bias)
    if (id >= 0 && size_t(id) < adjusted.size()) adjusted[size_t(id)] += bias;
  if (repetition && config_.repetition_penalty != 1.0f && config_.repeat_last_n > 0) {
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
  if (config_.frequency_penalty == 0.0f && config_.presence_penalty == 0.0f) return;
  // Counts of the generated tokens: sorted, then one subtraction per run of equal ids.
  std::vector<int32_t>& generated = scratch.generated;
  const size_t first = std::min(config_.n_prompt, history.size());
  generated.assign(history.begin() + ptrdiff_t(first), history.end());
  std::sort(generated.begin(), generated.end());
  for (size_t i = 0; i < generated.size();) {
    size_t j = i;
    while (j < generated.size() && generated[j] == generated[i]) ++j;
    const int32_t id = generated[i];
    if (id >= 0 && size_t(id) < adjusted.size())
      adjusted[size_t(id)] -= float(j - i) * config_.frequency_penalty + config_.presence_penalty;
    i = j;
  }
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
    std::span<const float> scores = logits;
    if (has_logit_rules()) {
      adjust_into(logits, history, /*repetition=*/false, scratch);
      scores = scratch.adjusted;
    }
    out.ids.push_back(int32_t(compute::argmax(scores.data(), int64_t(scores.size()))));
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
  adjust_into(logits, history, /*repetition=*/true, scratch);
  const std::vector<float>& adjusted = scratch.adjusted;
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

TokenLogprob Sampler::logprobs(std::span<const float> logits, std::span<const int32_t> history,
                               int32_t chosen, int n_top, std::vector<TokenLogprob>& top) const {
  Scratch scratch;
  adjust_into(logits, history, /*repetition=*/!greedy(), scratch);
  const double temperature = greedy() ? 1.0 : double(config_.temperature);
  const std::vector<float>& adjusted = scratch.adjusted;
  // log p_i = x_i - (max + log Σ exp(x_j - max)), x = logit / T: stable, every term in double.
  double max_scaled = -std::numeric_limits<double>::infinity();
  for (float v : adjusted) max_scaled = std::max(max_scaled, double(v) / temperature);
  double total = 0;
  for (float v : adjusted) total += std::exp(double(v) / temperature - max_scaled);
  const double log_norm = max_scaled + std::log(total);
  auto logprob = [&](int32_t id) { return double(adjusted[size_t(id)]) / temperature - log_norm; };
  top.clear();
  const size_t n = std::min(adjusted.size(), size_t(std::max(n_top, 0)));
  if (n > 0) {
    std::vector<int32_t>& order = scratch.order;
    order.resize(adjusted.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(n), order.end(),
                      [&](int32_t a, int32_t b) {
                        return adjusted[size_t(a)] != adjusted[size_t(b)]
                                   ? adjusted[size_t(a)] > adjusted[size_t(b)]
                                   : a < b;
                      });
    for (size_t i = 0; i < n; ++i) top.push_back({order[i], logprob(order[i])});
  }
  if (chosen < 0 || size_t(chosen) >= adjusted.size())
    fail("sampler: token {} is outside the {} logits", chosen, adjusted.size());
  return {chosen, logprob(chosen)};
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
