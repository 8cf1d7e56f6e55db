#include "serve/web_routes.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "serve/http_reply.h"
#include "serve/web_assets.h"

namespace strata::serve {
namespace {

using json = Json;
using SteadyClock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// An idle event stream sends a comment this often: proxies keep it open and a client that left
// is noticed by the failed write (httplib notices a closed connection only when writing).
constexpr auto kKeepAlive = std::chrono::seconds(5);
// EventSource's reconnection delay after the stream drops (the "retry" field).
constexpr int kRetryMs = 2000;
// Larger "plots" are not what strata bench writes (its SVGs are a few KB).
constexpr uintmax_t kMaxPlotBytes = 16u << 20;

// The page loads nothing from anywhere but this server (works with no network, and an injected
// tag could not phone home either); `strata bench`'s SVGs get no scripts at all.
constexpr const char* kPagePolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
constexpr const char* kPlotPolicy = "default-src 'none'; style-src 'unsafe-inline'";

std::string regex_escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string json_quoted(std::string_view text) {
  return dump_json(json(std::string(text)));
}

ApiError method_not_allowed(const httplib::Request& req) {
  ApiError error;
  error.status = 405;
  error.code = "method_not_allowed";
  error.message =
      fmt::format("{} {}: this route answers GET (and HEAD) only", req.method, req.path);
  return error;
}

bool parse_uint(std::string_view text, uint64_t& value) {
  if (text.empty() || text.size() > 19) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size();
}

json server_json(const WebRoutes& routes) {
  const ServeMetrics::Totals t = routes.metrics->totals();
  const LiveGauges live = routes.live();
  return json{{"generations", t.generations},
              {"prompt_tokens_total", t.prompt_tokens},
              {"completion_tokens_total", t.completion_tokens},
              {"prefill_seconds_total", t.prefill_s},
              {"decode_seconds_total", t.decode_s},
              {"queue_depth", live.queue_depth},
              {"queue_capacity", live.queue_capacity},
              {"generation_running", live.running},
              {"draining", routes.draining()}};
}

// The snapshot's cached JSON with the live "server" member added at the end.
std::string dashboard_body(const DashboardSnapshot& snapshot, const WebRoutes& routes) {
  const std::string& cached = snapshot.json();  // an object: ends with '}'
  std::string out;
  out.reserve(cached.size() + 512);
  out.append(cached, 0, cached.size() - 1);
  out += ",\"server\":";
  out += dump_json(server_json(routes));
  out += '}';
  return out;
}

bool valid_plot_name(std::string_view name) {
  if (name.size() < 5 || name.size() > 128 || name.front() == '.' || !name.ends_with(".svg"))
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

struct PlotFile {
  std::string name;
  uintmax_t bytes = 0;
  int64_t modified_unix = 0;
};

// The SVG files directly in `dir` whose names are plain (no hidden files, no subfolders, no
// links followed out of it), sorted by name.
std::vector<PlotFile> list_plots(const std::string& dir) {
  std::vector<PlotFile> plots;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!valid_plot_name(name) || !entry.is_regular_file(ec) || entry.is_symlink(ec)) continue;
    PlotFile plot;
    plot.name = name;
    plot.bytes = entry.file_size(ec);
    const auto modified = entry.last_write_time(ec);
    if (!ec)
      plot.modified_unix = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::file_clock::to_sys(modified).time_since_epoch())
                               .count();
    plots.push_back(std::move(plot));
  }
  std::sort(plots.begin(), plots.end(),
            [](const PlotFile& a, const PlotFile& b) { return a.name < b.name; });
  return plots;
}

// One /api/dashboard/events response, written on its connection's thread.
class EventStream {
 public:
  EventStream(const WebRoutes& routes, EventOptions options) : routes_(routes), options_(options) {}

  bool pump(httplib::DataSink& sink) {
    auto write = [&](const std::string& text) { return sink.write(text.data(), text.size()); };
    if (!write(fmt::format("retry: {}\n\n", kRetryMs))) return false;
    uint64_t sent = options_.last_event_id;
    SteadyClock::time_point next_allowed = SteadyClock::now();
    while (true) {
      if (ending()) {
        write("event: end\ndata: {\"reason\":\"the server is shutting down\"}\n\n");
        sink.done();
        return true;
      }
      std::shared_ptr<const DashboardSnapshot> snapshot = routes_.hub->wait_newer(
          sent, std::chrono::duration_cast<std::chrono::milliseconds>(kKeepAlive));
      if (ending()) continue;
      if (!snapshot || snapshot->version <= sent) {
        if (!write(": keep-alive\n\n")) return false;
        continue;
      }
      // At most one event per interval: wait out the rest of it, then send the newest.
      while (SteadyClock::now() < next_allowed && !ending())
        std::this_thread::sleep_for(std::min<SteadyClock::duration>(
            next_allowed - SteadyClock::now(), std::chrono::milliseconds(50)));
      snapshot = routes_.hub->latest();
      const std::string event = fmt::format("id: {}\nevent: snapshot\ndata: {}\n\n",
                                            snapshot->version, dashboard_body(*snapshot, routes_));
      if (!write(event)) return false;
      sent = snapshot->version;
      next_allowed = SteadyClock::now() + std::chrono::milliseconds(options_.interval_ms);
    }
  }

 private:
  bool ending() const { return routes_.draining() || routes_.hub->closed(); }
  const WebRoutes& routes_;
  const EventOptions options_;
};

}  // namespace

