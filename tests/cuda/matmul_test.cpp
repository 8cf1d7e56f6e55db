// CUDA quantized matmul against the CPU specification (quant::ref), on random weights of every
// type with a CUDA kernel, awkward sizes and window sizes; window identity, determinism, the
// slot-map expert path and argument errors.
//
// Tolerance (MatchesCpuReference): the CPU reference sums exact integer block dots in f64, so it
// is the exact dot of the dequantized operands up to one final rounding. The kernel rounds each
// unit's scale product and fused add once or twice (≤ 3u relative to the unit's magnitude), and
// adds a row's units in a chain of at most n_units/32 per lane plus 5 butterfly steps, each
// adding at most u times the running magnitude, all bounded by S = Σ_i |w_i·a_i| (dequantized).
// So |gpu − ref| ≤ (n_in/256 + 5 + 3 + 1)·u·S with u = 2^-24 (n_units ≤ n_in/8 for every type);
// the test uses that bound, and prints the largest fraction of it seen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compute/cuda/hyper_connection.h"
#include "compute/cuda/matmul.h"
#include "compute/cuda/ops.h"
#include "compute/cuda/window_ops.h"
#include "cuda_test_util.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "util/error.h"

namespace strata {
namespace {

using compute::cuda::ActivationLayout;
using compute::cuda::DeviceBuffer;
using compute::cuda::DeviceMatrix;
using compute::cuda::Stream;
using namespace test_support;

std::string fmt_case(GgmlType type, int64_t n_groups, int64_t group_size, int64_t n_rows, int fold) {
  return std::string(type_name(type)) + ", " + std::to_string(n_groups) + " groups of " + std::to_string(group_size) +
         ", " + std::to_string(n_rows) + " rows" +
         (fold == 2 ? ", folded MoE combine and hc_out" : fold ? ", folded hc_out" : "");
}

std::vector<GgmlType> cuda_types() {
  std::vector<GgmlType> types;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* traits = type_traits_or_null(id);
    if (traits && compute::cuda::has_cuda_kernel(traits->type)) types.push_back(traits->type);
  }
  return types;
}

std::vector<int64_t> widths_for(GgmlType type) {
  const int64_t block = type_traits(type).block_elems;
  if (block == 256) return {256, 768, 2560};
  if (block == 32) return {32, 224, 640};
  return {8, 40, 2560};  // float types
}

// Dequantized activation row as the CPU dot sees it.
std::vector<float> dequantized_activation(GgmlType weight_type, const std::vector<uint8_t>& act, const float* x,
                                          int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const GgmlType format = quant::activation_type(weight_type);
  if (format == GgmlType::F32) {
    std::copy_n(x, n, out.begin());
  } else if (format == GgmlType::Q8_K) {
    const auto* blocks = reinterpret_cast<const quant::BlockQ8_K*>(act.data());
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = blocks[i / 256].d * blocks[i / 256].qs[i % 256];
  } else {
    const auto* blocks = reinterpret_cast<const quant::BlockQ8_0*>(act.data());
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = f16_to_f32(blocks[i / 32].d) * blocks[i / 32].qs[i % 32];
  }
  return out;
}

struct GpuMatmul {
  DeviceBuffer weights, x, y, scratch;
  DeviceMatrix matrix;
  ActivationLayout layout;
};

GpuMatmul upload(GgmlType type, int64_t n_in, int64_t n_out, const std::vector<uint8_t>& w, size_t stride,
                 const std::vector<float>& x, int64_t n_rows) {
  GpuMatmul g;
  g.weights = to_device(w);
  g.x = to_device(x);
  g.y = DeviceBuffer(size_t(n_rows * n_out) * 4);
  g.layout = compute::cuda::activation_layout(type, n_in, n_rows);
  g.scratch = DeviceBuffer(g.layout.total_bytes);
  g.matrix = DeviceMatrix{type, n_in, n_out, g.weights.data(), stride};
  return g;
}

std::vector<float> run(GpuMatmul& g, const float* x_device, int64_t n_rows, const Stream& stream) {
  // Poison the output so an unwritten element cannot pass.
  STRATA_CUDA_CHECK(cudaMemsetAsync(g.y.data(), 0xff, g.y.bytes(), stream.get()));
  compute::cuda::matmul(g.matrix, x_device, n_rows, g.y.as<float>(), g.scratch.data(), stream.get());
  stream.synchronize();
  return from_device<float>(g.y, size_t(n_rows * g.matrix.n_out));
}

class CudaMatmul : public ::testing::TestWithParam<GgmlType> {};

TEST_P(CudaMatmul, MatchesCpuReference) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(1234 + uint32_t(type));
  Stream stream;
  double worst_fraction = 0.0;
  for (const int64_t n_in : widths_for(type)) {
    for (const int64_t n_out : {int64_t(37), int64_t(300)}) {
      for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(8), int64_t(11)}) {
        const size_t stride = row_bytes(type, n_in);
        const std::vector<uint8_t> w = random_weights(type, n_in, n_out, stride, rng);
        const std::vector<float> x = random_floats(size_t(n_rows * n_in), rng);
        GpuMatmul g = upload(type, n_in, n_out, w, stride, x, n_rows);
        const std::vector<float> y = run(g, g.x.as<float>(), n_rows, stream);
        std::vector<uint8_t> act(quant::activation_row_bytes(type, n_in));
        std::vector<float> w_row(static_cast<size_t>(n_in));
        for (int64_t t = 0; t < n_rows; ++t) {
          quant::ref::quantize_activation(type, x.data() + t * n_in, act.data(), n_in);
          const std::vector<float> a = dequantized_activation(type, act, x.data() + t * n_in, n_in);
          for (int64_t o = 0; o < n_out; ++o) {
            const uint8_t* row = w.data() + size_t(o) * stride;
            const float ref = quant::ref::dot(type, row, act.data(), n_in);
            quant::ref::dequantize_row(type, row, w_row.data(), n_in);
            double magnitude = 0.0;
            for (int64_t i = 0; i < n_in; ++i) magnitude += std::fabs(double(w_row[size_t(i)]) * a[size_t(i)]);
            const double bound = double(n_in / 256 + 9) * std::ldexp(magnitude, -24) + std::ldexp(std::fabs(ref), -24) + 1e-30;
            const float got = y[size_t(t * n_out + o)];
            const double error = std::fabs(double(got) - double(ref));
            worst_fraction = std::max(worst_fraction, error / bound);
            ASSERT_LE(error, bound) << type_name(type) << " n_in " << n_in << " n_out " << n_out << " rows "
                                    << n_rows << " at (" << t << ", " << o << "): gpu " << got << " cpu " << ref;
          }
        }
      }
    }
  }
  std::printf("[ cuda ] %-7s worst |gpu - cpu| = %.3f of the bound\n", std::string(type_name(type)).c_str(), worst_fraction);
}

// The shapes of a mid-size qwen4exp (hyper-connection down/up/inject, DeltaNet projections,
// router, experts) at the window sizes the model runs (1, 5, 16 rows: two passes of 8), against
// the CPU reference and row by row against the 1-row call (bitwise).
TEST(CudaMatmulShapes, ModelShapesAtWindowSizes) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(77);
  Stream stream;
  struct Shape {
    GgmlType type;
    int64_t n_in, n_out;
  };
  for (const Shape& sh : {Shape{GgmlType::Q8_0, 4096, 128}, Shape{GgmlType::Q8_0, 128, 4096}, Shape{GgmlType::Q8_0, 4096, 4},
                          Shape{GgmlType::Q8_0, 1024, 12}, Shape{GgmlType::Q8_0, 1024, 2560}, Shape{GgmlType::F32, 1024, 32},
                          Shape{GgmlType::IQ2_XS, 1024, 512}, Shape{GgmlType::IQ2_XS, 512, 1024}}) {
    const size_t stride = row_bytes(sh.type, sh.n_in);
    const std::vector<uint8_t> w = random_weights(sh.type, sh.n_in, sh.n_out, stride, rng);
    for (const int64_t n_rows : {int64_t(5), int64_t(16)}) {
      const std::vector<float> x = random_floats(size_t(n_rows * sh.n_in), rng);
      GpuMatmul g = upload(sh.type, sh.n_in, sh.n_out, w, stride, x, n_rows);
      const std::vector<float> y = run(g, g.x.as<float>(), n_rows, stream);
      std::vector<uint8_t> act(quant::activation_row_bytes(sh.type, sh.n_in));
      for (int64_t t = 0; t < n_rows; ++t) {
        GpuMatmul one = upload(sh.type, sh.n_in, sh.n_out, w, stride,
                               std::vector<float>(x.begin() + t * sh.n_in, x.begin() + (t + 1) * sh.n_in), 1);
        const std::vector<float> y1 = run(one, one.x.as<float>(), 1, stream);
        ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + t * sh.n_out, size_t(sh.n_out) * 4))
            << type_name(sh.type) << " " << sh.n_in << " x " << sh.n_out << ": row " << t << " of " << n_rows
            << " differs from its 1-row call";
        quant::ref::quantize_activation(sh.type, x.data() + t * sh.n_in, act.data(), sh.n_in);
        for (int64_t o = 0; o < sh.n_out; ++o) {
          const float ref = quant::ref::dot(sh.type, w.data() + size_t(o) * stride, act.data(), sh.n_in);
          const float got = y[size_t(t * sh.n_out + o)];
          ASSERT_LE(std::fabs(double(got) - ref), 1e-4 * (std::fabs(ref) + 1.0))
              << type_name(sh.type) << " " << sh.n_in << " x " << sh.n_out << " rows " << n_rows << " at (" << t
              << ", " << o << "): gpu " << got << " cpu " << ref;
        }
      }
    }
  }
}

