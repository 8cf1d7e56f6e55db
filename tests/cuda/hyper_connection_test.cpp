// CUDA hyper-connection steps and MoE combine (compute/cuda/hyper_connection.h) against the CPU:
// hc_out against layers/hyper_connection.h's hyper_connection_out itself (bitwise); the steps
// inside hyper_connection_in and moe.cpp's combine against transcriptions of their loops
// (bitwise where no σ/silu is involved, else within 8 ulp: CUDA's expf vs glibc's through
// σ's division, one multiply and a sum of S terms of one sign-stable magnitude each).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compute/cpu/ops.h"
#include "compute/cuda/hyper_connection.h"
#include "cuda_test_util.h"
#include "layers/hyper_connection.h"
#include "util/error.h"

namespace strata {
namespace {

using compute::cuda::DeviceBuffer;
using compute::cuda::Stream;
using namespace test_support;

constexpr double kU = 1.0 / 16777216.0;

TEST(CudaHyperConnection, StepsMatchCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(31);
  Stream stream;
  const int S = 4;
  const int64_t H = 1000, rows = 3, width = S * H;
  const float inv = 1.0f / float(S);
  // hc_out: bitwise the CPU function.
  auto X = random_floats(size_t(rows * width), rng), y = random_floats(size_t(rows * H), rng);
  auto inject = random_floats(size_t(rows * S), rng, 0.0f, 2.0f);
  DeviceBuffer dX = to_device(X), dy = to_device(y), di = to_device(inject);
  compute::cuda::hc_out(dy.as<float>(), di.as<float>(), rows, S, H, dX.as<float>(), stream.get());
  stream.synchronize();
  hyper_connection_out(S, H, y.data(), inject.data(), rows, X.data());
  EXPECT_EQ(0, std::memcmp(from_device<float>(dX, X.size()).data(), X.data(), X.size() * 4)) << "hc_out";
  // hc_combine.
  const auto gates = random_floats(size_t(rows * width), rng, -4.0f, 4.0f), normed = random_floats(size_t(rows * width), rng);
  DeviceBuffer dg = to_device(gates), dn = to_device(normed), dx(size_t(rows * H) * 4);
  compute::cuda::hc_combine(dg.as<float>(), dn.as<float>(), rows, S, H, inv, dx.as<float>(), stream.get());
  stream.synchronize();
  const auto x = from_device<float>(dx, size_t(rows * H));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < H; ++i) {
      float sum = 0.0f;
      double magnitude = 0.0;
      for (int s = 0; s < S; ++s) {
        const float term = compute::sigmoid(gates[size_t(t * width + s * H + i)]) * normed[size_t(t * width + s * H + i)];
        sum += term;
        magnitude += std::fabs(term);
      }
      const float cpu = sum * inv;
      ASSERT_LE(std::fabs(double(x[size_t(t * H + i)]) - cpu), 8.0 * kU * magnitude * inv + 1e-30) << t << "," << i;
    }
  {  // hc_combine with the injection step fused in: bitwise hc_combine, then hc_inject.
    const auto raw_inject = random_floats(size_t(rows * S), rng, -6.0f, 6.0f);
    DeviceBuffer fused_inject = to_device(raw_inject), alone_inject = to_device(raw_inject);
    DeviceBuffer fused_x(size_t(rows * H) * 4);
    compute::cuda::hc_combine(dg.as<float>(), dn.as<float>(), rows, S, H, inv, fused_x.as<float>(), stream.get(),
                              fused_inject.as<float>());
    compute::cuda::hc_inject(alone_inject.as<float>(), rows * S, inv, stream.get());
    stream.synchronize();
    EXPECT_EQ(0, std::memcmp(from_device<float>(fused_x, x.size()).data(), x.data(), x.size() * 4)) << "fused combine";
    EXPECT_EQ(0, std::memcmp(from_device<float>(fused_inject, raw_inject.size()).data(),
                             from_device<float>(alone_inject, raw_inject.size()).data(), raw_inject.size() * 4))
        << "fused inject";
  }
  // hc_scaled_silu and hc_inject.
  for (const bool silu : {true, false}) {
    auto m = random_floats(512, rng, -20.0f, 20.0f);
    DeviceBuffer dm = to_device(m);
    if (silu) compute::cuda::hc_scaled_silu(dm.as<float>(), 512, inv, stream.get());
    else compute::cuda::hc_inject(dm.as<float>(), 512, inv, stream.get());
    stream.synchronize();
    const auto got = from_device<float>(dm, 512);
    for (size_t i = 0; i < m.size(); ++i) {
      const float cpu = silu ? compute::silu(m[i] * inv) : 2.0f * compute::sigmoid(m[i] * inv);
      ASSERT_LE(std::fabs(double(got[i]) - cpu), 8.0 * kU * std::fabs(cpu) + 1e-38) << (silu ? "silu " : "inject ") << i;
    }
  }
}

TEST(CudaMoeCombine, AscendingExpertOrderAsCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(32);
  Stream stream;
  const int64_t rows = 4, H = 777;
  const int k = 10;
  const auto out = random_floats(size_t(rows * k * H), rng), weights = random_floats(size_t(rows * k), rng, 0.0f, 0.3f);
  const auto shared = random_floats(size_t(rows * H), rng), logits = random_floats(size_t(rows), rng, -3.0f, 3.0f);
  DeviceBuffer dout = to_device(out), dw = to_device(weights), ds = to_device(shared), dl = to_device(logits);
  DeviceBuffer dy(size_t(rows * H) * 4), dy_plain(size_t(rows * H) * 4);
  compute::cuda::moe_combine(dout.as<float>(), dw.as<float>(), rows, k, H, ds.as<float>(), dl.as<float>(), dy.as<float>(), stream.get());
  compute::cuda::moe_combine(dout.as<float>(), dw.as<float>(), rows, k, H, nullptr, nullptr, dy_plain.as<float>(), stream.get());
  stream.synchronize();
  const auto y = from_device<float>(dy, size_t(rows * H)), plain = from_device<float>(dy_plain, size_t(rows * H));
  for (int64_t t = 0; t < rows; ++t) {
    const float gate = compute::sigmoid(logits[size_t(t)]);
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) acc += weights[size_t(t * k + j)] * out[size_t((t * k + j) * H + c)];
      ASSERT_TRUE(same_bits(plain[size_t(t * H + c)], acc)) << "routed sum, row " << t << " element " << c;
      const float with_shared = acc + gate * shared[size_t(t * H + c)];
      ASSERT_LE(std::fabs(double(y[size_t(t * H + c)]) - with_shared), 4.0 * kU * std::fabs(gate * shared[size_t(t * H + c)]) + kU * std::fabs(with_shared) + 1e-38);
    }
  }
}

