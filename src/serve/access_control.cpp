#include "serve/access_control.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "serve/http_reply.h"

namespace strata::serve {
namespace {

constexpr const char* kAllowedMethods = "GET, POST, OPTIONS";
constexpr const char* kDefaultAllowedHeaders = "Authorization, Content-Type, X-Api-Key";

// Equal contents and lengths, in time that depends only on the two lengths.
bool equal_in_constant_time(std::string_view a, std::string_view b) {
  volatile unsigned char difference = a.size() != b.size() ? 1 : 0;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    difference = difference | (x ^ y);
  }
  return difference == 0;
}

ApiError api_key_error(bool presented) {
  ApiError error;
  error.status = 401;
  error.code = "invalid_api_key";
  error.message =
      presented ? "the API key given is not valid for this server (--api-key)"
                : "no API key given: send it as \"Authorization: Bearer KEY\" (or X-Api-Key), "
                  "this server requires one (--api-key)";
  return error;
}

}  // namespace

bool api_key_matches(std::string_view presented, const std::vector<std::string>& keys) {
  bool matched = false;
  for (const std::string& key : keys) matched |= equal_in_constant_time(presented, key);
  return matched;
}

std::string presented_api_key(const httplib::Request& req) {
  const std::string authorization = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() > kBearer.size() &&
      std::equal(kBearer.begin(), kBearer.end(), authorization.begin(), [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) ==
               std::tolower(static_cast<unsigned char>(b));
      }))
    return authorization.substr(kBearer.size());
  return req.get_header_value("X-Api-Key");
}

std::optional<std::string> allowed_origin(std::string_view origin,
                                          const std::vector<std::string>& allowed) {
  if (origin.empty()) return std::nullopt;
  for (const std::string& entry : allowed) {
    if (entry == "*") return std::string("*");
    if (entry == origin) return std::string(origin);
  }
  return std::nullopt;
}

void install_access_control(GuardedHttpServer& http, AccessOptions options,
                            std::function<bool(const std::string&)> open_path) {
  http.set_pre_routing_handler([&http, options, open_path](const httplib::Request& req,
                                                           httplib::Response& res) {
    const std::string origin = req.get_header_value("Origin");
    if (req.method == "OPTIONS") {
      if (!origin.empty() && !allowed_origin(origin, options.cors_origins)) {
        ApiError error;
        error.status = 403;
        error.code = "cors_origin_not_allowed";
        error.message =
            options.cors_origins.empty()
                ? fmt::format(
                      "Origin {}: cross-origin requests are not enabled on "
                      "this server (--cors-origin)",
                      origin)
                : fmt::format("Origin {}: not among the allowed origins (--cors-origin)", origin);
        send_error(res, error);
        return httplib::Server::HandlerResponse::Handled;
      }
      res.status = 204;
      res.set_header("Allow", kAllowedMethods);
      if (!origin.empty()) {
        res.set_header("Access-Control-Allow-Methods", kAllowedMethods);
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers",
                       asked.empty() ? kDefaultAllowedHeaders : asked);
        res.set_header("Access-Control-Max-Age", "600");
      }
      return httplib::Server::HandlerResponse::Handled;  // CORS origin added after routing
    }
    const bool open = (req.method == "GET" || req.method == "HEAD") &&
                      (req.path == "/health" || (open_path && open_path(req.path)));
    if (options.api_keys.empty() || open) return httplib::Server::HandlerResponse::Unhandled;
    const std::string key = presented_api_key(req);
    if (api_key_matches(key, options.api_keys)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, api_key_error(!key.empty()));
    res.set_header("WWW-Authenticate", "Bearer");
    res.set_header("Connection", "close");  // the body, if any, stays unread
    http.close_after_response();
    return httplib::Server::HandlerResponse::Handled;
  });
  if (options.cors_origins.empty()) return;
  http.set_post_routing_handler(
      [allowed = options.cors_origins](const httplib::Request& req, httplib::Response& res) {
        const std::optional<std::string> value =
            allowed_origin(req.get_header_value("Origin"), allowed);
        if (!value) return;
        res.set_header("Access-Control-Allow-Origin", *value);
        if (*value != "*") res.set_header("Vary", "Origin");
      });
}

}  // namespace strata::serve