TEST_P(CudaMatmul, WindowIdentityAndRepeatability) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(99 + uint32_t(type));
  Stream stream;
  const int64_t n_in = widths_for(type).back(), n_out = 301, n_rows = 13;
  const size_t stride = row_bytes(type, n_in);
  const std::vector<uint8_t> w = random_weights(type, n_in, n_out, stride, rng);
  const std::vector<float> x = random_floats(size_t(n_rows * n_in), rng);
  GpuMatmul g = upload(type, n_in, n_out, w, stride, x, n_rows);
  const std::vector<float> window = run(g, g.x.as<float>(), n_rows, stream);
  EXPECT_EQ(0, std::memcmp(window.data(), run(g, g.x.as<float>(), n_rows, stream).data(), window.size() * 4))
      << "two runs of the same window differ";
  // Every row alone (T = 1) and every prefix window (T = 1 .. 13) gives the same bits.
  for (int64_t t = 0; t < n_rows; ++t) {
    const std::vector<float> alone = run(g, g.x.as<float>() + t * n_in, 1, stream);
    ASSERT_EQ(0, std::memcmp(alone.data(), window.data() + t * n_out, size_t(n_out) * 4))
        << type_name(type) << ": row " << t << " alone differs from the same row in a 13-row window";
  }
  // Every launch shape (weight rows per warp) of the matrix's kernel gives the same bits (a matrix
  // of wide rows, as the float types' 2560-wide rows are, keeps them: wide_rows is its property).
  const int warps_per_row = compute::cuda::wide_rows(type, n_in, n_out) ? 4 : 0;
  for (const int rows_per_warp : {1, 2, 4}) for (const int staging : {1, 2}) {
    for (const int64_t rows : {int64_t(1), int64_t(2)}) {
      const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, rows);
      compute::cuda::quantize_activations(layout, g.x.as<float>(), g.scratch.data(), stream.get());
      const compute::cuda::MatmulTuning tuning{rows_per_warp, staging, 0, 0, 0, warps_per_row};
      compute::cuda::matmul_quantized(g.matrix, layout, g.scratch.data(), rows, g.y.as<float>(), stream.get(), &tuning);
      stream.synchronize();
      const auto shaped = from_device<float>(g.y, size_t(rows * n_out));
      ASSERT_EQ(0, std::memcmp(shaped.data(), window.data(), shaped.size() * 4))
          << type_name(type) << ": " << rows_per_warp << " weight rows per warp, staging " << staging
          << " change the result (" << rows << " rows)";
    }
  }
  for (int64_t rows = 2; rows < n_rows; ++rows) {
    const std::vector<float> prefix = run(g, g.x.as<float>(), rows, stream);
    ASSERT_EQ(0, std::memcmp(prefix.data(), window.data(), prefix.size() * 4))
        << type_name(type) << ": a " << rows << "-row window differs from the 13-row window";
  }
}

// Several matrices reading the same activations in one launch (matmul_quantized_many, as the
// backend's mm_shared uses it): each output bitwise the one-matrix launch's, for matrices of
// different heights (the grid is sized by the tallest; shorter ones stop at their own), 1..6
// matrices, T = 1, 3 and 9 (two row passes), and every launch shape.
TEST_P(CudaMatmul, SeveralMatricesInOneLaunchBitwiseAsOneEach) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(4242 + uint32_t(type));
  Stream stream;
  const int64_t n_in = widths_for(type)[1];
  const size_t stride = row_bytes(type, n_in) + 16;  // padded rows, as a sliced tensor could be
  const int64_t heights[] = {301, 7, 1024, 64, 33, 512};
  std::vector<DeviceBuffer> weights;
  for (const int64_t n_out : heights) weights.push_back(to_device(random_weights(type, n_in, n_out, stride, rng)));
  for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(9)}) {
    const std::vector<float> x = random_floats(size_t(n_rows * n_in), rng);
    const DeviceBuffer xd = to_device(x);
    const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
    DeviceBuffer scratch(layout.total_bytes);
    const void* act = compute::cuda::prepare_activations(layout, xd.as<float>(), scratch.data(), stream.get());
    std::vector<std::vector<float>> alone;
    for (size_t j = 0; j < weights.size(); ++j) {
      DeviceBuffer y(size_t(n_rows * heights[j]) * 4);
      const DeviceMatrix m{type, n_in, heights[j], weights[j].data(), stride};
      compute::cuda::matmul_quantized(m, layout, act, n_rows, y.as<float>(), stream.get());
      stream.synchronize();
      alone.push_back(from_device<float>(y, size_t(n_rows * heights[j])));
    }
    for (size_t count = 1; count <= weights.size(); ++count) {
      for (const int rows_per_warp : {0, 1, 4}) {
        std::vector<DeviceBuffer> ys;
        std::vector<compute::cuda::DenseOutput> outputs;
        for (size_t j = 0; j < count; ++j) {
          ys.emplace_back(size_t(n_rows * heights[j]) * 4);
          STRATA_CUDA_CHECK(cudaMemsetAsync(ys.back().data(), 0xff, ys.back().bytes(), stream.get()));
          outputs.push_back({DeviceMatrix{type, n_in, heights[j], weights[j].data(), stride}, ys.back().as<float>()});
        }
        const compute::cuda::MatmulTuning tuning{rows_per_warp, 0, 0, 0, 0};
        compute::cuda::matmul_quantized_many(outputs, layout, act, n_rows, stream.get(), &tuning);
        stream.synchronize();
        for (size_t j = 0; j < count; ++j) {
          const auto got = from_device<float>(ys[j], size_t(n_rows * heights[j]));
          ASSERT_EQ(0, std::memcmp(got.data(), alone[j].data(), got.size() * 4))
              << type_name(type) << ": matrix " << j << " of " << count << " in one launch (" << n_rows
              << " rows, " << rows_per_warp << " weight rows per warp) differs from its own launch";
        }
      }
    }
  }
}

// Rows of fewer than 32 units take fewer lanes, several rows per warp (matmul_kernels.cuh):
// bitwise a full warp per row, for unit counts 1 .. 31 that are and are not powers of two, every
// launch shape, T = 1, 3 and 9, an output count that leaves a partial warp.
TEST_P(CudaMatmul, NarrowRowsBitwiseAsAFullWarpPerRow) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(777 + uint32_t(type));
  Stream stream;
  const int64_t block = type_traits(type).block_elems;
  const std::vector<int64_t> widths = block == 256 ? std::vector<int64_t>{256, 512, 768, 1024, 1792}
                                      : block == 32 ? std::vector<int64_t>{32, 64, 224, 480, 512}
                                                    : std::vector<int64_t>{8, 16, 40, 120, 248};
  const int64_t n_out = 301;
  for (const int64_t n_in : widths) {
    const size_t stride = row_bytes(type, n_in);
    const std::vector<uint8_t> w = random_weights(type, n_in, n_out, stride, rng);
    const DeviceBuffer wd = to_device(w);
    const DeviceMatrix m{type, n_in, n_out, wd.data(), stride};
    for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(9)}) {
      const DeviceBuffer xd = to_device(random_floats(size_t(n_rows * n_in), rng));
      const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
      DeviceBuffer scratch(layout.total_bytes), y(size_t(n_rows * n_out) * 4);
      const void* act = compute::cuda::prepare_activations(layout, xd.as<float>(), scratch.data(), stream.get());
      auto run_with = [&](int rows_per_warp, int lanes) {
        STRATA_CUDA_CHECK(cudaMemsetAsync(y.data(), 0xff, y.bytes(), stream.get()));
        const compute::cuda::MatmulTuning tuning{rows_per_warp, 0, lanes, 0, 0};
        compute::cuda::matmul_quantized(m, layout, act, n_rows, y.as<float>(), stream.get(), &tuning);
        stream.synchronize();
        return from_device<float>(y, size_t(n_rows * n_out));
      };
      const std::vector<float> full = run_with(1, 32);
      for (const int rows_per_warp : {0, 1, 2, 4}) {
        const std::vector<float> narrow = run_with(rows_per_warp, 0);
        ASSERT_EQ(0, std::memcmp(narrow.data(), full.data(), full.size() * 4))
            << type_name(type) << ", " << n_in << " wide, " << n_rows << " rows, " << rows_per_warp
            << " weight rows per warp: fewer lanes per row changed the result";
      }
    }
  }
}

