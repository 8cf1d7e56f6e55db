#include "compute/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "compute/cpu/work_estimate.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/fp16.h"

namespace strata::compute {
namespace {

std::vector<GgmlType> types_with_kernels() {
  std::vector<GgmlType> types;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* traits = type_traits_or_null(id);
    if (traits && traits->has_kernels) types.push_back(traits->type);
  }
  return types;
}

// n_out rows of n_in weights of `type`, each row `row_stride` bytes (padding filled with 0xAB so a
// kernel reading past a row would change results).
std::vector<std::byte> random_weights(GgmlType type, int64_t n_in, int64_t n_out, size_t row_stride,
                                      std::mt19937& rng) {
  const size_t row_size = row_bytes(type, n_in);
  std::vector<std::byte> data(row_stride * size_t(n_out), std::byte{0xAB});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    std::byte* dst = data.data() + size_t(o) * row_stride;
    if (type == GgmlType::IQ2_XS || !quant::has_quantizer(type)) {
      // No quantizer without an imatrix: any bit pattern is a valid block; fix d to a sane f16.
      for (size_t i = 0; i < row_size; ++i) dst[i] = std::byte(byte(rng));
      const size_t block_bytes = type_traits(type).block_bytes;
      for (size_t block = 0; block < row_size; block += block_bytes) {
        const uint16_t d = f32_to_f16(0.01f + 0.001f * float(byte(rng)));
        if (type == GgmlType::IQ1_M) {  // d is the top nibbles of the u16 words at bytes 48-55
          for (size_t word = 0; word < 4; ++word) {
            uint16_t v;
            std::memcpy(&v, dst + block + 48 + 2 * word, 2);
            v = uint16_t((v & 0x0fff) | (((d >> (4 * word)) & 15) << 12));
            std::memcpy(dst + block + 48 + 2 * word, &v, 2);
          }
        } else {
          std::memcpy(dst + block, &d, 2);
        }
      }
    } else {
      for (float& value : row) value = normal(rng);
      quant::quantize_row(type, row.data(), dst, n_in);
    }
  }
  return data;
}

std::vector<float> random_inputs(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& value : x) value = normal(rng);
  return x;
}

// y[t, o] the way the contract defines it: one dot against that row's own activation.
std::vector<float> expected_by_direct_dots(const WeightMatrix& w, const float* x, int64_t n_rows) {
  std::vector<std::byte> activation(quant::activation_row_bytes(w.type, w.n_in));
  std::vector<float> y(static_cast<size_t>(n_rows * w.n_out));
  for (int64_t t = 0; t < n_rows; ++t) {
    quant::quantize_activation(w.type, x + t * w.n_in, activation.data(), w.n_in);
    for (int64_t o = 0; o < w.n_out; ++o) {
      y[size_t(t * w.n_out + o)] = quant::dot(w.type, w.row(o), activation.data(), w.n_in);
    }
  }
  return y;
}

TEST(Matmul, KernelTypesIncludeTheNineFormats) {
  const std::vector<GgmlType> types = types_with_kernels();
  for (GgmlType expected :
       {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
        GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q2_K, GgmlType::IQ2_XS}) {
    EXPECT_NE(std::find(types.begin(), types.end(), expected), types.end()) << type_name(expected);
  }
}

