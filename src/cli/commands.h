// The `strata` subcommands. Each lives in its own cmd_<name>.cpp and registers itself on the
// CLI11 app: it adds a subcommand with its options and a callback that does the work. Callbacks
// throw strata::Error for bad input; main() prints "strata <cmd>: <message>" and exits 1.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

void register_inspect(CLI::App& app);
void register_convert(CLI::App& app);
void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_synth(CLI::App& app);
void register_serve(CLI::App& app);
void register_pack(CLI::App& app);
void register_profile(CLI::App& app);
void register_bench(CLI::App& app);
void register_replay(CLI::App& app);

}  // namespace strata::cli
