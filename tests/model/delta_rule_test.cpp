// layers/gated_deltanet.h's delta_rule_token against the plain loops its contract names (the
// recurrent form as first written: column by column, each sum a strided loop over i), bitwise,
// over several tokens so the state carries rounding forward. Shapes: the default model's
// 32 × 32 heads, dk ≠ dv, and dv past one 64-column block with a ragged last block.
// Also the chunked form (delta_rule_chunked_head) with strong decays: no subnormal anywhere in
// what it writes, the same bits on every thread of a pool, and the caller's mode left alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compute/cpu/subnormals.h"
#include "compute/cpu/thread_pool.h"
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

// One V head's rows for delta_rule_chunked_head: q̂ (scaled by 1/√dk) and k̂ unit rows, v normal,
// β in (0, 1), and a log-decay that depends on `kind`:
//   0 mild:   g in -0.5 x [0.5, 1.5] per token (γ ≈ -32 at a 64-row chunk's end);
//   1 strong: g in -2 x [0.5, 1.5] (γ ≈ -128: the e^γ factors of rows ~44 apart are subnormal,
//             and so are the W rows and products built on them);
//   2 shut:   g = -0.1, but -95 at row 32 of every chunk with β = 0 from there to the chunk's end:
//             the gate forgets everything below the smallest normal float and nothing new is
//             written, so rows 32..63 of each chunk output and the chunk leaves a state of
//             e^-95-scaled terms: subnormal when computed as such, exactly 0 when flushed.
struct ChunkedHead {
  static constexpr int kDk = 32, kDv = 32;
  static constexpr int64_t kRows = 3 * kDeltaRuleChunkRows;
  std::vector<float> q, k, v, beta, g;
  ChunkedHead(int kind, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    auto unit_rows = [&](std::vector<float>& rows, float scale) {
      rows.resize(size_t(kRows) * kDk);
      for (int64_t t = 0; t < kRows; ++t) {
        float* row = rows.data() + t * kDk;
        float norm = 0.0f;
        for (int i = 0; i < kDk; ++i) {
          row[i] = normal(rng);
          norm += row[i] * row[i];
        }
        for (int i = 0; i < kDk; ++i) row[i] = row[i] / std::sqrt(norm) * scale;
      }
    };
    unit_rows(q, 1.0f / std::sqrt(float(kDk)));
    unit_rows(k, 1.0f);
    v.resize(size_t(kRows) * kDv);
    for (float& x : v) x = normal(rng);
    beta.resize(size_t(kRows));
    g.resize(size_t(kRows));
    for (int64_t t = 0; t < kRows; ++t) {
      const int64_t in_chunk = t % kDeltaRuleChunkRows;
      beta[size_t(t)] = kind == 2 && in_chunk >= 32 ? 0.0f : unit(rng);
      g[size_t(t)] = kind == 0   ? -0.5f * (0.5f + unit(rng))
                     : kind == 1 ? -2.0f * (0.5f + unit(rng))
                                 : (in_chunk == 32 ? -95.0f : -0.1f);
    }
  }
  DeltaRuleHeadRows rows() const {
    return {q.data(), k.data(), kDk, v.data(), kDv, beta.data(), g.data(), 1, kRows, kDk, kDv};
  }
  // Runs the chunked form from a zero state into `out` (kRows x kDv) and `state` (kDk x kDv).
  void run(std::vector<float>& state, std::vector<float>& out) const {
    state.assign(size_t(kDk) * kDv, 0.0f);
    out.assign(size_t(kRows) * kDv, -7.0f);
    delta_rule_chunked_head(rows(), state.data(), out.data(), kDv);
  }
};

bool is_subnormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL; }

// Whether this thread's arithmetic still produces a subnormal (FLT_MIN / 2): false if a
// flush-to-zero mode leaked out of a scope.
bool thread_keeps_subnormals() {
  volatile float smallest_normal = FLT_MIN;
  volatile float half = smallest_normal * 0.5f;
  return is_subnormal(half);
}

