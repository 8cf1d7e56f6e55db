// Writing JSON answers and OpenAI-style errors into an httplib response; shared by the API routes
// (http_server.cpp) and the page's routes (web_routes.cpp).
#pragma once

#include <httplib.h>

#include "serve/api_error.h"
#include "serve/openai_format.h"

namespace strata::serve {

inline void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

// {"error": {...}} with the error's status; 429 and 503 also say when to retry.
inline void send_error(httplib::Response& res, const ApiError& error) {
  send_json(res, error.status, error_json(error));
  if (error.status == 429 || error.status == 503) res.set_header("Retry-After", "1");
}

}  // namespace strata::serve
