// JSON schema → Grammar: the compiler behind response_format json_schema / json_object
// (docs/serve.md "Structured output").
//
// Supported (everything else that constrains a value is refused, see below):
//   type (one or an array of object, array, string, number, integer, boolean, null; absent:
//   inferred from the keywords, or any value), properties, required, additionalProperties
//   (false, true or a schema), items, minItems, maxItems, uniqueItems: false, enum, const,
//   anyOf, oneOf (as anyOf: alternatives that overlap are not excluded from each other),
//   $ref to "#", "#/$defs/..." or "#/definitions/..." (any local JSON pointer; recursion
//   allowed, left recursion refused), string minLength / maxLength (in code points, an escape
//   counting as one), minimum / maximum / exclusiveMinimum / exclusiveMaximum on a schema whose
//   type is "integer" (a number each; the grammar spells exactly the integers within them, as
//   runs of digit ranges per length), format on a string: date, time, date-time (RFC 3339),
//   uuid (RFC 4122), each as a subset of the valid spellings (Compiler::formatted says which),
//   pattern on a string (grammar/pattern.h: the regular subset of ECMA-262 regexes, unanchored
//   as JSON Schema says, together with minLength / maxLength if given).
//   A schema of `true` or {} is any JSON value. Annotations (title, description, examples,
//   default, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored; so are
//   keywords JSON Schema does not define.
// Refused with SchemaError naming the keyword's path (e.g. "properties.age.minimum"): a pattern
//   outside the subset (lookaround, backreferences, \b, \p{..}, bounds over kMaxPatternRepeat,
//   an automaton too large: grammar/regex.h, grammar/pattern.h), other formats (or one with
//   min/maxLength or pattern), minimum / maximum / exclusive* on anything but an "integer"
//   schema (a number's bounds, or a type array), an empty integer range, multipleOf, allOf,
//   not, if / then / else, patternProperties, propertyNames, min/maxProperties, dependent*,
//   prefixItems, contains, uniqueItems: true, unevaluated*, $ref outside the document, $ref
//   with constraining siblings, anyOf / oneOf with constraining siblings, a `false` schema,
//   required names that additionalProperties false forbids, bounds above kMaxRepeat.
//
// What the grammar generates (and the matcher accepts), a subset of the valid instances:
// - Whitespace: none at the top level; after { [ , : and before } ] at most one of "", " " or
//   "\n" followed by up to 20 spaces. A model can therefore not loop on whitespace, and the
//   common compact and pretty-printed styles both match.
// - Object keys in the schema's `properties` order (required and optional alike; an optional one
//   may be left out), additional properties (when allowed) after them, their names spelled
//   without escapes and different from the declared ones. When `properties` is given and
//   `additionalProperties` is absent, no other keys are generated.
// - Numbers: at most 18 digits of integer part (so an integer fits an int64), 20 of fraction
//   and 2 of exponent (so a number fits a double); integers without fraction or exponent. enum /
//   const values in nlohmann's compact form.
// - Strings: well-formed UTF-8 (no lone surrogates, escaped or not), control characters only
//   as escapes. A string with a pattern spells each character one way (grammar/pattern.h).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/grammar.h"
#include "util/error.h"

namespace strata::grammar {

// A schema the compiler cannot honour. `path` names the keyword ("properties.tags.items.pattern",
// "" for the schema itself); the message says what was expected and what was found.
class SchemaError : public Error {
 public:
  SchemaError(std::string path, const std::string& message)
      : Error(message), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Upper bound for minLength, maxLength, minItems, maxItems (each bound becomes rules).
inline constexpr int64_t kMaxRepeat = 10000;
// Upper bound on the compiled grammar's size (each element carries a 32-byte first set), so a
// hostile schema cannot cost more than about 20 MiB.
inline constexpr size_t kMaxGrammarElements = size_t(1) << 19;

// Throws SchemaError. The schema is read in its key order (ordered_json): that is the order of
// the generated properties.
Grammar compile_json_schema(const nlohmann::ordered_json& schema);

// Whether `keyword` only describes a schema (title, description, ...: ignored by the compiler).
bool is_annotation(std::string_view keyword);

// Any JSON object (response_format json_object).
Grammar json_object_grammar();

// The compiler over a caller's builder, to compose a schema's values into a larger grammar (the
// tool-call grammar, serve/tool_call_grammar.h: each tool's arguments). `document` is the schema
// that local $refs resolve in; `value` compiles a schema found in it (at `path`, for the
// SchemaError paths) and returns its rule. Throws SchemaError as compile_json_schema does. Both
// the builder and the document must outlive this object.
class SchemaRules {
 public:
  SchemaRules(GrammarBuilder& builder, const nlohmann::ordered_json& document);
  ~SchemaRules();
  uint32_t value(const nlohmann::ordered_json& schema, const std::string& path);
  uint32_t any_object();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// builder.finish(root), refusing left recursion (SchemaError naming the rule) as
// compile_json_schema does.
Grammar finish_checked(GrammarBuilder& builder, uint32_t root);

}  // namespace strata::grammar
