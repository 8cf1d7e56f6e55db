// CUDA ops (compute/cuda/ops.h) against their CPU references (compute/cpu/ops.h) on random
// inputs of awkward sizes. Bounds, with u = 2^-24:
// - rms_norm: both sides sum n positive squares, in different orders; each sum is within
//   (chain length)·u relative of the exact one (CPU: n/8 + 3 adds per lane tree; GPU with t =
//   norm_threads(n) threads: n/t per thread + 5 butterfly + t/32 warp sums, i.e. n/256 + 13 at 256),
//   1/sqrt halves a relative error and adds ~2u, the two multiplies add 2u: the bound below.
// - softmax: CUDA's expf is within 2 ulp, glibc's within 1; sums of positive terms as above.
// - silu/sigmoid/softplus: expf (3u between the two), 1 + e (u), the division (u), the product (u).
// - rope: the same f32 angle, cos/sin in double rounded to f32: bitwise (asserted).
// - top-k choice and argmax: bitwise the same indices for the same inputs (same tie rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compute/cpu/ops.h"
#include "compute/cuda/ops.h"
#include "route/moce.h"
#include "cuda_test_util.h"
#include "util/error.h"

namespace strata {
namespace {

using compute::cuda::DeviceBuffer;
using compute::cuda::Stream;
using namespace test_support;

constexpr double kU = 1.0 / 16777216.0;

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double relative_ulps,
                  const char* what, double absolute = 1e-30) {
  ASSERT_EQ(gpu.size(), cpu.size());
  double worst = 0.0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double bound = relative_ulps * kU * std::fabs(double(cpu[i])) + absolute;
    const double error = std::fabs(double(gpu[i]) - double(cpu[i]));
    worst = std::max(worst, error / bound);
    ASSERT_LE(error, bound) << what << " at " << i << ": gpu " << gpu[i] << " cpu " << cpu[i];
  }
  std::printf("[ cuda ] %-22s worst = %.3f of the bound (%.0f ulp)\n", what, worst, relative_ulps);
}

