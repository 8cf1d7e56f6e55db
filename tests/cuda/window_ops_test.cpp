// The small per-window CUDA steps of compute/cuda/window_ops.h against plain CPU references (the
// loops of layers/gated_deltanet.cpp, layers/attention.cpp and layers/ple.cpp, transcribed), on
// random inputs of awkward sizes. Bitwise where the header says so; the σ/silu steps within the
// ulp bound of CUDA's expf against glibc's (as tests/cuda/ops_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "compute/cpu/ops.h"
#include "compute/cuda/ops.h"
#include "compute/cuda/window_ops.h"
#include "layers/attention.h"
#include "cuda_test_util.h"

namespace strata {
namespace {

using compute::cuda::DeviceBuffer;
using compute::cuda::Stream;
using namespace test_support;

void expect_bitwise(const std::vector<float>& cpu, const std::vector<float>& gpu, const char* what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    ASSERT_TRUE(same_bits(cpu[i], gpu[i])) << what << " at " << i << ": cpu " << cpu[i] << " cuda " << gpu[i];
}

double ulps(float a, float b) { return std::fabs(double(a) - double(b)) / std::ldexp(std::max(std::fabs(double(a)), 1e-30), -23); }

TEST(CudaWindowOps, AddSplitAndHistoryTailAreBitwise) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(21);
  Stream stream;
  {  // add_rows
    const auto a = random_floats(1003, rng), b = random_floats(1003, rng);
    DeviceBuffer da = to_device(a), db = to_device(b);
    compute::cuda::add_rows(da.as<float>(), db.as<float>(), int64_t(a.size()), stream.get());
    stream.synchronize();
    std::vector<float> cpu = a;
    for (size_t i = 0; i < cpu.size(); ++i) cpu[i] += b[i];
    expect_bitwise(cpu, from_device<float>(da, a.size()), "add_rows");
  }
  for (const auto& [nk, r] : {std::pair{2, 3}, std::pair{4, 1}, std::pair{3, 2}}) {  // split_beta_alpha
    const int64_t rows = 5, nv = int64_t(nk) * r;
    const auto ba = random_floats(size_t(rows * 2 * nv), rng);
    DeviceBuffer dba = to_device(ba), dbeta(size_t(rows * nv) * 4), dalpha(size_t(rows * nv) * 4);
    compute::cuda::split_beta_alpha(dba.as<float>(), rows, nk, r, dbeta.as<float>(), dalpha.as<float>(), stream.get());
    stream.synchronize();
    std::vector<float> beta(size_t(rows * nv)), alpha(size_t(rows * nv));
    for (int64_t t = 0; t < rows; ++t)
      for (int g = 0; g < nk; ++g)
        for (int j = 0; j < r; ++j) {
          beta[size_t(t * nv + g * r + j)] = ba[size_t(t * 2 * nv + g * 2 * r + j)];
          alpha[size_t(t * nv + g * r + j)] = ba[size_t(t * 2 * nv + g * 2 * r + r + j)];
        }
    expect_bitwise(beta, from_device<float>(dbeta, beta.size()), "beta");
    expect_bitwise(alpha, from_device<float>(dalpha, alpha.size()), "alpha");
  }
  for (const int64_t n_rows : {int64_t(0), int64_t(1), int64_t(3), int64_t(9), int64_t(12)}) {  // history_tail
    const int64_t n_hist = 9, width = 37;
    const auto before = random_floats(size_t(n_hist * width), rng);
    const auto rows = random_floats(size_t(std::max<int64_t>(n_rows, 1) * width), rng);
    DeviceBuffer dbefore = to_device(before), drows = to_device(rows), dout(size_t(n_hist * width) * 4);
    compute::cuda::history_tail(dbefore.as<float>(), drows.as<float>(), n_rows, n_hist, width, dout.as<float>(),
                                stream.get());
    stream.synchronize();
    std::vector<float> cpu(size_t(n_hist * width));
    for (int64_t i = 0; i < n_hist; ++i) {
      const int64_t idx = n_rows - n_hist + i;
      const float* src = idx >= 0 ? rows.data() + idx * width : before.data() + (n_hist + idx) * width;
      std::copy_n(src, width, cpu.data() + i * width);
    }
    expect_bitwise(cpu, from_device<float>(dout, cpu.size()), "history_tail");
  }
}

TEST(CudaWindowOps, QsaBlockMeansAndScoresAreBitwise) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(22);
  Stream stream;
  const int di = 40, ratio = 4, n_heads = 3;
  const int64_t n_tokens = 43, first_block = 2, n_blocks = n_tokens / ratio - first_block;
  const auto raw = random_floats(size_t(n_tokens * di), rng);
  DeviceBuffer draw = to_device(raw), dkeys(size_t((n_blocks + first_block) * di) * 4);
  compute::cuda::qsa_block_means(draw.as<float>(), first_block, n_blocks, ratio, di,
                                 dkeys.as<float>() + first_block * di, stream.get());
  stream.synchronize();
  std::vector<float> means(size_t(n_blocks * di));
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int i = 0; i < di; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < ratio; ++j) acc += raw[size_t(((first_block + b) * ratio + j) * di + i)];
      means[size_t(b * di + i)] = acc / float(ratio);
    }
  const auto all_keys = from_device<float>(dkeys, size_t((n_blocks + first_block) * di));
  expect_bitwise(means, std::vector<float>(all_keys.begin() + first_block * di, all_keys.end()), "block means");

  // Scores of rows at positions first_pos .. first_pos + 4 over random block keys.
  const int64_t n_rows = 5, first_pos = 30, max_blocks = (first_pos + n_rows) / ratio;
  const auto keys = random_floats(size_t(max_blocks * di), rng);
  const auto q = random_floats(size_t(n_rows * n_heads * di), rng);
  DeviceBuffer dk = to_device(keys), dq = to_device(q), ds(size_t(n_rows * max_blocks) * 4);
  STRATA_CUDA_CHECK(cudaMemset(ds.data(), 0, ds.bytes()));
  const float scale = 1.0f / std::sqrt(float(di));
  compute::cuda::qsa_block_scores(dq.as<float>(), n_rows, n_heads, di, dk.as<float>(), first_pos, ratio, max_blocks,
                                  scale, ds.as<float>(), stream.get());
  stream.synchronize();
  const auto gpu = from_device<float>(ds, size_t(n_rows * max_blocks));
  for (int64_t t = 0; t < n_rows; ++t)
    for (int64_t b = 0; b < (first_pos + t + 1) / ratio; ++b) {  // select_tokens' loop
      float sum = 0.0f;
      for (int h = 0; h < n_heads; ++h) {
        float dot = 0.0f;
        for (int i = 0; i < di; ++i) dot += q[size_t((t * n_heads + h) * di + i)] * keys[size_t(b * di + i)];
        sum += std::max(dot, 0.0f);
      }
      ASSERT_TRUE(same_bits(sum * scale, gpu[size_t(t * max_blocks + b)])) << "row " << t << " block " << b;
    }
}

