// The JSON readers the request parsers share (serve/request.cpp for OpenAI's bodies and
// llama-server's, serve/anthropic_request.cpp for Anthropic's). Internal to src/serve: the public
// contract is serve/request.h.
//
// A reader that finds a field at fault throws Rejection with an ApiError naming the field's JSON
// path ("messages[1].content") and saying what was expected and what was found; parse_with turns
// the throw (and an allocation failure) into the parser's result. Nothing here keeps state.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "serve/api_error.h"
#include "serve/request.h"

namespace strata::serve::request_fields {

using json = nlohmann::json;

// Thrown inside the parsers only; parse_with turns it into their result.
struct Rejection {
  ApiError error;
};

template <typename... Args>
[[noreturn]] void reject(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  throw Rejection{invalid_field(std::move(param), format, std::forward<Args>(args)...)};
}

[[noreturn]] void reject_body(std::string message, std::string param = {});

// A short, printable rendering of a value for messages: numbers and booleans as written, strings
// quoted and cut at 40 bytes, containers by their type.
std::string describe(const json& value);

// JSON paths: child("tools[0]", "name") is "tools[0].name", element("tools", 0) is "tools[0]".
std::string child(const std::string& path, std::string_view key);
std::string element(const std::string& path, size_t index);

// The value of `key`, or nullptr when it is absent or null (OpenAI treats null as "not set").
const json* field(const json& object, const char* key);

// Typed reads of an optional field; a value of another type or out of range is rejected, naming
// `path`.
std::optional<bool> read_bool(const json& object, const char* key, const std::string& path);
std::optional<int64_t> read_int(const json& object, const char* key, const std::string& path,
                                int64_t min, int64_t max);
std::optional<double> read_number(const json& object, const char* key, const std::string& path,
                                  double min, double max);
const std::string* read_string(const json& object, const char* key, const std::string& path);
// body["messages"], which both the chat and the Messages API require as a non-empty array of
// objects: rejects anything else, naming "messages" or the element.
const json& message_array(const json& body);

// A function's (tool's) "name" under `path`: required, [a-zA-Z0-9_-]{1,64} (OpenAI's and
// Anthropic's rule; names are written into the prompt's tags). By value: g++ 13 takes a
// reference bound to the result for one into the temporary `path` (-Wdangling-reference).
std::string read_function_name(const json& function, const std::string& path);

// The body as a JSON object: UTF-8 checked, nesting bounded by `max_depth`, a syntax error
// reported with the field being read when the parser stopped.
json parse_body(std::string_view body, int max_depth);

// The fields of an OpenAI chat or completions body (defined in request.cpp): what
// parse_generation_request reads before its order-keeping passes (tools, response_format,
// grammar).
GenerationRequest parse_fields(const json& body, Endpoint endpoint, const RequestLimits& limits);

// Parses `body` and runs `read` on the object; a rejection or an allocation failure becomes the
// ApiError of the result.
template <typename Result, typename Read>
std::variant<Result, ApiError> parse_with(std::string_view body, const RequestLimits& limits,
                                          Read read) {
  try {
    const json parsed = parse_body(body, limits.max_json_depth);
    return read(parsed);
  } catch (Rejection& rejection) {
    return std::move(rejection.error);
  } catch (const std::bad_alloc&) {
    ApiError error;
    error.status = 413;
    error.message = "request body: too large to parse";
    return error;
  }
}

}  // namespace strata::serve::request_fields
