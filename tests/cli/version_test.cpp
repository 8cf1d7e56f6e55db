// `strata --version` and `--version` on every subcommand: the version and the git commit the
// binary was built from, on stdout, exit code 0.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include "cli_process.h"

namespace strata::cli::test {
namespace {

// The commit of the source tree the test runs in (the binary was built from it).
std::string head_commit() {
  FILE* pipe = popen("git -C '" STRATA_SOURCE_DIR "' rev-parse --short=12 HEAD 2>/dev/null", "r");
  if (!pipe) return "";
  std::array<char, 128> buffer{};
  std::string out;
  if (fgets(buffer.data(), int(buffer.size()), pipe)) out = buffer.data();
  pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

TEST(CliVersion, TopLevelAndEverySubcommandPrintVersionAndCommit) {
  const std::string commit = head_commit();
  const CommandResult top = run_strata("--version");
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_EQ(top.out.rfind("strata 0.", 0), 0u) << top.out;
  if (!commit.empty()) {
    EXPECT_NE(top.out.find("(commit " + commit), std::string::npos) << top.out << " vs " << commit;
  }
  EXPECT_NE(top.out.find("built with "), std::string::npos) << top.out;
  for (const char* command : {"run", "chat", "serve", "bench", "inspect", "convert", "synth",
                              "pack", "profile", "replay"}) {
    SCOPED_TRACE(command);
    // Even with a required argument missing, --version wins.
    const CommandResult sub = run_strata(std::string(command) + " --version");
    EXPECT_EQ(sub.exit_code, 0) << sub.err;
    EXPECT_EQ(sub.out, top.out);
  }
}

}  // namespace
}  // namespace strata::cli::test