// Wide rows (matmul.h wide_rows: four warps share each weight row of a dense matrix with rows of
// >= 128 units and at most 1024 of them). The default rule picks them by the matrix alone; every
// row of every window (T = 1 .. 11, two passes) is bitwise its 1-row call and repeatable; results
// against the CPU reference within MatchesCpuReference's bound; several matrices in one launch
// bitwise each alone, also when only some of them are wide (the launch is split); a tuning that
// asks for them gets them on a tall matrix too.
TEST_P(CudaMatmul, WideRowsWindowIdentityAndReference) {
  STRATA_REQUIRE_CUDA_DEVICE();
  if (const char* v = std::getenv("STRATA_CUDA_WIDE_ROWS"); v && std::string(v) == "0") GTEST_SKIP() << "turned off";
  const GgmlType type = GetParam();
  std::mt19937 rng(5151 + uint32_t(type));
  Stream stream;
  const int64_t block = std::max<int64_t>(type_traits(type).block_elems, 8);  // the float types' unit: 8
  const int64_t n_in = 8192 + block;  // >= 128 units for every type, and not a round count of them
  const int64_t narrow_in = block == 256 ? 2560 : block == 32 ? 640 : 512;  // < 128 units
  EXPECT_TRUE(compute::cuda::wide_rows(type, n_in, 1024));
  EXPECT_TRUE(compute::cuda::wide_rows(type, n_in, 4));
  EXPECT_FALSE(compute::cuda::wide_rows(type, n_in, 1025));
  EXPECT_FALSE(compute::cuda::wide_rows(type, narrow_in, 300));
  const compute::cuda::MatmulTuning ask{0, 0, 0, 0, 0, 4}, one_warp{0, 0, 0, 0, 0, 0};
  EXPECT_TRUE(compute::cuda::wide_rows(type, n_in, 5000, &ask));
  EXPECT_FALSE(compute::cuda::wide_rows(type, n_in, 300, &one_warp));

  const int64_t n_out = 324, n_rows = 11;  // the flagship's hyper-connection down + inject height
  const size_t stride = row_bytes(type, n_in);
  const std::vector<uint8_t> w = random_weights(type, n_in, n_out, stride, rng);
  const std::vector<float> x = random_floats(size_t(n_rows * n_in), rng);
  GpuMatmul g = upload(type, n_in, n_out, w, stride, x, n_rows);
  const std::vector<float> window = run(g, g.x.as<float>(), n_rows, stream);
  ASSERT_EQ(0, std::memcmp(window.data(), run(g, g.x.as<float>(), n_rows, stream).data(), window.size() * 4))
      << type_name(type) << ": two runs of the same window differ";
  std::vector<uint8_t> act(quant::activation_row_bytes(type, n_in));
  std::vector<float> w_row(static_cast<size_t>(n_in));
  for (int64_t t = 0; t < n_rows; ++t) {
    const std::vector<float> alone = run(g, g.x.as<float>() + t * n_in, 1, stream);
    ASSERT_EQ(0, std::memcmp(alone.data(), window.data() + t * n_out, size_t(n_out) * 4))
        << type_name(type) << ": row " << t << " alone differs from the same row in an 11-row window";
    quant::ref::quantize_activation(type, x.data() + t * n_in, act.data(), n_in);
    const std::vector<float> a = dequantized_activation(type, act, x.data() + t * n_in, n_in);
    for (int64_t o = 0; o < n_out; ++o) {
      const uint8_t* row = w.data() + size_t(o) * stride;
      const float ref = quant::ref::dot(type, row, act.data(), n_in);
      quant::ref::dequantize_row(type, row, w_row.data(), n_in);
      double magnitude = 0.0;
      for (int64_t i = 0; i < n_in; ++i) magnitude += std::fabs(double(w_row[size_t(i)]) * a[size_t(i)]);
      const double bound = double(n_in / 256 + 9) * std::ldexp(magnitude, -24) + std::ldexp(std::fabs(ref), -24) + 1e-30;
      const float got = window[size_t(t * n_out + o)];
      ASSERT_LE(std::fabs(double(got) - double(ref)), bound)
          << type_name(type) << " wide rows, row " << t << " output " << o << ": gpu " << got << " cpu " << ref;
    }
  }
  for (int64_t rows = 2; rows < n_rows; ++rows) {
    const std::vector<float> prefix = run(g, g.x.as<float>(), rows, stream);
    ASSERT_EQ(0, std::memcmp(prefix.data(), window.data(), prefix.size() * 4))
        << type_name(type) << ": a " << rows << "-row window differs from the 11-row window";
  }

  // Several matrices in one launch: 324 and 4 rows (both wide), and 324 with 1500 (split).
  const int64_t t_rows = 3;
  const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, t_rows);
  DeviceBuffer scratch(layout.total_bytes);
  const void* a_dev = compute::cuda::prepare_activations(layout, g.x.as<float>(), scratch.data(), stream.get());
  for (const int64_t other : {int64_t(4), int64_t(1500)}) {
    const DeviceBuffer w2 = to_device(random_weights(type, n_in, other, stride, rng));
    const DeviceMatrix m2{type, n_in, other, w2.data(), stride};
    DeviceBuffer y1(size_t(t_rows * n_out) * 4), y2(size_t(t_rows * other) * 4), a1(y1.bytes()), a2(y2.bytes());
    compute::cuda::matmul_quantized(g.matrix, layout, a_dev, t_rows, a1.as<float>(), stream.get());
    compute::cuda::matmul_quantized(m2, layout, a_dev, t_rows, a2.as<float>(), stream.get());
    STRATA_CUDA_CHECK(cudaMemsetAsync(y1.data(), 0xff, y1.bytes(), stream.get()));
    STRATA_CUDA_CHECK(cudaMemsetAsync(y2.data(), 0xff, y2.bytes(), stream.get()));
    const compute::cuda::DenseOutput both[] = {{g.matrix, y1.as<float>()}, {m2, y2.as<float>()}};
    compute::cuda::matmul_quantized_many(both, layout, a_dev, t_rows, stream.get());
    stream.synchronize();
    for (const auto& [got, alone] : {std::pair{&y1, &a1}, std::pair{&y2, &a2}}) {
      const auto gv = from_device<float>(*got, got->bytes() / 4), av = from_device<float>(*alone, alone->bytes() / 4);
      ASSERT_EQ(0, std::memcmp(gv.data(), av.data(), gv.size() * 4))
          << type_name(type) << ": with a " << other << "-row matrix in one launch, a matrix differs from its own launch";
    }
  }

  // Asked for by a tuning on a tall matrix: the same rows as the default wide launch of its top.
  const int64_t tall = 1500;
  std::vector<uint8_t> w_tall = w;
  w_tall.resize(size_t(tall) * stride);
  const std::vector<uint8_t> extra = random_weights(type, n_in, tall - n_out, stride, rng);
  std::copy(extra.begin(), extra.end(), w_tall.begin() + std::ptrdiff_t(size_t(n_out) * stride));
  const DeviceBuffer wt = to_device(w_tall);
  const DeviceMatrix mt{type, n_in, tall, wt.data(), stride};
  DeviceBuffer yt(size_t(t_rows * tall) * 4);
  compute::cuda::matmul_quantized(mt, layout, a_dev, t_rows, yt.as<float>(), stream.get(), &ask);
  stream.synchronize();
  const auto yt_host = from_device<float>(yt, size_t(t_rows * tall));
  for (int64_t t = 0; t < t_rows; ++t)
    ASSERT_EQ(0, std::memcmp(yt_host.data() + t * tall, window.data() + t * n_out, size_t(n_out) * 4))
        << type_name(type) << ": row " << t << " of a tuned wide launch on a 1500-row matrix differs";
}

TEST_P(CudaMatmul, ExpertsThroughTheSlotMap) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(7 + uint32_t(type));
  Stream stream;
  const int64_t n_in = widths_for(type)[1], n_out = 45, n_rows = 6;
  const int n_expert = 6, n_layer = 2;
  const size_t matrix_bytes = row_bytes(type, n_in) * size_t(n_out);
  const size_t offset = 16 * ((matrix_bytes + 15) / 16);  // a second matrix before ours in each slot
  const size_t slot_bytes = 16 * ((offset + matrix_bytes + 15) / 16);
  const int n_slots = 5;
  std::vector<uint8_t> arena(slot_bytes * n_slots, 0);
  // layer 1: expert e in slot (e * 3) % 5 for e < 5, expert 5 missing; layer 0 all missing.
  std::vector<uint32_t> smap(size_t(n_layer * n_expert), compute::cuda::kSlotMiss);
  std::vector<std::vector<uint8_t>> expert_weights(n_expert);
  for (int e = 0; e < 5; ++e) {
    smap[size_t(n_expert + e)] = uint32_t((e * 3) % 5);
    expert_weights[size_t(e)] = random_weights(type, n_in, n_out, row_bytes(type, n_in), rng);
    std::memcpy(arena.data() + smap[size_t(n_expert + e)] * slot_bytes + offset, expert_weights[size_t(e)].data(), matrix_bytes);
    const std::vector<uint8_t> before = random_weights(type, n_in, n_out, row_bytes(type, n_in), rng);
    std::memcpy(arena.data() + smap[size_t(n_expert + e)] * slot_bytes, before.data(), matrix_bytes);
  }
  const std::vector<float> x = random_floats(size_t(n_rows * n_in), rng);
  const std::vector<int32_t> experts = {3, 0, 5, 4};
  const int max_rows = 4;
  const std::vector<int32_t> row_ids = {1, 2, 5, 0, /**/ 0, 0, 0, 0, /**/ 3, 0, 0, 0, /**/ 4, 1, 0, 0};
  const std::vector<int32_t> counts = {3, 1, 1, 2};
  DeviceBuffer d_arena = to_device(arena), d_smap = to_device(smap), d_x = to_device(x);
  DeviceBuffer d_experts = to_device(experts), d_rows = to_device(row_ids), d_counts = to_device(counts);
  const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
  DeviceBuffer scratch(layout.total_bytes), y(size_t(experts.size() * max_rows * n_out) * 4);
  STRATA_CUDA_CHECK(cudaMemset(y.data(), 0, y.bytes()));
  compute::cuda::quantize_activations(layout, d_x.as<float>(), scratch.data(), stream.get());
  const compute::cuda::ExpertArenaView view{d_arena.as<uint8_t>(), slot_bytes, d_smap.as<uint32_t>(), n_expert};
  const compute::cuda::ExpertMatrixShape shape{type, n_in, n_out, offset, row_bytes(type, n_in)};
  compute::cuda::expert_matmul_quantized(view, 1, shape, d_experts.as<int32_t>(), int(experts.size()),
                                         d_rows.as<int32_t>(), d_counts.as<int32_t>(), max_rows, layout,
                                         scratch.data(), y.as<float>(), stream.get());
  stream.synchronize();
  const std::vector<float> got = from_device<float>(y, experts.size() * max_rows * size_t(n_out));
  for (size_t j = 0; j < experts.size(); ++j) {
    const int e = experts[j];
    if (e == 5) {  // not resident: NaN, so a broken residency promise cannot pass silently
      EXPECT_TRUE(std::isnan(got[j * max_rows * size_t(n_out)])) << "a missing expert must produce NaN";
      continue;
    }
    GpuMatmul dense = upload(type, n_in, n_out, expert_weights[size_t(e)], row_bytes(type, n_in), x, n_rows);
    const std::vector<float> all = run(dense, dense.x.as<float>(), n_rows, stream);
    for (int i = 0; i < counts[j]; ++i) {
      const int r = row_ids[j * max_rows + size_t(i)];
      ASSERT_EQ(0, std::memcmp(got.data() + (j * max_rows + size_t(i)) * size_t(n_out), all.data() + size_t(r) * n_out,
                               size_t(n_out) * 4))
          << type_name(type) << ": expert " << e << " row " << r << " differs from the dense matmul";
    }
  }
  // Both matrices of each slot in one launch (gate and up): bitwise the two single launches.
  const compute::cuda::ExpertMatrixShape first{type, n_in, n_out, 0, row_bytes(type, n_in)};
  ASSERT_TRUE(compute::cuda::can_pair_experts(first, shape));
  DeviceBuffer y_alone(y.bytes()), y_first(y.bytes()), y_second(y.bytes());
  for (DeviceBuffer* b : {&y_alone, &y_first, &y_second}) STRATA_CUDA_CHECK(cudaMemset(b->data(), 0, b->bytes()));
  compute::cuda::expert_matmul_quantized(view, 1, first, d_experts.as<int32_t>(), int(experts.size()),
                                         d_rows.as<int32_t>(), d_counts.as<int32_t>(), max_rows, layout,
                                         scratch.data(), y_alone.as<float>(), stream.get());
  compute::cuda::expert_matmul_quantized_pair(view, 1, first, shape, d_experts.as<int32_t>(), int(experts.size()),
                                              d_rows.as<int32_t>(), d_counts.as<int32_t>(), max_rows, layout,
                                              scratch.data(), y_first.as<float>(), y_second.as<float>(), stream.get());
  stream.synchronize();
  const size_t n_y = experts.size() * max_rows * size_t(n_out);
  ASSERT_EQ(0, std::memcmp(from_device<float>(y_first, n_y).data(), from_device<float>(y_alone, n_y).data(), n_y * 4))
      << type_name(type) << ": the pair's first matrix differs from its single launch";
  ASSERT_EQ(0, std::memcmp(from_device<float>(y_second, n_y).data(), got.data(), n_y * 4))
      << type_name(type) << ": the pair's second matrix differs from its single launch";
  const compute::cuda::ExpertMatrixShape narrower{type, n_in, n_out - 1, 0, row_bytes(type, n_in)};
  EXPECT_FALSE(compute::cuda::can_pair_experts(narrower, shape));
  EXPECT_THROW(compute::cuda::expert_matmul_quantized_pair(view, 1, narrower, shape, d_experts.as<int32_t>(),
                                                           int(experts.size()), d_rows.as<int32_t>(),
                                                           d_counts.as<int32_t>(), max_rows, layout, scratch.data(),
                                                           y_first.as<float>(), y_second.as<float>(), stream.get()),
               Error);
}