// The fused block-key kernel of a window (device-side first position) against the three-kernel
// chain it replaces, bitwise, including blocks that do not complete (left untouched) and a
// rotated part narrower than the key.
TEST(CudaWindowOps, QsaBlockKeysAtAreTheMeansNormRopeChain) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(24);
  Stream stream;
  const float eps = 1e-6f, theta = 1e6f;
  for (const auto& [di, n_rot, ratio] : {std::tuple{128, 64, 4}, std::tuple{40, 24, 3}}) {
    const int64_t n_tokens = 70;
    const auto raw = random_floats(size_t(n_tokens * di), rng);
    const auto norm = random_floats(size_t(di), rng, 0.5f, 1.5f);
    DeviceBuffer draw = to_device(raw), dnorm = to_device(norm);
    for (const int64_t first : {int64_t(0), int64_t(5), int64_t(8), int64_t(13)})
      for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(4), int64_t(9), int64_t(17)}) {
        const int64_t n_slots = n_tokens / ratio + 1, b0 = first / ratio, b1 = (first + n_rows) / ratio;
        const std::vector<float> sentinel(size_t(n_slots * di), -7.25f);
        DeviceBuffer fused = to_device(sentinel), chain = to_device(sentinel);
        DeviceBuffer dfirst = to_device(std::vector<int32_t>{int32_t(first)});
        compute::cuda::qsa_block_keys_at(draw.as<float>(), dfirst.as<int32_t>(), n_rows, ratio, di, dnorm.as<float>(),
                                         eps, n_rot, theta, fused.as<float>(), stream.get());
        std::vector<int32_t> positions;
        for (int64_t b = b0; b < b1; ++b) positions.push_back(int32_t(b * ratio));
        if (b1 > b0) {
          DeviceBuffer dpos = to_device(positions);
          float* keys = chain.as<float>() + b0 * di;
          compute::cuda::qsa_block_means(draw.as<float>(), b0, b1 - b0, ratio, di, keys, stream.get());
          compute::cuda::rms_norm_strided(keys, dnorm.as<float>(), b1 - b0, di, di, eps, keys, stream.get());
          compute::cuda::rope_neox_rows(keys, b1 - b0, 1, di, n_rot, dpos.as<int32_t>(), theta, stream.get());
          stream.synchronize();
        }
        stream.synchronize();
        expect_bitwise(from_device<float>(chain, sentinel.size()), from_device<float>(fused, sentinel.size()),
                       "block keys");
      }
  }
}

