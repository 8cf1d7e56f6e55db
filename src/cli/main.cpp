// strata — command-line entry point. Dispatches to the subcommands in commands.h.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "util/error.h"
#ifdef STRATA_HAVE_CUDA
#include "compute/cuda/cuda_backend.h"
#endif

int main(int argc, char** argv) {
#ifdef STRATA_HAVE_CUDA
  strata::compute::cuda::register_cuda_backend();
#endif
  CLI::App app{"strata: sparse MoE inference with experts streamed from RAM and SSD", "strata"};
  app.require_subcommand(1);
  strata::cli::register_inspect(app);
  strata::cli::register_convert(app);
  strata::cli::register_run(app);
  strata::cli::register_chat(app);
  strata::cli::register_synth(app);
  strata::cli::register_serve(app);
  strata::cli::register_pack(app);
  strata::cli::register_profile(app);
  strata::cli::register_bench(app);
  strata::cli::register_replay(app);
  strata::cli::add_version_flags(app);  // after the subcommands: each gets --version too
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const strata::Error& e) {
    fmt::print(stderr, "strata: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
