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

}  // namespace
}  // namespace strata::cli::test
