// hyper_connection_in (and hyper_connection_out_in) on the CPU: a window's rows give the bits each
// row gives alone on one thread, whatever the thread count, the window size and where the rows
// sit. Windows of a few rows per thread take the per-thread row slices
// (layers/hyper_connection.cpp), the others the split per step; both must agree with the
// row-by-row reference, with an inject (blocks) and without one (the final mixer).
#include "layers/hyper_connection.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compute/cpu/ops.h"
#include "quant/quant.h"

namespace strata {
namespace {

struct QuantMatrix {
  std::vector<std::byte> bytes;
  compute::WeightMatrix view;
};

QuantMatrix random_q8_0(int64_t n_in, int64_t n_out, std::mt19937& rng) {
  QuantMatrix m;
  const size_t row_size = row_bytes(GgmlType::Q8_0, n_in);
  m.bytes.resize(row_size * size_t(n_out));
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    for (float& v : row) v = normal(rng);
    quant::quantize_row(GgmlType::Q8_0, row.data(), m.bytes.data() + size_t(o) * row_size, n_in);
  }
  m.view = compute::WeightMatrix::dense(GgmlType::Q8_0, n_in, n_out, m.bytes.data());
  return m;
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Windows up to 32 rows that take no row slices (decode rows above all) run as one chain of
// steps in one hand-out, each step split in tasks of outputs or columns: the second shape has
// enough work for many tasks per step at every thread count (the first has one or two).
struct HcShape {
  int64_t n_embd, rank;
};
class HyperConnectionIn : public ::testing::TestWithParam<HcShape> {};

TEST_P(HyperConnectionIn, EveryWindowAndThreadCountGivesTheRowByRowBits) {
  constexpr int kStreams = 4;
  const int64_t kEmbd = GetParam().n_embd;
  const int64_t kRank = GetParam().rank;
  constexpr int64_t kMaxRows = 100;
  constexpr float kEps = 1e-6f;
  const int64_t width = kStreams * kEmbd;
  std::mt19937 rng(11);
  const QuantMatrix down = random_q8_0(width, kRank, rng);
  const QuantMatrix up = random_q8_0(kRank, width, rng);
  const QuantMatrix inject = random_q8_0(width, kStreams, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HyperConnectionWeights with_inject;
  with_inject.norm.resize(size_t(width));
  for (float& v : with_inject.norm) v = 1.0f + 0.3f * normal(rng);
  with_inject.down = down.view;
  with_inject.up = up.view;
  with_inject.inject = inject.view;
  HyperConnectionWeights mixer = with_inject;
  mixer.inject = {};
  std::vector<float> X(static_cast<size_t>(kMaxRows * width));
  for (float& v : X) v = normal(rng);

  for (const HyperConnectionWeights* w : {&with_inject, &mixer}) {
    const bool has_inject = w->has_inject();
    // The reference: every row alone, one thread.
    std::vector<float> want_x(static_cast<size_t>(kMaxRows * kEmbd));
    std::vector<float> want_inject(static_cast<size_t>(kMaxRows * kStreams));
    {
      compute::ThreadPool one(1);
      compute::Workspace ws;
      for (int64_t t = 0; t < kMaxRows; ++t)
        hyper_connection_in(one, ws, *w, kStreams, kEmbd, kEps, X.data() + t * width, 1,
                            want_x.data() + t * kEmbd,
                            has_inject ? want_inject.data() + t * kStreams : nullptr);
    }
    for (int threads : {1, 2, 3, 4, 7, 16})
      for (double inline_work_ns :
           {compute::ThreadPool::kInlineNever, compute::ThreadPool::kInlineAlways}) {
        compute::ThreadPool pool(threads, compute::ThreadPool::kDefaultWorkerSpinMicros,
                                 inline_work_ns);
        compute::Workspace ws;
        // 1..3: inline rows; 4..32 rows: the per-thread slices (at 2+ threads, 2+ rows each);
        // 33 and more: the split per step. Rows that take no slices: the steps one hand-out each,
        // and as one chain (ThreadPool::phase_chains).
        for (const bool chains : {false, true})
        for (int64_t n_rows : {1, 2, 3, 4, 5, 8, 16, 17, 32, 33, 64, 65, 100}) {
          pool.set_phase_chains(chains);
          const int64_t first = (kMaxRows - n_rows) / 2;
          std::vector<float> x(static_cast<size_t>(n_rows * kEmbd), -1.0f);
          std::vector<float> inj(static_cast<size_t>(n_rows * kStreams), -1.0f);
          hyper_connection_in(pool, ws, *w, kStreams, kEmbd, kEps, X.data() + first * width,
                              n_rows, x.data(), has_inject ? inj.data() : nullptr);
          for (int64_t i = 0; i < n_rows * kEmbd; ++i)
            ASSERT_EQ(bits(x[size_t(i)]), bits(want_x[size_t(first * kEmbd + i)]))
                << "x, " << threads << " threads, inline " << inline_work_ns << ", chains " << chains << ", " << n_rows
                << " rows, element " << i << (has_inject ? "" : ", mixer");
          if (has_inject) {
            for (int64_t i = 0; i < n_rows * kStreams; ++i)
              ASSERT_EQ(bits(inj[size_t(i)]), bits(want_inject[size_t(first * kStreams + i)]))
                  << "inject, " << threads << " threads, " << n_rows << " rows, element " << i;
          }
        }
      }
  }
}

// width 384 (12 Q8_0 blocks) with a rank of one block (the up projection's one-block path); width
// 2048 with rank 128 (the mid shape's rank).
INSTANTIATE_TEST_SUITE_P(Shapes, HyperConnectionIn,
                         ::testing::Values(HcShape{96, 32}, HcShape{512, 128}),
                         [](const ::testing::TestParamInfo<HcShape>& info) {
                           return "Embd" + std::to_string(info.param.n_embd) + "Rank" +
                                  std::to_string(info.param.rank);
                         });

// hyper_connection_out_in (a block's X += inject·y, then the next mixer's input, in one pass per
// row slice) against hyper_connection_out then hyper_connection_in, each row alone on one thread:
// X, x and the new inject bitwise, with the inject read and rewritten in the same buffer (as the
// model does), and for a next mixer without an inject.
TEST(HyperConnectionOutIn, EveryWindowAndThreadCountGivesTheTwoCallsRowByRowBits) {
  constexpr int kStreams = 4;
  constexpr int64_t kEmbd = 96, kRank = 32, kMaxRows = 40;
  constexpr float kEps = 1e-6f;
  const int64_t width = kStreams * kEmbd;
  std::mt19937 rng(23);
  const QuantMatrix down = random_q8_0(width, kRank, rng);
  const QuantMatrix up = random_q8_0(kRank, width, rng);
  const QuantMatrix inject = random_q8_0(width, kStreams, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HyperConnectionWeights with_inject;
  with_inject.norm.resize(size_t(width));
  for (float& v : with_inject.norm) v = 1.0f + 0.3f * normal(rng);
  with_inject.down = down.view;
  with_inject.up = up.view;
  with_inject.inject = inject.view;
  HyperConnectionWeights mixer = with_inject;
  mixer.inject = {};
  std::vector<float> X0(static_cast<size_t>(kMaxRows * width)),
      y(static_cast<size_t>(kMaxRows * kEmbd));
  std::vector<float> inject0(static_cast<size_t>(kMaxRows * kStreams));
  for (float& v : X0) v = normal(rng);
  for (float& v : y) v = normal(rng);
  for (float& v : inject0) v = 2.0f * compute::sigmoid(normal(rng));

  for (const HyperConnectionWeights* w : {&with_inject, &mixer}) {
    std::vector<float> want_X = X0, want_x(static_cast<size_t>(kMaxRows * kEmbd)),
                       want_inject = inject0;
    {
      compute::ThreadPool one(1);
      compute::Workspace ws;
      for (int64_t t = 0; t < kMaxRows; ++t) {
        hyper_connection_out(kStreams, kEmbd, y.data() + t * kEmbd, inject0.data() + t * kStreams,
                             1, want_X.data() + t * width);
        hyper_connection_in(one, ws, *w, kStreams, kEmbd, kEps, want_X.data() + t * width, 1,
                            want_x.data() + t * kEmbd,
                            w->has_inject() ? want_inject.data() + t * kStreams : nullptr);
      }
    }
    for (int threads : {1, 2, 3, 4, 7, 16}) {
      compute::ThreadPool pool(threads);
      compute::Workspace ws;
      for (const bool chains : {false, true})
      for (int64_t n_rows : {1, 3, 4, 5, 8, 16, 17, 32, 33, 40}) {
        pool.set_phase_chains(chains);
        const int64_t first = kMaxRows - n_rows;
        std::vector<float> X(X0.begin() + first * width, X0.begin() + kMaxRows * width);
        std::vector<float> inj(inject0.begin() + first * kStreams, inject0.end());
        std::vector<float> x(static_cast<size_t>(n_rows * kEmbd), -1.0f);
        hyper_connection_out_in(pool, ws, kStreams, kEmbd, y.data() + first * kEmbd, inj.data(),
                                X.data(), *w, kEps, n_rows, x.data(),
                                w->has_inject() ? inj.data() : nullptr);
        const auto where = [&](const char* what) {
          return std::string(what) + ", " + std::to_string(threads) + " threads, chains " +
                 std::to_string(chains) + ", " + std::to_string(n_rows) + " rows" +
                 (w->has_inject() ? "" : ", mixer");
        };
        for (size_t i = 0; i < X.size(); ++i)
          ASSERT_EQ(bits(X[i]), bits(want_X[size_t(first * width) + i])) << where("X") << " " << i;
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(bits(x[i]), bits(want_x[size_t(first * kEmbd) + i])) << where("x") << " " << i;
        for (size_t i = 0; i < inj.size(); ++i)
          ASSERT_EQ(bits(inj[i]), bits(w->has_inject() ? want_inject[size_t(first * kStreams) + i]
                                                       : inject0[size_t(first * kStreams) + i]))
              << where("inject") << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace strata
