#include "serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "serve/anthropic_format.h"
#include "serve/connection_guard.h"
#include "serve/connection_probe.h"
#include "serve/generator.h"
#include "serve/heap_policy.h"
#include "serve/http_reply.h"
#include "serve/llama_endpoints.h"
#include "serve/metrics.h"
#include "serve/openai_format.h"
#include "serve/request.h"
#include "serve/scheduler.h"
#include "serve/web_assets.h"
#include "serve/web_routes.h"
#include "util/error.h"

namespace strata::serve {
namespace {

using json = Json;
using namespace std::chrono_literals;

// How often a waiting request thread looks at its client (and how late a cancel can be noticed
// while nothing is being written).
constexpr auto kPollInterval = 50ms;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ApiError server_error(int status, std::string type, std::string code, std::string message) {
  ApiError error;
  error.status = status;
  error.type = std::move(type);
  error.code = std::move(code);
  error.message = std::move(message);
  return error;
}

ApiError request_timeout(int timeout_s) {
  return server_error(
      408, "invalid_request_error", "request_timeout",
      fmt::format("the request did not arrive completely within {} s (--timeout)", timeout_s));
}

ApiError too_many_connections(size_t max_connections) {
  return server_error(503, "server_error", "too_many_connections",
                      fmt::format("the server is serving its limit of {} connections "
                                  "(--max-connections); retry later",
                                  max_connections));
}

std::string spec_mode_name(spec::SpecMode mode) {
  switch (mode) {
    case spec::SpecMode::Off:
      return "off";
    case spec::SpecMode::Mtp:
      return "mtp";
    case spec::SpecMode::Suffix:
      return "suffix";
    case spec::SpecMode::Both:
      return "both";
  }
  return "off";
}

size_t max_connections(const ServerOptions& options) {
  return options.max_connections > 0 ? options.max_connections : options.max_queue + 16;
}

// The complete response a connection over --max-connections gets before it is closed.
std::string refusal_response(size_t limit) {
  const std::string body = dump_json(error_json(too_many_connections(limit)));
  return fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{}",
      body.size(), body);
}

ApiError shutting_down() {
  return server_error(503, "server_error", "server_shutting_down", "the server is shutting down");
}

ApiError shut_down_mid_generation() {
  return server_error(503, "server_error", "server_shutting_down",
                      "the server shut down during the generation; the reply is incomplete");
}

// Metric label for a request path: the known routes, everything else "other" (bounded labels).
std::string path_label(const std::string& path) {
  for (const char* known : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                            "/metrics", "/api/dashboard", "/api/dashboard/events", "/api/plots",
                            "/tokenize", "/detokenize", "/props", "/v1/messages"})
    if (path == known) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path.rfind("/plots/", 0) == 0) return "/plots/{name}";
  if (find_web_asset(path)) return "page";
  return "other";
}

// Debian's httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the
// library). A burst of new connections (32 load-test clients on a busy 2-core box) overflowed that
// accept queue and clients saw their requests reset after the 1 s SYN-ACK retransmit.
constexpr int kListenBacklog = 1024;

// The API a generation request came through: OpenAI's (/v1/chat/completions, /v1/completions)
// or Anthropic's Messages API (/v1/messages). They differ in request fields and in every reply's
// shape (serve/anthropic_format.h), not in what is generated.
enum class Wire { OpenAi, Anthropic };

void send_wire_error(httplib::Response& res, Wire wire, const ApiError& error) {
  if (wire == Wire::OpenAi) return send_error(res, error);
  send_json(res, error.status, anthropic_error_json(error));
  if (error.status == 429 || error.status == 503) res.set_header("Retry-After", "1");
}

}  // namespace

struct HttpServer::Impl {
  Impl(const ServedModel& served_model, compute::ThreadPool& pool,
       const ServerOptions& server_options);
  ~Impl();

