// CUDA Gated DeltaNet steps (compute/cuda/deltanet.h) against the CPU's.
// The recurrent and conv references below transcribe layers/gated_deltanet.cpp (its
// delta_rule_recurrent and the conv loop of gated_deltanet_forward) line for line; they move
// behind the backend interface with the seam issue, and this test then calls the CPU op itself.
// The chunked form's reference is the CPU's own code (layers/gated_deltanet.h
// delta_rule_chunked_head), called directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compute/cpu/ops.h"
#include "compute/cuda/deltanet.h"
#include "compute/cuda/window_ops.h"
#include "cuda_test_util.h"
#include "layers/gated_deltanet.h"
#include "util/error.h"

namespace strata::test_support {
// CUDA's expf on the device (device_expf.cu): the host's std::exp is glibc's, a few ulp away.
void device_expf(const float* x, float* y, int64_t n, cudaStream_t stream);
}  // namespace strata::test_support

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

// decay_log is the g whose expf is decay, bitwise (so the chunked form, which takes g, and the
// recurrent form, which takes e^g, start from the same numbers), and asking for it changes no bit
// of the other outputs.
TEST(CudaDeltaNet, PrepareDecayIsExpfOfDecayLog) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(14);
  Stream stream;
  const int nk = 2, nv = 6, dk = 32, dv = 48;
  const int64_t rows = 40, key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim;
  const size_t gates = size_t(rows * nv);
  const auto conv = random_floats(size_t(rows * conv_dim), rng, -1.0f, 1.0f);
  const auto braw = random_floats(gates, rng, -4.0f, 4.0f), araw = random_floats(gates, rng, -4.0f, 30.0f);
  const auto a = random_floats(size_t(nv), rng, -2.0f, -0.1f), dt = random_floats(size_t(nv), rng, -1.0f, 1.0f);
  DeviceBuffer dc = to_device(conv), db = to_device(braw), da = to_device(araw), dA = to_device(a), ddt = to_device(dt);
  DeviceBuffer q(size_t(rows * key_dim) * 4), k(size_t(rows * key_dim) * 4), v(size_t(rows * value_dim) * 4);
  DeviceBuffer beta(gates * 4), decay(gates * 4), decay_log(gates * 4), exp_of_log(gates * 4);
  DeviceBuffer q0(size_t(rows * key_dim) * 4), k0(size_t(rows * key_dim) * 4), v0(size_t(rows * value_dim) * 4);
  DeviceBuffer beta0(gates * 4), decay0(gates * 4);
  compute::cuda::deltanet_prepare(dc.as<float>(), db.as<float>(), da.as<float>(), dA.as<float>(), ddt.as<float>(), rows,
                                  nk, nv, dk, dv, q.as<float>(), k.as<float>(), v.as<float>(), beta.as<float>(),
                                  decay.as<float>(), decay_log.as<float>(), stream.get());
  compute::cuda::deltanet_prepare(dc.as<float>(), db.as<float>(), da.as<float>(), dA.as<float>(), ddt.as<float>(), rows,
                                  nk, nv, dk, dv, q0.as<float>(), k0.as<float>(), v0.as<float>(), beta0.as<float>(),
                                  decay0.as<float>(), nullptr, stream.get());
  device_expf(decay_log.as<float>(), exp_of_log.as<float>(), int64_t(gates), stream.get());
  stream.synchronize();
  const auto g = from_device<float>(decay_log, gates), e = from_device<float>(decay, gates);
  EXPECT_EQ(0, std::memcmp(from_device<float>(exp_of_log, gates).data(), e.data(), gates * 4))
      << "decay is not expf(decay_log)";
  EXPECT_EQ(0, std::memcmp(from_device<float>(decay0, gates).data(), e.data(), gates * 4))
      << "decay changed when decay_log was asked for";
  EXPECT_EQ(0, std::memcmp(from_device<float>(beta0, gates).data(), from_device<float>(beta, gates).data(), gates * 4));
  EXPECT_EQ(0, std::memcmp(from_device<float>(q0, size_t(rows * key_dim)).data(),
                           from_device<float>(q, size_t(rows * key_dim)).data(), size_t(rows * key_dim) * 4));
  for (size_t i = 0; i < gates; ++i) {
    const int h = int(i % nv);
    // The CPU's g (deltanet_inputs): softplus through log1pf/expf is within 4 ulp of the CPU's,
    // and a·softplus rounds once more.
    const float cpu_g = a[size_t(h)] * compute::softplus(araw[i] + dt[size_t(h)]);
    EXPECT_LE(std::fabs(double(g[i]) - cpu_g), std::ldexp(std::fabs(double(cpu_g)), -24) * 10.0) << "gate " << i;
    EXPECT_LE(g[i], 0.0f) << "gate " << i;
  }
}

