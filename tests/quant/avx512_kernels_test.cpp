// AVX-512 dot kernels (Q4_0, Q4_K, IQ2_XS) against the scalar reference and the AVX2 kernels, and
// the kernel-level dispatch (CPU check, STRATA_QUANT_MAX cap).
//
// The AVX-512 kernels promise bitwise equality with the AVX2 ones (same integer lanes, same f32
// code), so a CPU with AVX-512 computes the same bits as one without; against the reference they
// get the AVX2 bound of kernels_test.cpp. On a CPU without AVX-512 the comparisons skip (the
// kernels cannot run there); the dispatch tests still run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace strata::quant {
namespace {

using testing::accumulation_chain;
using testing::gaussian;
using testing::kUnitRoundoff;
using testing::magnitude_sum;
using testing::make_activation;
using testing::random_row;
using testing::weight_magnitudes;

struct Avx512Kernel {
  GgmlType type;
  DotFn scalar_dot;
  DotFn avx2_dot;
  DotFn avx512_dot;
};

const Avx512Kernel kKernels[] = {
    {GgmlType::Q4_0, scalar::dot_q4_0, avx2::dot_q4_0, avx512::dot_q4_0},
    {GgmlType::Q4_K, scalar::dot_q4_K, avx2::dot_q4_K, avx512::dot_q4_K},
    {GgmlType::IQ2_XS, scalar::dot_iq2_xs, avx2::dot_iq2_xs, avx512::dot_iq2_xs},
};

#define SKIP_WITHOUT_AVX512()                                                                   \
  if (!cpu_has_avx512())                                                                        \
  GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VBMI/VNNI/BITALG; the AVX-512 kernels cannot run " \
                  "here (the AVX2 and scalar paths are tested in kernels_test.cpp)"

// Odd and even block counts: 1 to 33 blocks of 256, and for Q4_0 also 1 to 81 blocks of 32 (the
// kernel takes blocks in pairs and finishes an odd count with one more).
std::vector<int64_t> lengths_for(GgmlType type) {
  std::vector<int64_t> n = {256, 512, 768, 1280, 2560, 4096, 4352, 8448};
  if (type == GgmlType::Q4_0) n.insert(n.end(), {32, 64, 96, 160, 2592});
  return n;
}

// Checks one row against the reference bound and the AVX2 kernel's bits.
void expect_row_matches(const Avx512Kernel& kernel, const uint8_t* row, int64_t n,
                        const testing::Activation& act, const std::string& where) {
  std::vector<uint8_t> row_copy(row, row + row_bytes(kernel.type, n));
  const double bound = double(accumulation_chain(kernel.type, n) + 16) * 2 * kUnitRoundoff *
                       magnitude_sum(weight_magnitudes(kernel.type, row_copy, n), act.values);
  const float expected = kernel.scalar_dot(row, act.bytes.data(), n);
  const float avx2 = kernel.avx2_dot(row, act.bytes.data(), n);
  const float avx512 = kernel.avx512_dot(row, act.bytes.data(), n);
  ASSERT_LE(std::fabs(double(expected) - double(avx512)), bound)
      << type_name(kernel.type) << " " << where << " ref=" << expected << " avx512=" << avx512;
  ASSERT_EQ(f32_to_bits(avx2), f32_to_bits(avx512))
      << type_name(kernel.type) << " " << where << " avx2=" << avx2 << " avx512=" << avx512;
}

TEST(QuantAvx512, DotMatchesReferenceAndAvx2OnRandomRows) {
  SKIP_WITHOUT_AVX512();
  for (const Avx512Kernel& kernel : kKernels) {
    for (int64_t n : lengths_for(kernel.type)) {
      for (uint32_t seed = 0; seed < 12; ++seed) {
        const std::vector<uint8_t> row = random_row(kernel.type, n, seed * 6151 + uint32_t(n));
        // Activations of varied scale; seed 0 gets a row of exact ±127 quants (the largest
        // products maddubs and the sign handling see).
        std::vector<float> x = gaussian(n, seed + 500, std::ldexp(1.0f, int(seed % 7) - 3));
        if (seed == 0) {
          for (int64_t i = 0; i < n; ++i) x[size_t(i)] = (i * 7 % 3 == 0) ? -1.0f : 1.0f;
        }
        const testing::Activation act = make_activation(kernel.type, x);
        expect_row_matches(kernel, row.data(), n, act,
                           "n=" + std::to_string(n) + " seed=" + std::to_string(seed));
      }
    }
  }
}

TEST(QuantAvx512, DotMatchesReferenceOnEveryRowOfAnOddMatrix) {
  // 37 rows packed back to back from a 2-byte offset: IQ2_XS rows (74 bytes per block) and Q4_0
  // rows (18) start at every 2-byte alignment, Q4_K rows at 16-byte steps; each row is checked on
  // its own.
  SKIP_WITHOUT_AVX512();
  constexpr int64_t kRows = 37;
  for (const Avx512Kernel& kernel : kKernels) {
    for (int64_t n : {int64_t(768), int64_t(2560), int64_t(2592)}) {
      if (n % type_traits(kernel.type).block_elems != 0) continue;  // 2592: Q4_0 only
      const size_t stride = row_bytes(kernel.type, n);
      std::vector<uint8_t> matrix(2 + stride * kRows);
      for (int64_t r = 0; r < kRows; ++r) {
        const std::vector<uint8_t> row = random_row(kernel.type, n, uint32_t(r * 977 + n));
        std::memcpy(matrix.data() + 2 + size_t(r) * stride, row.data(), stride);
      }
      const testing::Activation act = make_activation(kernel.type, gaussian(n, uint32_t(n)));
      for (int64_t r = 0; r < kRows; ++r) {
        expect_row_matches(kernel, matrix.data() + 2 + size_t(r) * stride, n, act,
                           "n=" + std::to_string(n) + " row=" + std::to_string(r));
      }
    }
  }
}

TEST(QuantAvx512, Iq2xsEveryGridPointAndSignPattern) {
  // Each block uses 32 consecutive grid indices and sign indices, so 16 blocks cover all 512
  // grid points and every one of the 128 sign patterns several times, with every scale nibble.
  SKIP_WITHOUT_AVX512();
  constexpr int64_t kBlocks = 16;
  std::vector<BlockIQ2_XS> blocks(kBlocks);
  for (int64_t b = 0; b < kBlocks; ++b) {
    blocks[size_t(b)].d = 0x3c00;  // 1.0
    for (int g = 0; g < 32; ++g) {
      const int grid = int(b) * 32 + g;
      const int signs = (grid * 5 + int(b)) % 128;
      blocks[size_t(b)].qs[g] = uint16_t(grid | signs << 9);
    }
    for (int s = 0; s < 8; ++s) blocks[size_t(b)].scales[s] = uint8_t((b * 8 + s) * 37 % 256);
  }
  const Avx512Kernel& kernel = kKernels[2];
  ASSERT_EQ(kernel.type, GgmlType::IQ2_XS);
  const int64_t n = kBlocks * kBlockK;
  const auto* bytes = reinterpret_cast<const uint8_t*>(blocks.data());
  for (uint32_t seed = 0; seed < 4; ++seed) {
    const testing::Activation act = make_activation(kernel.type, gaussian(n, seed));
    expect_row_matches(kernel, bytes, n, act, "seed=" + std::to_string(seed));
    // One block at a time, so a wrong group cannot hide in the sum of a long row.
    for (int64_t b = 0; b < kBlocks; ++b) {
      const testing::Activation one =
          make_activation(kernel.type, std::vector<float>(act.values.begin() + b * kBlockK,
                                                          act.values.begin() + (b + 1) * kBlockK));
      expect_row_matches(kernel, bytes + b * int64_t(sizeof(BlockIQ2_XS)), kBlockK, one,
                         "block=" + std::to_string(b));
    }
  }
}

using DotFn = float (*)(const void*, const void*, int64_t);
using DotManyFn = void (*)(const void*, const void*, size_t, int64_t, int64_t, float*, size_t);

// One weight row against T activation rows at once must give, for every activation, the bits of
// the single-activation kernel (and so of the AVX2 one): T = 1 .. 19 covers one pass of up to 8
// (IQ2_XS) or 4 (Q4_K) rows and the passes after it; weight rows at even and odd 2-byte offsets,
// activation rows at several strides, outputs at several strides (the gaps between outputs must
// stay untouched).
void expect_dot_many_is_bitwise_the_single_dot(GgmlType type, DotFn single_dot, DotFn avx2_dot,
                                               DotManyFn dot_many) {
  constexpr int64_t kMaxActs = 19;
  for (int64_t n : {int64_t(256), int64_t(768), int64_t(2560), int64_t(4352)}) {
    const size_t act_bytes = activation_row_bytes(type, n);
    for (size_t weight_offset : {size_t(0), size_t(2), size_t(6)}) {
      const std::vector<uint8_t> row = random_row(type, n, uint32_t(n * 31 + weight_offset));
      std::vector<uint8_t> weights(weight_offset + row.size());
      std::memcpy(weights.data() + weight_offset, row.data(), row.size());
      const uint8_t* w = weights.data() + weight_offset;
      for (size_t act_stride : {act_bytes, act_bytes + 4, act_bytes + 64 - act_bytes % 64}) {
        std::vector<uint8_t> acts(act_stride * kMaxActs);
        for (int64_t t = 0; t < kMaxActs; ++t) {
          std::vector<float> x = gaussian(n, uint32_t(t * 101 + n), std::ldexp(1.0f, int(t % 5)));
          if (t == 3) {  // exact ±127 quants: the largest products
            for (int64_t i = 0; i < n; ++i) x[size_t(i)] = (i * 5 % 3 == 0) ? -1.0f : 1.0f;
          }
          const testing::Activation act = make_activation(type, x);
          std::memcpy(acts.data() + size_t(t) * act_stride, act.bytes.data(), act_bytes);
        }
        std::vector<float> single(kMaxActs);
        for (int64_t t = 0; t < kMaxActs; ++t) {
          single[size_t(t)] = single_dot(w, acts.data() + size_t(t) * act_stride, n);
          ASSERT_EQ(f32_to_bits(single[size_t(t)]),
                    f32_to_bits(avx2_dot(w, acts.data() + size_t(t) * act_stride, n)));
        }
        for (size_t out_stride : {size_t(1), size_t(3)}) {
          for (int64_t n_acts = 1; n_acts <= kMaxActs; ++n_acts) {
            constexpr float kUntouched = -1234.5f;
            std::vector<float> out(size_t(n_acts) * out_stride, kUntouched);
            dot_many(w, acts.data(), act_stride, n_acts, n, out.data(), out_stride);
            for (size_t i = 0; i < out.size(); ++i) {
              const std::string where = std::string(type_name(type)) + " n=" + std::to_string(n) +
                                        " weight_offset=" + std::to_string(weight_offset) +
                                        " act_stride=" + std::to_string(act_stride) +
                                        " out_stride=" + std::to_string(out_stride) +
                                        " n_acts=" + std::to_string(n_acts) +
                                        " i=" + std::to_string(i);
              const float want = i % out_stride == 0 ? single[i / out_stride] : kUntouched;
              ASSERT_EQ(f32_to_bits(out[i]), f32_to_bits(want))
                  << where << " got=" << out[i] << " want=" << want;
            }
          }
        }
      }
    }
  }
}

TEST(QuantAvx512, Iq2xsDotManyIsBitwiseTheSingleDot) {
  SKIP_WITHOUT_AVX512();
  expect_dot_many_is_bitwise_the_single_dot(GgmlType::IQ2_XS, avx512::dot_iq2_xs, avx2::dot_iq2_xs,
                                            avx512::dot_many_iq2_xs);
}

TEST(QuantAvx512, Q4KDotManyIsBitwiseTheSingleDot) {
  SKIP_WITHOUT_AVX512();
  expect_dot_many_is_bitwise_the_single_dot(GgmlType::Q4_K, avx512::dot_q4_K, avx2::dot_q4_K,
                                            avx512::dot_many_q4_K);
}

// The level this process should dispatch to, from the CPU and the environment.
KernelLevel expected_level() {
  KernelLevel level = cpu_has_avx512() ? KernelLevel::Avx512
                      : cpu_has_avx2() ? KernelLevel::Avx2
                                       : KernelLevel::Scalar;
  const char* scalar = std::getenv("STRATA_QUANT_SCALAR");
  if (scalar != nullptr && std::string(scalar) == "1") level = KernelLevel::Scalar;
  const char* max = std::getenv("STRATA_QUANT_MAX");
  if (max != nullptr && std::string(max) == "scalar") level = KernelLevel::Scalar;
  if (max != nullptr && std::string(max) == "avx2" && level == KernelLevel::Avx512) {
    level = KernelLevel::Avx2;
  }
  return level;
}

TEST(QuantDispatch, LevelFollowsCpuAndEnvironmentCap) {
  EXPECT_EQ(active_kernel_level(), expected_level())
      << "active " << kernel_level_name(active_kernel_level()) << ", STRATA_QUANT_MAX="
      << (std::getenv("STRATA_QUANT_MAX") ? std::getenv("STRATA_QUANT_MAX") : "(unset)");
  if (cpu_has_avx512()) {
    EXPECT_TRUE(cpu_has_avx2());
  }
}

TEST(QuantDispatch, DispatchedDotIsTheActiveLevelsKernel) {
  for (const Avx512Kernel& kernel : kKernels) {
    const int64_t n = 2560;
    const std::vector<uint8_t> row = random_row(kernel.type, n, 11);
    const testing::Activation act = make_activation(kernel.type, gaussian(n, 12));
    const float got = dot(kernel.type, row.data(), act.bytes.data(), n);
    DotFn expected_kernel = kernel.scalar_dot;
    if (active_kernel_level() == KernelLevel::Avx2) expected_kernel = kernel.avx2_dot;
    if (active_kernel_level() == KernelLevel::Avx512) expected_kernel = kernel.avx512_dot;
    EXPECT_EQ(f32_to_bits(got), f32_to_bits(expected_kernel(row.data(), act.bytes.data(), n)))
        << type_name(kernel.type) << " at level " << kernel_level_name(active_kernel_level());
    EXPECT_EQ(dot_kernel(kernel.type), expected_kernel) << type_name(kernel.type);
  }
}

// quant::dot_many is quant::dot per activation, bitwise, for every type at whatever level this
// process dispatches to (ctest also runs this capped at scalar and avx2).
TEST(QuantDispatch, DotManyIsBitwiseOneDotPerActivation) {
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* traits = type_traits_or_null(id);
    if (traits == nullptr || !traits->has_kernels) continue;
    const GgmlType type = traits->type;
    const int64_t n = 2560;
    const std::vector<uint8_t> row = random_row(type, n, id + 40);
    const size_t act_stride = (activation_row_bytes(type, n) + 63) / 64 * 64;
    for (int64_t n_acts : {int64_t(1), int64_t(2), int64_t(5), int64_t(8), int64_t(11)}) {
      std::vector<uint8_t> acts(act_stride * size_t(n_acts));
      for (int64_t t = 0; t < n_acts; ++t) {
        const testing::Activation act = make_activation(type, gaussian(n, uint32_t(t + 70)));
        std::memcpy(acts.data() + size_t(t) * act_stride, act.bytes.data(), act.bytes.size());
      }
      std::vector<float> out(static_cast<size_t>(n_acts));
      dot_many(type, row.data(), acts.data(), act_stride, n_acts, n, out.data(), 1);
      for (int64_t t = 0; t < n_acts; ++t) {
        const float want = dot(type, row.data(), acts.data() + size_t(t) * act_stride, n);
        ASSERT_EQ(f32_to_bits(out[size_t(t)]), f32_to_bits(want))
            << traits->name << " n_acts=" << n_acts << " t=" << t << " at level "
            << kernel_level_name(active_kernel_level());
      }
    }
  }
}

}  // namespace
}  // namespace strata::quant