std::variant<EventOptions, ApiError> parse_event_options(const QueryParams& params,
                                                         std::string_view last_event_id) {
  EventOptions options;
  bool have_interval = false;
  for (const auto& [name, value] : params) {
    if (name != "interval_ms")
      return invalid_field(name,
                           "unknown query parameter of /api/dashboard/events (known: "
                           "interval_ms)");
    if (have_interval) return invalid_field(name, "given more than once");
    have_interval = true;
    uint64_t ms = 0;
    if (!parse_uint(value, ms) || ms < uint64_t(kMinEventIntervalMs) ||
        ms > uint64_t(kMaxEventIntervalMs))
      return invalid_field(name, "expected an integer between {} and {} (milliseconds), found {}",
                           kMinEventIntervalMs, kMaxEventIntervalMs, json_quoted(value));
    options.interval_ms = int(ms);
  }
  if (!last_event_id.empty() && !parse_uint(last_event_id, options.last_event_id))
    return invalid_field("Last-Event-ID",
                         "expected a snapshot version (a non-negative integer), found {}",
                         json_quoted(last_event_id));
  return options;
}

std::optional<ApiError> check_no_params(const QueryParams& params, std::string_view route) {
  if (params.empty()) return std::nullopt;
  return invalid_field(params.begin()->first, "{} takes no query parameters", route);
}

void add_web_routes(httplib::Server& http, const WebRoutes& routes) {
  for (const WebAsset& asset : web_assets()) {
    http.Get(regex_escape(asset.path),
             [&asset](const httplib::Request& req, httplib::Response& res) {
               res.set_header("ETag", std::string(asset.etag));
               res.set_header("Cache-Control", "no-cache");
               res.set_header("Content-Security-Policy", kPagePolicy);
               res.set_header("X-Content-Type-Options", "nosniff");
               if (req.get_header_value("If-None-Match") == asset.etag) {
                 res.status = 304;
                 return;
               }
               res.set_content(asset.body.data(), asset.body.size(),
                               std::string(asset.content_type).c_str());
             });
  }

  http.Get("/api/dashboard", [routes](const httplib::Request& req, httplib::Response& res) {
    if (const auto error = check_no_params(req.params, "/api/dashboard"))
      return send_error(res, *error);
    res.set_header("Cache-Control", "no-store");
    res.set_content(dashboard_body(*routes.hub->latest(), routes), "application/json");
  });

  http.Get("/api/dashboard/events", [routes](const httplib::Request& req, httplib::Response& res) {
    auto parsed = parse_event_options(req.params, req.get_header_value("Last-Event-ID"));
    if (const ApiError* error = std::get_if<ApiError>(&parsed)) return send_error(res, *error);
    if (routes.draining()) {
      ApiError error;
      error.status = 503;
      error.type = "server_error";
      error.code = "server_shutting_down";
      error.message = "the server is shutting down";
      return send_error(res, error);
    }
    auto stream = std::make_shared<EventStream>(routes, std::get<EventOptions>(parsed));
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream",
                                     [stream](size_t, httplib::DataSink& sink) {
                                       try {
                                         return stream->pump(sink);
                                       } catch (...) {
                                         return false;
                                       }
                                     });
  });

  http.Get("/api/plots", [routes](const httplib::Request& req, httplib::Response& res) {
    if (const auto error = check_no_params(req.params, "/api/plots"))
      return send_error(res, *error);
    json plots = json::array();
    if (!routes.plots_dir.empty()) {
      for (const PlotFile& plot : list_plots(routes.plots_dir))
        plots.push_back(json{{"name", plot.name},
                             {"url", "/plots/" + plot.name},
                             {"bytes", plot.bytes},
                             {"modified_unix", plot.modified_unix}});
    }
    send_json(res, 200,
              json{{"dir", routes.plots_dir.empty() ? json(nullptr) : json(routes.plots_dir)},
                   {"plots", std::move(plots)}});
  });

  http.Get("/plots/(.*)", [routes](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    ApiError missing;
    missing.status = 404;
    missing.code = "not_found";
    if (routes.plots_dir.empty()) {
      missing.message = "no plots are served: start strata serve with --plots DIR";
      return send_error(res, missing);
    }
    // Only names from the directory's own listing: nothing outside it can be named.
    const std::vector<PlotFile> plots = list_plots(routes.plots_dir);
    const auto it = std::find_if(plots.begin(), plots.end(),
                                 [&](const PlotFile& plot) { return plot.name == name; });
    if (it == plots.end() || it->bytes > kMaxPlotBytes) {
      missing.message = fmt::format("no plot named {} in {} (GET /api/plots lists them)",
                                    json_quoted(name), routes.plots_dir);
      return send_error(res, missing);
    }
    std::ifstream file(fs::path(routes.plots_dir) / it->name, std::ios::binary);
    std::ostringstream bytes;
    bytes << file.rdbuf();
    res.set_header("Content-Security-Policy", kPlotPolicy);
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(bytes.str(), "image/svg+xml");
  });

  // Only GET reads these; anything else is a clear 405 rather than "no route".
  const auto refuse = [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", "GET, HEAD");
    send_error(res, method_not_allowed(req));
  };
  for (const char* pattern : {"/api/.*", "/plots/.*"}) {
    http.Post(pattern, refuse);
    http.Put(pattern, refuse);
    http.Delete(pattern, refuse);
    http.Patch(pattern, refuse);
  }
}

}  // namespace strata::serve