  // Counts a generation request until its response has been written (or abandoned).
  class ActiveRequest {
   public:
    explicit ActiveRequest(Impl& impl) : impl_(impl) {
      std::lock_guard lock(impl_.active_mutex);
      ++impl_.active;
    }
    ~ActiveRequest() {
      std::lock_guard lock(impl_.active_mutex);
      --impl_.active;
      impl_.active_changed.notify_all();
    }
    ActiveRequest(const ActiveRequest&) = delete;
    ActiveRequest& operator=(const ActiveRequest&) = delete;

   private:
    Impl& impl_;
  };

  // The server-sent-event writer of one streamed completion; httplib calls pump() on the
  // request's thread after the response headers went out. Its destruction (when httplib drops
  // the response) cancels a job the client did not wait for.
  class SseStream {
   public:
    SseStream(Impl& impl, std::shared_ptr<Job> job, CompletionIdentity identity, Wire wire,
              bool include_usage, ConnectionProbe probe, std::unique_ptr<ActiveRequest> active)
        : impl_(impl),
          job_(std::move(job)),
          identity_(std::move(identity)),
          include_usage_(include_usage),
          probe_(probe),
          active_(std::move(active)) {
      if (wire == Wire::Anthropic)
        anthropic_.emplace(identity_.id, identity_.model, int64_t(job_->plan().prompt.size()));
    }
    ~SseStream() {
      if (job_->state() != JobState::Finished)
        impl_.scheduler.cancel(job_, CancelReason::ClientGone);
    }
    bool pump(httplib::DataSink& sink) noexcept;

   private:
    bool client_gone() {
      impl_.scheduler.cancel(job_, CancelReason::ClientGone);
      return false;
    }
    Impl& impl_;
    std::shared_ptr<Job> job_;
    // The OpenAI stream's events; the Anthropic one's come from anthropic_.
    bool pump_openai(httplib::DataSink& sink);
    bool pump_anthropic(httplib::DataSink& sink);

    CompletionIdentity identity_;
    bool include_usage_;
    ConnectionProbe probe_;
    std::unique_ptr<ActiveRequest> active_;
    std::optional<AnthropicStream> anthropic_;
  };

  void add_routes();
  // Reads a POST body (at most --max-body bytes); false when it answered with an error.
  bool read_body(const httplib::Request& req, const httplib::ContentReader& content_reader,
                 httplib::Response& res, std::string& body);
  void handle_generation(Endpoint endpoint, Wire wire, const httplib::Request& req,
                         const std::string& body, httplib::Response& res);
  // Waits until the job leaves the queue; false (job cancelled) when the client went away first.
  bool wait_for_start(const std::shared_ptr<Job>& job, const ConnectionProbe& probe);
  void respond_whole(const std::shared_ptr<Job>& job, const CompletionIdentity& identity, Wire wire,
                     const ConnectionProbe& probe, httplib::Response& res);
  json model_object() const;
  uint64_t fresh_seed();
  LiveGauges live() const;
  void drain();

  const ServedModel& served;
  const ServerOptions options;
  RequestLimits limits;
  ServeMetrics metrics;
  GrammarCache grammars;   // response_format / tools grammars of every request (thread-safe)
  DashboardHub dashboard;  // before generator, which publishes the first snapshot
  Generator generator;
  HeapPolicy heap;      // before scheduler, whose workers use it
  Scheduler scheduler;  // after generator: its worker runs generator.run
  GuardedHttpServer http;
  std::atomic<bool> draining{false};

  std::mutex active_mutex;  // guards active
  std::condition_variable active_changed;
  int active = 0;

  std::mutex seed_mutex;  // guards seeds
  std::mt19937_64 seeds{std::random_device{}()};

  std::mutex drainer_mutex;  // guards drainer
  std::thread drainer;
};

