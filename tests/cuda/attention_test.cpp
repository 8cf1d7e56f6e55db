// CUDA attention core (compute/cuda/attention.h) at 1..32 splits per row, against the CPU's
// per-(row, head) loop, which
// the reference below transcribes from layers/attention.cpp (scores, compute::softmax, weighted
// values, σ gate); with the seam issue the test calls the CPU op itself.
// Bound per output: the scores are bitwise equal; the softmax weights differ by at most ε_w
// relative (CUDA's expf vs glibc's, two sum orders: the ops_test softmax bound); each side's
// sequential value sum rounds ≤ n_tok·u relative to Σ_i w_i|v_ij|; the gate adds ≤ 6u.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compute/cpu/ops.h"
#include "compute/cuda/attention.h"
#include "cuda_test_util.h"
#include "util/error.h"

namespace strata {
namespace {

using compute::cuda::AttentionShape;
using compute::cuda::DeviceBuffer;
using compute::cuda::Stream;
using namespace test_support;

constexpr double kU = 1.0 / 16777216.0;

TEST(CudaAttention, MatchesCpuDenseAndSelected) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(21);
  Stream stream;
  for (const auto& [n_head, n_kv, hd, gated] : {std::tuple{8, 2, 256, true}, std::tuple{4, 4, 64, false}, std::tuple{6, 3, 72, true}}) {
    for (const auto& [first_pos, selected] : {std::pair<int64_t, bool>{37, false}, {37, true}, {126, false}, {700, true},
                                                {4200, false}, {5000, true}}) {
      // 37: one split per row; 126: rows of 127..131 tokens cross from one split to two; 700 and
      // 4200: several splits (6, 32); 5000 with every third token: ~1670 tokens in 14 splits.
      const int64_t n_rows = 5, kv_dim = int64_t(n_kv) * hd, n_cache = first_pos + n_rows;
      const int64_t q_row = int64_t(n_head) * hd * (gated ? 2 : 1);
      const AttentionShape shape{n_head, n_kv, hd, gated, q_row, kv_dim};
      const auto q = random_floats(size_t(n_rows * q_row), rng, -1.0f, 1.0f);
      const auto k = random_floats(size_t(n_cache * kv_dim), rng, -1.0f, 1.0f);
      const auto v = random_floats(size_t(n_cache * kv_dim), rng, -1.0f, 1.0f);
      // Selected: every third visible token plus the row's own position (ascending).
      const int max_tokens = int(n_cache);
      std::vector<int32_t> lists(size_t(n_rows * max_tokens), 0), counts(size_t(n_rows), 0);
      for (int64_t t = 0; t < n_rows; ++t) {
        const int64_t pos = first_pos + t;
        for (int64_t i = 0; i <= pos; ++i)
          if (!selected || i % 3 == 0 || i == pos) lists[size_t(t * max_tokens + counts[size_t(t)]++)] = int32_t(i);
      }
      DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dl = to_device(lists), dc = to_device(counts);
      {
        DeviceBuffer dout(size_t(n_rows * n_head * hd) * 4), dout1(size_t(n_rows * n_head * hd) * 4);
        DeviceBuffer partials(size_t(std::max<int64_t>(1, compute::cuda::attention_partial_floats(shape, n_rows, n_cache))) * 4);
        const int32_t* lp = selected ? dl.as<int32_t>() : nullptr;
        compute::cuda::attention_rows(shape, dq.as<float>(), n_rows, dk.as<float>(), dv.as<float>(), first_pos, lp,
                                      dc.as<int32_t>(), max_tokens, partials.as<float>(), dout.as<float>(), stream.get());
        for (int64_t t = 0; t < n_rows; ++t)  // the same rows one at a time
          compute::cuda::attention_rows(shape, dq.as<float>() + t * q_row, 1, dk.as<float>(), dv.as<float>(), first_pos + t,
                                        selected ? dl.as<int32_t>() + t * max_tokens : nullptr, dc.as<int32_t>() + t,
                                        max_tokens, partials.as<float>(), dout1.as<float>() + t * n_head * hd,
                                        stream.get());
        stream.synchronize();
        const auto gpu = from_device<float>(dout, size_t(n_rows * n_head * hd));
        EXPECT_EQ(0, std::memcmp(gpu.data(), from_device<float>(dout1, gpu.size()).data(), gpu.size() * 4))
            << "a row alone differs from the same row in the window";
        // The device-position form with a launch bound far above the rows' tokens (more split blocks,
        // more partials): the same bits (a recorded window serves every n_past up to its bound).
        {
          const int64_t bound = n_cache + 3000;
          const int64_t most = selected ? std::max<int64_t>(max_tokens, bound) : bound;
          DeviceBuffer wide(size_t(std::max<int64_t>(1, compute::cuda::attention_partial_floats(shape, n_rows, most))) * 4);
          DeviceBuffer first = to_device(std::vector<int32_t>{int32_t(first_pos)});
          DeviceBuffer dout2(size_t(n_rows * n_head * hd) * 4);
          compute::cuda::attention_rows_at(shape, dq.as<float>(), n_rows, dk.as<float>(), dv.as<float>(), first.as<int32_t>(),
                                           bound, lp, dc.as<int32_t>(), max_tokens, wide.as<float>(), dout2.as<float>(),
                                           stream.get());
          stream.synchronize();
          EXPECT_EQ(0, std::memcmp(gpu.data(), from_device<float>(dout2, gpu.size()).data(), gpu.size() * 4))
              << "a larger launch bound changed the rows";
        }
        const float scale = 1.0f / std::sqrt(float(hd));
        double worst = 0.0;
        for (int64_t t = 0; t < n_rows; ++t) {
          const int n_tok = counts[size_t(t)];
          for (int h = 0; h < n_head; ++h) {
            const float* qh = q.data() + t * q_row + h * hd * (gated ? 2 : 1);
            const int kvh = h / (n_head / n_kv);
            std::vector<float> w(static_cast<size_t>(n_tok));
            for (int i = 0; i < n_tok; ++i) {
              const float* kt = k.data() + int64_t(lists[size_t(t * max_tokens + i)]) * kv_dim + kvh * hd;
              float dot = 0.0f;
              for (int j = 0; j < hd; ++j) dot += qh[j] * kt[j];
              w[size_t(i)] = dot * scale;
            }
            compute::softmax(w.data(), n_tok);
            const double eps_w = double(3 + 3 + n_tok / 8 + 3 + n_tok / 256 + 13 + 2) * kU;
            for (int j = 0; j < hd; ++j) {
              float acc = 0.0f;
              double magnitude = 0.0;
              for (int i = 0; i < n_tok; ++i) {
                const float vi = v[size_t(int64_t(lists[size_t(t * max_tokens + i)]) * kv_dim + kvh * hd + j)];
                acc += w[size_t(i)] * vi;
                magnitude += double(w[size_t(i)]) * std::fabs(vi);
              }
              if (gated) acc *= compute::sigmoid(qh[hd + j]);
              const double bound = (eps_w + 2.0 * n_tok * kU) * magnitude + 6.0 * kU * std::fabs(acc) + 1e-30;
              const float got = gpu[size_t(t * n_head * hd + h * hd + j)];
              worst = std::max(worst, std::fabs(double(got) - acc) / bound);
              ASSERT_LE(std::fabs(double(got) - acc), bound) << "row " << t << " head " << h << " dim " << j;
            }
          }
        }
        std::printf("[ cuda ] attention hd %d %s, %lld..%lld tokens (%d..%d splits): worst = %.3f of the bound\n",
                    hd, selected ? "selected" : "dense", static_cast<long long>(counts.front()),
                    static_cast<long long>(counts.back()), compute::cuda::attention_split(counts.front()).count,
                    compute::cuda::attention_split(counts.back()).count, worst);
      }
    }
  }
}

TEST(CudaAttention, KvAppendAndLimits) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(22);
  Stream stream;
  const int64_t kv_dim = 96, rows = 3, at = 5;
  const auto k = random_floats(size_t(rows * kv_dim), rng), v = random_floats(size_t(rows * kv_dim), rng);
  DeviceBuffer dk = to_device(k), dv = to_device(v), kc(size_t(16 * kv_dim) * 4), vc(size_t(16 * kv_dim) * 4);
  compute::cuda::kv_append(dk.as<float>(), dv.as<float>(), rows, kv_dim, at, kc.as<float>(), vc.as<float>(), stream.get());
  stream.synchronize();
  EXPECT_EQ(0, std::memcmp(from_device<float>(kc, k.size(), size_t(at * kv_dim) * 4).data(), k.data(), k.size() * 4));
  EXPECT_EQ(0, std::memcmp(from_device<float>(vc, v.size(), size_t(at * kv_dim) * 4).data(), v.data(), v.size() * 4));
  const AttentionShape shape{4, 3, 64, false, 256, 192};  // 4 heads over 3 KV heads: refused
  EXPECT_THROW(compute::cuda::attention_rows(shape, kc.as<float>(), 1, kc.as<float>(), vc.as<float>(), 0, nullptr, nullptr, 0,
                                             nullptr, vc.as<float>(), stream.get()),
               Error);
  const AttentionShape ok{4, 2, 64, false, 256, 128};
  EXPECT_THROW(compute::cuda::attention_rows(ok, kc.as<float>(), 1, kc.as<float>(), vc.as<float>(),
                                             compute::cuda::kMaxAttentionTokens, nullptr, nullptr, 0, nullptr,
                                             vc.as<float>(), stream.get()),
               Error);
  // Rows of several splits need the partials buffer: refused without one; one split needs none.
  EXPECT_EQ(compute::cuda::attention_partial_floats(ok, 3, 128), 0);
  EXPECT_EQ(compute::cuda::attention_partial_floats(ok, 3, 501), 3 * 4 * 4 * (64 + 2));
  EXPECT_THROW(compute::cuda::attention_rows(ok, kc.as<float>(), 1, kc.as<float>(), vc.as<float>(), 500, nullptr, nullptr, 0,
                                             nullptr, vc.as<float>(), stream.get()),
               Error);
  // The split rule of attention.h.
  for (const auto& [n, count, tokens] : {std::tuple{1, 1, 1}, {128, 1, 128}, {129, 2, 65}, {700, 6, 117},
                                         {4096, 32, 128}, {4097, 32, 129}, {49152, 32, 1536}}) {
    EXPECT_EQ(compute::cuda::attention_split(n).count, count) << n;
    EXPECT_EQ(compute::cuda::attention_split(n).tokens, tokens) << n;
  }
}

}  // namespace
}  // namespace strata
