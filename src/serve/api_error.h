// ApiError — an error as the OpenAI API reports it: an HTTP status and a JSON body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// `param` names the request field at fault (a JSON path like "messages[2].content"), empty when no
// single field is; `code` is a machine-readable reason (e.g. "context_length_exceeded"), may be
// empty. Plain data; the JSON form is built by openai_format.h.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

namespace strata::serve {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string param;  // empty = null
  std::string code;   // empty = null
  std::string message;
};

// 400 invalid_request_error naming `param`; the message is prefixed with the field name so it
// reads on its own ("max_tokens: expected an integer >= 1, found -5").
template <typename... Args>
ApiError invalid_field(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  ApiError error;
  error.message = fmt::format("{}: {}", param, fmt::format(format, std::forward<Args>(args)...));
  error.param = std::move(param);
  return error;
}

}  // namespace strata::serve
