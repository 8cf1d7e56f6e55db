// CUDA ops (compute/cuda/ops.h) against their CPU references (compute/cpu/ops.h) on random
// inputs of awkward sizes. Bounds, with u = 2^-24:
// - rms_norm: both sides sum n positive squares, in different orders; each sum is within
//   (chain length)·u relative of the exact one (CPU: n/8 + 3 adds per lane tree; GPU: n/256 + 13),
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

TEST(CudaOps, RmsNormMatchesCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(1);
  Stream stream;
  for (const int64_t n : {int64_t(1), int64_t(7), int64_t(640), int64_t(2560), int64_t(4097)}) {
    const int64_t rows = 5;
    const auto x = random_floats(size_t(rows * n), rng, -4.0f, 4.0f);
    const auto w = random_floats(size_t(n), rng, 0.5f, 1.5f);
    DeviceBuffer dx = to_device(x), dw = to_device(w), dy(x.size() * 4);
    compute::cuda::rms_norm_rows(dx.as<float>(), dw.as<float>(), rows, n, 1e-6f, dy.as<float>(), stream.get());
    stream.synchronize();
    const auto gpu = from_device<float>(dy, x.size());
    std::vector<float> cpu(x.size());
    for (int64_t r = 0; r < rows; ++r) compute::rms_norm(x.data() + r * n, w.data(), n, 1e-6f, cpu.data() + r * n);
    const double ulps = 0.5 * double(n / 8 + 3 + n / 256 + 13) + 5.0;
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
  expect_close(from_device<float>(dy, x.size()), cpu, 0.5 * double(size / 8 + 3 + size / 256 + 13) + 5.0, "rms_norm_grouped");
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
