// Tensor tables by hand for the tests of the page-range planners (mapping advice, resident
// weights): only the name and the byte range matter to them.
#pragma once

#include <cstdint>
#include <string>

#include "gguf/gguf.h"

namespace strata::test_support {

inline constexpr uint64_t kPage = 4096;

inline TensorInfo tensor(const std::string& name, uint64_t offset, uint64_t n_bytes) {
  TensorInfo t;
  t.name = name;
  t.file_offset = offset;
  t.n_bytes = n_bytes;
  return t;
}

}  // namespace strata::test_support