// conv + prepare in one launch (decode and verify windows) against the two launches it replaces,
// every output and the conv history compared bit for bit: awkward head dims, kernels 1-4, 1-16
// rows, the gates from separate β/α rows or from the fused projection's rows (split first for
// the two launches, as the backend does), with and without decay_log.
TEST(CudaDeltaNet, ConvPrepareBitwiseAsTheTwoLaunches) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(15);
  Stream stream;
  struct Case {
    int nk, nv, dk, dv, kernel;
  };
  int checked = 0;
  for (const Case c : {Case{4, 12, 128, 128, 4}, Case{2, 6, 32, 48, 2}, Case{3, 3, 16, 24, 1}, Case{1, 4, 64, 100, 3}}) {
    for (const int64_t rows : {int64_t(1), int64_t(3), int64_t(16)}) {
      for (const bool fused_ba : {false, true}) {
        const bool with_log = fused_ba == (rows == 3);
        ASSERT_TRUE(compute::cuda::deltanet_conv_prepare_supported(rows, c.nk, c.nv, c.dk, c.dv, c.kernel));
        const int64_t key_dim = int64_t(c.nk) * c.dk, value_dim = int64_t(c.nv) * c.dv;
        const int64_t channels = 2 * key_dim + value_dim;
        const size_t gates = size_t(rows * c.nv);
        const auto x = random_floats(size_t(rows * channels), rng, -2.0f, 2.0f);
        const auto taps = random_floats(size_t(channels * c.kernel), rng);
        const auto history = random_floats(size_t(std::max(c.kernel - 1, 1) * channels), rng);
        const auto ba = random_floats(2 * gates, rng, -4.0f, 8.0f);
        const auto braw = random_floats(gates, rng, -4.0f, 4.0f), araw = random_floats(gates, rng, -4.0f, 30.0f);
        const auto a = random_floats(size_t(c.nv), rng, -2.0f, -0.1f), dt = random_floats(size_t(c.nv), rng, -1.0f, 1.0f);
        DeviceBuffer dx = to_device(x), dtaps = to_device(taps), dba = to_device(ba), db = to_device(braw),
                     da = to_device(araw), dA = to_device(a), ddt = to_device(dt);
        struct Outputs {
          DeviceBuffer history, q, k, v, beta, decay, decay_log;
        };
        auto outputs = [&] {
          return Outputs{to_device(history),
                         DeviceBuffer(size_t(rows * key_dim) * 4),
                         DeviceBuffer(size_t(rows * key_dim) * 4),
                         DeviceBuffer(size_t(rows * value_dim) * 4),
                         DeviceBuffer(gates * 4),
                         DeviceBuffer(gates * 4),
                         DeviceBuffer(gates * 4)};
        };
        Outputs two = outputs(), one = outputs();
        // The two launches (with the split first for fused rows).
        DeviceBuffer conv_out(size_t(rows * channels) * 4), split_b(gates * 4), split_a(gates * 4);
        const float* beta_raw = db.as<float>();
        const float* alpha_raw = da.as<float>();
        if (fused_ba) {
          compute::cuda::split_beta_alpha(dba.as<float>(), rows, c.nk, c.nv / c.nk, split_b.as<float>(),
                                          split_a.as<float>(), stream.get());
          beta_raw = split_b.as<float>();
          alpha_raw = split_a.as<float>();
        }
        compute::cuda::deltanet_conv_silu(dx.as<float>(), rows, channels, dtaps.as<float>(), c.kernel,
                                          two.history.as<float>(), conv_out.as<float>(), stream.get());
        compute::cuda::deltanet_prepare(conv_out.as<float>(), beta_raw, alpha_raw, dA.as<float>(), ddt.as<float>(), rows,
                                        c.nk, c.nv, c.dk, c.dv, two.q.as<float>(), two.k.as<float>(), two.v.as<float>(),
                                        two.beta.as<float>(), two.decay.as<float>(),
                                        with_log ? two.decay_log.as<float>() : nullptr, stream.get());
        compute::cuda::deltanet_conv_prepare(
            dx.as<float>(), rows, dtaps.as<float>(), c.kernel, one.history.as<float>(), fused_ba ? nullptr : db.as<float>(),
            fused_ba ? nullptr : da.as<float>(), fused_ba ? dba.as<float>() : nullptr, dA.as<float>(), ddt.as<float>(),
            c.nk, c.nv, c.dk, c.dv, one.q.as<float>(), one.k.as<float>(), one.v.as<float>(), one.beta.as<float>(),
            one.decay.as<float>(), with_log ? one.decay_log.as<float>() : nullptr, stream.get());
        stream.synchronize();
        const std::string where = "nk " + std::to_string(c.nk) + " nv " + std::to_string(c.nv) + " dk " +
                                  std::to_string(c.dk) + " dv " + std::to_string(c.dv) + " kernel " +
                                  std::to_string(c.kernel) + " rows " + std::to_string(rows) +
                                  (fused_ba ? " fused ba" : "") + (with_log ? " with decay_log" : "");
        auto same = [&](const DeviceBuffer& p, const DeviceBuffer& r, size_t n, const char* what) {
          const auto got = from_device<uint32_t>(p, n), want = from_device<uint32_t>(r, n);
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(got[i], want[i]) << what << " differs at " << i << ", " << where;
        };
        same(one.history, two.history, size_t((c.kernel - 1) * channels), "history");
        same(one.q, two.q, size_t(rows * key_dim), "q");
        same(one.k, two.k, size_t(rows * key_dim), "k");
        same(one.v, two.v, size_t(rows * value_dim), "v");
        same(one.beta, two.beta, gates, "beta");
        same(one.decay, two.decay, gates, "decay");
        if (with_log) same(one.decay_log, two.decay_log, gates, "decay_log");
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 24);
}

TEST(CudaDeltaNet, ConvPrepareRefusesWhatItDoesNotCover) {
  STRATA_REQUIRE_CUDA_DEVICE();
  using compute::cuda::deltanet_conv_prepare_supported;
  EXPECT_FALSE(deltanet_conv_prepare_supported(compute::cuda::kConvPrepareMaxRows + 1, 4, 12, 128, 128, 4));
  EXPECT_FALSE(deltanet_conv_prepare_supported(0, 4, 12, 128, 128, 4));
  EXPECT_FALSE(deltanet_conv_prepare_supported(1, 4, 10, 128, 128, 4));   // nv not a multiple of nk
  EXPECT_FALSE(deltanet_conv_prepare_supported(1, 1, 8, 128, 128, 4));    // 1280 channels a block
  EXPECT_FALSE(deltanet_conv_prepare_supported(1, 4, 12, 128, 128, 9));   // kernel
  EXPECT_TRUE(deltanet_conv_prepare_supported(1, 16, 48, 128, 128, 4));   // the flagship's
  Stream stream;
  DeviceBuffer scratch(4096);
  float* f = scratch.as<float>();
  EXPECT_THROW(compute::cuda::deltanet_conv_prepare(f, 1, f, 4, f, f, f, nullptr, f, f, 4, 10, 128, 128, f, f, f, f,
                                                    f, nullptr, stream.get()),
               Error);
  EXPECT_THROW(compute::cuda::deltanet_conv_prepare(f, 1, f, 4, f, nullptr, nullptr, nullptr, f, f, 4, 12, 128, 128, f,
                                                    f, f, f, f, nullptr, stream.get()),
               Error);
}

// ---------------------------------------------------------------------------------------------
// The chunked form

// The delta rule's inputs for a window: q̂ and k̂ unit rows (q̂ scaled by 1/√dk, as prepare
// leaves them), v in [-1, 1], β in [0.05, 0.95], g in [-0.7, 0] (decay 0.5 .. 1: over a 64-row
// chunk γ reaches -45, e^γ ≈ 3e-20, still a normal float), a start state in [-0.5, 0.5].
struct DeltaRuleCase {
  int nk, nv, dk, dv;
  bool tiled;
};
struct DeltaRuleData {
  std::vector<float> q, k, v, beta, decay_log, state;
};

DeltaRuleData random_delta_rule_data(std::mt19937& rng, const DeltaRuleCase& c, int64_t n_rows) {
  DeltaRuleData d;
  d.q = unit_rows(rng, n_rows, c.nk, c.dk);
  for (float& x : d.q) x = x / std::sqrt(float(c.dk));
  d.k = unit_rows(rng, n_rows, c.nk, c.dk);
  d.v = random_floats(size_t(n_rows * c.nv * c.dv), rng);
  d.beta = random_floats(size_t(n_rows * c.nv), rng, 0.05f, 0.95f);
  d.decay_log = random_floats(size_t(n_rows * c.nv), rng, -0.7f, 0.0f);
  d.state = random_floats(size_t(c.nv) * c.dk * c.dv, rng, -0.5f, 0.5f);
  return d;
}

// The CPU's chunked form over every V head (its own code: layers/gated_deltanet.h).
void cpu_chunked(const DeltaRuleData& d, const DeltaRuleCase& c, int64_t n_rows, std::vector<float>& state,
                 std::vector<float>& out) {
  const int64_t key_dim = int64_t(c.nk) * c.dk, value_dim = int64_t(c.nv) * c.dv;
  for (int h = 0; h < c.nv; ++h) {
    const int kh = c.tiled ? h % c.nk : h / (c.nv / c.nk);
    const DeltaRuleHeadRows rows{.q = d.q.data() + kh * c.dk,
                                 .k = d.k.data() + kh * c.dk,
                                 .key_stride = key_dim,
                                 .v = d.v.data() + h * c.dv,
                                 .value_stride = value_dim,
                                 .beta = d.beta.data() + h,
                                 .decay_log = d.decay_log.data() + h,
                                 .gate_stride = c.nv,
                                 .n_rows = n_rows,
                                 .dk = c.dk,
                                 .dv = c.dv};
    delta_rule_chunked_head(rows, state.data() + size_t(h) * c.dk * c.dv, out.data() + h * c.dv, value_dim);
  }
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, double(std::fabs(v)));
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

// Head shapes: the flagship's 128 x 128 (3 V heads per K head), smaller equal dims, dk ≠ dv both
// ways of the brief (32 x 48, 64 x 128), nk == nv; tiled and grouped K head maps. Window rows: one
// half chunk, one whole chunk, one row past it, ragged last chunks, three chunks.
constexpr DeltaRuleCase kChunkedCases[] = {{2, 4, 16, 16, true},    {2, 4, 32, 32, false}, {1, 2, 64, 64, true},
                                           {2, 6, 128, 128, true},  {2, 6, 128, 128, false}, {2, 4, 32, 48, false},
                                           {1, 3, 64, 128, true},   {2, 2, 128, 128, false}};
constexpr int64_t kChunkedRows[] = {32, 64, 65, 100, 130};

// Tolerances on max |Δ|, as a fraction of the reference's largest |value| (outputs and state
// each; here about 0.05 .. 0.2 and 0.15 .. 0.55).
// - Against the CPU's chunked form: both run the same operations in the same order with the
//   same rounding, so the only differences are the e^x values (CUDA's expf is within 2 ulp of
//   exact, glibc's within 1: at most 3 ulp apart, 3.6e-7 relative), carried through dots of dk
//   terms, the substitution's sums of up to 63 (|l_ij| < 0.95 here, so it barely amplifies)
//   and the 64-term state update. Simulated on the CPU (delta_rule_chunked_head with every e^x
//   moved by a random -3..+3 ulp, these 40 cases, 6 seeds): the worst was 3.9e-7 of the max for
//   the outputs and 3.8e-7 for the state (7.8e-7 with ±8 ulp). The bound is about 10 times
//   that; a wrong index, a missing term or a race shows up at ≳ 1e-3.
// - Against the recurrent form: the two forms round differently (the CPU's model test bounds
//   their logits by 1e-5); simulated on the CPU (chunked vs delta_rule_token, same cases and
//   seeds) the worst was 1.3e-6 of the max for the outputs and 1.7e-6 for the state: the bound
//   is again about 10 times that.
constexpr double kChunkedVsCpuTolerance = 4e-6;
constexpr double kChunkedVsRecurrentTolerance = 2e-5;

TEST(CudaDeltaNet, ChunkedRuleMatchesCpuChunked) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(15);
  Stream stream;
  for (const DeltaRuleCase& c : kChunkedCases) {
    for (const int64_t n_rows : kChunkedRows) {
      const DeltaRuleData d = random_delta_rule_data(rng, c, n_rows);
      const size_t out_size = size_t(n_rows * c.nv * c.dv);
      DeviceBuffer dq = to_device(d.q), dk = to_device(d.k), dv = to_device(d.v), db = to_device(d.beta);
      DeviceBuffer dg = to_device(d.decay_log), ds = to_device(d.state), dout(out_size * 4);
      compute::cuda::delta_rule_chunked(dq.as<float>(), dk.as<float>(), dv.as<float>(), db.as<float>(), dg.as<float>(),
                                        n_rows, c.nk, c.nv, c.dk, c.dv, c.tiled, ds.as<float>(), dout.as<float>(),
                                        stream.get());
      stream.synchronize();
      std::vector<float> state = d.state, out(out_size);
      cpu_chunked(d, c, n_rows, state, out);
      const auto gpu_out = from_device<float>(dout, out_size), gpu_state = from_device<float>(ds, state.size());
      const double out_diff = max_abs_diff(gpu_out, out), state_diff = max_abs_diff(gpu_state, state);
      const std::string where = "dk " + std::to_string(c.dk) + ", dv " + std::to_string(c.dv) + ", nk " +
                                std::to_string(c.nk) + ", nv " + std::to_string(c.nv) +
                                (c.tiled ? " tiled" : " grouped") + ", " + std::to_string(n_rows) + " rows";
      std::printf("[ cuda ] chunked vs cpu chunked, %s: max |dout| %.3g (of %.3g), max |dstate| %.3g (of %.3g)\n",
                  where.c_str(), out_diff, max_abs(out), state_diff, max_abs(state));
      EXPECT_LE(out_diff, kChunkedVsCpuTolerance * max_abs(out)) << where;
      EXPECT_LE(state_diff, kChunkedVsCpuTolerance * max_abs(state)) << where;
    }
  }
}

