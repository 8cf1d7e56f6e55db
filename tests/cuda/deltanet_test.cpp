// CUDA Gated DeltaNet steps (compute/cuda/deltanet.h) against the CPU's recurrent form.
// The CPU references below transcribe layers/gated_deltanet.cpp (its delta_rule_recurrent and the
// conv loop of gated_deltanet_forward) line for line; they move behind the backend interface with
// the seam issue, and this test then calls the CPU op itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compute/cpu/ops.h"
#include "compute/cuda/deltanet.h"
#include "cuda_test_util.h"

namespace strata {
namespace {

using compute::cuda::DeviceBuffer;
using compute::cuda::Stream;
using namespace test_support;

void cpu_delta_rule(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& beta, const std::vector<float>& decay, int64_t n_rows, int nk, int nv,
                    int dk, int dv, bool tiled, std::vector<float>& state, std::vector<float>& out) {
  const int64_t key_dim = int64_t(nk) * dk, value_dim = int64_t(nv) * dv;
  for (int h = 0; h < nv; ++h) {
    const int kh = tiled ? h % nk : h / (nv / nk);
    float* S = state.data() + size_t(h) * dk * dv;
    for (int64_t t = 0; t < n_rows; ++t) {
      const float* kt = k.data() + t * key_dim + kh * dk;
      const float* qt = q.data() + t * key_dim + kh * dk;
      const float* vt = v.data() + t * value_dim + h * dv;
      const float b = beta[size_t(t * nv + h)], g = decay[size_t(t * nv + h)];
      for (int i = 0; i < dk * dv; ++i) S[i] *= g;
      for (int j = 0; j < dv; ++j) {
        float recalled = 0.0f;
        for (int i = 0; i < dk; ++i) recalled += S[i * dv + j] * kt[i];
        const float u = (vt[j] - recalled) * b;
        for (int i = 0; i < dk; ++i) S[i * dv + j] += kt[i] * u;
      }
      for (int j = 0; j < dv; ++j) {
        float acc = 0.0f;
        for (int i = 0; i < dk; ++i) acc += S[i * dv + j] * qt[i];
        out[size_t(t * value_dim + h * dv + j)] = acc;
      }
    }
  }
}

std::vector<float> unit_rows(std::mt19937& rng, int64_t rows, int heads, int d) {
  auto x = random_floats(size_t(rows * heads * d), rng);
  for (int64_t r = 0; r < rows * heads; ++r) {
    double s = 0;
    for (int i = 0; i < d; ++i) s += double(x[size_t(r * d + i)]) * x[size_t(r * d + i)];
    for (int i = 0; i < d; ++i) x[size_t(r * d + i)] = float(x[size_t(r * d + i)] / std::sqrt(s));
  }
  return x;
}

TEST(CudaDeltaNet, RecurrentRuleBitwiseAsCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(11);
  Stream stream;
  // {nk, nv, dk, dv, tiled}: equal head dims, and dk != dv both ways (transformers allows it).
  for (const auto& [nk, nv, d, dvh, tiled] :
       {std::tuple{2, 6, 128, 128, true}, std::tuple{2, 6, 128, 128, false}, std::tuple{3, 3, 72, 72, true},
        std::tuple{2, 4, 48, 80, false}, std::tuple{2, 4, 96, 40, true},
        std::tuple{2, 4, 16, 24, false}, std::tuple{1, 2, 64, 200, true}, std::tuple{1, 2, 128, 300, false}}) {
    for (const int64_t n_rows : {int64_t(1), int64_t(4), int64_t(7)}) {
      const auto q = unit_rows(rng, n_rows, nk, d), k = unit_rows(rng, n_rows, nk, d);
      const auto v = random_floats(size_t(n_rows * nv * dvh), rng);
      const auto beta = random_floats(size_t(n_rows * nv), rng, 0.05f, 0.95f);
      const auto decay = random_floats(size_t(n_rows * nv), rng, 0.5f, 1.0f);
      std::vector<float> state = random_floats(size_t(nv) * d * dvh, rng, -0.5f, 0.5f);
      DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), db = to_device(beta), dg = to_device(decay);
      DeviceBuffer ds = to_device(state), dout(size_t(n_rows * nv * dvh) * 4);
      compute::cuda::delta_rule_recurrent(dq.as<float>(), dk.as<float>(), dv.as<float>(), db.as<float>(), dg.as<float>(),
                                          n_rows, nk, nv, d, dvh, tiled, ds.as<float>(), dout.as<float>(), stream.get());
      stream.synchronize();
      // The same window fed one row at a time from the same start state (window identity).
      DeviceBuffer ds1 = to_device(state), dout1(size_t(n_rows * nv * dvh) * 4);
      for (int64_t t = 0; t < n_rows; ++t)
        compute::cuda::delta_rule_recurrent(dq.as<float>() + t * nk * d, dk.as<float>() + t * nk * d,
                                            dv.as<float>() + t * nv * dvh, db.as<float>() + t * nv, dg.as<float>() + t * nv,
                                            1, nk, nv, d, dvh, tiled, ds1.as<float>(), dout1.as<float>() + t * nv * dvh,
                                            stream.get());
      stream.synchronize();
      std::vector<float> out(size_t(n_rows * nv * dvh));
      cpu_delta_rule(q, k, v, beta, decay, n_rows, nk, nv, d, dvh, tiled, state, out);
      const auto gpu_out = from_device<float>(dout, out.size()), gpu_state = from_device<float>(ds, state.size());
      ASSERT_EQ(0, std::memcmp(gpu_out.data(), out.data(), out.size() * 4)) << "outputs differ from the CPU (d " << d << ")";
      ASSERT_EQ(0, std::memcmp(gpu_state.data(), state.data(), state.size() * 4)) << "state differs from the CPU";
      EXPECT_EQ(0, std::memcmp(from_device<float>(dout1, out.size()).data(), gpu_out.data(), out.size() * 4))
          << "row-by-row calls differ from one " << n_rows << "-row window";
      EXPECT_EQ(0, std::memcmp(from_device<float>(ds1, state.size()).data(), gpu_state.data(), state.size() * 4));
    }
  }
}

TEST(CudaDeltaNet, ConvSiluMatchesCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(12);
  Stream stream;
  const int64_t channels = 777;
  for (const int kernel : {1, 2, 4}) {
    for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(9)}) {
      const auto x = random_floats(size_t(n_rows * channels), rng, -2.0f, 2.0f);
      const auto taps = random_floats(size_t(channels * kernel), rng);
      std::vector<float> history = random_floats(size_t((kernel - 1) * channels), rng);
      DeviceBuffer dx = to_device(x), dt = to_device(taps), dh = to_device(history), dy(x.size() * 4);
      compute::cuda::deltanet_conv_silu(dx.as<float>(), n_rows, channels, dt.as<float>(), kernel, dh.as<float>(),
                                        dy.as<float>(), stream.get());
      stream.synchronize();
      const auto gpu = from_device<float>(dy, x.size());
      const auto gpu_history = from_device<float>(dh, history.size());
      for (int64_t t = 0; t < n_rows; ++t) {
        const float* row = x.data() + t * channels;
        for (int64_t ch = 0; ch < channels; ++ch) {
          const float* w = taps.data() + ch * kernel;
          float sum = 0.0f;
          for (int j = 0; j < kernel - 1; ++j) sum += w[j] * history[size_t(j * channels + ch)];
          sum += w[kernel - 1] * row[ch];
          const float cpu = compute::silu(sum);
          const float got = gpu[size_t(t * channels + ch)];
          ASSERT_LE(std::fabs(double(got) - cpu), 6.0 * std::ldexp(std::fabs(double(cpu)), -24) + 1e-38)
              << "kernel " << kernel << " row " << t << " channel " << ch;
        }
        if (kernel > 1) {
          for (int j = 0; j + 1 < kernel - 1; ++j)
            std::copy_n(history.data() + (j + 1) * channels, channels, history.data() + j * channels);
          std::copy_n(row, channels, history.data() + (kernel - 2) * channels);
        }
      }
      ASSERT_EQ(0, std::memcmp(gpu_history.data(), history.data(), history.size() * 4)) << "history kernel " << kernel;
    }
  }
}