// Against a double-precision reference on dequantized weights and the f32 input.
// Tolerance: the only approximation besides fp32 rounding is the activation quantization (Q8_0 or
// Q8_K: every x_i is rounded to a step of amax_block/127, error <= half a step), so
// |y - y_ref| <= Σ_i |w_i|·step_i/2, plus fp32 accumulation (n_in·2^-24·Σ|w_i x_i|).
TEST(Matmul, MatchesDoublePrecisionReferenceForEveryKernelType) {
  std::mt19937 rng(42);
  ThreadPool pool(2);
  const int64_t n_in = 512;
  const int64_t n_out = 45;
  const int64_t n_rows = 3;
  const std::vector<float> x = random_inputs(n_in * n_rows, rng);
  for (GgmlType type : types_with_kernels()) {
    const std::vector<std::byte> data =
        random_weights(type, n_in, n_out, row_bytes(type, n_in), rng);
    const WeightMatrix w = WeightMatrix::dense(type, n_in, n_out, data.data());
    std::vector<float> y(static_cast<size_t>(n_rows * n_out));
    matmul(pool, w, x.data(), n_rows, y.data());

    const bool quantized_activation = quant::activation_type(type) != GgmlType::F32;
    const int64_t act_block = quant::activation_type(type) == GgmlType::Q8_0 ? 32 : 256;
    std::vector<float> weights(static_cast<size_t>(n_in));
    for (int64_t o = 0; o < n_out; ++o) {
      quant::ref::dequantize_row(type, w.row(o), weights.data(), n_in);
      for (int64_t t = 0; t < n_rows; ++t) {
        const float* xt = x.data() + t * n_in;
        double reference = 0;
        double magnitude = 0;
        double activation_bound = 0;
        for (int64_t b = 0; b < n_in; b += act_block) {
          float amax = 0;
          for (int64_t i = b; i < b + act_block; ++i) amax = std::max(amax, std::fabs(xt[i]));
          const double half_step = quantized_activation ? double(amax) / 127.0 / 2.0 : 0.0;
          for (int64_t i = b; i < b + act_block; ++i) {
            reference += double(weights[size_t(i)]) * double(xt[i]);
            magnitude += std::fabs(double(weights[size_t(i)]) * double(xt[i]));
            activation_bound += std::fabs(double(weights[size_t(i)])) * half_step;
          }
        }
        const double tolerance =
            activation_bound * 1.001 + double(n_in) * 0x1p-24 * magnitude + 1e-30;
        ASSERT_NEAR(y[size_t(t * n_out + o)], reference, tolerance)
            << type_name(type) << " o " << o << " t " << t;
      }
    }
  }
}

// Window identity: y[t, o] is bitwise quant::dot of that row alone, for every window size, offset
// of the row in the window, and thread count, with the pool's inline rule off (every product
// split over the threads) and always on (every product on the caller, in the threads' tiling).
TEST(Matmul, WindowIdentityIsBitwiseForEverySizeAndThreadCount) {
  std::mt19937 rng(7);
  const int64_t n_in = 1024;
  const int64_t n_out = 300;  // several output tiles for every type, not a multiple of any
  const int64_t max_rows = 17;
  const std::vector<float> x = random_inputs(n_in * max_rows, rng);
  for (GgmlType type : types_with_kernels()) {
    const std::vector<std::byte> data =
        random_weights(type, n_in, n_out, row_bytes(type, n_in), rng);
    const WeightMatrix w = WeightMatrix::dense(type, n_in, n_out, data.data());
    const std::vector<float> expected = expected_by_direct_dots(w, x.data(), max_rows);
    // Windows under 2 rows a thread convert their rows in the tiles' hand-out (run_phases), the
    // others before it, split over the pool: 7 and 16 threads take both for every window here.
    for (int n_threads : {1, 2, 3, 7, 16})
      for (double inline_work_ns : {ThreadPool::kInlineNever, ThreadPool::kInlineAlways}) {
        ThreadPool pool(n_threads, ThreadPool::kDefaultWorkerSpinMicros, inline_work_ns);
        for (int64_t n_rows : {1, 2, 3, 5, 8, 17}) {
          for (int64_t first_row : {int64_t(0), max_rows - n_rows, (max_rows - n_rows) / 2}) {
            std::vector<float> y(static_cast<size_t>(n_rows * n_out));
            matmul(pool, w, x.data() + first_row * n_in, n_rows, y.data());
            for (int64_t t = 0; t < n_rows; ++t) {
              for (int64_t o = 0; o < n_out; ++o) {
                const float got = y[size_t(t * n_out + o)];
                const float want = expected[size_t((first_row + t) * n_out + o)];
                ASSERT_EQ(f32_to_bits(got), f32_to_bits(want))
                    << type_name(type) << " threads " << n_threads << " inline_work_ns "
                    << inline_work_ns << " n_rows " << n_rows << " row " << first_row + t << " o "
                    << o;
              }
            }
          }
        }
      }
  }
}

