// layers/gated_deltanet.h's delta_rule_token against the plain loops its contract names (the
// recurrent form as first written: column by column, each sum a strided loop over i), bitwise,
// over several tokens so the state carries rounding forward. Shapes: the default model's
// 32 × 32 heads, dk ≠ dv, and dv past one 64-column block with a ragged last block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "layers/gated_deltanet.h"

namespace strata {
namespace {

void reference_token(const float* q, const float* k, const float* v, float beta, float decay_log,
                     int dk, int dv, float* state, float* out) {
  const float decay = std::exp(decay_log);
  for (int i = 0; i < dk * dv; ++i) state[i] *= decay;
  for (int j = 0; j < dv; ++j) {
    float recalled = 0.0f;
    for (int i = 0; i < dk; ++i) recalled += state[i * dv + j] * k[i];
    const float u = (v[j] - recalled) * beta;
    for (int i = 0; i < dk; ++i) state[i * dv + j] += k[i] * u;
  }
  for (int j = 0; j < dv; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < dk; ++i) acc += state[i * dv + j] * q[i];
    out[j] = acc;
  }
}

TEST(DeltaRuleToken, IsBitwiseThePlainLoops) {
  const int shapes[][2] = {{32, 32}, {16, 100}, {128, 128}, {64, 7}};
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (const auto& shape : shapes) {
    const int dk = shape[0], dv = shape[1];
    std::vector<float> state(static_cast<size_t>(dk) * dv), expected_state(state.size());
    std::vector<float> out(static_cast<size_t>(dv)), expected_out(static_cast<size_t>(dv));
    for (float& x : state) x = 0.1f * normal(rng);
    expected_state = state;
    for (int t = 0; t < 12; ++t) {
      std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)),
          v(static_cast<size_t>(dv));
      for (float& x : q) x = normal(rng) / std::sqrt(float(dk));
      for (float& x : k) x = normal(rng) / std::sqrt(float(dk));
      for (float& x : v) x = normal(rng);
      const float beta = unit(rng), decay_log = -unit(rng);
      reference_token(q.data(), k.data(), v.data(), beta, decay_log, dk, dv, expected_state.data(),
                      expected_out.data());
      // Every other token without an output (the rollback replay's form): same state bits.
      const bool with_out = t % 2 == 0;
      delta_rule_token(q.data(), k.data(), v.data(), beta, decay_log, dk, dv, state.data(),
                       with_out ? out.data() : nullptr);
      ASSERT_EQ(std::memcmp(state.data(), expected_state.data(), state.size() * sizeof(float)), 0)
          << "state after token " << t << ", dk " << dk << ", dv " << dv;
      if (with_out) {
        ASSERT_EQ(std::memcmp(out.data(), expected_out.data(), out.size() * sizeof(float)), 0)
            << "output of token " << t << ", dk " << dk << ", dv " << dv;
      }
    }
  }
}

// delta_rule_token_columns: a head's columns cut into ranges (uneven, ragged against the 64-column
// blocks, an empty one) and run range by range give delta_rule_token's state and output bits,
// token after token; columns outside a range are not touched.
TEST(DeltaRuleToken, ColumnRangesAreBitwiseTheWholeHead) {
  const int shapes[][2] = {{16, 16}, {128, 128}, {64, 100}, {32, 7}};
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (const auto& shape : shapes) {
    const int dk = shape[0], dv = shape[1];
    std::vector<float> state(static_cast<size_t>(dk) * dv), whole_state(state.size());
    std::vector<float> out(static_cast<size_t>(dv)), whole_out(static_cast<size_t>(dv));
    for (float& x : state) x = 0.1f * normal(rng);
    whole_state = state;
    std::uniform_int_distribution<int> cut(0, dv);
    for (int t = 0; t < 10; ++t) {
      std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)),
          v(static_cast<size_t>(dv));
      for (float& x : q) x = normal(rng) / std::sqrt(float(dk));
      for (float& x : k) x = normal(rng) / std::sqrt(float(dk));
      for (float& x : v) x = normal(rng);
      const float beta = unit(rng), decay_log = -unit(rng);
      delta_rule_token(q.data(), k.data(), v.data(), beta, decay_log, dk, dv, whole_state.data(),
                       whole_out.data());
      // Three cuts (sorted): four ranges, some possibly empty.
      int cuts[3] = {cut(rng), cut(rng), cut(rng)};
      std::sort(std::begin(cuts), std::end(cuts));
      const int bounds[5] = {0, cuts[0], cuts[1], cuts[2], dv};
      std::fill(out.begin(), out.end(), -7.0f);
      for (int r = 0; r < 4; ++r) {
        const std::vector<float> before = state;
        delta_rule_token_columns(q.data(), k.data(), v.data(), beta, decay_log, dk, dv, bounds[r],
                                 bounds[r + 1], state.data(), out.data());
        for (int i = 0; i < dk; ++i)
          for (int j = 0; j < dv; ++j) {
            if (j >= bounds[r] && j < bounds[r + 1]) continue;
            ASSERT_EQ(state[size_t(i * dv + j)], before[size_t(i * dv + j)])
                << "column " << j << " outside [" << bounds[r] << ", " << bounds[r + 1] << ")";
          }
      }
      ASSERT_EQ(std::memcmp(state.data(), whole_state.data(), state.size() * sizeof(float)), 0)
          << "state after token " << t << ", dk " << dk << ", dv " << dv;
      ASSERT_EQ(std::memcmp(out.data(), whole_out.data(), out.size() * sizeof(float)), 0)
          << "output of token " << t << ", dk " << dk << ", dv " << dv;
    }
  }
}

}  // namespace
}  // namespace strata
