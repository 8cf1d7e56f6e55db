// What `strata --version` prints: the version (CMake's project version), the git commit the
// binary was built from (looked up at build time by src/cli/build_info.cmake; "-dirty" when
// tracked files differed from it, "unknown" outside a git checkout), and how it was built.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace strata::cli {

struct BuildInfo {
  const char* version;     // "0.1.0"
  const char* commit;      // "5228bbf1c2d3", "5228bbf1c2d3-dirty" or "unknown"
  const char* compiler;    // "GNU 12.2.0"
  const char* build_type;  // "Release"
  const char* cuda;        // "ON" or "OFF": whether the CUDA backend is compiled in
};

const BuildInfo& build_info();

// "strata 0.1.0 (commit 5228bbf1c2d3)\nbuilt with GNU 12.2.0, Release, CUDA backend OFF"
std::string version_text();

// Adds --version to `app` and to every subcommand registered so far: CLI11 prints
// version_text() on stdout and the program exits 0, whatever else is on the command line.
void add_version_flags(CLI::App& app);

}  // namespace strata::cli
