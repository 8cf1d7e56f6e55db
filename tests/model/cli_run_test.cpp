// `strata run` end to end: the binary's greedy ids equal the library's, and bad input gives one
// clear error line with exit code 1.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "compute/cpu/ops.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "model/model.h"
#include "synth/synth.h"

namespace strata {
namespace {

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

CommandResult run_command(const std::string& command) {
  CommandResult result{-1, ""};
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  while (fgets(buffer.data(), int(buffer.size()), pipe)) result.output += buffer.data();
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TEST(CliRun, GreedyIdsMatchLibrary) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("strata-cli-" + std::to_string(getpid()) + ".gguf"))
          .string();
  SynthOptions options;
  options.hparams = synth_shape("tiny-qwen3next");
  write_synthetic_model(options, path);

  const auto model = Model::load(path);
  compute::ThreadPool pool(2);
  Session session(*model, pool);
  const std::vector<int32_t> prompt = {5, 17, 42, 7};
  session.prefill(prompt);
  std::string expected;
  for (int i = 0; i < 6; ++i) {
    const int32_t next = int32_t(compute::argmax(session.logits().data(), model->hparams().n_vocab));
    expected += fmt::format("{}{}", expected.empty() ? "" : ",", next);
    if (i + 1 < 6) session.decode(next);
  }

  const CommandResult result = run_command(std::string(STRATA_BINARY) + " run -m " + path +
                                           " --tokens 5,17,42,7 -n 6 -t 2 2>/dev/null");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(expected + "\n"), std::string::npos)
      << "expected " << expected << " in:\n" << result.output;

  // --logits-out: every prompt position, bitwise equal to the library's window forward;
  // --ids-out: the generated ids, one per line.
  const std::string logits_path = path + ".logits", ids_path = path + ".ids";
  const CommandResult files = run_command(std::string(STRATA_BINARY) + " run -m " + path +
                                          " --tokens 5,17,42,7 -n 6 -t 1 --logits-out " +
                                          logits_path + " --ids-out " + ids_path);
  ASSERT_EQ(files.exit_code, 0) << files.output;
  Session window(*model, pool);
  const std::vector<float> all = window.forward_all(prompt);
  std::vector<float> written(all.size());
  FILE* f = std::fopen(logits_path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(std::fread(written.data(), sizeof(float), written.size(), f), written.size());
  EXPECT_EQ(std::fgetc(f), EOF);
  std::fclose(f);
  EXPECT_EQ(written, all);
  std::string ids_text;
  f = std::fopen(ids_path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  for (int c; (c = std::fgetc(f)) != EOF;) ids_text += char(c == '\n' ? ',' : c);
  std::fclose(f);
  EXPECT_EQ(ids_text, expected + ",");
  std::filesystem::remove(logits_path);
  std::filesystem::remove(ids_path);

  const CommandResult bad = run_command(std::string(STRATA_BINARY) + " run -m " + path +
                                        " --tokens 5,x -n 2");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("--tokens: expected comma-separated non-negative token ids, found 'x'"),
            std::string::npos)
      << bad.output;
  const CommandResult outside = run_command(std::string(STRATA_BINARY) + " run -m " + path +
                                            " --tokens 999999 -n 2");
  EXPECT_EQ(outside.exit_code, 1);
  EXPECT_NE(outside.output.find("outside the vocabulary"), std::string::npos) << outside.output;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace strata
