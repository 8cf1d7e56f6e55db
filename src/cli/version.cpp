#include <fmt/format.h>

#include "cli/build_info.h"

namespace strata::cli {

std::string version_text() {
  const BuildInfo& info = build_info();
  return fmt::format("strata {} (commit {})\nbuilt with {}, {}, CUDA backend {}", info.version,
                     info.commit, info.compiler, info.build_type, info.cuda);
}

void add_version_flags(CLI::App& app) {
  const std::string text = version_text();
  app.set_version_flag("--version", text, "print the version and the git commit, then exit");
  for (CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
    command->set_version_flag("--version", text, "print the version and the git commit, then exit");
}

}  // namespace strata::cli