HttpServer::Impl::Impl(const ServedModel& served_model, compute::ThreadPool& pool,
                       const ServerOptions& server_options)
    : served(served_model),
      options(server_options),
      generator(served_model, pool, metrics, dashboard, server_options.spec,
                server_options.access_log, server_options.profile, server_options.cache_ram_bytes,
                server_options.parallel, server_options.batch_groups),
      scheduler(
          server_options.max_queue,
          [this](Job& job) {
            generator.run(job,
                          [this](Scheduler::LentTask task) { scheduler.lend(std::move(task)); });
          },
          size_t(server_options.parallel),
          // After each job and each choice run for another job (a lent task that claimed one):
          // those end generations too, on their own slots. It only wakes the heap's trim thread.
          [this] { heap.after_generation(); }),
      http(ConnectionLimits{server_options.io_timeout_s, server_options.io_timeout_s,
                            max_connections(server_options),
                            refusal_response(max_connections(server_options)),
                            [this] { metrics.count_response("other", 503); }}) {
  limits.model_id = served.id;
  limits.n_vocab = served.tokenizer->n_tokens();
  limits.n_ctx = served.n_ctx;

  const size_t threads = http.threads_needed();
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options.max_body_bytes);
  // The read deadline and write timeout are the GuardedHttpServer's; httplib also sets them as
  // SO_RCVTIMEO/SO_SNDTIMEO on accepted sockets, which bounds a blocking send() the same way.
  http.set_read_timeout(options.io_timeout_s, 0);
  http.set_write_timeout(options.io_timeout_s, 0);
  http.set_tcp_nodelay(true);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and take
  // half of the connections; SO_REUSEADDR alone still allows a quick restart.
  // Accepted connections inherit the listener's SO_SNDBUF.
  http.set_socket_options([send_buffer = options.send_buffer_bytes](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (send_buffer > 0) setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof(send_buffer));
  });
  add_routes();
}

HttpServer::Impl::~Impl() {
  std::lock_guard lock(drainer_mutex);
  if (drainer.joinable()) drainer.join();
}

uint64_t HttpServer::Impl::fresh_seed() {
  std::lock_guard lock(seed_mutex);
  return seeds();
}

LiveGauges HttpServer::Impl::live() const {
  LiveGauges gauges{scheduler.queue_depth(), scheduler.max_queue(), scheduler.busy()};
  gauges.slots = scheduler.slots();
  gauges.running_count = scheduler.running_count();
  gauges.busy_slots = scheduler.busy_slots();
  gauges.batch = generator.batch_stats();
  gauges.heap_trims = heap.stats();
  return gauges;
}

json HttpServer::Impl::model_object() const {
  return json{
      {"id", served.id}, {"object", "model"}, {"created", served.created}, {"owned_by", "strata"}};
}