// Rows of one block take dot_tile even for a single activation row (compute/cpu/matmul.cpp): the
// default model's rank-32 up projections and expert downs. Every type's one-row and few-row windows
// must be bitwise the direct dots, on 1 and 2 threads.
TEST(Matmul, OneBlockRowsAreBitwiseTheDirectDotsForOneRowAndMore) {
  std::mt19937 rng(17);
  const int64_t n_out = 300;  // 18 groups of 16 outputs and a tail
  const int64_t max_rows = 5;
  for (GgmlType type : types_with_kernels()) {
    const int64_t n_in = type_traits(type).block_elems;
    const std::vector<float> x = random_inputs(n_in * max_rows, rng);
    const std::vector<std::byte> data =
        random_weights(type, n_in, n_out, row_bytes(type, n_in), rng);
    const WeightMatrix w = WeightMatrix::dense(type, n_in, n_out, data.data());
    const std::vector<float> expected = expected_by_direct_dots(w, x.data(), max_rows);
    for (int n_threads : {1, 2}) {
      ThreadPool pool(n_threads, ThreadPool::kDefaultWorkerSpinMicros, ThreadPool::kInlineNever);
      for (int64_t n_rows : {1, 2, 5}) {
        const int64_t first_row = max_rows - n_rows;
        std::vector<float> y(static_cast<size_t>(n_rows * n_out));
        matmul(pool, w, x.data() + first_row * n_in, n_rows, y.data());
        for (int64_t t = 0; t < n_rows; ++t)
          for (int64_t o = 0; o < n_out; ++o)
            ASSERT_EQ(f32_to_bits(y[size_t(t * n_out + o)]),
                      f32_to_bits(expected[size_t((first_row + t) * n_out + o)]))
                << type_name(type) << " threads " << n_threads << " n_rows " << n_rows << " row "
                << first_row + t << " o " << o;
      }
    }
  }
}

// The inline rule engages on matmul: with the threshold between a small product's estimate and a
// large one's, the small one (alone, in matmul_many, in matmul_rows_each) runs with no hand-out to
// the workers, the large one is still split, and both give the bits of a one-thread pool.
TEST(Matmul, InlineRuleRunsSmallProductsOnTheCallerAndSplitsLargeOnes) {
  std::mt19937 rng(11);
  const GgmlType type = GgmlType::Q8_0;
  const int64_t n_in = 256, small_out = 256, large_out = 8192;  // 3 and 69 tiles on 2 threads
  const std::vector<std::byte> small_data =
      random_weights(type, n_in, small_out, row_bytes(type, n_in), rng);
  const std::vector<std::byte> large_data =
      random_weights(type, n_in, large_out, row_bytes(type, n_in), rng);
  const WeightMatrix small = WeightMatrix::dense(type, n_in, small_out, small_data.data());
  const WeightMatrix large = WeightMatrix::dense(type, n_in, large_out, large_data.data());
  const std::vector<float> x = random_inputs(n_in, rng);
  const double small_ns = dot_work_ns(type, small_out, n_in);
  const double large_ns = dot_work_ns(type, large_out, n_in);
  ASSERT_GT(small_ns, 0);
  ASSERT_NEAR(large_ns / small_ns, 32.0, 1e-9);  // linear in the outputs
  ThreadPool one(1);
  std::vector<float> small_ref(static_cast<size_t>(small_out));
  std::vector<float> large_ref(static_cast<size_t>(large_out));
  matvec(one, small, x.data(), small_ref.data());
  matvec(one, large, x.data(), large_ref.data());

  ThreadPool pool(2, ThreadPool::kDefaultWorkerSpinMicros, std::sqrt(small_ns * large_ns));
  std::vector<float> y_small(static_cast<size_t>(small_out));
  std::vector<float> y_large(static_cast<size_t>(large_out));
  matvec(pool, small, x.data(), y_small.data());
  EXPECT_EQ(pool.jobs_run(), 0u) << "the small product was handed out";
  EXPECT_EQ(pool.jobs_inline(), 1u);
  matvec(pool, large, x.data(), y_large.data());
  EXPECT_EQ(pool.jobs_run(), 1u) << "the large product ran on the caller";
  // Two small products together (matmul_many: the estimates add up, 2x small stays below).
  std::vector<float> y_small2(static_cast<size_t>(small_out));
  const MatmulProduct two_small[] = {{&small, y_small2.data()}, {&small, y_small.data()}};
  matmul_many(pool, two_small, x.data(), 1);
  EXPECT_EQ(pool.jobs_run(), 1u);
  // Converted rows, one product each (the routed experts' path).
  std::vector<std::byte> converted(activation_row_stride(type, n_in));
  const ActivationRows rows =
      quantize_activation_rows(pool, type, x.data(), 1, n_in, converted.data());
  std::vector<float> y_rows(static_cast<size_t>(small_out));
  const RowsProduct each[] = {{&small, y_rows.data(), rows}};
  matmul_rows_each(pool, each);
  EXPECT_EQ(pool.jobs_run(), 1u);
  EXPECT_EQ(pool.jobs_inline(), 3u);
  for (const std::vector<float>* y : {&y_small, &y_small2, &y_rows})
    for (int64_t o = 0; o < small_out; ++o)
      ASSERT_EQ(f32_to_bits((*y)[size_t(o)]), f32_to_bits(small_ref[size_t(o)])) << "o " << o;
  for (int64_t o = 0; o < large_out; ++o)
    ASSERT_EQ(f32_to_bits(y_large[size_t(o)]), f32_to_bits(large_ref[size_t(o)])) << "o " << o;
}

