#include "route/moce.h"

#include <algorithm>
#include <cmath>

namespace strata {

void moce_select(std::span<const float> p, int k, const MoceOptions& o,
                 const std::function<bool(int32_t)>& resident, std::vector<int32_t>& true_order,
                 int32_t* ids_out, float* weights_out, MoceStats* stats) {
  const int n = int(p.size());
  const int window = std::clamp(o.max_rank > 0 ? std::max(o.max_rank, k) : n, k, n);
  const int protect = std::clamp(o.protect, 0, k);
  const auto by_probability = [&](int32_t a, int32_t b) {
    return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] > p[size_t(b)] : a < b;
  };
  true_order.resize(size_t(n));
  for (int e = 0; e < n; ++e) true_order[size_t(e)] = e;
  std::partial_sort(true_order.begin(), true_order.begin() + window, true_order.end(), by_probability);
  true_order.resize(size_t(window));

  // The eligible ranks protect..window-1, re-ranked by the boosted score.
  const double boost = 1.0 + o.lambda;
  std::vector<char> is_resident(size_t(window), 0);
  for (int r = protect; r < window; ++r) is_resident[size_t(r)] = resident(true_order[size_t(r)]) ? 1 : 0;
  std::vector<int> ranks;
  for (int r = protect; r < window; ++r) ranks.push_back(r);
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    const double sa = double(p[size_t(true_order[size_t(a)])]) * (is_resident[size_t(a)] ? boost : 1.0);
    const double sb = double(p[size_t(true_order[size_t(b)])]) * (is_resident[size_t(b)] ? boost : 1.0);
    return sa != sb ? sa > sb : a < b;  // a < b: the true order breaks ties (higher p, lower id)
  });

  std::vector<int32_t> chosen(true_order.begin(), true_order.begin() + protect);
  for (int j = 0; j < k - protect; ++j) chosen.push_back(true_order[size_t(ranks[size_t(j)])]);
  // Summed best first, as moe_route sums its top-k: bitwise the same weights when nothing moved.
  std::sort(chosen.begin(), chosen.end(), by_probability);
  float sum = 0.0f;
  for (int32_t e : chosen) sum += p[size_t(e)];
  std::sort(chosen.begin(), chosen.end());
  for (int j = 0; j < k; ++j) {
    ids_out[j] = chosen[size_t(j)];
    weights_out[j] = p[size_t(chosen[size_t(j)])] / sum;
  }

  if (!stats) return;
  int agree = 0;
  for (int32_t e : chosen)
    if (std::find(true_order.begin(), true_order.begin() + k, e) != true_order.begin() + k) ++agree;
  ++stats->rows;
  stats->swaps += uint64_t(k - agree);
  stats->agreement_sum += double(agree) / double(k);
  // KL(p ‖ p'), p' ∝ p·boost on the eligible resident experts: with Z = Σ p·factor,
  // KL = Σ p·log(p/p') = log Z − Σ_{boosted} p·log(boost).
  double z = 1.0, boosted_mass = 0.0;
  for (int r = protect; r < window; ++r)
    if (is_resident[size_t(r)]) boosted_mass += double(p[size_t(true_order[size_t(r)])]);
  z += boosted_mass * (boost - 1.0);
  stats->kl_sum += std::log(z) - boosted_mass * std::log(boost);
}

}  // namespace strata