// The launch guard (runtime.h check_launch_shape): shapes beyond the device's limits throw a
// strata::Error naming the shape and the limit; shapes the kernels use pass.
TEST(CudaLaunch, ShapesBeyondTheDeviceLimitsThrowNamingThem) {
  STRATA_REQUIRE_CUDA_DEVICE();
  using compute::cuda::check_launch_shape;
  EXPECT_NO_THROW(check_launch_shape(dim3(2112, 20), dim3(256), 2048));
  EXPECT_NO_THROW(check_launch_shape(dim3(1), dim3(1024), 0));
  auto message = [](dim3 grid, dim3 block, size_t shared) {
    try {
      check_launch_shape(grid, block, shared);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string grid_y = message(dim3(4, 65536), dim3(256), 0);
  EXPECT_NE(grid_y.find("(4, 65536, 1)"), std::string::npos) << grid_y;
  EXPECT_NE(grid_y.find("65535"), std::string::npos) << grid_y;
  EXPECT_NE(message(dim3(0), dim3(256), 0).find("empty"), std::string::npos);
  const std::string threads = message(dim3(1), dim3(64, 32), 0);
  EXPECT_NE(threads.find("(64, 32, 1)"), std::string::npos) << threads;
  EXPECT_NE(message(dim3(1), dim3(32), size_t(1) << 30).find("1073741824 bytes"), std::string::npos);
}

// The GPU's longest chain of adds in a norm's Σx² over n values (see the top of the file).
int64_t gpu_norm_chain(int64_t n) {
  const int64_t t = compute::cuda::norm_threads(n);
  return n / t + 5 + t / 32;
}

TEST(CudaOps, RmsNormMatchesCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(1);
  Stream stream;
  for (const int64_t n : {int64_t(1), int64_t(7), int64_t(640), int64_t(2048), int64_t(2049), int64_t(2560), int64_t(4097), int64_t(9000)}) {
    const int64_t rows = 5;
    const auto x = random_floats(size_t(rows * n), rng, -4.0f, 4.0f);
    const auto w = random_floats(size_t(n), rng, 0.5f, 1.5f);
    DeviceBuffer dx = to_device(x), dw = to_device(w), dy(x.size() * 4);
    compute::cuda::rms_norm_rows(dx.as<float>(), dw.as<float>(), rows, n, 1e-6f, dy.as<float>(), stream.get());
    stream.synchronize();
    const auto gpu = from_device<float>(dy, x.size());
    std::vector<float> cpu(x.size());
    for (int64_t r = 0; r < rows; ++r) compute::rms_norm(x.data() + r * n, w.data(), n, 1e-6f, cpu.data() + r * n);
    const double ulps = 0.5 * double(n / 8 + 3 + gpu_norm_chain(n)) + 5.0;
    expect_close(gpu, cpu, ulps, "rms_norm");
    // A row alone gives the same bits as inside the 5-row call.
    compute::cuda::rms_norm_rows(dx.as<float>() + 3 * n, dw.as<float>(), 1, n, 1e-6f, dy.as<float>(), stream.get());
    stream.synchronize();
    const auto alone = from_device<float>(dy, size_t(n));
    EXPECT_EQ(0, std::memcmp(alone.data(), gpu.data() + 3 * n, size_t(n) * 4));
  }
}

TEST(CudaOps, GroupedRmsNormMatchesCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(2);
  Stream stream;
  const int64_t rows = 3, groups = 4, size = 640, n = groups * size;
  const auto x = random_floats(size_t(rows * n), rng, -2.0f, 2.0f);
  const auto w = random_floats(size_t(n), rng, 0.5f, 1.5f);
  DeviceBuffer dx = to_device(x), dw = to_device(w), dy(x.size() * 4);
  compute::cuda::rms_norm_grouped_rows(dx.as<float>(), dw.as<float>(), rows, groups, size, 1e-6f, dy.as<float>(), stream.get());
  stream.synchronize();
  std::vector<float> cpu(x.size());
  for (int64_t r = 0; r < rows; ++r) compute::rms_norm_grouped(x.data() + r * n, w.data(), groups, size, 1e-6f, cpu.data() + r * n);
  expect_close(from_device<float>(dy, x.size()), cpu, 0.5 * double(size / 8 + 3 + gpu_norm_chain(size)) + 5.0, "rms_norm_grouped");
}

TEST(CudaOps, SoftmaxMatchesCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(3);
  Stream stream;
  for (const int64_t n : {int64_t(1), int64_t(10), int64_t(512), int64_t(3007)}) {
    const int64_t rows = 4;
    auto x = random_floats(size_t(rows * n), rng, -8.0f, 8.0f);
    if (n > 1) x[1] = -std::numeric_limits<float>::infinity();
    DeviceBuffer dx = to_device(x);
    compute::cuda::softmax_rows(dx.as<float>(), rows, n, stream.get());
    stream.synchronize();
    std::vector<float> cpu = x;
    for (int64_t r = 0; r < rows; ++r) compute::softmax(cpu.data() + r * n, n);
    expect_close(from_device<float>(dx, x.size()), cpu, double(3 + 3 + n / 8 + 3 + n / 256 + 13 + 2), "softmax");
  }
}

TEST(CudaOps, ActivationsMatchCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(4);
  Stream stream;
  const int64_t n = 100003;
  auto x = random_floats(size_t(n), rng, -30.0f, 30.0f);
  auto up = random_floats(size_t(n), rng, -2.0f, 2.0f);
  x[0] = 0.0f;
  x[1] = -0.0f;
  DeviceBuffer dx = to_device(x), du = to_device(up), dy(size_t(n) * 4);
  compute::cuda::silu_mul(dx.as<float>(), du.as<float>(), n, dy.as<float>(), stream.get());
  stream.synchronize();
  std::vector<float> cpu(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) cpu[size_t(i)] = compute::silu(x[size_t(i)]) * up[size_t(i)];
  expect_close(from_device<float>(dy, size_t(n)), cpu, 7.0, "silu_mul");
  const std::pair<compute::cuda::Activation, float (*)(float)> kinds[] = {
      {compute::cuda::Activation::Sigmoid, compute::sigmoid},
      {compute::cuda::Activation::Silu, compute::silu},
      {compute::cuda::Activation::Softplus, compute::softplus}};
  for (const auto& [kind, reference] : kinds) {
    compute::cuda::activation(kind, dx.as<float>(), n, dy.as<float>(), stream.get());
    stream.synchronize();
    for (int64_t i = 0; i < n; ++i) cpu[size_t(i)] = reference(x[size_t(i)]);
    // softplus: log1pf adds ≤ 2 ulp of CUDA's log1pf over glibc's, relative to a result ≥ e^x/2.
    expect_close(from_device<float>(dy, size_t(n)), cpu, kind == compute::cuda::Activation::Softplus ? 10.0 : 6.0,
                 kind == compute::cuda::Activation::Sigmoid ? "sigmoid" : kind == compute::cuda::Activation::Silu ? "silu" : "softplus");
  }
}

TEST(CudaOps, RopeBitwiseAsCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(5);
  Stream stream;
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 100000, 262143};
  const int n_heads = 3;
  for (const auto& [head_dim, n_rot, theta] : {std::tuple{128, 64, 10000.0f}, std::tuple{128, 128, 1e6f}, std::tuple{256, 64, 5e6f}}) {
    const int64_t rows = int64_t(positions.size()), width = n_heads * head_dim;
    const auto x = random_floats(size_t(rows * width), rng);
    DeviceBuffer dx = to_device(x), dp = to_device(positions);
    compute::cuda::rope_neox_rows(dx.as<float>(), rows, n_heads, head_dim, n_rot, dp.as<int32_t>(), theta, stream.get());
    stream.synchronize();
    const auto gpu = from_device<float>(dx, x.size());
    std::vector<float> cpu = x;
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < n_heads; ++h) compute::rope_neox(cpu.data() + r * width + h * head_dim, head_dim, n_rot, positions[size_t(r)], theta);
    for (size_t i = 0; i < cpu.size(); ++i)
      ASSERT_TRUE(same_bits(gpu[i], cpu[i])) << "rope head_dim " << head_dim << " n_rot " << n_rot << " at " << i
                                             << ": gpu " << gpu[i] << " cpu " << cpu[i];
  }
}

