// `strata run`'s prompt sources on the embedded default model: -p TEXT, -f FILE, stdin when -p is
// absent, and an empty prompt as a clear error (llama-cli's behaviour for models without BOS).
// `strata run` echoes the prompt text before the generated text, so stdout shows which prompt
// was used.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli_process.h"

namespace strata::cli::test {
namespace {

const std::string kRun = "run -n 2 --temp 0 -t 1";

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()))).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// A stdin redirection from a temp file holding `text`.
std::string stdin_from(const std::string& text) {
  // Appended, not "<" + path: GCC 12 warns (-Wrestrict, a false positive) on that operator+.
  std::string redirect = "<";
  redirect += temp_file("strata-stdin", text);
  return redirect;
}

TEST(CliRunPrompt, ReadsStdinWhenNoPromptIsGiven) {
  const CommandResult piped = run_strata(kRun, stdin_from("The stdin prompt\n"));
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  // The trailing newline of the input is dropped, as llama-cli's -f does.
  EXPECT_EQ(piped.out.rfind("The stdin prompt", 0), 0u) << piped.out;
  EXPECT_NE(piped.out.rfind("The stdin prompt\n", 0), 0u) << piped.out;
  EXPECT_EQ(piped.out.find("Once upon a time"), std::string::npos) << piped.out;
  // The same prompt through -p gives the same output.
  EXPECT_EQ(run_strata(kRun + " -p 'The stdin prompt'", "</dev/null").out, piped.out);
}

TEST(CliRunPrompt, ReadsAFileWithDashF) {
  const std::string path = temp_file("strata-prompt", "From a file\n");
  const CommandResult from_file = run_strata(kRun + " -f " + path, "</dev/null");
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(from_file.out.rfind("From a file", 0), 0u) << from_file.out;
  EXPECT_EQ(run_strata(kRun + " -f -", stdin_from("From a file\n")).out,
            from_file.out);  // - = stdin
  std::filesystem::remove(path);

  const CommandResult missing = run_strata(kRun + " -f /nonexistent/prompt.txt", "</dev/null");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("-f /nonexistent/prompt.txt: cannot open the prompt file"),
            std::string::npos)
      << missing.err;
  const CommandResult both = run_strata(kRun + " -p x -f " + path, "</dev/null");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
}

TEST(CliRunPrompt, EmptyPromptIsAnErrorNotTheDemoPrompt) {
  const struct {
    std::string arguments, input, source;
  } cases[] = {
      {kRun + " -p ''", "</dev/null", "-p:"},
      {kRun, "</dev/null", "stdin:"},
      {kRun, stdin_from("\n"), "stdin:"},  // only a newline
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.arguments + " " + c.input);
    const CommandResult result = run_strata(c.arguments, c.input);
    EXPECT_EQ(result.exit_code, 1) << result.out;
    EXPECT_NE(result.err.find(c.source + " the prompt is empty"), std::string::npos) << result.err;
    EXPECT_EQ(result.out.find("Once upon a time"), std::string::npos) << result.out;
  }
}

// A GPU expert budget on a CPU session would be ignored: refused with a message saying why. (This
// build may have no CUDA backend at all, as in CI; --backend cpu is refused either way.)
TEST(CliRunPrompt, GpuBudgetWithoutTheCudaBackendIsRefused) {
  for (const std::string flag : {"--gpu-budget 50%", "--gpu-slots-per-layer 2"}) {
    const CommandResult result = run_strata(kRun + " --backend cpu -p 'hi' " + flag, "</dev/null");
    EXPECT_EQ(result.exit_code, 1) << flag << ": " << result.out;
    EXPECT_NE(result.err.find("need --backend cuda"), std::string::npos) << flag << ": " << result.err;
  }
}

// The default prefill window (512 rows on the CPU, cli/model_options.h) gives the greedy tokens of
// smaller and larger windows: a 700-token prompt in 512 + 188 rows, in 64-row windows, in one
// window, and in 7-row windows (the recurrent DeltaNet form throughout).
TEST(CliRunPrompt, DefaultPrefillWindowGivesTheTokensOfEveryWindowSize) {
  std::string ids;
  for (int i = 0; i < 700; ++i) {
    if (i > 0) ids += ',';
    ids += std::to_string((i * 7919 + 13) % 3007);
  }
  const std::string run = "run -n 12 --temp 0 -t 2 --ignore-eos --print-ids --tokens " + ids;
  const CommandResult by_default = run_strata(run, "</dev/null");
  ASSERT_EQ(by_default.exit_code, 0) << by_default.err;
  ASSERT_FALSE(by_default.out.empty());
  for (const char* chunk : {"64", "700", "7"}) {
    const CommandResult windows = run_strata(run + " --chunk " + chunk, "</dev/null");
    ASSERT_EQ(windows.exit_code, 0) << windows.err;
    EXPECT_EQ(windows.out, by_default.out) << "--chunk " << chunk;
  }
  const CommandResult help = run_strata("run --help", "</dev/null");
  EXPECT_NE(help.out.find("default: 512 on the CPU, 64 on CUDA"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace strata::cli::test
