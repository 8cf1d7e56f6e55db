// Reads a reference array written by tools/*.py (raw little-endian f32, no header) for the tests
// that compare against it. Header-only so any test binary can use it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

namespace strata::test_support {

// `expected` floats from `path`; a missing or short file fails the calling test (and the missing
// values read as 0).
inline std::vector<float> read_f32_file(const std::filesystem::path& path, size_t expected) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::vector<float> values(expected);
  in.read(reinterpret_cast<char*>(values.data()), std::streamsize(expected * sizeof(float)));
  EXPECT_EQ(size_t(in.gcount()), expected * sizeof(float)) << path;
  return values;
}

}  // namespace strata::test_support
