#include "spec/acceptance.h"

#include <algorithm>
#include <unordered_map>

namespace strata::spec {

double probability_of(const TokenDistribution& dist, int32_t token) {
  for (size_t i = 0; i < dist.ids.size(); ++i)
    if (dist.ids[i] == token) return dist.probs[i];
  return 0.0;
}

std::optional<int32_t> rejection_step(const TokenDistribution& target,
                                      const TokenDistribution& draft_dist, int32_t draft,
                                      double u_accept, double u_residual) {
  const double p = probability_of(target, draft), q = probability_of(draft_dist, draft);
  // Accept with probability min(1, p/q), written without the division (q may be 0 for a draft the
  // drafter did not think possible; then p/q is infinite and any p > 0 accepts).
  if (p > 0 && u_accept * q < p) return std::nullopt;
  std::unordered_map<int32_t, double> q_of;
  for (size_t i = 0; i < draft_dist.ids.size(); ++i) q_of[draft_dist.ids[i]] = draft_dist.probs[i];
  // Residual max(0, p − q) over the target's support (outside it p = 0, so the residual is 0),
  // walked in the target's order so draws are reproducible.
  std::vector<double> residual(target.ids.size());
  double total = 0;
  for (size_t i = 0; i < target.ids.size(); ++i) {
    const auto it = q_of.find(target.ids[i]);
    residual[i] = std::max(0.0, double(target.probs[i]) - (it == q_of.end() ? 0.0 : it->second));
    total += residual[i];
  }
  if (total <= 0) {
    // Only reachable through rounding when p ≈ q everywhere: fall back to p itself.
    for (size_t i = 0; i < target.ids.size(); ++i) residual[i] = target.probs[i];
    total = 1;
  }
  const double r = u_residual * total;
  double cumulative = 0;
  for (size_t i = 0; i < target.ids.size(); ++i) {
    cumulative += residual[i];
    if (r < cumulative && residual[i] > 0) return target.ids[i];
  }
  for (size_t i = target.ids.size(); i-- > 0;)
    if (residual[i] > 0) return target.ids[i];
  return target.ids.back();
}

}  // namespace strata::spec