// The shapes the backend hands the in-block quantizer on the models it runs: the hyper-connection's
// up matrix (rank 128 or 320: Q8_0, IQ4_NL; not Q5_0, whose kernel has no SharedActView load),
// SwiGLU's down of the experts (512 wide: IQ2_XS, Q8_0), windows of 1 to 8 rows. Not taken: rows of
// 17-31 units, which take a full warp each (the flagship's 640-wide down, 20 units), and wide rows.
TEST(CudaMatmulInBlock, TakesTheModelsNarrowShapes) {
  if (const char* v = std::getenv("STRATA_CUDA_IN_BLOCK"); v && std::string(v) == "0") GTEST_SKIP() << "turned off";
  for (const int64_t rows : {int64_t(1), int64_t(4), int64_t(8)}) {
    EXPECT_TRUE(compute::cuda::can_quantize_in_block(GgmlType::Q8_0, 128, rows));
    EXPECT_TRUE(compute::cuda::can_quantize_in_block(GgmlType::Q8_0, 320, rows));
    EXPECT_TRUE(compute::cuda::can_quantize_in_block(GgmlType::Q8_0, 512, rows));
    EXPECT_TRUE(compute::cuda::can_quantize_in_block(GgmlType::IQ4_NL, 320, rows));
    EXPECT_TRUE(compute::cuda::can_quantize_in_block(GgmlType::IQ2_XS, 512, rows));
    EXPECT_TRUE(compute::cuda::can_quantize_in_block(GgmlType::IQ2_XS, 1024, rows));
  }
  EXPECT_FALSE(compute::cuda::can_quantize_in_block(GgmlType::F32, 128, 1));
  EXPECT_FALSE(compute::cuda::can_quantize_in_block(GgmlType::IQ4_NL, 640, 1));
  EXPECT_FALSE(compute::cuda::can_quantize_in_block(GgmlType::Q5_0, 320, 1));
  EXPECT_FALSE(compute::cuda::can_quantize_in_block(GgmlType::Q8_0, 2560, 1));
}

// The in-block quantizer (matmul_in_block, expert_matmul_in_block) against its two launches
// (quantize_activations_fused, then matmul_quantized / expert_matmul_quantized): every output bit
// equal, for each prologue, narrow widths and window sizes, dense and through the slot map (a
// missing expert still NaN). The types it is compiled for must take every narrow width (no silent
// fallback); wide rows, windows of more than 8 rows and the float types are refused, and a refused
// call throws before launching.
TEST_P(CudaMatmul, InBlockQuantizerBitwiseAsTheTwoLaunches) {
  STRATA_REQUIRE_CUDA_DEVICE();
  if (const char* v = std::getenv("STRATA_CUDA_IN_BLOCK"); v && std::string(v) == "0") GTEST_SKIP() << "turned off";
  using compute::cuda::ActivationPrologue;
  using compute::cuda::InBlockActivations;
  const GgmlType type = GetParam();
  std::mt19937 rng(4242 + uint32_t(type));
  Stream stream;
  const int64_t block = type_traits(type).block_elems;
  const GgmlType format = quant::activation_type(type);
  const bool taken_type = type == GgmlType::Q8_0 || type == GgmlType::IQ4_NL || type == GgmlType::Q4_0 ||
                          type == GgmlType::IQ2_XS || type == GgmlType::Q4_K || type == GgmlType::Q3_K;
  // Narrow: at most 16 units (rows of 17-31 units take a full warp each, lanes_per_row).
  const std::vector<int64_t> widths = block == 256 ? std::vector<int64_t>{256, 512, 768, 1024}
                                      : block == 32 ? std::vector<int64_t>{32, 128, 320, 480, 512}
                                                    : std::vector<int64_t>{8, 40, 248};
  const int64_t n_out = 203;
  int compared = 0;
  for (const int64_t n_in : widths) {
    const size_t stride = row_bytes(type, n_in);
    const std::vector<uint8_t> w = random_weights(type, n_in, n_out, stride, rng);
    const DeviceBuffer wd = to_device(w);
    const DeviceMatrix m{type, n_in, n_out, wd.data(), stride};
    for (const int64_t n_rows : {int64_t(1), int64_t(2), int64_t(3), int64_t(8)}) {
      const bool taken = compute::cuda::can_quantize_in_block(type, n_in, n_rows);
      const size_t n = size_t(n_rows * n_in);
      const DeviceBuffer d_a = to_device(random_floats(n, rng, -6.0f, 6.0f)), d_b = to_device(random_floats(n, rng, -2.0f, 2.0f));
      DeviceBuffer y_in_block(size_t(n_rows * n_out) * 4), y_two(size_t(n_rows * n_out) * 4);
      for (const ActivationPrologue prologue : {ActivationPrologue::SiluMul, ActivationPrologue::ScaledSilu}) {
        const InBlockActivations in{prologue, d_a.as<float>(), d_b.as<float>(), 0.25f};
        const std::string where = std::string(type_name(type)) + ", " + std::to_string(n_in) + " wide, " +
                                  std::to_string(n_rows) + " rows, prologue " + std::to_string(int(prologue));
        if (!taken) {
          EXPECT_FALSE(taken_type && format != GgmlType::F32) << where << ": a narrow width of a type it is compiled for was refused";
          EXPECT_THROW(compute::cuda::matmul_in_block(m, in, n_rows, y_in_block.as<float>(), stream.get()), Error) << where;
          continue;
        }
        ASSERT_TRUE(taken_type) << where << ": taken by a type the test does not expect";
        const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
        DeviceBuffer scratch(layout.total_bytes);
        STRATA_CUDA_CHECK(cudaMemsetAsync(y_in_block.data(), 0xff, y_in_block.bytes(), stream.get()));
        STRATA_CUDA_CHECK(cudaMemsetAsync(y_two.data(), 0xff, y_two.bytes(), stream.get()));
        compute::cuda::matmul_in_block(m, in, n_rows, y_in_block.as<float>(), stream.get());
        compute::cuda::quantize_activations_fused(layout, prologue, in.a, in.b, in.scale, scratch.data(), stream.get());
        compute::cuda::matmul_quantized(m, layout, scratch.data(), n_rows, y_two.as<float>(), stream.get());
        stream.synchronize();
        const auto a = from_device<float>(y_in_block, size_t(n_rows * n_out)), b = from_device<float>(y_two, size_t(n_rows * n_out));
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << where << ": differs from the two launches";
        ++compared;
      }
    }
  }
  if (taken_type) {
    EXPECT_GT(compared, 0) << type_name(type) << ": nothing compared";
  }
  // Refused: a window of 9 rows, rows of 32 units or more (a full warp each).
  EXPECT_FALSE(compute::cuda::can_quantize_in_block(type, widths[0], 9));
  const int64_t wide = block == 256 ? 8192 : block == 32 ? 1024 : 256;  // >= 32 units for every type
  EXPECT_FALSE(compute::cuda::can_quantize_in_block(type, wide, 1)) << type_name(type) << " " << wide << " wide";
  if (!taken_type) return;

  // Through the slot map: experts 2, 0, 3 (3 missing) of one layer, their rows by row_ids.
  const int64_t n_in = block == 256 ? 512 : 320, n_rows = 5;
  const int n_expert = 4, max_rows = 3;
  const size_t matrix_bytes = row_bytes(type, n_in) * size_t(n_out), slot_bytes = 16 * ((matrix_bytes + 15) / 16);
  std::vector<uint8_t> arena(slot_bytes * 3);
  for (auto& byte : arena) byte = uint8_t(rng());
  for (int slot = 0; slot < 3; ++slot) {
    const std::vector<uint8_t> ew = random_weights(type, n_in, n_out, row_bytes(type, n_in), rng);
    std::memcpy(arena.data() + size_t(slot) * slot_bytes, ew.data(), matrix_bytes);
  }
  const std::vector<uint32_t> smap = {1, 2, 0, compute::cuda::kSlotMiss};
  const std::vector<int32_t> experts = {2, 0, 3}, row_ids = {4, 1, 0, /**/ 2, 0, 0, /**/ 3, 0, 0}, counts = {3, 1, 1};
  const size_t n = size_t(n_rows * n_in);
  DeviceBuffer d_arena = to_device(arena), d_smap = to_device(smap), d_experts = to_device(experts),
               d_rows = to_device(row_ids), d_counts = to_device(counts);
  const DeviceBuffer d_a = to_device(random_floats(n, rng, -6.0f, 6.0f)), d_b = to_device(random_floats(n, rng, -2.0f, 2.0f));
  const compute::cuda::ExpertArenaView view{d_arena.as<uint8_t>(), slot_bytes, d_smap.as<uint32_t>(), n_expert};
  const compute::cuda::ExpertMatrixShape shape{type, n_in, n_out, 0, row_bytes(type, n_in)};
  ASSERT_TRUE(compute::cuda::can_quantize_in_block(type, n_in, max_rows));
  const size_t n_y = experts.size() * max_rows * size_t(n_out);
  DeviceBuffer y_in_block(n_y * 4), y_two(n_y * 4);
  const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
  DeviceBuffer scratch(layout.total_bytes);
  for (const ActivationPrologue prologue : {ActivationPrologue::SiluMul, ActivationPrologue::ScaledSilu}) {
    const InBlockActivations in{prologue, d_a.as<float>(), d_b.as<float>(), 0.5f};
    STRATA_CUDA_CHECK(cudaMemsetAsync(y_in_block.data(), 0, y_in_block.bytes(), stream.get()));
    STRATA_CUDA_CHECK(cudaMemsetAsync(y_two.data(), 0, y_two.bytes(), stream.get()));
    compute::cuda::expert_matmul_in_block(view, 0, shape, d_experts.as<int32_t>(), int(experts.size()),
                                          d_rows.as<int32_t>(), d_counts.as<int32_t>(), max_rows, in,
                                          y_in_block.as<float>(), stream.get());
    compute::cuda::quantize_activations_fused(layout, prologue, in.a, in.b, in.scale, scratch.data(), stream.get());
    compute::cuda::expert_matmul_quantized(view, 0, shape, d_experts.as<int32_t>(), int(experts.size()),
                                           d_rows.as<int32_t>(), d_counts.as<int32_t>(), max_rows, layout,
                                           scratch.data(), y_two.as<float>(), stream.get());
    stream.synchronize();
    const auto a = from_device<float>(y_in_block, n_y), b = from_device<float>(y_two, n_y);
    for (size_t j = 0; j < experts.size(); ++j) {
      const size_t at = j * max_rows * size_t(n_out);
      if (experts[j] == 3) {
        EXPECT_TRUE(std::isnan(a[at])) << "a missing expert must produce NaN in block too";
        continue;
      }
      ASSERT_EQ(0, std::memcmp(a.data() + at, b.data() + at, size_t(counts[j]) * size_t(n_out) * 4))
          << type_name(type) << ": expert " << experts[j] << ", prologue " << int(prologue)
          << ": the in-block expert matmul differs from the two launches";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaMatmul, ::testing::ValuesIn(cuda_types()),
                         [](const ::testing::TestParamInfo<GgmlType>& info) { return std::string(type_name(info.param)); });

// ---- the staged path (MatmulTuning::staging = 1: weight rows copied into shared memory by
// cp.async, 2 or 3 stages deep; optionally the activations too) ----------------------------------

using compute::cuda::MatmulTuning;
using compute::cuda::MatvecPath;

const GgmlType kStagedTypes[] = {GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::IQ2_XS};

// The direct kernel (staging 2) at the default launch shape: the reference of every staged run.
constexpr MatmulTuning kDirect{0, 2, 0, 0, 0};

// Every staged launch shape the tests try: weight rows per warp (0: default), stage buffers per
// warp, activations in shared memory (1) or global (2). lanes_per_row 32 so that rows of fewer
// than 32 units (256-wide IQ2_XS: 4) take the staged path too, with idle lanes.
std::vector<MatmulTuning> staged_tunings() {
  std::vector<MatmulTuning> out;
  for (const int rows_per_warp : {0, 1, 2, 4})
    for (const int stages : {2, 3})
      for (const int act_shared : {1, 2}) out.push_back(MatmulTuning{rows_per_warp, 1, 32, stages, act_shared});
  return out;
}

std::string describe(const MatmulTuning& t) {
  return "rows/warp " + std::to_string(t.rows_per_warp) + ", staging " + std::to_string(t.staging) + ", stages " +
         std::to_string(t.stages) + ", act_shared " + std::to_string(t.act_shared);
}

// y of matmul_quantized under `tuning`, the output poisoned first.
std::vector<float> run_tuned(const DeviceMatrix& m, const ActivationLayout& layout, const void* act, int64_t n_rows,
                             DeviceBuffer& y, const Stream& stream, const MatmulTuning& tuning) {
  STRATA_CUDA_CHECK(cudaMemsetAsync(y.data(), 0xff, y.bytes(), stream.get()));
  compute::cuda::matmul_quantized(m, layout, act, n_rows, y.as<float>(), stream.get(), &tuning);
  stream.synchronize();
  return from_device<float>(y, size_t(n_rows * m.n_out));
}

// The path a staged tuning must take: staged, with the activations in shared memory when asked
// for a window of <= 4 rows (every shape here fits the shared memory).
MatvecPath expected_path(const MatmulTuning& t, int64_t n_rows) {
  return t.act_shared == 1 && std::min<int64_t>(n_rows, 8) <= 4 ? MatvecPath::StagedSharedActivations
                                                                : MatvecPath::Staged;
}

class CudaMatmulStaged : public ::testing::TestWithParam<GgmlType> {};

// Bitwise the direct kernel for every staged launch shape, widths 256 .. 8192 (a stage is 32 or 64
// units: rows of one partial stage up to 8 stages), heights that leave partial tiles, T = 1 .. 8
// and 11 (two passes), padded rows; and a tall matrix, so that each warp walks several row groups
// and the copies run ahead across rows.
TEST_P(CudaMatmulStaged, BitwiseAsTheDirectKernel) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(3737 + uint32_t(type));
  Stream stream;
  struct Shape {
    int64_t n_in, n_out;
    std::vector<int64_t> windows;
  };
  const std::vector<int64_t> all_windows = {1, 2, 3, 4, 5, 6, 7, 8, 11};
  const std::vector<Shape> shapes = {{256, 45, all_windows},  {512, 301, all_windows},  {1024, 37, all_windows},
                                     {2560, 301, all_windows}, {8192, 45, all_windows}, {512, 20011, {1, 4, 8}}};
  for (const Shape& sh : shapes) {
    // 1024 wide: padded rows (6 bytes, so the rows' alignment modulo 16 varies; Q4_K keeps 16)
    const size_t pad = sh.n_in != 1024 ? 0 : type == GgmlType::Q4_K ? 16 : 6;
    const size_t stride = row_bytes(type, sh.n_in) + pad;
    const DeviceBuffer wd = to_device(random_weights(type, sh.n_in, sh.n_out, stride, rng));
    const DeviceMatrix m{type, sh.n_in, sh.n_out, wd.data(), stride};
    for (const int64_t n_rows : sh.windows) {
      const DeviceBuffer xd = to_device(random_floats(size_t(n_rows * sh.n_in), rng));
      const ActivationLayout layout = compute::cuda::activation_layout(type, sh.n_in, n_rows);
      DeviceBuffer scratch(layout.total_bytes), y(size_t(n_rows * sh.n_out) * 4);
      compute::cuda::quantize_activations(layout, xd.as<float>(), scratch.data(), stream.get());
      ASSERT_EQ(MatvecPath::Direct, compute::cuda::matvec_path(type, sh.n_in, n_rows, &kDirect));
      const std::vector<float> direct = run_tuned(m, layout, scratch.data(), n_rows, y, stream, kDirect);
      for (const MatmulTuning& tuning : staged_tunings()) {
        ASSERT_EQ(expected_path(tuning, n_rows), compute::cuda::matvec_path(type, sh.n_in, n_rows, &tuning))
            << type_name(type) << " " << sh.n_in << " wide, " << n_rows << " rows, " << describe(tuning);
        const std::vector<float> staged = run_tuned(m, layout, scratch.data(), n_rows, y, stream, tuning);
        ASSERT_EQ(0, std::memcmp(staged.data(), direct.data(), direct.size() * 4))
            << type_name(type) << " " << sh.n_in << " x " << sh.n_out << ", " << n_rows << " rows, "
            << describe(tuning) << ": the staged kernel differs from the direct one";
      }
    }
  }
}

// Without tuning, the path is the measured rule (matmul_plan.cuh default_staged): staged with the
// activations in shared memory for Q8_0, Q4_K and IQ2_XS windows of 1-4 rows and the other staged types' windows of
// 2-4 rows, the direct kernel otherwise (unless STRATA_CUDA_STAGED overrides it).
TEST_P(CudaMatmulStaged, DefaultPathIsTheMeasuredRule) {
  STRATA_REQUIRE_CUDA_DEVICE();
  if (std::getenv("STRATA_CUDA_STAGED")) GTEST_SKIP() << "STRATA_CUDA_STAGED overrides the default";
  const GgmlType type = GetParam();
  const bool from_one = type == GgmlType::Q8_0 || type == GgmlType::Q4_K || type == GgmlType::IQ2_XS;
  for (const int64_t n_in : {int64_t(2560), int64_t(8192)})
    for (int64_t n_rows = 1; n_rows <= 11; ++n_rows) {
      const int64_t pass = std::min<int64_t>(n_rows, 8);
      const bool staged = pass <= 4 && (from_one || pass >= 2);
      EXPECT_EQ(staged ? MatvecPath::StagedSharedActivations : MatvecPath::Direct,
                compute::cuda::matvec_path(type, n_in, n_rows))
          << type_name(type) << " " << n_in << " wide, " << n_rows << " rows";
    }
}

// The staged path against the CPU specification directly (the direct kernel's own test bounds it
// too): IQ2_XS's default at T = 1 on the models' width, and every staged type at T = 3.
TEST_P(CudaMatmulStaged, MatchesCpuReference) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(4343 + uint32_t(type));
  Stream stream;
  const int64_t n_in = 2560, n_out = 77;
  const size_t stride = row_bytes(type, n_in);
  const std::vector<uint8_t> w = random_weights(type, n_in, n_out, stride, rng);
  for (const int64_t n_rows : {int64_t(1), int64_t(3)}) {
    const std::vector<float> x = random_floats(size_t(n_rows * n_in), rng);
    GpuMatmul g = upload(type, n_in, n_out, w, stride, x, n_rows);
    compute::cuda::quantize_activations(g.layout, g.x.as<float>(), g.scratch.data(), stream.get());
    const MatmulTuning tuning{0, 1, 0, 0, 1};
    ASSERT_NE(MatvecPath::Direct, compute::cuda::matvec_path(type, n_in, n_rows, &tuning));
    const std::vector<float> y = run_tuned(g.matrix, g.layout, g.scratch.data(), n_rows, g.y, stream, tuning);
    std::vector<uint8_t> act(quant::activation_row_bytes(type, n_in));
    for (int64_t t = 0; t < n_rows; ++t) {
      quant::ref::quantize_activation(type, x.data() + t * n_in, act.data(), n_in);
      for (int64_t o = 0; o < n_out; ++o) {
        const float ref = quant::ref::dot(type, w.data() + size_t(o) * stride, act.data(), n_in);
        const float got = y[size_t(t * n_out + o)];
        ASSERT_LE(std::fabs(double(got) - ref), 1e-4 * (std::fabs(ref) + 1.0))
            << type_name(type) << " rows " << n_rows << " at (" << t << ", " << o << "): gpu " << got << " cpu " << ref;
      }
    }
  }
}

