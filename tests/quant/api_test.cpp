// The public quant API's contracts: activation formats, sizes, and errors for bad input.
#include <gtest/gtest.h>

#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "util/error.h"

namespace strata::quant {
namespace {

TEST(QuantApi, TraitsTableMatchesBlockLayouts) {
  auto check = [](GgmlType type, int64_t elems, size_t bytes) {
    EXPECT_EQ(type_traits(type).block_elems, elems) << type_name(type);
    EXPECT_EQ(type_traits(type).block_bytes, bytes) << type_name(type);
    EXPECT_TRUE(type_traits(type).has_kernels || type == GgmlType::Q8_K) << type_name(type);
  };
  check(GgmlType::Q8_0, 32, sizeof(BlockQ8_0));
  check(GgmlType::Q4_0, 32, sizeof(BlockQ4_0));
  check(GgmlType::Q2_K, 256, sizeof(BlockQ2_K));
  check(GgmlType::Q4_K, 256, sizeof(BlockQ4_K));
  check(GgmlType::Q6_K, 256, sizeof(BlockQ6_K));
  check(GgmlType::IQ2_XS, 256, sizeof(BlockIQ2_XS));
  check(GgmlType::Q8_K, 256, sizeof(BlockQ8_K));
  check(GgmlType::F32, 1, 4);
  check(GgmlType::F16, 1, 2);
  check(GgmlType::BF16, 1, 2);
}

TEST(QuantApi, ActivationFormats) {
  EXPECT_EQ(activation_type(GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(activation_type(GgmlType::F16), GgmlType::F32);
  EXPECT_EQ(activation_type(GgmlType::BF16), GgmlType::F32);
  EXPECT_EQ(activation_type(GgmlType::Q8_0), GgmlType::Q8_0);
  EXPECT_EQ(activation_type(GgmlType::Q4_0), GgmlType::Q8_0);
  EXPECT_EQ(activation_type(GgmlType::Q2_K), GgmlType::Q8_K);
  EXPECT_EQ(activation_type(GgmlType::Q4_K), GgmlType::Q8_K);
  EXPECT_EQ(activation_type(GgmlType::Q6_K), GgmlType::Q8_K);
  EXPECT_EQ(activation_type(GgmlType::IQ2_XS), GgmlType::Q8_K);
  EXPECT_EQ(activation_row_bytes(GgmlType::BF16, 100), 400u);
  EXPECT_EQ(activation_row_bytes(GgmlType::Q4_0, 640), 20u * 34u);
  EXPECT_EQ(activation_row_bytes(GgmlType::IQ2_XS, 2560), 10u * 292u);
  EXPECT_THROW(activation_type(GgmlType::TQ2_0), Error);
}

TEST(QuantApi, TypesWithoutKernelsAreRefusedByName) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buffer(1024);
  try {
    dequantize_row(GgmlType::TQ2_0, buffer.data(), x.data(), 256);
    FAIL() << "expected strata::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tq2_0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_row(GgmlType::TQ1_0, x.data(), buffer.data(), 256), Error);
  EXPECT_THROW(dot(GgmlType::Q8_1, buffer.data(), buffer.data(), 256), Error);
  EXPECT_THROW(dot_kernel(GgmlType::MXFP4), Error);
  EXPECT_THROW(ref::dot(static_cast<GgmlType>(77), buffer.data(), buffer.data(), 256), Error);
}

TEST(QuantApi, LengthsMustBeBlockMultiples) {
  std::vector<float> x(512, 1.0f);
  std::vector<uint8_t> buffer(4096);
  try {
    quantize_row(GgmlType::Q4_K, x.data(), buffer.data(), 320);
    FAIL() << "expected strata::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("320"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(GgmlType::Q8_0, buffer.data(), x.data(), 33), Error);
  EXPECT_THROW(quantize_activation(GgmlType::Q2_K, x.data(), buffer.data(), 128), Error);
  EXPECT_THROW(ref::dot(GgmlType::Q4_0, buffer.data(), buffer.data(), 48), Error);
  EXPECT_NO_THROW(dot(GgmlType::F16, buffer.data(), x.data(), 3));
}

}  // namespace
}  // namespace strata::quant
