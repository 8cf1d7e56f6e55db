#include "llama_cpp_driver.h"

#include "../common/f32_file.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata::testing_llama_cpp {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string node_llama_cpp_unavailable_reason() {
  const fs::path tool_dir(STRATA_LLAMA_CPP_TOOL_DIR);
  if (std::string(STRATA_NODE_EXECUTABLE).empty()) {
    return "node was not found when CMake configured (install Node.js >= 20 and re-run cmake)";
  }
  if (!fs::is_regular_file(tool_dir / "node_modules/node-llama-cpp/package.json")) {
    return tool_dir.string() +
           "/node_modules is not installed: run scripts/install-llama-cpp-peer.sh";
  }
  return "";
}

std::vector<double> log_softmax_rows(const float* logits, size_t n_rows, size_t n_vocab) {
  std::vector<double> out(n_rows * n_vocab);
  for (size_t r = 0; r < n_rows; ++r) {
    const float* row = logits + r * n_vocab;
    const double max = *std::max_element(row, row + n_vocab);
    double sum = 0;
    for (size_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - max);
    const double log_sum = max + std::log(sum);
    for (size_t v = 0; v < n_vocab; ++v) out[r * n_vocab + v] = double(row[v]) - log_sum;
  }
  return out;
}

std::vector<std::vector<float>> llama_cpp_logprobs(const fs::path& work_dir,
                                                   const std::string& gguf_path,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   size_t n_vocab, const std::string& label,
                                                   bool print_summary) {
  std::string arguments;
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::string tokens;
    for (int32_t id : prompts[p]) tokens += fmt::format("{}{}", tokens.empty() ? "" : ",", id);
    arguments += fmt::format(" --tokens {} --out '{}'", tokens,
                             (work_dir / fmt::format("p{}.bin", p)).string());
  }
  const fs::path log = work_dir / "llama.log", info = work_dir / "llama.json";
  const std::string command = fmt::format(
      "'{}' '{}/dump_logprobs.mjs' --model '{}'{} --threads 2 >'{}' 2>'{}'", STRATA_NODE_EXECUTABLE,
      STRATA_LLAMA_CPP_TOOL_DIR, gguf_path, arguments, info.string(), log.string());
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << "llama.cpp (node-llama-cpp) failed on " << label << ":\n"
                       << read_text(log);
  if (status != 0) return {};
  const nlohmann::json summary = nlohmann::json::parse(read_text(info));
  if (print_summary) std::printf("%s: llama.cpp run: %s\n", label.c_str(), summary.dump().c_str());
  EXPECT_EQ(summary["n_vocab"].get<size_t>(), n_vocab);
  std::vector<std::vector<float>> logprobs;
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_EQ(summary["n_tokens"][p].get<size_t>(), prompts[p].size());
    logprobs.push_back(test_support::read_f32_file(work_dir / fmt::format("p{}.bin", p),
                                                   prompts[p].size() * n_vocab));
  }
  return logprobs;
}

}  // namespace strata::testing_llama_cpp
