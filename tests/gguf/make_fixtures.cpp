// gguf_make_fixtures DATA_DIR — regenerates the committed GGUF test data with strata's writer:
//   DATA_DIR/gguf/tiny-qwen4exp.gguf   (the README example; see tests/data/gguf/README.md)
//   DATA_DIR/fuzz/gguf/*.gguf          (fuzz seed corpus: valid files and one-field corruptions)
// Output is deterministic; tests/gguf/gguf_fixture_test.cpp checks the committed files match.
#include <cstdio>
#include <exception>
#include <filesystem>

#include "gguf_test_util.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DATA_DIR   (e.g. tests/data)\n", argv[0]);
    return 2;
  }
  try {
    const std::string data_dir = argv[1];
    std::filesystem::create_directories(data_dir + "/gguf");
    std::filesystem::create_directories(data_dir + "/fuzz/gguf");
    strata::test::write_tiny_qwen4exp(data_dir + "/gguf/tiny-qwen4exp.gguf");
    strata::test::write_fuzz_seeds(data_dir + "/fuzz/gguf");
    std::printf("wrote %s/gguf/tiny-qwen4exp.gguf and %s/fuzz/gguf/\n", data_dir.c_str(), data_dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_make_fixtures: %s\n", e.what());
    return 1;
  }
  return 0;
}