// Several matrices in one launch and routed experts through the slot map (one and paired) take
// the staged kernel too: each output bitwise the direct kernel's, a missing expert NaN.
TEST_P(CudaMatmulStaged, ManyMatricesAndExpertsBitwiseAsDirect) {
  STRATA_REQUIRE_CUDA_DEVICE();
  const GgmlType type = GetParam();
  std::mt19937 rng(5151 + uint32_t(type));
  Stream stream;
  const int64_t n_in = 2560;
  const size_t stride = row_bytes(type, n_in);
  const MatmulTuning staged{0, 1, 0, 2, 1}, staged3{2, 1, 0, 3, 2};
  {  // matmul_quantized_many, matrices of different heights
    const int64_t heights[] = {301, 7, 1000};
    std::vector<DeviceBuffer> weights;
    for (const int64_t n_out : heights) weights.push_back(to_device(random_weights(type, n_in, n_out, stride, rng)));
    for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(9)}) {
      const DeviceBuffer xd = to_device(random_floats(size_t(n_rows * n_in), rng));
      const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
      DeviceBuffer scratch(layout.total_bytes);
      compute::cuda::quantize_activations(layout, xd.as<float>(), scratch.data(), stream.get());
      for (const MatmulTuning& tuning : {staged, staged3}) {
        std::vector<DeviceBuffer> ys;
        std::vector<compute::cuda::DenseOutput> outputs;
        for (size_t j = 0; j < weights.size(); ++j) {
          ys.emplace_back(size_t(n_rows * heights[j]) * 4);
          STRATA_CUDA_CHECK(cudaMemsetAsync(ys.back().data(), 0xff, ys.back().bytes(), stream.get()));
          outputs.push_back({DeviceMatrix{type, n_in, heights[j], weights[j].data(), stride}, ys.back().as<float>()});
        }
        compute::cuda::matmul_quantized_many(outputs, layout, scratch.data(), n_rows, stream.get(), &tuning);
        stream.synchronize();
        for (size_t j = 0; j < weights.size(); ++j) {
          DeviceBuffer y(size_t(n_rows * heights[j]) * 4);
          const DeviceMatrix m{type, n_in, heights[j], weights[j].data(), stride};
          const std::vector<float> direct = run_tuned(m, layout, scratch.data(), n_rows, y, stream, kDirect);
          const auto got = from_device<float>(ys[j], direct.size());
          ASSERT_EQ(0, std::memcmp(got.data(), direct.data(), direct.size() * 4))
              << type_name(type) << ": matrix " << j << " of a staged many-matrix launch, " << n_rows << " rows, "
              << describe(tuning);
        }
      }
    }
  }
  // Experts: as ExpertsThroughTheSlotMap, 2560 wide (40 or 80 units: the staged path by width).
  const int64_t n_out = 45, n_rows = 6;
  const int n_expert = 6;
  const size_t matrix_bytes = stride * size_t(n_out);
  const size_t offset = 16 * ((matrix_bytes + 15) / 16);
  const size_t slot_bytes = 16 * ((offset + matrix_bytes + 15) / 16);
  const int n_slots = 5;
  std::vector<uint8_t> arena(slot_bytes * n_slots, 0);
  std::vector<uint32_t> smap(size_t(2 * n_expert), compute::cuda::kSlotMiss);
  for (int e = 0; e < 5; ++e) {
    smap[size_t(n_expert + e)] = uint32_t((e * 3) % 5);
    for (const size_t at : {size_t(0), offset}) {
      const std::vector<uint8_t> m = random_weights(type, n_in, n_out, stride, rng);
      std::memcpy(arena.data() + smap[size_t(n_expert + e)] * slot_bytes + at, m.data(), matrix_bytes);
    }
  }
  const std::vector<int32_t> experts = {3, 0, 5, 4};
  const int max_rows = 4;
  const std::vector<int32_t> row_ids = {1, 2, 5, 0, /**/ 0, 0, 0, 0, /**/ 3, 0, 0, 0, /**/ 4, 1, 0, 0};
  const std::vector<int32_t> counts = {3, 1, 1, 2};
  DeviceBuffer d_arena = to_device(arena), d_smap = to_device(smap), d_x = to_device(random_floats(size_t(n_rows * n_in), rng));
  DeviceBuffer d_experts = to_device(experts), d_rows = to_device(row_ids), d_counts = to_device(counts);
  const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
  DeviceBuffer scratch(layout.total_bytes);
  compute::cuda::quantize_activations(layout, d_x.as<float>(), scratch.data(), stream.get());
  const compute::cuda::ExpertArenaView view{d_arena.as<uint8_t>(), slot_bytes, d_smap.as<uint32_t>(), n_expert};
  const compute::cuda::ExpertMatrixShape first{type, n_in, n_out, 0, stride}, second{type, n_in, n_out, offset, stride};
  const size_t n_y = experts.size() * max_rows * size_t(n_out);
  const auto experts_run = [&](const MatmulTuning& tuning, bool pair) {
    DeviceBuffer y1(n_y * 4), y2(n_y * 4);
    STRATA_CUDA_CHECK(cudaMemsetAsync(y1.data(), 0, y1.bytes(), stream.get()));
    STRATA_CUDA_CHECK(cudaMemsetAsync(y2.data(), 0, y2.bytes(), stream.get()));
    if (pair)
      compute::cuda::expert_matmul_quantized_pair(view, 1, first, second, d_experts.as<int32_t>(), int(experts.size()),
                                                  d_rows.as<int32_t>(), d_counts.as<int32_t>(), max_rows, layout,
                                                  scratch.data(), y1.as<float>(), y2.as<float>(), stream.get(), &tuning);
    else
      compute::cuda::expert_matmul_quantized(view, 1, second, d_experts.as<int32_t>(), int(experts.size()),
                                             d_rows.as<int32_t>(), d_counts.as<int32_t>(), max_rows, layout,
                                             scratch.data(), y1.as<float>(), stream.get(), &tuning);
    stream.synchronize();
    std::vector<float> out = from_device<float>(y1, n_y);
    if (pair) {
      const std::vector<float> more = from_device<float>(y2, n_y);
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  };
  for (const bool pair : {false, true}) {
    const std::vector<float> direct = experts_run(kDirect, pair);
    for (const MatmulTuning& tuning : {staged, staged3}) {
      ASSERT_NE(MatvecPath::Direct, compute::cuda::matvec_path(type, n_in, max_rows, &tuning));
      const std::vector<float> got = experts_run(tuning, pair);
      EXPECT_TRUE(std::isnan(got[2 * max_rows * size_t(n_out)])) << "a missing expert must produce NaN";
      ASSERT_EQ(0, std::memcmp(got.data(), direct.data(), direct.size() * 4))
          << type_name(type) << ": staged experts (" << (pair ? "pair" : "one matrix") << ", " << describe(tuning)
          << ") differ from the direct kernel";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StagedTypes, CudaMatmulStaged, ::testing::ValuesIn(kStagedTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& info) { return std::string(type_name(info.param)); });

// A few staged launches, small enough for compute-sanitizer racecheck (scripts/cuda-matvec-staged.sh):
// the shared-memory stage ring and the shared activations are where a missing barrier would show.
TEST(CudaMatmulStagedRacecheck, SmallLaunches) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(99);
  Stream stream;
  for (const GgmlType type : {GgmlType::IQ2_XS, GgmlType::Q4_K, GgmlType::Q8_0}) {
    const int64_t n_in = 2560, n_out = 600;
    const size_t stride = row_bytes(type, n_in);
    const DeviceBuffer wd = to_device(random_weights(type, n_in, n_out, stride, rng));
    const DeviceMatrix m{type, n_in, n_out, wd.data(), stride};
    for (const int64_t n_rows : {int64_t(1), int64_t(3)}) {
      const DeviceBuffer xd = to_device(random_floats(size_t(n_rows * n_in), rng));
      const ActivationLayout layout = compute::cuda::activation_layout(type, n_in, n_rows);
      DeviceBuffer scratch(layout.total_bytes), y(size_t(n_rows * n_out) * 4);
      compute::cuda::quantize_activations(layout, xd.as<float>(), scratch.data(), stream.get());
      const std::vector<float> direct = run_tuned(m, layout, scratch.data(), n_rows, y, stream, kDirect);
      for (const MatmulTuning& tuning : {MatmulTuning{1, 1, 0, 2, 1}, MatmulTuning{4, 1, 0, 3, 1}, MatmulTuning{2, 1, 0, 2, 2}}) {
        const std::vector<float> staged = run_tuned(m, layout, scratch.data(), n_rows, y, stream, tuning);
        ASSERT_EQ(0, std::memcmp(staged.data(), direct.data(), direct.size() * 4))
            << type_name(type) << ", " << n_rows << " rows, " << describe(tuning);
      }
    }
  }
}

TEST(CudaActivations, QuantizedBitwiseAsTheCpu) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(5);
  Stream stream;
  for (const GgmlType weight_type : {GgmlType::Q8_0, GgmlType::Q4_K}) {
    const int64_t n_in = 768, n_rows = 5;
    std::vector<float> x = random_floats(size_t(n_rows * n_in), rng, -3.0f, 3.0f);
    std::fill_n(x.begin() + n_in, n_in, 0.0f);  // an all-zero row: d = 0, inverse 0
    for (int64_t i = 0; i < n_in; ++i) {        // exact halves after scaling: round-half-even cases
      x[size_t(2 * n_in + i)] = float(int(i % 255) - 127) * 0.5f;
    }
    x[size_t(3 * n_in + 7)] = -0.0f;
    x[size_t(4 * n_in + 3)] = 1e30f;  // one huge value: everything else rounds to 0
    const ActivationLayout layout = compute::cuda::activation_layout(weight_type, n_in, n_rows);
    DeviceBuffer d_x = to_device(x), scratch(layout.total_bytes);
    compute::cuda::quantize_activations(layout, d_x.as<float>(), scratch.data(), stream.get());
    stream.synchronize();
    std::vector<uint8_t> cpu(quant::activation_row_bytes(weight_type, n_in));
    for (int64_t t = 0; t < n_rows; ++t) {
      quant::ref::quantize_activation(weight_type, x.data() + t * n_in, cpu.data(), n_in);
      const auto qs = from_device<int8_t>(scratch, size_t(n_in), layout.qs_offset + size_t(t) * layout.qs_row_bytes);
      const auto scales = from_device<float>(scratch, layout.scale_row_count, layout.scale_offset + size_t(t) * layout.scale_row_count * 4);
      const auto sums = from_device<int32_t>(scratch, layout.sum_row_count, layout.sum_offset + size_t(t) * layout.sum_row_count * 4);
      if (weight_type == GgmlType::Q4_K) {
        const auto* blocks = reinterpret_cast<const quant::BlockQ8_K*>(cpu.data());
        for (int64_t b = 0; b < n_in / 256; ++b) {
          ASSERT_TRUE(same_bits(blocks[b].d, scales[size_t(b)])) << "row " << t << " block " << b;
          ASSERT_EQ(0, std::memcmp(blocks[b].qs, qs.data() + b * 256, 256)) << "row " << t << " block " << b;
          for (int g = 0; g < 16; ++g) ASSERT_EQ(blocks[b].bsums[g], sums[size_t(b * 16 + g)]);
        }
      } else {
        const auto* blocks = reinterpret_cast<const quant::BlockQ8_0*>(cpu.data());
        for (int64_t b = 0; b < n_in / 32; ++b) {
          ASSERT_TRUE(same_bits(f16_to_f32(blocks[b].d), scales[size_t(b)])) << "row " << t << " block " << b;
          ASSERT_EQ(0, std::memcmp(blocks[b].qs, qs.data() + b * 32, 32)) << "row " << t << " block " << b;
          int sum = 0;
          for (int j = 0; j < 32; ++j) sum += blocks[b].qs[j];
          ASSERT_EQ(sum, sums[size_t(b)]);
        }
      }
    }
  }
}