// On an Intel core every subnormal operand or result costs a microcode assist, and strong decays
// fill the chunked form with them (layers/gated_deltanet.cpp, delta_rule_chunked_head), so it
// flushes them: nothing it writes is subnormal; a head whose gate shuts gives exact zeros where
// the unflushed arithmetic gave subnormals (this fails without the flush); 12 heads of all three
// kinds handed out over pools of 1-4 threads (workers included) give the bits of the same heads run
// on this thread; and neither this thread nor the workers keep the flush afterwards (a leaked mode
// would change the bits of whatever the thread runs next, e.g. the recurrent form).
TEST(DeltaRuleChunked, StrongDecaysLeaveNoSubnormalsAndTheSameBitsOnEveryThread) {
  if (!STRATA_HAS_MXCSR) GTEST_SKIP() << "no MXCSR: subnormals are kept on this architecture";
  constexpr int kHeads = 12;
  std::vector<ChunkedHead> heads;
  for (int h = 0; h < kHeads; ++h) heads.emplace_back(h % 3, 40 + uint32_t(h));
  std::vector<std::vector<float>> states(kHeads), outs(kHeads);
  for (int h = 0; h < kHeads; ++h) {
    SCOPED_TRACE("head " + std::to_string(h) + ", kind " + std::to_string(h % 3));
    heads[size_t(h)].run(states[size_t(h)], outs[size_t(h)]);
    EXPECT_EQ(std::count_if(states[size_t(h)].begin(), states[size_t(h)].end(), is_subnormal), 0);
    EXPECT_EQ(std::count_if(outs[size_t(h)].begin(), outs[size_t(h)].end(), is_subnormal), 0);
    if (h % 3 == 2) {
      EXPECT_TRUE(std::all_of(states[size_t(h)].begin(), states[size_t(h)].end(),
                              [](float x) { return x == 0.0f; }))
          << "the state after a shut gate";
      for (int64_t t = 0; t < ChunkedHead::kRows; ++t) {
        if (t % kDeltaRuleChunkRows < 32) continue;
        for (int c = 0; c < ChunkedHead::kDv; ++c)
          ASSERT_EQ(outs[size_t(h)][size_t(t * ChunkedHead::kDv + c)], 0.0f) << "row " << t;
      }
    }
  }
  EXPECT_TRUE(thread_keeps_subnormals()) << "the flush leaked to the calling thread";
  for (const int threads : {1, 2, 3, 4}) {
    compute::ThreadPool pool(threads, compute::ThreadPool::kDefaultWorkerSpinMicros,
                             compute::ThreadPool::kInlineNever);
    std::vector<std::vector<float>> pool_states(kHeads), pool_outs(kHeads);
    pool.parallel_for(kHeads, [&](int64_t begin, int64_t end, int) {
      for (int64_t h = begin; h < end; ++h)
        heads[size_t(h)].run(pool_states[size_t(h)], pool_outs[size_t(h)]);
    });
    std::vector<int> kept(size_t(threads), 0);
    pool.parallel_for(threads, [&](int64_t begin, int64_t end, int thread) {
      for (int64_t i = begin; i < end; ++i)
        kept[size_t(thread)] |= thread_keeps_subnormals() ? 1 : 2;
    });
    for (int h = 0; h < kHeads; ++h) {
      ASSERT_EQ(std::memcmp(pool_states[size_t(h)].data(), states[size_t(h)].data(),
                            states[size_t(h)].size() * sizeof(float)),
                0)
          << "state of head " << h << " on " << threads << " threads";
      ASSERT_EQ(std::memcmp(pool_outs[size_t(h)].data(), outs[size_t(h)].data(),
                            outs[size_t(h)].size() * sizeof(float)),
                0)
          << "outputs of head " << h << " on " << threads << " threads";
    }
    for (int thread = 0; thread < threads; ++thread)
      EXPECT_NE(kept[size_t(thread)] & 2, 2) << "the flush leaked to thread " << thread;
  }
}

}  // namespace
}  // namespace strata