TEST(CudaDeltaNet, ChunkedRuleMatchesRecurrent) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(16);
  Stream stream;
  for (const DeltaRuleCase& c : kChunkedCases) {
    for (const int64_t n_rows : kChunkedRows) {
      const DeltaRuleData d = random_delta_rule_data(rng, c, n_rows);
      const size_t out_size = size_t(n_rows * c.nv * c.dv), gates = d.decay_log.size();
      DeviceBuffer dq = to_device(d.q), dk = to_device(d.k), dv = to_device(d.v), db = to_device(d.beta);
      DeviceBuffer dg = to_device(d.decay_log), decay(gates * 4);
      DeviceBuffer chunked_state = to_device(d.state), chunked_out(out_size * 4);
      DeviceBuffer recurrent_state = to_device(d.state), recurrent_out(out_size * 4);
      // The recurrent form takes e^g as prepare gives it (expf of decay_log on the device).
      device_expf(dg.as<float>(), decay.as<float>(), int64_t(gates), stream.get());
      compute::cuda::delta_rule_chunked(dq.as<float>(), dk.as<float>(), dv.as<float>(), db.as<float>(), dg.as<float>(),
                                        n_rows, c.nk, c.nv, c.dk, c.dv, c.tiled, chunked_state.as<float>(),
                                        chunked_out.as<float>(), stream.get());
      compute::cuda::delta_rule_recurrent(dq.as<float>(), dk.as<float>(), dv.as<float>(), db.as<float>(),
                                          decay.as<float>(), n_rows, c.nk, c.nv, c.dk, c.dv, c.tiled,
                                          recurrent_state.as<float>(), recurrent_out.as<float>(), stream.get());
      stream.synchronize();
      const auto out = from_device<float>(recurrent_out, out_size);
      const auto state = from_device<float>(recurrent_state, d.state.size());
      const double out_diff = max_abs_diff(from_device<float>(chunked_out, out_size), out);
      const double state_diff = max_abs_diff(from_device<float>(chunked_state, d.state.size()), state);
      const std::string where = "dk " + std::to_string(c.dk) + ", dv " + std::to_string(c.dv) + ", nk " +
                                std::to_string(c.nk) + ", nv " + std::to_string(c.nv) +
                                (c.tiled ? " tiled" : " grouped") + ", " + std::to_string(n_rows) + " rows";
      EXPECT_LE(out_diff, kChunkedVsRecurrentTolerance * max_abs(out)) << where;
      EXPECT_LE(state_diff, kChunkedVsRecurrentTolerance * max_abs(state)) << where;
    }
  }
}

// Head dims whose chunk does not fit the shared memory are refused before anything launches, and
// so is a call without outputs (the state-only replay is the recurrent form's).
TEST(CudaDeltaNet, ChunkedRuleRefusesWhatItCannotRun) {
  STRATA_REQUIRE_CUDA_DEVICE();
  EXPECT_TRUE(compute::cuda::delta_rule_chunked_supported(128, 128));
  EXPECT_EQ(compute::cuda::delta_rule_chunked_shared_bytes(128, 128), size_t(165376));
  EXPECT_FALSE(compute::cuda::delta_rule_chunked_supported(256, 256));
  DeviceBuffer scratch(4096);
  float* p = scratch.as<float>();
  EXPECT_THROW(compute::cuda::delta_rule_chunked(p, p, p, p, p, 64, 1, 1, 256, 256, true, p, p, nullptr), Error);
  EXPECT_THROW(compute::cuda::delta_rule_chunked(p, p, p, p, p, 64, 1, 1, 16, 16, true, p, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace strata
