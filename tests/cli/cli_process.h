// Runs the `strata` binary as a shell command line for the CLI tests: exit code, stdout and
// stderr apart (stderr goes through a temp file), with the default model found next to it.
#pragma once

#include <string>

namespace strata::cli::test {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `STRATA_BINARY arguments stdin_redirect` through /bin/sh.
CommandResult run_strata(const std::string& arguments, const std::string& stdin_redirect = "");

}  // namespace strata::cli::test
