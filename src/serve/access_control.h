// Access control for `strata serve`: an API key (--api-key / --api-key-file) and the browser
// origins allowed to call the server from a page on another site (--cors-origin).
//
// API key: with keys set, every request except GET/HEAD of /health and of the web page's own files
// must present one, as "Authorization: Bearer KEY" (OpenAI's clients) or "X-Api-Key: KEY";
// otherwise 401 with an OpenAI-style body (code "invalid_api_key"), `WWW-Authenticate: Bearer` and
// `Connection: close` (the body, if any, is not read). Keys are compared in time that depends only
// on the lengths, never on where a wrong key differs, and every key is tried.
//
// CORS: a request whose Origin is allowed (listed exactly, or "*" = any) gets
// Access-Control-Allow-Origin (the origin itself, with Vary: Origin; or "*"). A preflight (OPTIONS
// with Origin) is answered 204 with the allowed methods and headers, before and without the API
// key (browsers send none on a preflight); a preflight from an origin not allowed gets 403. With
// no --cors-origin no CORS headers are sent (the browser's same-origin policy stays in force).
//
// Thread-safe: the installed handlers only read their copy of the options.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/connection_guard.h"

namespace strata::serve {

struct AccessOptions {
  std::vector<std::string> api_keys;      // empty = no key needed
  std::vector<std::string> cors_origins;  // empty = no CORS; "*" = any origin
};

// Whether `presented` equals one of `keys`; time independent of the contents.
bool api_key_matches(std::string_view presented, const std::vector<std::string>& keys);
// The key a request presents (Authorization: Bearer, else X-Api-Key); "" when none.
std::string presented_api_key(const httplib::Request& req);
// The Access-Control-Allow-Origin value for `origin`, or nullopt when it is not allowed.
std::optional<std::string> allowed_origin(std::string_view origin,
                                          const std::vector<std::string>& allowed);

// Installs the pre-routing (preflight, key check) and post-routing (CORS headers) handlers.
// `open_path(path)` says which GET/HEAD paths need no key besides /health (the page's files).
void install_access_control(GuardedHttpServer& http, AccessOptions options,
                            std::function<bool(const std::string&)> open_path);

}  // namespace strata::serve
