// layers/torch_top_k.h (the loop form of torch's CPU topk that the CUDA backend runs for tied QSA
// scores) against torch_cpu_top_k_set (the std:: calls torch itself makes): the same selected
// set on inputs with many exact ties, for both of torch's branches (partial sort when k·64 <= n,
// nth_element otherwise, including its heap-select fallback on adversarial orders).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "layers/attention.h"
#include "layers/torch_top_k.h"

namespace strata {
namespace {

std::vector<int64_t> emulated_set(const std::vector<float>& values, int64_t k) {
  std::vector<int32_t> idx(values.size());
  std::iota(idx.begin(), idx.end(), 0);
  torch_top_k::torch_top_k_permute(idx.data(), int64_t(idx.size()), k,
                                   [&](int32_t a, int32_t b) { return values[size_t(a)] > values[size_t(b)]; });
  std::vector<int64_t> set(idx.begin(), idx.begin() + k);
  std::sort(set.begin(), set.end());
  return set;
}

std::vector<int64_t> torch_set(const std::vector<float>& values, int64_t k) {
  std::vector<int64_t> set;
  torch_cpu_top_k_set(values, k, set);
  std::sort(set.begin(), set.end());
  return set;
}

TEST(TorchTopK, SameSetAsTorchOnTiedScores) {
  std::mt19937 rng(41);
  int checked = 0;
  for (const int64_t n : {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64, 65, 100, 129, 257, 600, 2048, 5000}) {
    for (int trial = 0; trial < 24; ++trial) {
      // Few distinct levels (zeros dominate, as after QSA's relu), or random floats.
      const int levels = trial % 4 == 3 ? 0 : 1 + trial % 5;
      std::uniform_int_distribution<int> level(0, std::max(levels, 1) * 2);
      std::uniform_real_distribution<float> uniform(0.0f, 4.0f);
      std::vector<float> values(static_cast<size_t>(n));
      for (float& v : values) {
        if (levels == 0) {
          v = uniform(rng);
        } else {
          const int l = level(rng) - levels;
          v = l <= 0 ? 0.0f : float(l) * 0.25f;
        }
      }
      for (const int64_t k : {int64_t(1), int64_t(2), n / 64, n / 8, n / 2, n - 1, n}) {
        if (k < 1 || k > n) continue;
        ASSERT_EQ(torch_set(values, k), emulated_set(values, k)) << "n " << n << " k " << k << " trial " << trial;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// Orders that push introselect into its depth limit (sorted, reversed, organ-pipe, all equal).
TEST(TorchTopK, SameSetOnAdversarialOrders) {
  for (const int64_t n : {9, 40, 300, 3000}) {
    std::vector<std::vector<float>> inputs(5, std::vector<float>(static_cast<size_t>(n)));
    for (int64_t i = 0; i < n; ++i) {
      inputs[0][size_t(i)] = float(i);
      inputs[1][size_t(i)] = float(n - i);
      inputs[2][size_t(i)] = float(std::min(i, n - 1 - i));
      inputs[3][size_t(i)] = 1.0f;
      inputs[4][size_t(i)] = float((i * 7) % 5);
    }
    for (const auto& values : inputs)
      for (const int64_t k : {int64_t(1), n / 3, n / 2 + 1, n})
        ASSERT_EQ(torch_set(values, k), emulated_set(values, k)) << "n " << n << " k " << k;
  }
}

}  // namespace
}  // namespace strata