void HttpServer::Impl::add_routes() {
  // The POST bodies are read through a content reader: httplib's own body reading would parse a
  // body sent as application/x-www-form-urlencoded (curl -d's default) and refuse it above 8 KiB.
  for (const Endpoint endpoint : {Endpoint::ChatCompletions, Endpoint::Completions}) {
    http.Post(std::string(endpoint_path(endpoint)),
              [this, endpoint](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& content_reader) {
                std::string body;
                if (read_body(req, content_reader, res, body))
                  handle_generation(endpoint, Wire::OpenAi, req, body, res);
              });
  }
  http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& content_reader) {
    std::string body;
    if (read_body(req, content_reader, res, body))
      handle_generation(Endpoint::ChatCompletions, Wire::Anthropic, req, body, res);
  });
  // llama-server's tokenizer endpoints and /props (serve/llama_endpoints.h).
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& content_reader) {
    std::string body;
    if (!read_body(req, content_reader, res, body)) return;
    auto parsed = parse_tokenize_request(body, limits);
    if (const ApiError* error = std::get_if<ApiError>(&parsed)) return send_error(res, *error);
    send_json(res, 200, tokenize_response(*served.tokenizer, std::get<TokenizeRequest>(parsed)));
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& content_reader) {
    std::string body;
    if (!read_body(req, content_reader, res, body)) return;
    auto parsed = parse_detokenize_request(body, limits);
    if (const ApiError* error = std::get_if<ApiError>(&parsed)) return send_error(res, *error);
    send_json(res, 200,
              detokenize_response(*served.tokenizer, std::get<DetokenizeRequest>(parsed)));
  });
  // No embeddings: a 501 saying so (llama-server's answer without --embeddings), not a 404 that
  // reads like a wrong base URL. The body is read first so a keep-alive connection stays in step.
  for (const char* path : {"/v1/embeddings", "/embeddings"}) {
    http.Post(path, [this, path](const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& content_reader) {
      std::string body;
      if (!read_body(req, content_reader, res, body)) return;
      send_error(res, server_error(501, "not_supported_error", "embeddings_not_supported",
                                   fmt::format("{}: this server does not compute embeddings (it "
                                               "serves a generative model and defines no pooling "
                                               "for it); use an embedding model's server",
                                               path)));
    });
  }
  http.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
    PropsLimits props;
    props.max_queue = options.max_queue;
    props.max_connections = max_connections(options);
    props.max_body_bytes = options.max_body_bytes;
    props.timeout_s = options.io_timeout_s;
    props.speculative = spec_mode_name(options.spec.mode);
    props.build_info = options.build_info;
    props.slots = options.parallel;
    props.batch_groups = options.batch_groups;
    props.batch_groups_reason = options.batch_groups_reason;
    Json answer = props_json(served, props);
    answer["default_generation_settings"]["is_processing"] = live().running;
    const StateCacheStats cache = generator.state_cache().stats();  // thread-safe
    answer["strata"]["state_cache"] = {{"max_bytes", cache.max_bytes},
                                       {"bytes", cache.bytes},
                                       {"entries", cache.entries},
                                       {"hits", cache.hits},
                                       {"misses", cache.misses},
                                       {"evictions", cache.evictions},
                                       {"cached_tokens", cache.cached_tokens}};
    const GrammarCache::Stats compiled = grammars.stats();
    answer["strata"]["grammar_cache"] = {{"max_entries", compiled.max_entries},
                                         {"entries", compiled.entries},
                                         {"hits", compiled.hits},
                                         {"misses", compiled.misses},
                                         {"evictions", compiled.evictions}};
    const Generator::SharedMaskStats masks = generator.shared_mask_stats();
    answer["strata"]["grammar_cache"]["shared_masks"] = {
        {"grammars", masks.grammars}, {"masks", masks.masks}, {"hits", masks.hits}};
    send_json(res, 200, answer);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, json{{"object", "list"}, {"data", json::array({model_object()})}});
  });
  http.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id == served.id) return send_json(res, 200, model_object());
    ApiError error =
        invalid_field("model", "the model {} does not exist; this server serves \"{}\"",
                      dump_json(json(id)), served.id);
    error.status = 404;
    error.code = "model_not_found";
    send_error(res, error);
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const LiveGauges gauges = live();
    send_json(res, draining ? 503 : 200,
              json{{"status", draining ? "shutting down" : "ok"},
                   {"model", served.id},
                   {"queue_depth", gauges.queue_depth},
                   {"generation_running", gauges.running},
                   // llama-server's names: slots running a request or another one's choices.
                   {"slots_processing", gauges.busy_slots},
                   {"slots_idle", gauges.slots - std::min(gauges.slots, gauges.busy_slots)}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    // The expert counters from the same snapshot /api/dashboard reports.
    const std::shared_ptr<const DashboardSnapshot> snapshot = dashboard.latest();
    const ExpertStoreStats* experts = snapshot->experts ? &*snapshot->experts : nullptr;
    res.set_content(metrics.render(live(), experts), "text/plain; version=0.0.4; charset=utf-8");
  });
  install_access_control(http, options.access,
                         [](const std::string& path) { return find_web_asset(path) != nullptr; });
  WebRoutes web;
  web.hub = &dashboard;
  web.metrics = &metrics;
  web.live = [this] { return live(); };
  web.draining = [this] { return draining.load(); };
  web.plots_dir = options.plots_dir;
  add_web_routes(http, web);

  // httplib's own errors (no route, body over --max-body, malformed HTTP) get JSON bodies too.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError error;
        error.status = res.status;
        if (http.request_timed_out()) {
          error = request_timeout(options.io_timeout_s);
          res.set_header("Connection", "close");
        } else if (res.status == 404) {
          error.code = "not_found";
          error.message = fmt::format("no route for {} {}", req.method, req.path);
        } else if (res.status == 413) {
          error.code = "request_too_large";
          error.message =
              fmt::format("request body: larger than the server's limit of {} bytes (--max-body)",
                          options.max_body_bytes);
        } else if (res.status == 400) {
          error.message = "malformed HTTP request";
        } else {
          error.type = res.status >= 500 ? "server_error" : "invalid_request_error";
          error.message = fmt::format("HTTP {}", res.status);
        }
        send_error(res, error);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, server_error(500, "server_error", "", fmt::format("internal error: {}", what)));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.count_response(path_label(req.path), res.status);
    if (options.access_log)
      fmt::print(stderr, "strata serve: {} {} {} -> {}\n", req.remote_addr, req.method, req.path,
                 res.status);
  });
}

