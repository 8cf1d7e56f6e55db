#include "cli/spec_options.h"

namespace strata::cli {

void add_spec_options(CLI::App& cmd, SpecCliOptions& options) {
  cmd.add_option("--spec", options.mode,
                 "speculative decoding: off, mtp (the model's MTP head), suffix (prompt lookup) or "
                 "both")
      ->check(CLI::IsMember({"off", "mtp", "suffix", "both"}))
      ->capture_default_str();
  cmd.add_option("--draft-max", options.draft_max, "most drafts per verify window")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd.add_option("--spec-gate", options.gate,
                 "on: SpecGate picks the depth per window; off: always --draft-max")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

spec::SpecOptions resolve_spec_options(const SpecCliOptions& options) {
  spec::SpecOptions resolved;
  resolved.mode = spec::parse_spec_mode(options.mode);
  resolved.gate.max_depth = options.draft_max;
  resolved.gate.enabled = options.gate == "on";
  return resolved;
}

}  // namespace strata::cli
