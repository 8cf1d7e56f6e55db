// Options shared by the commands that generate (run, chat, serve): speculative decoding
// (docs/spec-decoding.md). `--spec off|mtp|suffix|both`, `--draft-max K` (drafts per verify
// window, 1..8), `--spec-gate on|off` (SpecGate picks the depth per window, or always K).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "spec/spec_decoder.h"

namespace strata::cli {

struct SpecCliOptions {
  std::string mode = "off";  // off | mtp | suffix | both
  int draft_max = 3;
  std::string gate = "on";  // off = always the full --draft-max depth
};

void add_spec_options(CLI::App& cmd, SpecCliOptions& options);
// The decoder's options; mode Off when --spec off.
spec::SpecOptions resolve_spec_options(const SpecCliOptions& options);

}  // namespace strata::cli