// The CPU's select_tokens (layers/attention.cpp) for one row at position pos, over given scores.
std::vector<int32_t> select_reference(const float* scores, int64_t pos, int ratio, int64_t budget_blocks) {
  const int64_t n_visible = pos + 1, n_blocks = n_visible / ratio;
  std::vector<int32_t> list;
  if (n_blocks <= budget_blocks) {
    for (int64_t i = 0; i < n_visible; ++i) list.push_back(int32_t(i));
    return list;
  }
  std::vector<int64_t> top;
  torch_cpu_top_k_set(std::vector<float>(scores, scores + n_blocks), budget_blocks, top);
  std::vector<char> selected(static_cast<size_t>(n_blocks), 0);
  for (const int64_t b : top) selected[size_t(b)] = 1;
  for (int64_t b = 0; b < n_blocks; ++b)
    if (selected[size_t(b)])
      for (int j = 0; j < ratio; ++j) list.push_back(int32_t(b * ratio + j));
  for (int64_t i = n_blocks * ratio; i < n_visible; ++i) list.push_back(int32_t(i));
  return list;
}

// Device-side QSA selection against the CPU's: scores drawn from a few values (many exact ties
// at the threshold, −0 among them: torch's order decides) and from random floats, rows within
// and over budget in one window, small and large block counts.
TEST(CudaWindowOps, QsaSelectTokensMatchTheReference) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(25);
  Stream stream;
  const int ratio = 4;
  struct Case {
    int64_t first, n_rows, budget;
    bool ties;
  };
  for (const Case c : {Case{30, 7, 8, true}, Case{30, 7, 8, false}, Case{31, 1, 8, true}, Case{1000, 5, 16, true},
                       Case{20003, 3, 512, true}, Case{20003, 3, 512, false}, Case{3990, 64, 1000, true}}) {
    const int64_t max_blocks = (c.first + c.n_rows + 1023) / 1024 * 1024 / ratio;
    const int max_tokens = int((c.budget + 1) * ratio - 1);
    std::vector<float> scores(size_t(c.n_rows * max_blocks));
    std::uniform_int_distribution<int> level(0, 5);
    for (float& v : scores) {
      if (c.ties) {
        const int l = level(rng);
        v = l == 0 ? -0.0f : float(l / 2) * 0.5f;
      } else {
        v = random_floats(1, rng, 0.0f, 3.0f)[0];
      }
    }
    DeviceBuffer dscores = to_device(scores), dfirst = to_device(std::vector<int32_t>{int32_t(c.first)});
    DeviceBuffer dlists(size_t(c.n_rows * max_tokens) * 4), dcounts(size_t(c.n_rows) * 4);
    compute::cuda::qsa_select_tokens(dscores.as<float>(), c.n_rows, max_blocks, dfirst.as<int32_t>(), ratio, c.budget,
                                     max_tokens, dlists.as<int32_t>(), dcounts.as<int32_t>(), stream.get());
    stream.synchronize();
    const auto lists = from_device<int32_t>(dlists, size_t(c.n_rows * max_tokens));
    const auto counts = from_device<int32_t>(dcounts, size_t(c.n_rows));
    for (int64_t t = 0; t < c.n_rows; ++t) {
      const auto want = select_reference(scores.data() + t * max_blocks, c.first + t, ratio, c.budget);
      ASSERT_EQ(int64_t(want.size()), counts[size_t(t)]) << "first " << c.first << " row " << t;
      ASSERT_TRUE(std::equal(want.begin(), want.end(), lists.begin() + t * max_tokens))
          << "first " << c.first << " row " << t << (c.ties ? " (ties)" : "");
    }
  }
}