// Every type with kernels has a measured rate, and an estimate grows with the work.
TEST(Matmul, WorkEstimatesArePositiveForEveryKernelType) {
  for (GgmlType type : types_with_kernels()) {
    const double one_row = dot_work_ns(type, 1, 1024);
    EXPECT_GT(one_row, 0) << type_name(type);
    EXPECT_TRUE(std::isfinite(one_row)) << type_name(type);
    EXPECT_DOUBLE_EQ(dot_work_ns(type, 8, 1024), 8 * one_row) << type_name(type);
  }
  EXPECT_GT(f32_loop_work_ns(1000), 0);
  EXPECT_TRUE(std::isinf(dot_work_ns(GgmlType::I32, 1, 1024))) << "no kernels: never small";
}

// A window larger than one activation row tile (256 KiB of activations) must still give each row
// exactly its single-row result.
TEST(Matmul, WindowLargerThanOneRowTileKeepsIdentity) {
  std::mt19937 rng(3);
  const int64_t n_in = 4096;  // f32 rows: 16 KiB, so 16 rows per tile; Q8_0 rows: ~60 per tile
  const int64_t n_out = 24;
  const int64_t n_rows = 70;
  const std::vector<float> x = random_inputs(n_in * n_rows, rng);
  ThreadPool pool(2);
  for (GgmlType type : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::IQ2_XS}) {
    const std::vector<std::byte> data =
        random_weights(type, n_in, n_out, row_bytes(type, n_in), rng);
    const WeightMatrix w = WeightMatrix::dense(type, n_in, n_out, data.data());
    const std::vector<float> expected = expected_by_direct_dots(w, x.data(), n_rows);
    std::vector<float> y(static_cast<size_t>(n_rows * n_out));
    matmul(pool, w, x.data(), n_rows, y.data());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(f32_to_bits(y[i]), f32_to_bits(expected[i])) << type_name(type) << " at " << i;
    }
  }
}

// The windows speculative verify and prefill use (T = 1 .. 9 rows: one pass of the
// multi-activation kernels and the pass after it), on the flagship's expert width and on a strided
// view whose rows start at every 2-byte offset: each output equals a matvec of its row alone.
TEST(Matmul, WindowEqualsOneMatvecPerRow) {
  std::mt19937 rng(11);
  const int64_t n_out = 45;
  ThreadPool pool(2);
  for (GgmlType type : {GgmlType::IQ2_XS, GgmlType::Q4_K, GgmlType::Q8_0}) {
    for (int64_t n_in : {int64_t(2560), int64_t(4096)}) {
      const std::vector<float> x = random_inputs(n_in * 9, rng);
      const size_t stride = row_bytes(type, n_in) + 2;
      const std::vector<std::byte> data = random_weights(type, n_in, n_out, stride, rng);
      const WeightMatrix w{type, n_in, n_out, data.data(), stride};
      std::vector<float> single(static_cast<size_t>(9 * n_out));
      for (int64_t t = 0; t < 9; ++t) {
        matvec(pool, w, x.data() + t * n_in, single.data() + t * n_out);
      }
      for (int64_t n_rows = 1; n_rows <= 9; ++n_rows) {
        std::vector<float> y(static_cast<size_t>(n_rows * n_out));
        matmul(pool, w, x.data() + (9 - n_rows) * n_in, n_rows, y.data());
        for (int64_t t = 0; t < n_rows; ++t) {
          for (int64_t o = 0; o < n_out; ++o) {
            ASSERT_EQ(f32_to_bits(y[size_t(t * n_out + o)]),
                      f32_to_bits(single[size_t((9 - n_rows + t) * n_out + o)]))
                << type_name(type) << " n_in " << n_in << " n_rows " << n_rows << " t " << t
                << " o " << o;
          }
        }
      }
    }
  }
}

