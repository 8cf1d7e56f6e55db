// What the two llama.cpp parity tests (llama_cpp_parity_test.cpp, f32 files;
// llama_cpp_quantized_parity_test.cpp, files quantized by llama.cpp) share: running
// tools/llama_cpp/dump_logprobs.mjs (node-llama-cpp's prebuilt CPU libllama) on a GGUF, reading
// what it writes, and the log-softmax of strata's logits that its rows are compared with.
//
// Compile with STRATA_NODE_EXECUTABLE and STRATA_LLAMA_CPP_TOOL_DIR defined (tests/llama_cpp/
// CMakeLists.txt). Failures are reported through GoogleTest's EXPECT_* (the caller's test fails
// and goes on); nothing throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace strata::testing_llama_cpp {

// The whole file as bytes ("" when it cannot be read).
std::string read_text(const std::filesystem::path& path);

// Why node or tools/llama_cpp/node_modules cannot run here, or "" when they can (each test adds
// its own check of the prebuilt binary it needs).
std::string node_llama_cpp_unavailable_reason();

// Row-wise log-softmax in double (the reference side of the comparison).
std::vector<double> log_softmax_rows(const float* logits, size_t n_rows, size_t n_vocab);

// llama.cpp's log-probabilities, [prompts[i].size(), n_vocab] per prompt, from one run of the Node
// script on `gguf_path` (each prompt in a fresh context, the whole prompt in one batch), its files
// in `work_dir`. `label` names the run in failure messages; with `print_summary` the script's JSON
// summary is printed. Empty when the script failed.
std::vector<std::vector<float>> llama_cpp_logprobs(const std::filesystem::path& work_dir,
                                                   const std::string& gguf_path,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   size_t n_vocab, const std::string& label,
                                                   bool print_summary);

}  // namespace strata::testing_llama_cpp
