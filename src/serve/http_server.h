// HttpServer — the OpenAI-compatible HTTP API on top of cpp-httplib.
//
// Routes: POST /v1/chat/completions, POST /v1/completions (JSON or server-sent events), Anthropic's
// POST /v1/messages (the same generation, its wire format: serve/anthropic_format.h),
// GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics (Prometheus text), llama-server's
// POST /tokenize, POST /detokenize and GET /props (serve/llama_endpoints.h), and the web page with
// its dashboard data (serve/web_routes.h: GET /, /api/dashboard[/events], /plots/). API keys and
// CORS: serve/access_control.h. Slow or too many connections: serve/connection_guard.h.
// Every error, including httplib's own (unknown route 404, body over --max-body 413, malformed
// HTTP 400), is answered with an OpenAI-style JSON error body.
//
// Threads: httplib serves each connection on a thread of its pool (sized so that a full queue
// still leaves threads to answer 429s and /metrics); generations run on the scheduler's workers
// (serve/scheduler.h: one, or `parallel` whose decode steps are batched). A request's thread waits
// for its job, watching the client with a ConnectionProbe; a client that goes away cancels its job,
// queued or running. The dashboard's routes read only the snapshots the worker publishes
// (serve/dashboard.h), never the ExpertStore.
//
// Shutdown (`shutdown`, e.g. on SIGTERM): new generation requests get 503 and /health turns 503;
// queued jobs fail with 503; the running generation may finish for `shutdown_grace_s`, then it is
// cancelled (a stream then ends with an error event); once every generation response has been
// written (or its client timed out) the listener stops and `serve` returns. A second call cancels
// the running generation at once. `shutdown` does not block and may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "compute/cpu/thread_pool.h"
#include "decode/state_cache.h"
#include "serve/access_control.h"
#include "serve/plan.h"
#include "spec/spec_decoder.h"

namespace strata::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0 = any free port (bind() returns it)
  size_t max_queue = 64;             // waiting generations before 429
  size_t max_body_bytes = 4u << 20;  // larger request bodies get 413
  double shutdown_grace_s = 10;      // time the running generation gets to finish on shutdown
  int io_timeout_s = 10;             // a request must arrive within it; a write may block as long
  size_t max_connections = 0;        // served at once (more get 503); 0 = max_queue + 16
  int send_buffer_bytes = 0;         // SO_SNDBUF per connection; 0 = the kernel's autotuning
  bool access_log = true;            // one stderr line per response
  spec::SpecOptions spec;            // speculative decoding for every request (off by default)
  bool profile = true;               // time the forward's phases for the dashboard
  std::string plots_dir;             // SVGs served at /plots/ (strata bench --svg); "" = none
  AccessOptions access;              // API keys and CORS origins (serve/access_control.h)
  std::string build_info;            // reported by /props (`strata --version`'s text)
  uint64_t cache_ram_bytes = StateCache::kDefaultMaxBytes;  // --cache-ram; 0 = no state cache
  int parallel = 1;      // --parallel: generations decoded together (serve/decode_batcher.h)
  int batch_groups = 1;  // --batch-groups: windows a batched step is cut into (BatchGroups)
  std::string batch_groups_reason;  // how that number was chosen (serve/batch_groups.h), /props
};

class HttpServer {
 public:
  // `served` and `pool` must outlive the server.
  HttpServer(const ServedModel& served, compute::ThreadPool& pool, const ServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port. Throws strata::Error naming host and port.
  int bind();
  // Serves until shutdown has completed. Call after bind().
  void serve();
  void shutdown();
  // With speculative decoding, the gate's line over all requests ("spec: T(1) ..."), else "".
  // Call after serve() returned (the generation thread has stopped).
  std::string spec_summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::serve