TEST(Matmul, StridedViewEqualsDenseAndMatvecEqualsOneRow) {
  std::mt19937 rng(5);
  const int64_t n_in = 256;
  const int64_t n_out = 33;
  const std::vector<float> x = random_inputs(n_in, rng);
  ThreadPool pool(3);
  for (GgmlType type : types_with_kernels()) {
    const size_t dense_stride = row_bytes(type, n_in);
    const size_t padded_stride = dense_stride + 72;  // padding bytes are garbage (0xAB)
    const std::vector<std::byte> padded = random_weights(type, n_in, n_out, padded_stride, rng);
    std::vector<std::byte> dense(dense_stride * size_t(n_out));
    for (int64_t o = 0; o < n_out; ++o) {
      std::memcpy(dense.data() + size_t(o) * dense_stride,
                  padded.data() + size_t(o) * padded_stride, dense_stride);
    }
    const WeightMatrix strided{type, n_in, n_out, padded.data(), padded_stride};
    const WeightMatrix packed = WeightMatrix::dense(type, n_in, n_out, dense.data());
    std::vector<float> y_strided(static_cast<size_t>(n_out));
    std::vector<float> y_dense(static_cast<size_t>(n_out));
    std::vector<float> y_own_scratch(static_cast<size_t>(n_out));
    matmul(pool, strided, x.data(), 1, y_strided.data());
    matvec(pool, packed, x.data(), y_dense.data());
    ScratchBuffer scratch;
    matmul(pool, packed, x.data(), 1, y_own_scratch.data(), scratch);
    for (int64_t o = 0; o < n_out; ++o) {
      ASSERT_EQ(f32_to_bits(y_strided[size_t(o)]), f32_to_bits(y_dense[size_t(o)]))
          << type_name(type);
      ASSERT_EQ(f32_to_bits(y_own_scratch[size_t(o)]), f32_to_bits(y_dense[size_t(o)]))
          << type_name(type);
    }
  }
}

TEST(Matmul, SteadyStateReusesScratch) {
  std::mt19937 rng(9);
  const int64_t n_in = 512;
  const int64_t n_out = 16;
  const std::vector<float> x = random_inputs(n_in * 8, rng);
  const std::vector<std::byte> data =
      random_weights(GgmlType::Q4_K, n_in, n_out, row_bytes(GgmlType::Q4_K, n_in), rng);
  const WeightMatrix w = WeightMatrix::dense(GgmlType::Q4_K, n_in, n_out, data.data());
  ThreadPool pool(2);
  std::vector<float> y(static_cast<size_t>(8 * n_out));
  matmul(pool, w, x.data(), 8, y.data());
  const size_t capacity = pool.scratch(0).capacity_bytes();
  EXPECT_GE(capacity, 8 * quant::activation_row_bytes(GgmlType::Q4_K, n_in));
  std::byte* buffer = pool.scratch(0).reserve(0);
  for (int64_t n_rows : {1, 8, 3}) matmul(pool, w, x.data(), n_rows, y.data());
  EXPECT_EQ(pool.scratch(0).capacity_bytes(), capacity);
  EXPECT_EQ(pool.scratch(0).reserve(0), buffer);
}