// The fused prologues against their two launches (the elementwise kernel, then the quantizer):
// every byte of the activation scratch equal, for each activation format (F32 via F16 weights,
// Q8_0, Q8_K) and window size.
TEST(CudaActivations, FusedProloguesBitwiseAsTheTwoSteps) {
  STRATA_REQUIRE_CUDA_DEVICE();
  using compute::cuda::ActivationPrologue;
  std::mt19937 rng(9);
  Stream stream;
  for (const GgmlType weight_type : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K}) {
    for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(8)}) {
      const int64_t n_in = 768;
      const size_t n = size_t(n_rows * n_in);
      const std::vector<float> a = random_floats(n, rng, -6.0f, 6.0f), b = random_floats(n, rng, -2.0f, 2.0f);
      const ActivationLayout layout = compute::cuda::activation_layout(weight_type, n_in, n_rows);
      for (const ActivationPrologue prologue : {ActivationPrologue::SiluMul, ActivationPrologue::ScaledSilu}) {
        const float scale = 0.25f;
        DeviceBuffer d_a = to_device(a), d_b = to_device(b), step(n * 4);
        DeviceBuffer fused(layout.total_bytes), two_step(layout.total_bytes);
        STRATA_CUDA_CHECK(cudaMemsetAsync(fused.data(), 0, layout.total_bytes, stream.get()));
        STRATA_CUDA_CHECK(cudaMemsetAsync(two_step.data(), 0, layout.total_bytes, stream.get()));
        compute::cuda::quantize_activations_fused(layout, prologue, d_a.as<float>(), d_b.as<float>(), scale,
                                                  fused.data(), stream.get());
        if (prologue == ActivationPrologue::SiluMul) {
          compute::cuda::silu_mul(d_a.as<float>(), d_b.as<float>(), int64_t(n), step.as<float>(), stream.get());
        } else {
          STRATA_CUDA_CHECK(cudaMemcpyAsync(step.data(), d_a.data(), n * 4, cudaMemcpyDeviceToDevice, stream.get()));
          compute::cuda::hc_scaled_silu(step.as<float>(), int64_t(n), scale, stream.get());
        }
        compute::cuda::quantize_activations(layout, step.as<float>(), two_step.data(), stream.get());
        stream.synchronize();
        const auto x = from_device<uint8_t>(fused, layout.total_bytes), y = from_device<uint8_t>(two_step, layout.total_bytes);
        ASSERT_EQ(0, std::memcmp(x.data(), y.data(), x.size()))
            << type_name(weight_type) << ", " << n_rows << " rows, prologue " << int(prologue);
      }
    }
  }
}

