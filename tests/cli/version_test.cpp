// `strata --version` and `--version` on every subcommand: the version and the git commit the
// binary was built from, on stdout, exit code 0.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "cli_process.h"

namespace strata::cli::test {
namespace {

// Exit status of a git command run in the source tree the binary was built from.
int git(const std::string& arguments) {
  const std::string command = "git -C '" STRATA_SOURCE_DIR "' " + arguments + " >/dev/null 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CliVersion, TopLevelAndEverySubcommandPrintVersionAndCommit) {
  const CommandResult top = run_strata("--version");
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_EQ(top.out.rfind("strata 0.", 0), 0u) << top.out;
  EXPECT_NE(top.out.find("built with "), std::string::npos) << top.out;
  // The commit is one of this repository's, HEAD or (when commits came after the last build) an
  // ancestor of it.
  const size_t at = top.out.find("(commit ");
  ASSERT_NE(at, std::string::npos) << top.out;
  std::string commit = top.out.substr(at + 8, top.out.find(')', at) - at - 8);
  if (commit.ends_with("-dirty")) commit.resize(commit.size() - 6);
  if (git("rev-parse --git-dir") == 0) {
    EXPECT_EQ(commit.size(), 12u) << top.out;
    EXPECT_EQ(git("merge-base --is-ancestor " + commit + " HEAD"), 0)
        << commit << " is not HEAD or an ancestor of it";
  } else {
    EXPECT_EQ(commit, "unknown");  // built outside a git checkout
  }
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