TEST(Matmul, NestedInsidePoolTaskUsesThatThreadsScratch) {
  std::mt19937 rng(13);
  const int64_t n_in = 256;
  const int64_t n_out = 40;
  const int64_t n_matrices = 6;
  const std::vector<float> x = random_inputs(n_in * 2, rng);
  std::vector<std::vector<std::byte>> datas;
  std::vector<WeightMatrix> matrices;
  for (int64_t m = 0; m < n_matrices; ++m) {
    datas.push_back(
        random_weights(GgmlType::Q2_K, n_in, n_out, row_bytes(GgmlType::Q2_K, n_in), rng));
  }
  for (auto& data : datas)
    matrices.push_back(WeightMatrix::dense(GgmlType::Q2_K, n_in, n_out, data.data()));
  ThreadPool pool(3);
  std::vector<float> y(static_cast<size_t>(n_matrices * 2 * n_out));
  // Like an MoE layer parallel over experts: each task runs a whole matmul inline.
  pool.parallel_for(n_matrices, [&](int64_t begin, int64_t end, int) {
    for (int64_t m = begin; m < end; ++m) {
      matmul(pool, matrices[size_t(m)], x.data(), 2, y.data() + m * 2 * n_out);
    }
  });
  for (int64_t m = 0; m < n_matrices; ++m) {
    const std::vector<float> expected = expected_by_direct_dots(matrices[size_t(m)], x.data(), 2);
    for (int64_t i = 0; i < 2 * n_out; ++i) {
      ASSERT_EQ(f32_to_bits(y[size_t(m * 2 * n_out + i)]), f32_to_bits(expected[size_t(i)]));
    }
  }
}

