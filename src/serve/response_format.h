// response_format — OpenAI's structured-output field, parsed and compiled to a grammar
// (grammar/json_schema.h) for grammar-constrained sampling (docs/serve.md "Structured output").
//
//   {"type": "text"}                                  plain text (the default)
//   {"type": "json_object"}                           any JSON object
//   {"type": "json_object", "schema": {...}}          llama-server's extension: that schema
//   {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true,
//    "description": "..."}}                           a value of that schema (no schema: any JSON)
//
// Contract: no model; never throws; thread-safe (the cache is). A malformed field or a schema the
// compiler refuses is an ApiError (400) whose param is the JSON path of the keyword at fault, e.g.
// "response_format.json_schema.schema.properties.age.minimum". `strict` is accepted either way:
// the grammar is always enforced.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "serve/api_error.h"
#include "serve/grammar_cache.h"

namespace strata::serve {

struct ResponseFormat {
  enum class Type { Text, JsonObject, JsonSchema };
  Type type = Type::Text;
  std::string name;                                 // json_schema.name, when given
  std::shared_ptr<const grammar::Grammar> grammar;  // null for Text
};

// `format` is the value of "response_format" (read in its key order: property order follows it).
// `cache`: the server's compiled grammars (serve/grammar_cache.h), keyed by the schema's text;
// null compiles every time.
std::variant<ResponseFormat, ApiError> parse_response_format(const nlohmann::ordered_json& format,
                                                             GrammarCache* cache = nullptr);

// The 400 for a schema the compiler refused, its param the keyword's path under `path` (the
// schema's own JSON path in the request, "response_format.json_schema.schema").
ApiError schema_error(const grammar::SchemaError& error, const std::string& path);

}  // namespace strata::serve
