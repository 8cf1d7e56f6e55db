// AVX2 kernels against the scalar reference on random inputs, the reference dot against a
// double-precision dot of the dequantized operands, determinism and dispatch.
//
// Tolerances (u = 2^-24, the f32 unit roundoff; S = Σ_i m_i·|a_i| with m_i the magnitude of
// weight i's parts before they cancel, see weight_magnitudes):
// - ref::dot vs double dot of dequantized operands: the ref sums exact integer block sums in
//   double, so it differs from the exact value of the *encoded* operands only by its final
//   rounding (u·S). The dequantized weights carry ≤ 3 roundings (scale product, times q, minus
//   min) and the activations 1, each ≤ u relative to the parts: bound 8u·S.
// - AVX2 dot vs ref: the integer sums are exact; each block adds one rounded scale product and
//   one FMA per lane, lanes accumulate `chain` terms (blocks, or n/32 for float types), then a
//   fixed ~6-step reduction. Standard summation bounds give ≤ (chain + 8)·u·S; we allow twice
//   that, (chain + 16)·2u·S, which is still ~1e-6 relative for one block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant_test_util.h"
#include "util/fp16.h"

namespace strata::quant {
namespace {

using testing::accumulation_chain;
using testing::gaussian;
using testing::kKernelTypes;
using testing::kUnitRoundoff;
using testing::magnitude_sum;
using testing::make_activation;
using testing::random_row;
using testing::weight_magnitudes;

struct KernelPair {
  GgmlType type;
  DequantizeFn scalar_dequantize;
  DequantizeFn avx2_dequantize;
  DotFn scalar_dot;
  DotFn avx2_dot;
};

const KernelPair kPairs[] = {
    {GgmlType::F32, scalar::dequantize_f32, scalar::dequantize_f32, scalar::dot_f32, avx2::dot_f32},
    {GgmlType::F16, scalar::dequantize_f16, avx2::dequantize_f16, scalar::dot_f16, avx2::dot_f16},
    {GgmlType::BF16, scalar::dequantize_bf16, avx2::dequantize_bf16, scalar::dot_bf16, avx2::dot_bf16},
    {GgmlType::Q8_0, scalar::dequantize_q8_0, avx2::dequantize_q8_0, scalar::dot_q8_0, avx2::dot_q8_0},
    {GgmlType::Q4_0, scalar::dequantize_q4_0, avx2::dequantize_q4_0, scalar::dot_q4_0, avx2::dot_q4_0},
    {GgmlType::Q2_K, scalar::dequantize_q2_K, avx2::dequantize_q2_K, scalar::dot_q2_K, avx2::dot_q2_K},
    {GgmlType::Q4_K, scalar::dequantize_q4_K, avx2::dequantize_q4_K, scalar::dot_q4_K, avx2::dot_q4_K},
    {GgmlType::Q6_K, scalar::dequantize_q6_K, avx2::dequantize_q6_K, scalar::dot_q6_K, avx2::dot_q6_K},
    {GgmlType::IQ2_XS, scalar::dequantize_iq2_xs, avx2::dequantize_iq2_xs, scalar::dot_iq2_xs,
     avx2::dot_iq2_xs},
};

// Row lengths per type: multiples of 256 up to 8192 for all, plus 32-multiples for the 32-block
// types and odd lengths for the scalar types.
std::vector<int64_t> lengths_for(GgmlType type) {
  std::vector<int64_t> n = {256, 512, 768, 1280, 2048, 4096, 8192};
  const int64_t block = type_traits(type).block_elems;
  if (block == 32) n.insert(n.end(), {32, 64, 96, 160, 640, 2560 + 32});
  if (block == 1) n.insert(n.end(), {1, 7, 8, 31, 33, 100, 2561});
  return n;
}

#define SKIP_WITHOUT_AVX2() \
  if (!cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C/BMI1; AVX2 kernels cannot run here"

TEST(QuantKernels, Avx2DequantizeIsBitwiseEqual) {
  SKIP_WITHOUT_AVX2();
  for (const KernelPair& pair : kPairs) {
    for (int64_t n : lengths_for(pair.type)) {
      for (uint32_t seed = 0; seed < 10; ++seed) {
        const std::vector<uint8_t> row = random_row(pair.type, n, seed * 7919 + uint32_t(n));
        std::vector<float> expected(n), actual(n);
        pair.scalar_dequantize(row.data(), expected.data(), n);
        pair.avx2_dequantize(row.data(), actual.data(), n);
        ASSERT_EQ(std::memcmp(expected.data(), actual.data(), size_t(n) * 4), 0)
            << type_name(pair.type) << " n=" << n << " seed=" << seed;
      }
    }
  }
}

TEST(QuantKernels, Avx2F16DequantizeMatchesOnEveryHalf) {
  SKIP_WITHOUT_AVX2();
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = uint16_t(h);
  std::vector<float> expected(65536), actual(65536);
  scalar::dequantize_f16(all.data(), expected.data(), 65536);
  avx2::dequantize_f16(all.data(), actual.data(), 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    if (std::isnan(expected[h])) {
      EXPECT_TRUE(std::isnan(actual[h])) << h;
    } else {
      EXPECT_EQ(f32_to_bits(expected[h]), f32_to_bits(actual[h])) << h;
    }
  }
}

TEST(QuantKernels, Avx2ActivationQuantizersAreBitwiseEqual) {
  SKIP_WITHOUT_AVX2();
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> x = gaussian(4096, seed, std::ldexp(1.0f, int(seed % 9) - 4));
    // Edge blocks: an all-zero block, exact ties (k + 0.5 with max 127), a huge and a tiny one.
    std::fill(x.begin(), x.begin() + 256, 0.0f);
    for (int i = 256; i < 512; ++i) x[i] = float(i % 255 - 127) + (i % 2 ? 0.5f : 0.0f);
    x[300] = 127.0f;
    for (int i = 512; i < 768; ++i) x[i] *= 1e30f;
    for (int i = 768; i < 1024; ++i) x[i] *= 1e-30f;
    std::vector<BlockQ8_K> k_ref(16), k_avx(16);
    scalar::quantize_q8_K(x.data(), k_ref.data(), 4096);
    avx2::quantize_q8_K(x.data(), k_avx.data(), 4096);
    EXPECT_EQ(std::memcmp(k_ref.data(), k_avx.data(), sizeof(BlockQ8_K) * 16), 0) << seed;
    std::vector<BlockQ8_0> z_ref(128), z_avx(128);
    scalar::quantize_q8_0(x.data(), z_ref.data(), 4096);
    avx2::quantize_q8_0(x.data(), z_avx.data(), 4096);
    EXPECT_EQ(std::memcmp(z_ref.data(), z_avx.data(), sizeof(BlockQ8_0) * 128), 0) << seed;
  }
}

TEST(QuantKernels, Avx2DotMatchesReferenceWithinRoundingBound) {
  SKIP_WITHOUT_AVX2();
  for (const KernelPair& pair : kPairs) {
    double worst_ratio = 0.0;
    for (int64_t n : lengths_for(pair.type)) {
      for (uint32_t seed = 0; seed < 10; ++seed) {
        const std::vector<uint8_t> row = random_row(pair.type, n, seed * 104729 + uint32_t(n));
        const testing::Activation act = make_activation(pair.type, gaussian(n, seed + 1000));
        const double bound = double(accumulation_chain(pair.type, n) + 16) * 2 * kUnitRoundoff *
                             magnitude_sum(weight_magnitudes(pair.type, row, n), act.values);
        const float expected = pair.scalar_dot(row.data(), act.bytes.data(), n);
        const float actual = pair.avx2_dot(row.data(), act.bytes.data(), n);
        const double error = std::fabs(double(expected) - double(actual));
        ASSERT_LE(error, bound) << type_name(pair.type) << " n=" << n << " seed=" << seed
                                << " ref=" << expected << " avx2=" << actual;
        if (bound > 0) worst_ratio = std::max(worst_ratio, error / bound);
      }
    }
    // A kernel that dropped a block would be caught above; this records how tight it is.
    RecordProperty(std::string(type_name(pair.type)) + "_worst_error_over_bound",
                   std::to_string(worst_ratio));
  }
}

TEST(QuantKernels, ReferenceDotMatchesDoubleDotOfDequantizedOperands) {
  for (GgmlType type : kKernelTypes) {
    for (int64_t n : lengths_for(type)) {
      for (uint32_t seed = 0; seed < 5; ++seed) {
        const std::vector<uint8_t> row = random_row(type, n, seed * 31 + uint32_t(n));
        const testing::Activation act = make_activation(type, gaussian(n, seed + 77));
        std::vector<float> w(n);
        ref::dequantize_row(type, row.data(), w.data(), n);
        double exact = 0.0;
        for (int64_t i = 0; i < n; ++i) exact += double(w[i]) * double(act.values[i]);
        const double bound = 8 * kUnitRoundoff * magnitude_sum(weight_magnitudes(type, row, n), act.values);
        const float got = ref::dot(type, row.data(), act.bytes.data(), n);
        ASSERT_LE(std::fabs(double(got) - exact), bound)
            << type_name(type) << " n=" << n << " seed=" << seed;
      }
    }
  }
}

TEST(QuantKernels, QuantizedDotTracksFloatDot) {
  // End to end: quantize Gaussian weights and activations, and compare dot() with the f32 dot
  // of the original values; the error must be of the order of the quantization noise.
  const int64_t n = 4096;
  const std::vector<float> w = gaussian(n, 5);
  const std::vector<float> x = gaussian(n, 6);
  double exact = 0.0, scale = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    exact += double(w[i]) * x[i];
    scale += double(w[i]) * w[i];
  }
  scale = std::sqrt(scale * n);  // ~ |w|·|x| for unit Gaussian x
  const std::pair<GgmlType, double> tolerance[] = {
      {GgmlType::F32, 1e-6}, {GgmlType::F16, 1e-3}, {GgmlType::BF16, 5e-3}, {GgmlType::Q8_0, 2e-2},
      {GgmlType::Q4_0, 0.1}, {GgmlType::Q2_K, 0.3}, {GgmlType::Q4_K, 0.1}, {GgmlType::Q6_K, 3e-2},
      {GgmlType::IQ2_XS, 0.3}};
  for (auto [type, relative] : tolerance) {
    std::vector<uint8_t> row(row_bytes(type, n));
    quantize_row(type, w.data(), row.data(), n);
    std::vector<uint8_t> act(activation_row_bytes(type, n));
    quantize_activation(type, x.data(), act.data(), n);
    EXPECT_NEAR(dot(type, row.data(), act.data(), n), exact, relative * scale) << type_name(type);
  }
}

TEST(QuantKernels, DotIsDeterministicAndIndependentOfRowPosition) {
  for (GgmlType type : kKernelTypes) {
    const int64_t n = 2048;
    const size_t bytes = row_bytes(type, n);
    const std::vector<uint8_t> row = random_row(type, n, 99);
    const testing::Activation act = make_activation(type, gaussian(n, 98));
    // The same row placed as row 3 of a matrix, at a different address and alignment.
    std::vector<uint8_t> matrix(bytes * 5 + 2);
    std::memcpy(matrix.data() + 2 + 3 * bytes, row.data(), bytes);
    const float first = dot(type, row.data(), act.bytes.data(), n);
    const float second = dot(type, row.data(), act.bytes.data(), n);
    const float moved = dot(type, matrix.data() + 2 + 3 * bytes, act.bytes.data(), n);
    const float through_pointer = dot_kernel(type)(row.data(), act.bytes.data(), n);
    EXPECT_EQ(f32_to_bits(first), f32_to_bits(second)) << type_name(type);
    EXPECT_EQ(f32_to_bits(first), f32_to_bits(moved)) << type_name(type);
    EXPECT_EQ(f32_to_bits(first), f32_to_bits(through_pointer)) << type_name(type);
    const float ref_first = ref::dot(type, row.data(), act.bytes.data(), n);
    EXPECT_EQ(f32_to_bits(ref_first), f32_to_bits(ref::dot(type, row.data(), act.bytes.data(), n)));
  }
}

TEST(QuantKernels, DispatchUsesAvx2WhenAvailable) {
  SKIP_WITHOUT_AVX2();
  if (active_kernel_level() == KernelLevel::Scalar) {
    GTEST_SKIP() << "kernels capped to scalar by STRATA_QUANT_MAX / STRATA_QUANT_SCALAR";
  }
  // At the AVX-512 level Q4_K and IQ2_XS use avx512:: kernels, which are bitwise equal to these.
  for (const KernelPair& pair : kPairs) {
    const int64_t n = 1024;
    const std::vector<uint8_t> row = random_row(pair.type, n, 5);
    const testing::Activation act = make_activation(pair.type, gaussian(n, 6));
    EXPECT_EQ(f32_to_bits(dot(pair.type, row.data(), act.bytes.data(), n)),
              f32_to_bits(pair.avx2_dot(row.data(), act.bytes.data(), n)))
        << type_name(pair.type);
  }
}

}  // namespace
}  // namespace strata::quant
