// Parity with llama.cpp itself: strata's reference dequantizers against ggml's own to_float for
// the low-bit IQ types, bit for bit, on random blocks. ggml comes from the prebuilt
// libggml-base.so of the llama.cpp peer (docs/llama-cpp-parity.md; never built or vendored here):
// $STRATA_GGML_BASE_LIB, else tools/llama_cpp/node_modules/... of this checkout. Without it the
// test skips and says why. ggml_type_traits is read with the layout of llama.cpp 2025 releases
// (name, blck_size, blck_size_interleave, type_size, is_quantized, to_float, ...); the name, size
// and block size are checked first, so a different layout skips instead of misreading.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "iq_lowbit_test_util.h"
#include "quant/quant.h"

namespace strata::quant {
namespace {

struct GgmlTypeTraits {
  const char* type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  void (*to_float)(const void* x, float* y, int64_t k);
};

std::string ggml_library_path() {
  if (const char* path = std::getenv("STRATA_GGML_BASE_LIB"); path != nullptr && *path != '\0')
    return path;
  return std::string(STRATA_SOURCE_DIR) +
         "/tools/llama_cpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so";
}

TEST(IqLowbitGgmlParity, DequantizeMatchesGgmlBitForBit) {
  const std::string path = ggml_library_path();
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "llama.cpp's libggml-base.so not found at " << path;
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) GTEST_SKIP() << "dlopen " << path << ": " << dlerror();
  using TraitsFn = const GgmlTypeTraits* (*)(int);
  const auto traits_of = reinterpret_cast<TraitsFn>(dlsym(library, "ggml_get_type_traits"));
  ASSERT_NE(traits_of, nullptr) << dlerror();
  for (GgmlType type : testing::kIqLowbitTypes) {
    const GgmlTypeTraits* traits = traits_of(static_cast<int>(type));
    ASSERT_NE(traits, nullptr);
    if (std::string(traits->type_name) != type_name(type) || traits->blck_size != 256 ||
        traits->type_size != type_traits(type).block_bytes || traits->to_float == nullptr) {
      GTEST_SKIP() << "unexpected ggml_type_traits layout in " << path;
    }
    const int64_t n = 256 * 64;
    for (uint32_t seed = 0; seed < 4; ++seed) {
      const std::vector<uint8_t> row = testing::random_iq_row(type, n, 1000 + seed);
      std::vector<float> ours(n), theirs(n);
      ref::dequantize_row(type, row.data(), ours.data(), n);
      traits->to_float(row.data(), theirs.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::memcmp(&ours[i], &theirs[i], 4), 0)
            << type_name(type) << " seed " << seed << " element " << i << ": " << ours[i] << " vs "
            << theirs[i];
      }
    }
  }
  dlclose(library);
}

}  // namespace
}  // namespace strata::quant
