// `strata inspect FILE.gguf` — placeholder until the GGUF reader lands (replaced by the gguf work).
#include "cli/commands.h"
#include "util/error.h"

namespace strata::cli {
void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe a GGUF model file");
  auto path = std::make_shared<std::string>();
  cmd->add_option("file", *path, "GGUF file")->required();
  cmd->callback([path] { fail("{}: inspect is not implemented yet", *path); });
}
}  // namespace strata::cli