bool HttpServer::Impl::read_body(const httplib::Request& req,
                                 const httplib::ContentReader& content_reader,
                                 httplib::Response& res, std::string& body) {
  const auto refuse = [&](const ApiError& error) {
    send_error(res, error);
    res.set_header("Connection", "close");  // the rest of the body may be unread
    http.close_after_response();
    return false;
  };
  if (req.is_multipart_form_data()) {
    content_reader([](const httplib::MultipartFormData&) { return true; },
                   [](const char*, size_t) { return true; });
    ApiError error;
    error.status = 415;
    error.message =
        "request body: expected JSON (Content-Type: application/json), found multipart/form-data";
    return refuse(error);
  }
  bool too_large = false;
  const bool complete = content_reader([&](const char* data, size_t length) {
    if (body.size() + length > options.max_body_bytes) {
      too_large = true;
      return false;
    }
    body.append(data, length);
    return true;
  });
  if (too_large || res.status == 413) {
    ApiError error;
    error.status = 413;
    error.code = "request_too_large";
    error.message =
        fmt::format("request body: larger than the server's limit of {} bytes (--max-body)",
                    options.max_body_bytes);
    return refuse(error);
  }
  if (!complete && http.request_timed_out()) return refuse(request_timeout(options.io_timeout_s));
  if (!complete) {
    ApiError error;
    error.message = "request body: could not be read completely";
    return refuse(error);
  }
  return true;
}

bool HttpServer::Impl::wait_for_start(const std::shared_ptr<Job>& job,
                                      const ConnectionProbe& probe) {
  while (job->wait_started(kPollInterval) == JobState::Queued) {
    if (probe.peer_closed()) {
      scheduler.cancel(job, CancelReason::ClientGone);
      return false;
    }
  }
  return true;
}

void HttpServer::Impl::handle_generation(Endpoint endpoint, Wire wire, const httplib::Request& req,
                                         const std::string& body, httplib::Response& res) {
  const Clock::time_point received = Clock::now();
  const auto reply_error = [&res, wire](const ApiError& error) {
    send_wire_error(res, wire, error);
  };
  if (draining) return reply_error(shutting_down());
  ParseResult parsed = wire == Wire::Anthropic
                           ? parse_anthropic_messages_request(body, limits)
                           : parse_generation_request(body, endpoint, limits, &grammars);
  if (const ApiError* error = std::get_if<ApiError>(&parsed)) return reply_error(*error);
  const GenerationRequest& request = std::get<GenerationRequest>(parsed);
  PlanResult planned = plan_generation(request, served, fresh_seed(), &grammars);
  if (ApiError* error = std::get_if<ApiError>(&planned)) {
    // The plan reads the translated chat request: name the Anthropic body's fields.
    if (wire == Wire::Anthropic) name_anthropic_fields(*error);
    return reply_error(*error);
  }

  auto active_request = std::make_unique<ActiveRequest>(*this);
  auto job = std::make_shared<Job>(std::move(std::get<GenerationPlan>(planned)), received);
  switch (scheduler.submit(job)) {
    case Scheduler::Admission::Accepted:
      break;
    case Scheduler::Admission::QueueFull:
      return reply_error(
          server_error(429, "rate_limit_error", "queue_full",
                       fmt::format("the server is busy: {} requests are already waiting "
                                   "(--max-queue {}); retry later",
                                   scheduler.max_queue(), scheduler.max_queue())));
    case Scheduler::Admission::ShuttingDown:
      return reply_error(shutting_down());
  }

  const ConnectionProbe probe =
      ConnectionProbe::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  const ApiError gone =
      server_error(499, "invalid_request_error", "client_closed_request", "client went away");
  if (!wait_for_start(job, probe)) return reply_error(gone);
  const CompletionIdentity identity{
      endpoint, wire == Wire::Anthropic ? new_random_id("msg_") : new_completion_id(endpoint),
      unix_now(), served.id};
  if (!request.stream) return respond_whole(job, identity, wire, probe, res);

  // A job that ended before it started (shutdown) is answered with its error status.
  if (job->state() == JobState::Finished) {
    Job::Update update = job->wait_update(0ms);
    if (update.error) return reply_error(*update.error);
    // Finished with a result already: stream it all.
    for (TextDelta& delta : update.deltas) job->emit(std::move(delta));
  }
  auto stream = std::make_shared<SseStream>(*this, job, identity, wire, request.include_usage,
                                            probe, std::move(active_request));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream", [stream](size_t, httplib::DataSink& sink) {
    return stream->pump(sink);
  });
}

