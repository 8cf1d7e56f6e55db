#include "serve/response_format.h"

#include <fmt/format.h>

#include "grammar/json_schema.h"

namespace strata::serve {
namespace {

using ojson = nlohmann::ordered_json;

std::string describe(const ojson& value) {
  if (value.is_string()) {
    const std::string text = value.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return text.size() <= 42 ? text : text.substr(0, 40) + "...\"";
  }
  if (value.is_primitive()) return value.dump();
  return value.type_name();
}

// The grammar of `schema` (from `cache` when it was compiled before: keyed by its text); a
// refused schema throws the 400 whose param is under `path`.
std::shared_ptr<const grammar::Grammar> compile(const ojson& schema, const std::string& path,
                                                GrammarCache* cache) {
  GrammarResult result =
      cached_grammar(cache, "json-schema\n" + schema.dump(), [&]() -> GrammarResult {
        try {
          return std::make_shared<const grammar::Grammar>(grammar::compile_json_schema(schema));
        } catch (const grammar::SchemaError& error) {
          return schema_error(error, path);
        }
      });
  if (ApiError* error = std::get_if<ApiError>(&result)) throw std::move(*error);
  return std::get<std::shared_ptr<const grammar::Grammar>>(std::move(result));
}

ResponseFormat parse(const ojson& format, GrammarCache* cache) {
  if (!format.is_object())
    throw invalid_field("response_format", "expected an object, found {}", describe(format));
  const auto type = format.find("type");
  if (type == format.end() || !type->is_string())
    throw invalid_field("response_format.type",
                        "expected \"text\", \"json_object\" or \"json_schema\", found {}",
                        type == format.end() ? std::string("nothing") : describe(*type));
  ResponseFormat out;
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "text") return out;
  if (name == "json_object") {
    out.type = ResponseFormat::Type::JsonObject;
    const auto schema = format.find("schema");
    if (schema != format.end() && !schema->is_null()) {
      out.grammar = compile(*schema, "response_format.schema", cache);
    } else {
      out.grammar = std::get<std::shared_ptr<const grammar::Grammar>>(
          cached_grammar(cache, "json-object", []() -> GrammarResult {
            return std::make_shared<const grammar::Grammar>(grammar::json_object_grammar());
          }));
    }
    return out;
  }
  if (name != "json_schema")
    throw invalid_field("response_format.type",
                        "expected \"text\", \"json_object\" or \"json_schema\", found {}",
                        describe(*type));
  out.type = ResponseFormat::Type::JsonSchema;
  const auto spec = format.find("json_schema");
  if (spec == format.end() || !spec->is_object())
    throw invalid_field("response_format.json_schema",
                        "expected an object with the schema (\"name\", \"schema\", \"strict\"), "
                        "found {}",
                        spec == format.end() ? std::string("nothing") : describe(*spec));
  if (const auto given = spec->find("name"); given != spec->end() && !given->is_null()) {
    if (!given->is_string())
      throw invalid_field("response_format.json_schema.name", "expected a string, found {}",
                          describe(*given));
    out.name = given->get<std::string>();
  }
  if (const auto strict = spec->find("strict");
      strict != spec->end() && !strict->is_null() && !strict->is_boolean())
    throw invalid_field("response_format.json_schema.strict", "expected true or false, found {}",
                        describe(*strict));
  const auto schema = spec->find("schema");
  out.grammar = compile(schema == spec->end() || schema->is_null() ? ojson(true) : *schema,
                        "response_format.json_schema.schema", cache);
  return out;
}

}  // namespace

ApiError schema_error(const grammar::SchemaError& error, const std::string& path) {
  const std::string param = error.path().empty() ? path : path + "." + error.path();
  std::string message = error.what();
  if (!error.path().empty() && message.rfind(error.path(), 0) == 0)
    message = message.substr(error.path().size() + 2);  // invalid_field prefixes the path
  return invalid_field(param, "{}", message);
}

std::variant<ResponseFormat, ApiError> parse_response_format(const nlohmann::ordered_json& format,
                                                             GrammarCache* cache) {
  try {
    return parse(format, cache);
  } catch (ApiError& error) {
    return std::move(error);
  } catch (const std::bad_alloc&) {
    ApiError error;
    error.status = 413;
    error.message = "response_format: the schema is too large to compile";
    error.param = "response_format";
    return error;
  }
}

}  // namespace strata::serve
