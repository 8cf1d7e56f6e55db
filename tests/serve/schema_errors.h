// JSON Schema validation of what the server generated, by an independent validator (Debian's
// libvalijson-dev), for the tests of structured output and tool calls. Header-only: a test binary
// that includes it adds ${VALIJSON_INCLUDE_DIR} (tests/serve/CMakeLists.txt).
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>

namespace strata::serve::test {

// Validates `text` (JSON) against `schema` with valijson; "" when valid, else the reasons.
inline std::string schema_errors(const nlohmann::json& schema, const std::string& text) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    return fmt::format("not JSON ({}): {}", error.what(), text);
  }
  valijson::Schema compiled;
  valijson::SchemaParser parser;
  valijson::adapters::NlohmannJsonAdapter schema_adapter(schema);
  parser.populateSchema(schema_adapter, compiled);
  valijson::Validator validator;
  valijson::ValidationResults results;
  valijson::adapters::NlohmannJsonAdapter target(document);
  if (validator.validate(compiled, target, &results)) return "";
  std::string reasons = text + ":";
  valijson::ValidationResults::Error error;
  while (results.popError(error)) reasons += " " + error.description;
  return reasons;
}

}  // namespace strata::serve::test