void HttpServer::Impl::respond_whole(const std::shared_ptr<Job>& job,
                                     const CompletionIdentity& identity, Wire wire,
                                     const ConnectionProbe& probe, httplib::Response& res) {
  const auto reply_error = [&res, wire](const ApiError& error) {
    send_wire_error(res, wire, error);
  };
  const GenerationPlan& plan = job->plan();
  std::vector<ChoiceResult> choices(size_t(plan.n_choices));
  // Anthropic's blocks come in the order the reply wrote them, as its stream has them: built by
  // the stream's writer from the deltas as they come (its events are not sent).
  std::optional<AnthropicStream> anthropic;
  if (wire == Wire::Anthropic) anthropic.emplace(identity.id, identity.model, 0);
  while (true) {
    Job::Update update = job->wait_update(kPollInterval);
    for (TextDelta& delta : update.deltas) {
      if (anthropic) anthropic->delta(delta);
      TextDelta& text = choices.at(size_t(delta.choice)).text;
      text.content += delta.content;
      text.reasoning += delta.reasoning;
      for (LogprobEntry& entry : delta.logprobs) text.logprobs.push_back(std::move(entry));
      for (ToolCallDelta& call : delta.tool_calls) {
        if (size_t(call.index) >= text.tool_calls.size()) {
          text.tool_calls.push_back(std::move(call));
        } else {
          text.tool_calls[size_t(call.index)].arguments += call.arguments;
        }
      }
    }
    if (update.state == JobState::Finished) {
      if (update.error) return reply_error(*update.error);
      if (update.outcome->cancelled) return reply_error(shut_down_mid_generation());
      const GenerationOutcome& outcome = *update.outcome;
      for (size_t i = 0; i < choices.size() && i < outcome.choice_finish.size(); ++i)
        choices[i].finish = outcome.choice_finish[i];
      if (!anthropic)
        return send_json(
            res, 200, completion_json(identity, choices, outcome.usage, plan.logprobs.has_value()));
      anthropic->finish(outcome.finish, outcome.usage, outcome.stop_sequence);
      return send_json(res, 200,
                       anthropic->message(outcome.finish, outcome.usage, outcome.stop_sequence));
    }
    if (probe.peer_closed()) {
      scheduler.cancel(job, CancelReason::ClientGone);
      return reply_error(
          server_error(499, "invalid_request_error", "client_closed_request", "client went away"));
    }
  }
}

bool HttpServer::Impl::SseStream::pump(httplib::DataSink& sink) noexcept {
  try {
    return anthropic_ ? pump_anthropic(sink) : pump_openai(sink);
  } catch (...) {
    return client_gone();
  }
}

