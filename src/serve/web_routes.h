// The browser page's routes on the HTTP server (docs/serve.md, "The web page"):
//   GET /, /app.js, /style.css ...   the embedded page (serve/web_assets.h), ETag + 304
//   GET /api/dashboard               the latest DashboardSnapshot as JSON, plus "server" totals
//   GET /api/dashboard/events        the same as server-sent events: one `snapshot` event now and
//                                    one per newer snapshot, at most every interval_ms
//   GET /api/plots, GET /plots/NAME  the SVG plots in --plots DIR (`strata bench --svg`)
// Other methods on the /api routes get 405, bad query parameters 400, each with an OpenAI-style
// JSON error naming the parameter.
//
// Threads: the handlers run on httplib's connection threads and read only the hub's immutable
// snapshots, the thread-safe ServeMetrics and the plots directory; an event stream occupies its
// connection's thread until the client leaves or the hub closes (shutdown).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "serve/api_error.h"

#include "serve/dashboard.h"
#include "serve/metrics.h"

namespace httplib {
class Server;
}

namespace strata::serve {

struct WebRoutes {
  DashboardHub* hub = nullptr;
  const ServeMetrics* metrics = nullptr;
  std::function<LiveGauges()> live;
  std::function<bool()> draining;
  std::string plots_dir;  // "" = no plots
};

void add_web_routes(httplib::Server& http, const WebRoutes& routes);

// What a GET /api/dashboard/events request asks for.
struct EventOptions {
  int interval_ms = 250;
  uint64_t last_event_id = 0;  // the Last-Event-ID header (EventSource reconnects): send newer only
};
inline constexpr int kMinEventIntervalMs = 50;
inline constexpr int kMaxEventIntervalMs = 10000;

// Query parameters as httplib gives them (name -> value, repeated names allowed).
using QueryParams = std::multimap<std::string, std::string>;
// The query `interval_ms` (an integer in [kMinEventIntervalMs, kMaxEventIntervalMs]) and the
// Last-Event-ID header (a snapshot version, a non-negative integer; "" = absent). Anything else
// (an unknown or repeated parameter, a non-integer) is a 400 naming it. Pure; for the unit tests.
std::variant<EventOptions, ApiError> parse_event_options(const QueryParams& params,
                                                         std::string_view last_event_id);
// GET /api/dashboard takes no parameters: an ApiError naming the first one, if any.
std::optional<ApiError> check_no_params(const QueryParams& params, std::string_view route);

}  // namespace strata::serve