TEST(CudaOps, RouterTopKMatchesCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(6);
  Stream stream;
  for (const auto& [n_expert, k] : {std::pair{8, 2}, std::pair{64, 8}, std::pair{512, 10}, std::pair{128, 1}, std::pair{33, 32},
                                    std::pair{4096, 32}, std::pair{200, 7}}) {
    const int64_t rows = 40;
    auto logits = random_floats(size_t(rows * n_expert), rng, -3.0f, 3.0f);
    for (int e = 0; e < n_expert; ++e) logits[size_t(e)] = 0.25f;  // row 0: every expert tied
    for (int e = 0; e < 4; ++e) logits[size_t(n_expert + 2 * e)] = 9.0f;  // row 1: ties at the top
    DeviceBuffer dl = to_device(logits), de(size_t(rows * k) * 4), dw(size_t(rows * k) * 4);
    compute::cuda::route_top_k(dl.as<float>(), rows, n_expert, k, de.as<int32_t>(), dw.as<float>(), stream.get());
    stream.synchronize();
    const auto experts = from_device<int32_t>(de, size_t(rows * k));
    const auto weights = from_device<float>(dw, size_t(rows * k));
    int near_ties = 0;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> p(logits.begin() + r * n_expert, logits.begin() + (r + 1) * n_expert);
      compute::softmax(p.data(), n_expert);
      std::vector<int32_t> picked(static_cast<size_t>(k));
      compute::top_k(p.data(), n_expert, k, picked.data());
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += p[size_t(picked[size_t(j)])];
      // A near-tie at the k-th place may legitimately pick differently (probabilities differ by
      // a few ulp); none occurs with these seeds except the planted exact ties, which must agree.
      if (k < n_expert) {
        std::vector<int32_t> k1(size_t(k + 1));
        compute::top_k(p.data(), n_expert, k + 1, k1.data());
        const float a = p[size_t(k1[size_t(k - 1)])], b = p[size_t(k1[size_t(k)])];
        if (a != b && std::fabs(a - b) <= 64 * kU * a) {
          ++near_ties;
          continue;
        }
      }
      std::vector<int32_t> sorted = picked;
      std::sort(sorted.begin(), sorted.end());
      for (int j = 0; j < k; ++j) {
        ASSERT_EQ(sorted[size_t(j)], experts[size_t(r * k + j)]) << "row " << r << " n_expert " << n_expert << " k " << k;
        const float cpu_weight = p[size_t(sorted[size_t(j)])] / sum;
        const double bound = double(3 + 3 + n_expert / 8 + 16 + 2 * k) * kU * cpu_weight;
        ASSERT_LE(std::fabs(double(weights[size_t(r * k + j)]) - cpu_weight), bound) << "row " << r;
      }
    }
    EXPECT_EQ(near_ties, 0);
  }
}

