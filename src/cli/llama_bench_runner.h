// Runs llama.cpp's llama-bench for `strata bench cpu` and `strata bench gpu` and hands back its
// JSON output (-o json): one place for the command line, the pipe and the error report.
//
// Contract
// - run_llama_bench_json(binary, args, who): runs `binary args -o json` through the shell (each
//   argument quoted), stdout parsed as llama-bench's JSON array of tests. Its stderr goes to a
//   temporary file, not the terminal (llama.cpp logs every tensor it loads), and is deleted after.
// - A run that exits non-zero, prints no JSON array, or cannot start throws strata::Error naming
//   the command, the exit status and the last ~1500 bytes of its stderr, so the reason (a model
//   it refuses, out of memory) reaches the user instead of a bare status.
// - llama_test_tps(tests, n_prompt, n_gen): avg_ts (and stddev_ts) of the test with exactly that
//   prompt / generation length (0 for the side the test does not have); nullopt when absent.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace strata::cli {

nlohmann::json run_llama_bench_json(const std::string& binary, const std::vector<std::string>& args,
                                    const std::string& who);

struct LlamaTestSpeed {
  double tps = 0, stddev = 0;
};
std::optional<LlamaTestSpeed> llama_test_tps(const nlohmann::json& tests, bool has_prompt, bool has_gen);

}  // namespace strata::cli