// Two layouts of one input in one launch against two quantize_activations: every byte equal, for
// the pairs the MoE layer uses (router Q8_0 + experts Q8_K) and the fallbacks (an F32 layout).
TEST(CudaActivations, TwoLayoutsInOneLaunchBitwiseAsTwo) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(11);
  Stream stream;
  for (const auto& [a_type, b_type] : {std::pair{GgmlType::Q8_0, GgmlType::IQ2_XS}, std::pair{GgmlType::Q4_K, GgmlType::Q5_0},
                                       std::pair{GgmlType::F16, GgmlType::Q8_0}}) {
    for (const int64_t n_rows : {int64_t(1), int64_t(5), int64_t(9)}) {
      const int64_t n_in = 1536;
      const std::vector<float> x = random_floats(size_t(n_rows * n_in), rng, -4.0f, 4.0f);
      DeviceBuffer d_x = to_device(x);
      const ActivationLayout la = compute::cuda::activation_layout(a_type, n_in, n_rows),
                             lb = compute::cuda::activation_layout(b_type, n_in, n_rows);
      DeviceBuffer a1(la.total_bytes), b1(lb.total_bytes), a2(la.total_bytes), b2(lb.total_bytes);
      for (DeviceBuffer* d : {&a1, &b1, &a2, &b2}) STRATA_CUDA_CHECK(cudaMemset(d->data(), 0, d->bytes()));
      compute::cuda::quantize_activations_two(la, a1.data(), lb, b1.data(), d_x.as<float>(), stream.get());
      compute::cuda::quantize_activations(la, d_x.as<float>(), a2.data(), stream.get());
      compute::cuda::quantize_activations(lb, d_x.as<float>(), b2.data(), stream.get());
      stream.synchronize();
      ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(a1, la.total_bytes).data(), from_device<uint8_t>(a2, la.total_bytes).data(), la.total_bytes))
          << type_name(a_type) << " + " << type_name(b_type) << ", " << n_rows << " rows: the first layout differs";
      ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(b1, lb.total_bytes).data(), from_device<uint8_t>(b2, lb.total_bytes).data(), lb.total_bytes))
          << type_name(a_type) << " + " << type_name(b_type) << ", " << n_rows << " rows: the second layout differs";
    }
  }
}

// Gated DeltaNet's output step fused (rms_norm_gate_quantize_activations) against its steps:
// rms_norm_rows with the heads' shared weight, gate_rows, quantize_activations. The gated values
// (written back in place) and every activation byte equal, both gate kinds, with and without a
// weight, for head widths the formats take.
TEST(CudaActivations, NormGateQuantizeBitwiseAsTheSteps) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(13);
  Stream stream;
  struct Case {
    GgmlType weight_type;
    int64_t n_heads, head_dim;
  };
  for (const Case c : {Case{GgmlType::Q8_0, 48, 128}, Case{GgmlType::Q8_0, 3, 64}, Case{GgmlType::Q4_K, 16, 256},
                       Case{GgmlType::F16, 5, 40}}) {
    for (const int64_t n_rows : {int64_t(1), int64_t(4)}) {
      for (const bool sigmoid_gate : {false, true}) {
        for (const bool with_weight : {false, true}) {
          const int64_t width = c.n_heads * c.head_dim;
          const size_t n = size_t(n_rows * width);
          const auto x = random_floats(n, rng, -3.0f, 3.0f), z = random_floats(n, rng, -4.0f, 4.0f),
                     weight = random_floats(size_t(c.head_dim), rng, 0.5f, 1.5f);
          const ActivationLayout layout = compute::cuda::activation_layout(c.weight_type, width, n_rows);
          ASSERT_TRUE(compute::cuda::can_norm_quantize(layout, c.n_heads, c.head_dim)) << type_name(c.weight_type);
          DeviceBuffer x_fused = to_device(x), x_steps = to_device(x), dz = to_device(z), dw = to_device(weight);
          DeviceBuffer fused(layout.total_bytes), steps(layout.total_bytes);
          STRATA_CUDA_CHECK(cudaMemsetAsync(fused.data(), 0, layout.total_bytes, stream.get()));
          STRATA_CUDA_CHECK(cudaMemsetAsync(steps.data(), 0, layout.total_bytes, stream.get()));
          const float eps = 1e-6f;
          const float* w = with_weight ? dw.as<float>() : nullptr;
          compute::cuda::rms_norm_gate_quantize_activations(layout, x_fused.as<float>(), w, c.n_heads, c.head_dim, eps,
                                                            dz.as<float>(), sigmoid_gate, fused.data(), stream.get());
          compute::cuda::rms_norm_rows(x_steps.as<float>(), w, n_rows * c.n_heads, c.head_dim, eps, x_steps.as<float>(),
                                       stream.get());
          compute::cuda::gate_rows(x_steps.as<float>(), dz.as<float>(), int64_t(n), sigmoid_gate, stream.get());
          compute::cuda::quantize_activations(layout, x_steps.as<float>(), steps.data(), stream.get());
          stream.synchronize();
          const std::string where = std::string(type_name(c.weight_type)) + ", " + std::to_string(c.n_heads) + " x " +
                                    std::to_string(c.head_dim) + ", " + std::to_string(n_rows) + " rows" +
                                    (sigmoid_gate ? ", sigmoid" : ", silu") + (with_weight ? ", weight" : "");
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(x_fused, n * 4).data(), from_device<uint8_t>(x_steps, n * 4).data(), n * 4)) << where;
          const auto a = from_device<uint8_t>(fused, layout.total_bytes), b = from_device<uint8_t>(steps, layout.total_bytes);
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << where;
        }
      }
    }
  }
  DeviceBuffer buffer(1 << 16);
  const ActivationLayout q8_0 = compute::cuda::activation_layout(GgmlType::Q8_0, 96, 1);
  EXPECT_THROW(compute::cuda::rms_norm_gate_quantize_activations(q8_0, buffer.as<float>(), nullptr, 2, 48, 1e-6f,
                                                                 buffer.as<float>(), true, buffer.data(), stream.get()),
               Error);  // 48 is not whole Q8_0 blocks
  EXPECT_THROW(compute::cuda::rms_norm_gate_quantize_activations(q8_0, buffer.as<float>(), nullptr, 3, 32, 1e-6f,
                                                                 nullptr, true, buffer.data(), stream.get()),
               Error);  // no gate
}

// hyper_connection_in's combine deferred into the next matmul's quantizer
// (quantize_activations_combined, and in quantize_activations_two) against its steps: hc_combine,
// then quantize_activations of x. x, the injection weights and every activation byte equal, for
// one and two layouts, 1-5 streams, with and without the injection step.
TEST(CudaActivations, CombinedQuantizerBitwiseAsTheSteps) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(12);
  Stream stream;
  for (const auto& [a_type, b_type] : {std::pair{GgmlType::Q8_0, GgmlType::IQ2_XS}, std::pair{GgmlType::Q4_K, GgmlType::Q5_0},
                                       std::pair{GgmlType::Q8_0, GgmlType::Q8_0}}) {
    for (const int S : {1, 2, 4, 5}) {  // 5: more streams than load8 holds in registers
      for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(9)}) {
        for (const bool with_inject : {false, true}) {
          const int64_t n_in = 1536, width = S * n_in;
          const float inv = 1.0f / float(S);
          const auto gates = random_floats(size_t(n_rows * width), rng, -4.0f, 4.0f),
                     normed = random_floats(size_t(n_rows * width), rng, -3.0f, 3.0f),
                     inject = random_floats(size_t(n_rows * S), rng, -2.0f, 2.0f);
          DeviceBuffer dg = to_device(gates), dn = to_device(normed), inj_fused = to_device(inject),
                       inj_two = to_device(inject), inj_steps = to_device(inject);
          DeviceBuffer x_fused(size_t(n_rows * n_in) * 4), x_two(size_t(n_rows * n_in) * 4), x_steps(size_t(n_rows * n_in) * 4);
          const ActivationLayout la = compute::cuda::activation_layout(a_type, n_in, n_rows),
                                 lb = compute::cuda::activation_layout(b_type, n_in, n_rows);
          DeviceBuffer a_fused(la.total_bytes), a_two(la.total_bytes), b_two(lb.total_bytes), a_steps(la.total_bytes),
              b_steps(lb.total_bytes);
          for (DeviceBuffer* d : {&a_fused, &a_two, &b_two, &a_steps, &b_steps})
            STRATA_CUDA_CHECK(cudaMemset(d->data(), 0, d->bytes()));
          auto in = [&](DeviceBuffer& x, DeviceBuffer& inj) {
            return compute::cuda::HcCombineInputs{dg.as<float>(), dn.as<float>(), S, inv, x.as<float>(),
                                                  with_inject ? inj.as<float>() : nullptr};
          };
          const compute::cuda::HcCombineInputs fused_in = in(x_fused, inj_fused), two_in = in(x_two, inj_two);
          compute::cuda::quantize_activations_combined(la, fused_in, a_fused.data(), stream.get());
          compute::cuda::quantize_activations_two(la, a_two.data(), lb, b_two.data(), nullptr, stream.get(), &two_in);
          compute::cuda::hc_combine(dg.as<float>(), dn.as<float>(), n_rows, S, n_in, inv, x_steps.as<float>(), stream.get(),
                                    with_inject ? inj_steps.as<float>() : nullptr);
          compute::cuda::quantize_activations(la, x_steps.as<float>(), a_steps.data(), stream.get());
          compute::cuda::quantize_activations(lb, x_steps.as<float>(), b_steps.data(), stream.get());
          stream.synchronize();
          const std::string where = std::string(type_name(a_type)) + " + " + std::string(type_name(b_type)) + ", " +
                                    std::to_string(S) + " streams, " + std::to_string(n_rows) + " rows" +
                                    (with_inject ? ", inject" : "");
          const size_t nx = size_t(n_rows * n_in) * 4, ni = size_t(n_rows * S) * 4;
          const auto x_ref = from_device<uint8_t>(x_steps, nx), inj_ref = from_device<uint8_t>(inj_steps, ni);
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(x_fused, nx).data(), x_ref.data(), nx)) << where << ": x (one layout)";
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(x_two, nx).data(), x_ref.data(), nx)) << where << ": x (two layouts)";
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(inj_fused, ni).data(), inj_ref.data(), ni)) << where << ": inject (one)";
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(inj_two, ni).data(), inj_ref.data(), ni)) << where << ": inject (two)";
          const auto a_ref = from_device<uint8_t>(a_steps, la.total_bytes), b_ref = from_device<uint8_t>(b_steps, lb.total_bytes);
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(a_fused, la.total_bytes).data(), a_ref.data(), la.total_bytes)) << where;
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(a_two, la.total_bytes).data(), a_ref.data(), la.total_bytes)) << where;
          ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(b_two, lb.total_bytes).data(), b_ref.data(), lb.total_bytes)) << where;
        }
      }
    }
  }
  // F32 activations are x itself: the combined quantizer refuses them rather than launching.
  const ActivationLayout f32 = compute::cuda::activation_layout(GgmlType::F16, 64, 1);
  DeviceBuffer buffer(1 << 16);
  const compute::cuda::HcCombineInputs in{buffer.as<float>(), buffer.as<float>(), 2, 0.5f, buffer.as<float>(), nullptr};
  EXPECT_THROW(compute::cuda::quantize_activations_combined(f32, in, buffer.data(), stream.get()), Error);
}