// The MoCE router on the device against route/moce.h's moce_select on the same logits (the CPU's
// softmax): the same experts wherever no two candidates' probabilities or boosted scores lie
// within 64 ulp of each other (the two softmaxes differ by a few ulp, so such rows may choose
// either; counted, and none expected with these seeds), weights within the router's bound, the
// telemetry equal; rows past n_main read the next layer's slot map. With every expert resident,
// or none, bitwise the exact router's ids and weights.
TEST(CudaOps, MoceRouterFollowsTheCpuRule) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(9);
  Stream stream;
  struct Case {
    int n_expert, k, protect, max_rank;
    double lambda;
  };
  constexpr uint32_t kMiss = UINT32_MAX, kResidentBelow = 1000;
  for (const Case& c : {Case{64, 8, 1, 16, 0.5}, Case{512, 10, 2, 0, 1.0}, Case{128, 4, 0, 12, 3.0},
                        Case{33, 8, 1, 0, 0.25}, Case{2048, 8, 1, 64, 1.0}}) {
    const int64_t rows = 40, n_main = 24;
    const auto logits = random_floats(size_t(rows * c.n_expert), rng, -3.0f, 3.0f);
    // Two layers' slot-map rows: ~40 % cache slots, some transient slots (not residency), misses.
    std::vector<uint32_t> smap(size_t(2 * c.n_expert));
    for (uint32_t& v : smap) {
      const unsigned roll = rng() % 10;
      v = roll < 4 ? roll : roll < 6 ? kResidentBelow + roll : kMiss;
    }
    DeviceBuffer dl = to_device(logits), dm = to_device(smap), de(size_t(rows * c.k) * 4), dw(size_t(rows * c.k) * 4),
                 ds(4 * sizeof(double));
    cudaMemset(ds.data(), 0, 4 * sizeof(double));
    compute::cuda::RouteMoce moce;
    moce.lambda = c.lambda;
    moce.protect = c.protect;
    moce.max_rank = c.max_rank;
    moce.smap = dm.as<uint32_t>();
    moce.smap_next = dm.as<uint32_t>() + c.n_expert;
    moce.resident_below = kResidentBelow;
    moce.stats = ds.as<double>();
    compute::cuda::route_top_k_moce(dl.as<float>(), rows, n_main, c.n_expert, c.k, moce, de.as<int32_t>(),
                                    dw.as<float>(), stream.get());
    stream.synchronize();
    const auto experts = from_device<int32_t>(de, size_t(rows * c.k));
    const auto weights = from_device<float>(dw, size_t(rows * c.k));
    const auto gpu_stats = from_device<double>(ds, 4);
    MoceStats cpu_stats;
    int near_ties = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t* map = smap.data() + (r < n_main ? 0 : c.n_expert);
      const auto resident = [&](int32_t e) { return map[e] < kResidentBelow; };
      std::vector<float> p(logits.begin() + r * c.n_expert, logits.begin() + (r + 1) * c.n_expert);
      compute::softmax(p.data(), c.n_expert);
      std::vector<int32_t> scratch, ids(size_t(c.k));
      std::vector<float> w(size_t(c.k));
      MoceOptions options{c.lambda, c.protect, c.max_rank, 0};
      moce_select(p, c.k, options, resident, scratch, ids.data(), w.data(), r < n_main ? &cpu_stats : nullptr);
      // Near-ties where the rule compares (either choice is right there): the window's edge, the
      // protected ranks' edge, the true top-k's edge (the telemetry), and the boosted scores at
      // the edge of the places they fill.
      const auto close = [](double a, double b) { return a != b && std::fabs(a - b) <= 64 * kU * std::max(a, b); };
      std::vector<int32_t> order(size_t(c.n_expert));
      for (int e = 0; e < c.n_expert; ++e) order[size_t(e)] = e;
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] > p[size_t(b)] : a < b;
      });
      const int window = std::clamp(c.max_rank > 0 ? std::max(c.max_rank, c.k) : c.n_expert, c.k, c.n_expert);
      const int protect = std::clamp(c.protect, 0, c.k);
      const auto p_at = [&](int rank) { return double(p[size_t(order[size_t(rank)])]); };
      bool tie = (window < c.n_expert && close(p_at(window - 1), p_at(window))) ||
                 (protect > 0 && close(p_at(protect - 1), p_at(protect))) ||
                 (c.k < c.n_expert && close(p_at(c.k - 1), p_at(c.k)));
      std::vector<double> scores;
      for (int rank = protect; rank < window; ++rank)
        scores.push_back(p_at(rank) * (resident(order[size_t(rank)]) ? 1.0 + c.lambda : 1.0));
      std::sort(scores.rbegin(), scores.rend());
      const size_t places = size_t(c.k - protect);
      if (places > 0 && places < scores.size()) tie = tie || close(scores[places - 1], scores[places]);
      if (tie) {
        ++near_ties;
        continue;
      }
      float sum = 0.0f;
      for (int j = 0; j < c.k; ++j) sum += p[size_t(ids[size_t(j)])];
      for (int j = 0; j < c.k; ++j) {
        ASSERT_EQ(ids[size_t(j)], experts[size_t(r * c.k + j)]) << "row " << r << " n_expert " << c.n_expert;
        const double bound = double(3 + 3 + c.n_expert / 8 + 16 + 2 * c.k) * kU * w[size_t(j)];
        ASSERT_LE(std::fabs(double(weights[size_t(r * c.k + j)]) - w[size_t(j)]), bound) << "row " << r;
      }
    }
    std::printf("[ cuda ] moce n_expert %d k %d protect %d max_rank %d lambda %.2f: %llu swaps over %llu rows, "
                "agreement %.3f, KL %.4f; near-ties %d\n",
                c.n_expert, c.k, c.protect, c.max_rank, c.lambda, (unsigned long long)cpu_stats.swaps,
                (unsigned long long)cpu_stats.rows, cpu_stats.agreement(), cpu_stats.kl(), near_ties);
    EXPECT_EQ(near_ties, 0);
    EXPECT_EQ(gpu_stats[0], double(n_main));
    if (near_ties == 0) {
      EXPECT_EQ(gpu_stats[1], double(cpu_stats.swaps));
    }
    EXPECT_NEAR(gpu_stats[2], cpu_stats.agreement_sum, 1e-9 * double(n_main));
    EXPECT_NEAR(gpu_stats[3], cpu_stats.kl_sum, 1e-6 * std::max(1.0, std::fabs(cpu_stats.kl_sum)));
    EXPECT_GT(cpu_stats.swaps, 0u);  // the boost really moved experts

    // Every expert resident, or none: the exact router's bits.
    for (const uint32_t fill : {0u, kMiss}) {
      std::vector<uint32_t> uniform(size_t(2 * c.n_expert), fill);
      DeviceBuffer du = to_device(uniform), de2(size_t(rows * c.k) * 4), dw2(size_t(rows * c.k) * 4);
      moce.smap = du.as<uint32_t>();
      moce.smap_next = du.as<uint32_t>() + c.n_expert;
      moce.stats = nullptr;
      compute::cuda::route_top_k_moce(dl.as<float>(), rows, n_main, c.n_expert, c.k, moce, de2.as<int32_t>(),
                                      dw2.as<float>(), stream.get());
      compute::cuda::route_top_k(dl.as<float>(), rows, c.n_expert, c.k, de.as<int32_t>(), dw.as<float>(), stream.get());
      stream.synchronize();
      EXPECT_EQ(from_device<int32_t>(de2, size_t(rows * c.k)), from_device<int32_t>(de, size_t(rows * c.k)));
      const auto a = from_device<float>(dw2, size_t(rows * c.k)), b = from_device<float>(dw, size_t(rows * c.k));
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << (fill ? "none" : "all") << " resident";
    }
  }
}

