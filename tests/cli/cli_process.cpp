#include "cli_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata::cli::test {

CommandResult run_strata(const std::string& arguments, const std::string& stdin_redirect) {
  const std::string err_path =
      (std::filesystem::temp_directory_path() / ("strata-cli-err-" + std::to_string(getpid())))
          .string();
  const std::string command = std::string("'") + STRATA_BINARY + "' " + arguments + " " +
                              stdin_redirect + " 2>'" + err_path + "'";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream text;
  text << err.rdbuf();
  result.err = text.str();
  std::filesystem::remove(err_path);
  return result;
}

}  // namespace strata::cli::test
