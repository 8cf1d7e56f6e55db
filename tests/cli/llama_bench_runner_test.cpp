// run_llama_bench_json against stand-in llama-bench scripts (no llama.cpp needed): the JSON is read
// back, and a failing run's exit status and the end of its stderr reach the error message.
#include "cli/llama_bench_runner.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "util/error.h"

namespace strata::cli {
namespace {

// An executable shell script in a fresh temporary folder; removed with the folder.
class StandIn {
 public:
  explicit StandIn(const std::string& body) {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata-llama-stand-in-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "llama bench").string();  // a space: the command line must quote it
    std::ofstream(path_) << "#!/bin/sh\n" << body;
    ::chmod(path_.c_str(), 0755);
  }
  ~StandIn() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::string path_;
};

TEST(LlamaBenchRunner, ReadsTheTestsAndPicksTheGenerationTest) {
  // Echoes its arguments to stderr (never shown) and prints a log line before the JSON, as
  // llama-bench does.
  const StandIn bench(
      "echo \"args: $*\" >&2\n"
      "echo 'build: 1 (x)'\n"
      "echo '[{\"n_prompt\": 512, \"n_gen\": 0, \"avg_ts\": 300.5, \"stddev_ts\": 2.0},"
      " {\"n_prompt\": 0, \"n_gen\": 64, \"avg_ts\": 41.25, \"stddev_ts\": 0.5}]'\n");
  const nlohmann::json tests = run_llama_bench_json(bench.path(), {"-m", "a model's path.gguf", "-n", "64"}, "test");
  ASSERT_TRUE(tests.is_array());
  ASSERT_EQ(tests.size(), 2u);
  const auto decode = llama_test_tps(tests, /*has_prompt=*/false, /*has_gen=*/true);
  ASSERT_TRUE(decode);
  EXPECT_DOUBLE_EQ(decode->tps, 41.25);
  EXPECT_DOUBLE_EQ(decode->stddev, 0.5);
  const auto prompt = llama_test_tps(tests, /*has_prompt=*/true, /*has_gen=*/false);
  ASSERT_TRUE(prompt);
  EXPECT_DOUBLE_EQ(prompt->tps, 300.5);
  EXPECT_FALSE(llama_test_tps(tests, /*has_prompt=*/true, /*has_gen=*/true));
}

TEST(LlamaBenchRunner, PassesEachArgumentQuoted) {
  // The stand-in prints its argument count and the -m value as a JSON test.
  const StandIn bench("printf '[{\"n_prompt\": 0, \"n_gen\": %d, \"avg_ts\": 1, \"model\": \"%s\"}]' \"$#\" \"$2\"\n");
  const nlohmann::json tests = run_llama_bench_json(bench.path(), {"-m", "it's a path.gguf"}, "test");
  ASSERT_TRUE(tests.is_array());
  EXPECT_EQ(tests[0]["n_gen"], 4);  // -m, the path, -o, json
  EXPECT_EQ(tests[0]["model"], "it's a path.gguf");
}

TEST(LlamaBenchRunner, AFailedRunReportsItsStatusAndTheEndOfItsStderr) {
  const StandIn bench(
      "i=0; while [ $i -lt 200 ]; do echo \"load_tensors: tensor $i\" >&2; i=$((i+1)); done\n"
      "echo 'llama_model_load: error loading model: missing tokenizer.ggml.model' >&2\n"
      "echo '['\n"
      "exit 1\n");
  try {
    run_llama_bench_json(bench.path(), {"-m", "x.gguf"}, "bench gpu");
    FAIL() << "expected strata::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bench gpu"), std::string::npos) << what;
    EXPECT_NE(what.find("status"), std::string::npos) << what;
    EXPECT_NE(what.find("missing tokenizer.ggml.model"), std::string::npos) << what;
    EXPECT_EQ(what.find("tensor 0\n"), std::string::npos) << "only the end of stderr: " << what;
  }
}

TEST(LlamaBenchRunner, OutputWithoutJsonIsAnError) {
  const StandIn bench("echo 'usage: llama-bench [options]'\n");
  EXPECT_THROW(run_llama_bench_json(bench.path(), {}, "bench cpu"), Error);
}

TEST(LlamaBenchRunner, AMissingBinaryIsAnError) {
  EXPECT_THROW(run_llama_bench_json("/nonexistent/llama-bench", {}, "bench cpu"), Error);
}

}  // namespace
}  // namespace strata::cli