// matmul_many (products sharing one conversion per activation format and one parallel_for) and
// matmul_rows (pre-converted, gathered rows) give every output bitwise what one matmul per
// product gives, for mixed weight types (Q8_K, Q8_0 and f32 activation formats in one call),
// windows of 1 .. 13 rows and 1 and 3 threads.
TEST(Matmul, ManyProductsAndConvertedRowsEqualOneMatmulEach) {
  std::mt19937 rng(77);
  const int64_t n_in = 512;
  const GgmlType types[] = {GgmlType::Q4_K, GgmlType::Q8_0,   GgmlType::F32,
                            GgmlType::Q6_K, GgmlType::IQ2_XS, GgmlType::Q5_0};
  const int64_t n_outs[] = {37, 5, 64, 130, 12, 33};
  std::vector<std::vector<std::byte>> storage;
  std::vector<WeightMatrix> matrices;
  for (size_t i = 0; i < std::size(types); ++i) {
    const size_t stride = row_bytes(types[i], n_in) + 2 * (i % 2);
    storage.push_back(random_weights(types[i], n_in, n_outs[i], stride, rng));
    matrices.push_back(WeightMatrix{types[i], n_in, n_outs[i], storage.back().data(), stride});
  }
  for (int threads : {1, 3, 16})
  for (const bool chains : {false, true}) {  // a few rows' conversion in the tiles' hand-out or before it
    ThreadPool pool(threads);
    pool.set_phase_chains(chains);
    for (int64_t n_rows : {1, 2, 5, 13}) {
      const std::vector<float> x = random_inputs(n_rows * n_in, rng);
      std::vector<std::vector<float>> want, got;
      std::vector<MatmulProduct> products;
      for (const WeightMatrix& w : matrices) {
        want.emplace_back(size_t(n_rows * w.n_out));
        matmul(pool, w, x.data(), n_rows, want.back().data());
        got.emplace_back(size_t(n_rows * w.n_out), -1.0f);
      }
      for (size_t i = 0; i < matrices.size(); ++i)
        products.push_back({&matrices[i], got[i].data()});
      matmul_many(pool, products, x.data(), n_rows);
      for (size_t i = 0; i < matrices.size(); ++i)
        EXPECT_EQ(0, std::memcmp(want[i].data(), got[i].data(), want[i].size() * sizeof(float)))
            << type_traits(types[i]).name << " rows " << n_rows << " threads " << threads << " chains " << chains;

      // Converted once, rows gathered in reverse order: the Q8_K products of matrices 0 and 3.
      const size_t stride = activation_row_stride(GgmlType::Q4_K, n_in);
      std::vector<std::byte> converted(stride * size_t(n_rows)), gathered(converted.size());
      const ActivationRows all =
          quantize_activation_rows(pool, GgmlType::Q4_K, x.data(), n_rows, n_in, converted.data());
      for (int64_t t = 0; t < n_rows; ++t)
        std::memcpy(gathered.data() + size_t(t) * stride,
                    converted.data() + size_t(n_rows - 1 - t) * stride, stride);
      const ActivationRows reversed{all.activation_type, n_in, n_rows, gathered.data(), stride};
      std::vector<float> y0(size_t(n_rows * n_outs[0])), y3(size_t(n_rows * n_outs[3]));
      const MatmulProduct k_products[] = {{&matrices[0], y0.data()}, {&matrices[3], y3.data()}};
      matmul_rows(pool, k_products, reversed);
      for (int64_t t = 0; t < n_rows; ++t) {
        const int64_t source = n_rows - 1 - t;
        EXPECT_EQ(0, std::memcmp(y0.data() + t * n_outs[0], want[0].data() + source * n_outs[0],
                                 size_t(n_outs[0]) * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(y3.data() + t * n_outs[3], want[3].data() + source * n_outs[3],
                                 size_t(n_outs[3]) * sizeof(float)));
      }
      // A weight type whose activation format differs from the rows' is refused.
      std::vector<float> y1(size_t(n_rows * n_outs[1]));
      const MatmulProduct wrong[] = {{&matrices[1], y1.data()}};
      EXPECT_THROW(matmul_rows(pool, wrong, reversed), Error);
    }
  }
}

// matmul_rows_range: any output range, on the calling thread, gives matmul's bits for those
// outputs and leaves every other element of y alone; covering [0, n_out) in uneven pieces gives
// the whole product. Odd starts and lengths (the tile kernels pair weight rows), one-block rows,
// a window longer than one row tile. Ranges outside [0, n_out] throw.
TEST(Matmul, OutputRangesAreBitwiseTheWholeProduct) {
  std::mt19937 rng(91);
  struct Shape {
    GgmlType type;
    int64_t n_in, n_out;
  };
  const Shape shapes[] = {{GgmlType::Q8_0, 128, 96},   {GgmlType::Q8_0, 32, 70},
                          {GgmlType::Q4_K, 512, 37},   {GgmlType::Q6_K, 256, 20},
                          {GgmlType::IQ2_XS, 256, 33}, {GgmlType::Q5_0, 64, 17}};
  ThreadPool pool(3);
  for (const Shape& shape : shapes) {
    const size_t stride = row_bytes(shape.type, shape.n_in);
    const std::vector<std::byte> weights =
        random_weights(shape.type, shape.n_in, shape.n_out, stride, rng);
    const WeightMatrix w{shape.type, shape.n_in, shape.n_out, weights.data(), stride};
    for (int64_t n_rows : {1, 2, 5, 9}) {
      const std::vector<float> x = random_inputs(n_rows * shape.n_in, rng);
      std::vector<float> want(size_t(n_rows * shape.n_out));
      matmul(pool, w, x.data(), n_rows, want.data());
      std::vector<std::byte> converted(activation_row_stride(shape.type, shape.n_in) *
                                       size_t(n_rows));
      const ActivationRows rows = quantize_activation_rows(pool, shape.type, x.data(), n_rows,
                                                           shape.n_in, converted.data());
      std::uniform_int_distribution<int64_t> cut(0, shape.n_out);
      for (int round = 0; round < 8; ++round) {
        int64_t a = cut(rng), b = cut(rng);
        if (a > b) std::swap(a, b);
        std::vector<float> y(want.size(), -7.0f);
        matmul_rows_range(w, rows, a, b, y.data());
        for (int64_t t = 0; t < n_rows; ++t)
          for (int64_t o = 0; o < shape.n_out; ++o) {
            const size_t i = size_t(t * shape.n_out + o);
            if (o >= a && o < b)
              ASSERT_EQ(0, std::memcmp(&y[i], &want[i], sizeof(float)))
                  << type_traits(shape.type).name << " rows " << n_rows << " [" << a << ", " << b
                  << ") output " << o;
            else
              ASSERT_EQ(y[i], -7.0f) << "outside the range: output " << o;
          }
      }
      std::vector<float> pieces(want.size(), -7.0f);
      for (int64_t o = 0, step = 1; o < shape.n_out; o += step, step = step % 5 + 1)
        matmul_rows_range(w, rows, o, std::min(shape.n_out, o + step), pieces.data());
      EXPECT_EQ(0, std::memcmp(pieces.data(), want.data(), want.size() * sizeof(float)));
      EXPECT_THROW(matmul_rows_range(w, rows, -1, 2, pieces.data()), Error);
      EXPECT_THROW(matmul_rows_range(w, rows, 0, shape.n_out + 1, pieces.data()), Error);
      EXPECT_THROW(matmul_rows_range(w, rows, 3, 2, pieces.data()), Error);
    }
  }
}

// The decode row's software prefetch (matmul.h weight_prefetch_bytes) is a hint: every distance,
// from off to more rows than a thread's range holds, gives the same bits, on one thread and on
// several, with padded rows too; a distance past the bound is refused.
TEST(Matmul, DecodeRowPrefetchNeverChangesOutputs) {
  std::mt19937 rng(17);
  struct Shape {
    GgmlType type;
    int64_t n_in, n_out;
    size_t padding;
  };
  const Shape shapes[] = {{GgmlType::Q4_K, 512, 301, 0},  {GgmlType::IQ2_XS, 1024, 97, 0},
                          {GgmlType::Q6_K, 256, 150, 48}, {GgmlType::F32, 64, 77, 0},
                          {GgmlType::Q8_0, 256, 64, 0}};
  const size_t saved = weight_prefetch_bytes();
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (const Shape& shape : shapes) {
      const size_t stride = row_bytes(shape.type, shape.n_in) + shape.padding;
      const std::vector<std::byte> weights = random_weights(shape.type, shape.n_in, shape.n_out, stride, rng);
      const WeightMatrix w{shape.type, shape.n_in, shape.n_out, weights.data(), stride};
      const std::vector<float> x = random_inputs(shape.n_in, rng);
      set_weight_prefetch_bytes(0);
      std::vector<float> want(size_t(shape.n_out));
      matvec(pool, w, x.data(), want.data());
      for (size_t bytes : {size_t(1), size_t(64), size_t(2048), size_t(1) << 20}) {
        set_weight_prefetch_bytes(bytes);
        EXPECT_EQ(weight_prefetch_bytes(), bytes);
        std::vector<float> y(want.size(), -7.0f);
        matvec(pool, w, x.data(), y.data());
        EXPECT_EQ(0, std::memcmp(y.data(), want.data(), want.size() * sizeof(float)))
            << type_traits(shape.type).name << " prefetch " << bytes << " bytes, " << threads << " threads";
      }
    }
  }
  EXPECT_THROW(set_weight_prefetch_bytes((size_t(1) << 20) + 1), Error);
  set_weight_prefetch_bytes(saved);
}

