// Paths of the committed transformers fixtures: tests/data/models/<arch>/model-f32.gguf (made by
// tools/fixtures; see docs/fixtures.md). Header-only; needs STRATA_TEST_DATA_DIR from the test target.
#pragma once

#include <string>

namespace strata::test_support {

inline std::string fixture_model_gguf(const std::string& arch) {
  return std::string(STRATA_TEST_DATA_DIR) + "/models/" + arch + "/model-f32.gguf";
}

}  // namespace strata::test_support