TEST(CudaOps, ArgmaxBitwiseAsCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(7);
  Stream stream;
  const int64_t n = 151936, rows = 4;
  auto x = random_floats(size_t(rows * n), rng, -10.0f, 10.0f);
  x[size_t(5000)] = 50.0f;  // row 0: a tie between 5000 and 70000 → 5000
  x[size_t(70000)] = 50.0f;
  x[size_t(n + 123)] = std::numeric_limits<float>::quiet_NaN();  // row 1: NaN wins
  x[size_t(n + 9)] = 1e30f;
  for (int64_t i = 0; i < n; ++i) x[size_t(3 * n + i)] = -0.0f;  // row 3: all equal → 0
  x[size_t(3 * n + 77)] = 0.0f;
  DeviceBuffer dx = to_device(x), di(size_t(rows) * 4);
  compute::cuda::argmax_rows(dx.as<float>(), rows, n, di.as<int32_t>(), stream.get());
  stream.synchronize();
  const auto gpu = from_device<int32_t>(di, size_t(rows));
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(gpu[size_t(r)], compute::argmax(x.data() + r * n, n)) << "row " << r;
}

TEST(CudaOps, BadArgumentsThrow) {
  STRATA_REQUIRE_CUDA_DEVICE();
  Stream stream;
  DeviceBuffer buffer(1 << 16);
  EXPECT_THROW(compute::cuda::rope_neox_rows(buffer.as<float>(), 1, 1, 64, 65, buffer.as<int32_t>(), 1e4f, stream.get()), Error);
  EXPECT_THROW(compute::cuda::route_top_k(buffer.as<float>(), 1, 8, 9, buffer.as<int32_t>(), buffer.as<float>(), stream.get()), Error);
  EXPECT_THROW(compute::cuda::softmax_rows(buffer.as<float>(), 1, 0, stream.get()), Error);
}

}  // namespace
}  // namespace strata