// The fused grouped norm + quantizer (hyper_connection_in's first launch) against its steps:
// hc_out (when folded), rms_norm_grouped_rows, quantize_activations. The updated x, the normed
// floats and every byte of the activation scratch must be equal, for each activation format and
// window size, with groups of awkward size where the format allows it.
TEST(CudaActivations, NormQuantizeBitwiseAsTheSteps) {
  STRATA_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(10);
  Stream stream;
  struct Case {
    GgmlType weight_type;
    int64_t n_groups, group_size;
  };
  for (const Case c : {Case{GgmlType::F16, 4, 1000}, Case{GgmlType::Q8_0, 4, 1024}, Case{GgmlType::Q8_0, 3, 96},
                       Case{GgmlType::Q8_0, 1, 2080}, Case{GgmlType::Q4_K, 4, 1024}, Case{GgmlType::Q4_K, 2, 2560},
                       Case{GgmlType::Q8_0, 1, 3840}, Case{GgmlType::Q8_0, 2, 4128},  // 1024 threads past 2048
                       Case{GgmlType::Q8_0, 1, 8224}}) {  // past 8192: the load-store loop
    for (const int64_t n_rows : {int64_t(1), int64_t(3), int64_t(8)}) {
      // fold 0: the norm alone; 1: hc_out folded in; 2: the MoE combine and hc_out folded in (with
      // the shared expert on odd row counts).
      for (const int fold : {0, 1, 2}) {
        const int64_t width = c.n_groups * c.group_size;
        const size_t n = size_t(n_rows * width), ny = size_t(n_rows * c.group_size);
        const int k = 3;
        const bool with_shared = n_rows % 2 == 1;
        const std::vector<float> x = random_floats(n, rng, -3.0f, 3.0f),
                                 weight = random_floats(size_t(width), rng, 0.5f, 1.5f),
                                 y = random_floats(ny, rng, -1.0f, 1.0f),
                                 inject = random_floats(size_t(n_rows * c.n_groups), rng, 0.0f, 2.0f),
                                 expert_out = random_floats(ny * k, rng, -1.0f, 1.0f),
                                 routing = random_floats(size_t(n_rows * k), rng, 0.0f, 0.5f),
                                 shared = random_floats(ny, rng, -1.0f, 1.0f),
                                 logit = random_floats(size_t(n_rows), rng, -3.0f, 3.0f);
        const ActivationLayout layout = compute::cuda::activation_layout(c.weight_type, width, n_rows);
        ASSERT_TRUE(compute::cuda::can_norm_quantize(layout, c.n_groups, c.group_size)) << type_name(c.weight_type);
        DeviceBuffer dx_fused = to_device(x), dx_steps = to_device(x), dw = to_device(weight), dy = to_device(y),
                     dy_fused = to_device(y), dinj = to_device(inject), normed_fused(n * 4), normed_steps(n * 4),
                     dout = to_device(expert_out), drouting = to_device(routing), dshared = to_device(shared),
                     dlogit = to_device(logit);
        DeviceBuffer fused(layout.total_bytes), steps(layout.total_bytes);
        STRATA_CUDA_CHECK(cudaMemsetAsync(fused.data(), 0, layout.total_bytes, stream.get()));
        STRATA_CUDA_CHECK(cudaMemsetAsync(steps.data(), 0, layout.total_bytes, stream.get()));
        const float eps = 1e-6f;
        const compute::cuda::MoeCombineInputs combine{dout.as<float>(), drouting.as<float>(), k,
                                                      with_shared ? dshared.as<float>() : nullptr,
                                                      with_shared ? dlogit.as<float>() : nullptr};
        compute::cuda::rms_norm_quantize_activations(layout, dx_fused.as<float>(), dw.as<float>(), c.n_groups,
                                                     c.group_size, eps, normed_fused.as<float>(), fused.data(),
                                                     stream.get(), fold ? dy_fused.as<float>() : nullptr,
                                                     fold ? dinj.as<float>() : nullptr, fold == 2 ? &combine : nullptr);
        if (fold == 2)
          compute::cuda::moe_combine(combine.expert_out, combine.weights, n_rows, k, c.group_size, combine.shared,
                                     combine.shared_gate_logit, dy.as<float>(), stream.get());
        if (fold)
          compute::cuda::hc_out(dy.as<float>(), dinj.as<float>(), n_rows, int(c.n_groups), c.group_size,
                                dx_steps.as<float>(), stream.get());
        compute::cuda::rms_norm_grouped_rows(dx_steps.as<float>(), dw.as<float>(), n_rows, c.n_groups, c.group_size,
                                             eps, normed_steps.as<float>(), stream.get());
        compute::cuda::quantize_activations(layout, normed_steps.as<float>(), steps.data(), stream.get());
        stream.synchronize();
        const std::string where = fmt_case(c.weight_type, c.n_groups, c.group_size, n_rows, fold);
        ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(dx_fused, n * 4).data(), from_device<uint8_t>(dx_steps, n * 4).data(), n * 4)) << where;
        ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(normed_fused, n * 4).data(), from_device<uint8_t>(normed_steps, n * 4).data(), n * 4)) << where;
        ASSERT_EQ(0, std::memcmp(from_device<uint8_t>(dy_fused, ny * 4).data(), from_device<uint8_t>(dy, ny * 4).data(), ny * 4)) << where;
        const auto a = from_device<uint8_t>(fused, layout.total_bytes), b = from_device<uint8_t>(steps, layout.total_bytes);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << where;
      }
    }
  }
  // Shapes the format cannot take are refused, and the call throws rather than launching.
  const ActivationLayout q8k = compute::cuda::activation_layout(GgmlType::Q4_K, 4 * 640, 1);
  EXPECT_FALSE(compute::cuda::can_norm_quantize(q8k, 4, 640));   // groups not whole Q8_K blocks
  EXPECT_FALSE(compute::cuda::can_norm_quantize(q8k, 2, 1024));  // groups not the layout's width
  EXPECT_TRUE(compute::cuda::can_norm_quantize(q8k, 10, 256));
  const ActivationLayout q8_0 = compute::cuda::activation_layout(GgmlType::Q8_0, 96, 1);
  EXPECT_FALSE(compute::cuda::can_norm_quantize(q8_0, 2, 48));  // 48 is not whole Q8_0 blocks
  EXPECT_TRUE(compute::cuda::can_norm_quantize(q8_0, 3, 32));
  DeviceBuffer buffer(1 << 20);
  EXPECT_THROW(compute::cuda::rms_norm_quantize_activations(q8k, buffer.as<float>(), nullptr, 4, 640, 1e-6f,
                                                            buffer.as<float>(), buffer.data(), stream.get()),
               Error);
}

TEST(CudaMatmulErrors, BadArgumentsThrowBeforeLaunch) {
  STRATA_REQUIRE_CUDA_DEVICE();
  Stream stream;
  DeviceBuffer w(1 << 16), x(1 << 16), y(1 << 16), scratch(1 << 20);
  const auto call = [&](DeviceMatrix m) { compute::cuda::matmul(m, x.as<float>(), 1, y.as<float>(), scratch.data(), stream.get()); };
  EXPECT_THROW(call(DeviceMatrix{GgmlType::Q4_K, 300, 4, w.data(), 144}), Error);               // width not a block multiple
  EXPECT_THROW(call(DeviceMatrix{GgmlType::Q4_K, 256, 4, w.data(), 128}), Error);               // stride < row
  EXPECT_THROW(call(DeviceMatrix{GgmlType::Q4_K, 256, 4, w.as<uint8_t>() + 2, 144}), Error);   // misaligned
  EXPECT_THROW(call(DeviceMatrix{GgmlType::TQ2_0, 256, 4, w.data(), 66}), Error);               // no kernel
  {  // several matrices in one launch: one type and width, at most kMaxDenseMatrices
    const ActivationLayout layout = compute::cuda::activation_layout(GgmlType::Q4_K, 256, 1);
    const compute::cuda::DenseOutput mixed[] = {{DeviceMatrix{GgmlType::Q4_K, 256, 4, w.data(), 144}, y.as<float>()},
                                                {DeviceMatrix{GgmlType::Q5_K, 256, 4, w.data(), 176}, y.as<float>()}};
    EXPECT_THROW(compute::cuda::matmul_quantized_many(mixed, layout, scratch.data(), 1, stream.get()), Error);
    std::vector<compute::cuda::DenseOutput> many(compute::cuda::kMaxDenseMatrices + 1,
                                                 {DeviceMatrix{GgmlType::Q4_K, 256, 4, w.data(), 144}, y.as<float>()});
    EXPECT_THROW(compute::cuda::matmul_quantized_many(many, layout, scratch.data(), 1, stream.get()), Error);
  }
  try {
    call(DeviceMatrix{GgmlType::Q4_K, 300, 4, w.data(), 144});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_K"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