// The deferred MoE combine folded into hc_out (one launch): y and X bitwise moe_combine then hc_out,
// with and without the shared expert, for several stream counts and awkward widths.
TEST(CudaMoeCombine, FoldedIntoHcOutBitwiseAsTheSteps) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(33);
  Stream stream;
  for (const int S : {1, 2, 4}) {
    for (const int64_t H : {int64_t(40), int64_t(777), int64_t(1024)}) {
      for (const int64_t rows : {int64_t(1), int64_t(3)}) {
        for (const bool with_shared : {false, true}) {
          const int k = 10;
          const auto out = random_floats(size_t(rows * k * H), rng), w = random_floats(size_t(rows * k), rng, 0.0f, 0.3f);
          const auto shared = random_floats(size_t(rows * H), rng), logits = random_floats(size_t(rows), rng, -3.0f, 3.0f);
          const auto X = random_floats(size_t(rows * S * H), rng), inject = random_floats(size_t(rows * S), rng, 0.0f, 2.0f);
          DeviceBuffer dout = to_device(out), dw = to_device(w), ds = to_device(shared), dl = to_device(logits),
                       di = to_device(inject), dX_fused = to_device(X), dX_steps = to_device(X);
          DeviceBuffer dy_fused(size_t(rows * H) * 4), dy_steps(size_t(rows * H) * 4);
          const float* sh = with_shared ? ds.as<float>() : nullptr;
          const float* lg = with_shared ? dl.as<float>() : nullptr;
          compute::cuda::moe_combine(dout.as<float>(), dw.as<float>(), rows, k, H, sh, lg, dy_steps.as<float>(), stream.get());
          compute::cuda::hc_out(dy_steps.as<float>(), di.as<float>(), rows, S, H, dX_steps.as<float>(), stream.get());
          compute::cuda::moe_combine_hc_out(compute::cuda::MoeCombineInputs{dout.as<float>(), dw.as<float>(), k, sh, lg},
                                            di.as<float>(), rows, S, H, dy_fused.as<float>(), dX_fused.as<float>(),
                                            stream.get());
          stream.synchronize();
          const std::string where = "S " + std::to_string(S) + ", H " + std::to_string(H) + ", rows " +
                                    std::to_string(rows) + (with_shared ? ", shared" : "");
          const size_t ny = size_t(rows * H) * 4, nx = size_t(rows * S * H) * 4;
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(dy_fused, ny).data(), from_device<uint8_t>(dy_steps, ny).data(), ny)) << where;
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(dX_fused, nx).data(), from_device<uint8_t>(dX_steps, nx).data(), nx)) << where;
        }
      }
    }
  }
  // The shared expert's output and its gate logit go together; k must be positive.
  DeviceBuffer b(1 << 16);
  float* f = b.as<float>();
  const compute::cuda::MoeCombineInputs no_logit{f, f, 2, f, nullptr}, no_experts{f, f, 0, nullptr, nullptr};
  EXPECT_THROW(compute::cuda::moe_combine_hc_out(no_logit, f, 1, 2, 8, f, f, stream.get()), Error);
  EXPECT_THROW(compute::cuda::moe_combine_hc_out(no_experts, f, 1, 2, 8, f, f, stream.get()), Error);
}

}  // namespace
}  // namespace strata