TEST(CudaWindowOps, GateAndPleStepsWithinUlps) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(23);
  Stream stream;
  for (const bool sigmoid_gate : {true, false}) {  // gate_rows
    const auto o = random_floats(777, rng, -3.0f, 3.0f), z = random_floats(777, rng, -8.0f, 8.0f);
    DeviceBuffer dout = to_device(o), dz = to_device(z);
    compute::cuda::gate_rows(dout.as<float>(), dz.as<float>(), int64_t(o.size()), sigmoid_gate, stream.get());
    stream.synchronize();
    const auto gpu = from_device<float>(dout, o.size());
    for (size_t i = 0; i < o.size(); ++i) {
      const float cpu = o[i] * (sigmoid_gate ? compute::sigmoid(z[i]) : compute::silu(z[i]));
      ASSERT_LE(ulps(cpu, gpu[i]), 10.0) << "gate " << i;
    }
  }
  // PLE gate and conv on 3 rows of S = 2 streams of H = 48.
  const int S = 2, kernel = 4, dilation = 3;
  const int64_t H = 48, width = S * H, n_rows = 3, history_steps = (kernel - 1) * dilation;
  const auto keys = random_floats(size_t(n_rows * width), rng), queries = random_floats(size_t(n_rows * width), rng);
  const auto values = random_floats(size_t(n_rows * H), rng);
  DeviceBuffer dk = to_device(keys), dq = to_device(queries), dv = to_device(values), dg(size_t(n_rows * width) * 4);
  compute::cuda::ple_gate(dk.as<float>(), dq.as<float>(), dv.as<float>(), n_rows, S, H, dg.as<float>(), stream.get());
  stream.synchronize();
  const auto gated = from_device<float>(dg, size_t(n_rows * width));
  const float inv_sqrt_h = 1.0f / std::sqrt(float(H));
  for (int64_t t = 0; t < n_rows; ++t)
    for (int s = 0; s < S; ++s) {
      double score = 0.0, magnitude_sum = 0.0;
      for (int64_t i = 0; i < H; ++i) {
        score += double(keys[size_t(t * width + s * H + i)]) * queries[size_t(t * width + s * H + i)];
        magnitude_sum += std::fabs(double(keys[size_t(t * width + s * H + i)]) * queries[size_t(t * width + s * H + i)]);
      }
      score *= inv_sqrt_h;
      const double m = std::sqrt(std::max(std::fabs(score), 1e-6));
      const double gate = 1.0 / (1.0 + std::exp(-(score < 0 ? -m : score > 0 ? m : 0.0)));
      // The dot's two sum orders differ by ≤ (H + 5)·u·Σ|k·q|; through sqrt and σ (slopes ≤ 1/(2√|s|)·¼) plus expf.
      const double bound = 4 * ((double(H) + 5) * std::ldexp(magnitude_sum * inv_sqrt_h, -24) / (8 * m) + 8 * std::ldexp(gate, -24));
      for (int64_t i = 0; i < H; ++i) {
        const double want = gate * values[size_t(t * H + i)];
        ASSERT_LE(std::fabs(want - gated[size_t(t * width + s * H + i)]), bound * std::fabs(values[size_t(t * H + i)]) + 1e-7)
            << "ple gate row " << t << " stream " << s;
      }
    }
  const auto normed = random_floats(size_t(n_rows * width), rng);
  const auto history = random_floats(size_t(history_steps * width), rng);
  const auto taps = random_floats(size_t(width * kernel), rng);
  const auto X = random_floats(size_t(n_rows * width), rng);
  DeviceBuffer dn = to_device(normed), dh = to_device(history), dt = to_device(taps), dX = to_device(X);
  compute::cuda::ple_conv(dn.as<float>(), dh.as<float>(), dt.as<float>(), dg.as<float>(), n_rows, width, kernel, dilation,
                          dX.as<float>(), stream.get());
  stream.synchronize();
  const auto gpu = from_device<float>(dX, X.size());
  for (int64_t t = 0; t < n_rows; ++t)
    for (int64_t c = 0; c < width; ++c) {  // ple_forward's conv loop
      float sum = 0.0f;
      for (int j = 0; j < kernel; ++j) {
        const int64_t idx = t - int64_t(kernel - 1 - j) * dilation;
        const float n = idx >= 0 ? normed[size_t(idx * width + c)] : history[size_t((history_steps + idx) * width + c)];
        sum += taps[size_t(c * kernel + j)] * n;
      }
      const float silu = compute::silu(sum);
      const float cpu = X[size_t(t * width + c)] + (gated[size_t(t * width + c)] + silu);
      // Bitwise sums; silu within 6 ulp of |silu|; two roundings after it.
      const double bound = 6 * std::ldexp(std::fabs(double(silu)), -24) + 2 * std::ldexp(std::fabs(double(cpu)), -24) + 1e-38;
      ASSERT_LE(std::fabs(double(cpu) - gpu[size_t(t * width + c)]), bound) << "ple conv row " << t << " channel " << c;
    }
}

}  // namespace
}  // namespace strata