TEST(CudaDeltaNet, PrepareMatchesCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(13);
  Stream stream;
  const int nk = 2, nv = 6, d = 128;
  const int64_t rows = 3, key_dim = nk * d, value_dim = nv * d, conv_dim = 2 * key_dim + value_dim;
  const auto conv = random_floats(size_t(rows * conv_dim), rng, -1.0f, 1.0f);
  const auto braw = random_floats(size_t(rows * nv), rng, -4.0f, 4.0f), araw = random_floats(size_t(rows * nv), rng, -4.0f, 30.0f);
  const auto a = random_floats(size_t(nv), rng, -2.0f, -0.1f), dt = random_floats(size_t(nv), rng, -1.0f, 1.0f);
  DeviceBuffer dc = to_device(conv), db = to_device(braw), da = to_device(araw), dA = to_device(a), ddt = to_device(dt);
  DeviceBuffer q(size_t(rows * key_dim) * 4), k(size_t(rows * key_dim) * 4), v(size_t(rows * value_dim) * 4);
  DeviceBuffer beta(size_t(rows * nv) * 4), decay(size_t(rows * nv) * 4);
  compute::cuda::deltanet_prepare(dc.as<float>(), db.as<float>(), da.as<float>(), dA.as<float>(), ddt.as<float>(), rows, nk, nv,
                                  d, d, q.as<float>(), k.as<float>(), v.as<float>(), beta.as<float>(), decay.as<float>(),
                                  nullptr, stream.get());
  stream.synchronize();
  const auto gq = from_device<float>(q, size_t(rows * key_dim)), gk = from_device<float>(k, size_t(rows * key_dim));
  const auto gb = from_device<float>(beta, size_t(rows * nv)), gd = from_device<float>(decay, size_t(rows * nv));
  const float q_scale = 1.0f / std::sqrt(float(d));
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < 2 * nk; ++h) {  // the CPU's l2_normalize, transcribed
      const float* src = conv.data() + t * conv_dim + (h < nk ? 0 : key_dim) + (h % nk) * d;
      float sum = 0.0f;
      for (int i = 0; i < d; ++i) sum += src[i] * src[i];
      const float scale = (h < nk ? q_scale : 1.0f) / std::sqrt(sum + 1e-6f);
      const float* got = (h < nk ? gq : gk).data() + t * key_dim + (h % nk) * d;
      for (int i = 0; i < d; ++i) ASSERT_TRUE(same_bits(got[i], src[i] * scale)) << "row " << t << " head " << h << " i " << i;
    }
    for (int h = 0; h < nv; ++h) {
      const float cpu_beta = compute::sigmoid(braw[size_t(t * nv + h)]);
      const float cpu_decay = std::exp(a[size_t(h)] * compute::softplus(araw[size_t(t * nv + h)] + dt[size_t(h)]));
      EXPECT_LE(std::fabs(double(gb[size_t(t * nv + h)]) - cpu_beta), 6.0 * std::ldexp(double(cpu_beta), -24));
      // decay = e^(a·softplus): softplus within 4 ulp, times |a·softplus| ≤ 60 in the exponent.
      EXPECT_LE(std::fabs(double(gd[size_t(t * nv + h)]) - cpu_decay), std::ldexp(double(cpu_decay), -24) * (4.0 + 4.0 * 64.0));
    }
  }
  const auto gv = from_device<float>(v, size_t(rows * value_dim));
  for (int64_t t = 0; t < rows; ++t)
    EXPECT_EQ(0, std::memcmp(gv.data() + t * value_dim, conv.data() + t * conv_dim + 2 * key_dim, size_t(value_dim) * 4)) << "v of row " << t;
}

}  // namespace
}  // namespace strata