bool HttpServer::Impl::SseStream::pump_openai(httplib::DataSink& sink) {
  auto write = [&](const std::string& event) { return sink.write(event.data(), event.size()); };
  const int n_choices = job_->plan().n_choices;
  if (identity_.endpoint == Endpoint::ChatCompletions)
    for (int choice = 0; choice < n_choices; ++choice)
      if (!write(sse_event(chat_role_chunk(identity_, include_usage_, choice))))
        return client_gone();
  // Completions' legacy logprobs count text_offset from the start of each choice's text.
  std::vector<int64_t> text_offsets(size_t(n_choices), 0);
  while (true) {
    Job::Update update = job_->wait_update(kPollInterval);
    for (const TextDelta& delta : update.deltas) {
      int64_t& offset = text_offsets.at(size_t(delta.choice));
      if (!write(sse_event(delta_chunk(identity_, delta, include_usage_, offset))))
        return client_gone();
      for (const LogprobEntry& entry : delta.logprobs) offset += int64_t(entry.bytes.size());
    }
    if (update.state == JobState::Finished) {
      // Headers (200) are out: failures end the stream with an OpenAI error event, no [DONE].
      if (update.error || update.outcome->cancelled) {
        write(sse_event(error_json(update.error ? *update.error : shut_down_mid_generation())));
      } else {
        const GenerationOutcome& outcome = *update.outcome;
        for (size_t choice = 0; choice < outcome.choice_finish.size(); ++choice)
          if (!write(sse_event(finish_chunk(identity_, outcome.choice_finish[choice],
                                            include_usage_, int(choice)))))
            return false;
        if (include_usage_ && !write(sse_event(usage_chunk(identity_, outcome.usage))))
          return false;
        if (!write(std::string(kSseDone))) return false;
      }
      sink.done();
      return true;
    }
    if (probe_.peer_closed()) return client_gone();
  }
}

bool HttpServer::Impl::SseStream::pump_anthropic(httplib::DataSink& sink) {
  auto write = [&](const std::string& events) {
    return events.empty() || sink.write(events.data(), events.size());
  };
  if (!write(anthropic_->start())) return client_gone();
  while (true) {
    Job::Update update = job_->wait_update(kPollInterval);
    for (const TextDelta& delta : update.deltas)
      if (!write(anthropic_->delta(delta))) return client_gone();
    if (update.state == JobState::Finished) {
      if (update.error || update.outcome->cancelled) {
        write(AnthropicStream::error(update.error ? *update.error : shut_down_mid_generation()));
      } else if (!write(anthropic_->finish(update.outcome->finish, update.outcome->usage,
                                           update.outcome->stop_sequence))) {
        return false;
      }
      sink.done();
      return true;
    }
    if (probe_.peer_closed()) return client_gone();
  }
}

void HttpServer::Impl::drain() {
  dashboard.close();  // dashboard event streams end now; their pages reconnect to a 503
  scheduler.shutdown(std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(options.shutdown_grace_s)));
  {
    // Every generation response written, or its client dropped after the write timeout.
    std::unique_lock lock(active_mutex);
    active_changed.wait_for(lock, std::chrono::seconds(options.io_timeout_s + 2),
                            [&] { return active == 0; });
  }
  http.stop();
}

HttpServer::HttpServer(const ServedModel& served, compute::ThreadPool& pool,
                       const ServerOptions& options)
    : impl_(std::make_unique<Impl>(served, pool, options)) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) fail("--host {} --port 0: cannot listen on any port of this address", o.host);
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    fail(
        "--host {} --port {}: cannot listen there (address in use, or not an address of this "
        "machine?)",
        o.host, port);
  }
  if (!impl_->http.raise_backlog(kListenBacklog))
    fail("--host {} --port {}: listen(backlog {}) failed: {}", o.host, port, kListenBacklog,
         std::strerror(errno));
  return port;
}

void HttpServer::serve() {
  impl_->http.listen_after_bind();
  std::lock_guard lock(impl_->drainer_mutex);
  if (impl_->drainer.joinable()) impl_->drainer.join();
}

std::string HttpServer::spec_summary() const {
  return impl_->generator.spec_summary();
}

void HttpServer::shutdown() {
  if (impl_->draining.exchange(true)) {
    impl_->scheduler.cancel_running();
    return;
  }
  std::lock_guard lock(impl_->drainer_mutex);
  impl_->drainer = std::thread([impl = impl_.get()] { impl->drain(); });
}

}  // namespace strata::serve