TEST(Matmul, RejectsBadShapes) {
  ThreadPool pool(1);
  std::vector<std::byte> data(4096);
  std::vector<float> x(512);
  std::vector<float> y(16);
  // n_in not a multiple of the block size.
  EXPECT_THROW(
      matmul(pool, WeightMatrix{GgmlType::Q4_K, 100, 1, data.data(), 144}, x.data(), 1, y.data()),
      Error);
  // Stride smaller than a row.
  EXPECT_THROW(
      matmul(pool, WeightMatrix{GgmlType::Q8_0, 64, 2, data.data(), 60}, x.data(), 1, y.data()),
      Error);
  // A type without kernels.
  EXPECT_THROW(matmul(pool, WeightMatrix::dense(GgmlType::TQ2_0, 256, 1, data.data()), x.data(), 1,
                      y.data()),
               Error);
  // Null data with work to do.
  EXPECT_THROW(matmul(pool, WeightMatrix{GgmlType::F32, 4, 2, nullptr, 16}, x.data(), 1, y.data()),
               Error);
  // Nothing to do: no throw, nothing written.
  y[0] = 123.0f;
  matmul(pool, WeightMatrix{GgmlType::F32, 4, 2, data.data(), 16}, x.data(), 0, y.data());
  EXPECT_EQ(y[0], 123.0f);
}

}  // namespace
}  // namespace strata::compute
