// `strata serve` — an OpenAI-compatible HTTP server for one model (src/serve/, docs/serve.md).
//
// Signals: SIGTERM and SIGINT are blocked in every thread (the mask is set before any thread
// starts, and threads inherit it) and taken by one thread with sigtimedwait, so no handler runs in
// async-signal context. The first signal starts a graceful shutdown (HttpServer::shutdown); a
// second one cancels the running generation at once. The process exits 0 after a shutdown.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/expert_options.h"
#include "cli/model_options.h"
#include "cli/spec_options.h"
#include "compute/cpu/thread_pool.h"
#include "engine/session.h"
#include "model/model.h"
#include "serve/batch_groups.h"
#include "serve/heap_policy.h"
#include "serve/http_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace strata::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  ExpertOptions experts;
  serve::ServerOptions server;
  SpecCliOptions spec;
  std::string alias;
  std::string api_key_file;
  std::string cache_ram;
  int chunk_rows = 0;  // --chunk; 0: the Generator's default
  std::string batch_groups = "auto";      // --batch-groups as given
  std::optional<int> batch_groups_given;  // parsed: nullopt = auto, decided at start
  bool seed_given = false;
};

int64_t file_mtime_unix(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? int64_t(info.st_mtime) : 0;
}

// --api-key-file: one key per line; blank lines and surrounding whitespace are ignored.
std::vector<std::string> read_api_keys(const std::string& path) {
  std::ifstream file(path);
  if (!file) fail("--api-key-file {}: cannot open: {}", path, std::strerror(errno));
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(file, line)) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos) continue;
    const size_t end = line.find_last_not_of(" \t\r");
    keys.push_back(line.substr(begin, end - begin + 1));
  }
  if (keys.empty()) fail("--api-key-file {}: no key in the file (expected one per line)", path);
  return keys;
}

void run_serve(const ServeOptions& options) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up must cost a failed write, not the process
  // Before any thread starts: fewer malloc arenas keep RSS flat under load (serve/heap_policy.h).
  serve::HeapPolicy::limit_arenas();

  const std::string path = resolve_model_path(options.model);
  const auto model = Model::load(path);
  if (!model->file().has("tokenizer.ggml.tokens"))
    fail("{}: the file has no tokenizer (tokenizer.ggml.*); serve needs one", path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  const ChatTemplate chat_template = ChatTemplate::from_gguf(model->file());
  compute::ThreadPool pool(resolve_threads(options.model));
  const std::unique_ptr<ExpertStore> store = open_expert_store(*model, path, options.experts);

  serve::ServedModel served;
  served.model = model.get();
  served.tokenizer = &tokenizer;
  served.chat_template = &chat_template;
  served.expert_store = store.get();
  served.backend =
      resolve_backend(options.model, store != nullptr && !wants_gpu_tier(options.experts));
  check_gpu_tier_backend(options.experts, served.backend);
  place_resident_weights(*model, store.get(), served.backend, options.experts);
  served.id = options.alias.empty() ? std::filesystem::path(path).stem().string() : options.alias;
  served.n_ctx = session_context_length(model->hparams(), options.model.ctx);
  served.prefill_rows = options.chunk_rows;
  served.end_of_turn = tokenizer.find_token(ChatTemplate::kEndOfTurn);
  served.default_sampling = options.model.sampling;
  if (options.seed_given) served.default_seed = options.model.sampling.seed;
  served.created = file_mtime_unix(path);

  std::string spec_summary;
  {  // the server (and its generation thread) ends before the store is touched from this thread
    serve::ServerOptions server_options = options.server;
    server_options.spec = resolve_spec_options(options.spec);
    if (server_options.parallel < 1 || server_options.parallel > 256)
      fail("--parallel: expected a number of slots from 1 to 256, found {}",
           server_options.parallel);
    if (server_options.parallel > 1 && options.experts.moce_lambda > 0)
      fail(
          "--parallel {} with --moce: cache-aware routing depends on which experts are resident, "
          "which other requests change, so replies would depend on what else runs; use "
          "--parallel 1 or leave --moce off",
          server_options.parallel);
    const serve::LastLevelCache llc = serve::last_level_cache();
    const serve::BatchGroupsChoice groups = serve::choose_batch_groups(
        options.batch_groups_given,
        {int(pool.size()), server_options.parallel, model->file().file_size(), llc.bytes,
         store != nullptr, llc.origin});
    server_options.batch_groups = groups.groups;
    server_options.batch_groups_reason = groups.reason;
    fmt::print(stderr, "strata serve: batch groups {} ({})\n", groups.groups, groups.reason);
    if (server_options.cache_ram_bytes > 0 && served.backend != "cpu")
      fmt::print(stderr,
                 "strata serve: no conversation state cache on the {} backend (its states live "
                 "in device memory); every prompt is prefilled in full\n",
                 served.backend);
    server_options.build_info = version_text().substr(0, version_text().find('\n'));
    for (const std::string& key : server_options.access.api_keys)
      if (key.empty()) fail("--api-key: an empty key would let every client in; give a key");
    if (!options.api_key_file.empty())
      for (std::string& key : read_api_keys(options.api_key_file))
        server_options.access.api_keys.push_back(std::move(key));
    serve::HttpServer server(served, pool, server_options);
    const int port = server.bind();
    fmt::print(
        "strata serve: {} ({}, context {}) on http://{}:{} (queue {}, {} threads, {} slot{}); "
        "web page and dashboard at /\n",
        served.id, path, served.n_ctx, options.server.host, port, options.server.max_queue,
        resolve_threads(options.model), server_options.parallel,
        server_options.parallel == 1 ? "" : "s");
    std::fflush(stdout);

    std::atomic<bool> stopped{false};
    std::thread signal_waiter([&] {
      const timespec tick{0, 100'000'000};
      while (!stopped.load()) {
        const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
        if (sig < 0) continue;  // timeout or EINTR
        fmt::print(
            stderr,
            "strata serve: {} received, shutting down (again: cancel the running generation)\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT");
        server.shutdown();
      }
    });
    server.serve();
    stopped.store(true);
    signal_waiter.join();
    spec_summary = server.spec_summary();
  }
  if (!spec_summary.empty()) fmt::print(stderr, "strata serve: {}\n", spec_summary);
  save_usage(store.get(), options.experts);  // --usage: at exit
  fmt::print(stderr, "strata serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/serve.md)");
  add_model_options(*cmd, options->model);
  add_expert_options(*cmd, options->experts);
  add_spec_options(*cmd, options->spec);
  // llama.cpp server's defaults for requests that set no sampling fields.
  options->model.sampling.temperature = 0.8f;
  options->model.sampling.top_p = 0.95f;
  add_sampling_options(*cmd, options->model.sampling);
  serve::ServerOptions& server = options->server;
  cmd->add_option("--host", server.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", server.port, "TCP port (0 = any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--max-queue", server.max_queue,
                  "generation requests that may wait behind the running ones (--parallel); "
                  "more get 429")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--max-body", server.max_body_bytes,
                  "largest request body (bytes; KiB/MiB suffixes); larger get 413")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", server.shutdown_grace_s,
                  "seconds the running generation may take to finish after SIGTERM")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--timeout", server.io_timeout_s,
                  "seconds a request (line, headers and body) may take to arrive, and a blocked "
                  "write may wait; slower clients are answered 408 or dropped")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--max-connections,--http-threads", server.max_connections,
                  "connections served at once, each on its own thread; one more is answered 503 "
                  "and closed (default: max-queue + 16)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--send-buffer", server.send_buffer_bytes,
                  "kernel send buffer per connection in bytes (0 = autotuned, up to MiBs); caps "
                  "what a client "
                  "that stops reading pins in the kernel, the rest waits in the server")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--plots", server.plots_dir,
                  "serve the SVG plots in this folder (strata bench --svg) on the web page")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("!--no-profile", server.profile,
                "do not time the forward's phases (the dashboard's time split)");
  cmd->add_option("--api-key", server.access.api_keys,
                  "require this key (Authorization: Bearer KEY) on every route but /health and "
                  "the web page's files; repeat for several keys");
  cmd->add_option("--api-key-file", options->api_key_file,
                  "read the keys from FILE, one per line (keeps them out of the process list)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--cors-origin", server.access.cors_origins,
                  "let web pages from ORIGIN (e.g. http://localhost:3000, or * for any) call the "
                  "API; repeat for several");
  cmd->add_option("--parallel", server.parallel,
                  "generations decoded together: up to N requests run at once and each decode "
                  "step is one window with a row per request (weights and the union of their "
                  "experts read once per step; every reply bitwise as with 1); more wait in the "
                  "queue. cpu backend only; not with --spec or --moce")
      ->capture_default_str();
  cmd->add_option("--batch-groups", options->batch_groups,
                  "G or auto: cut each batched step into G windows of consecutive requests run "
                  "side by side, each on threads/G threads (every reply still bitwise as with 1); "
                  "experts from the file mapping only (not with --ram-budget). auto, decided at "
                  "start: when the model file fits in the last-level cache (a step is compute), "
                  "min(threads, --parallel/4) rounded down to a power of two (4 rows and one "
                  "thread a group at least); otherwise (a step is weight reads), unknown cache "
                  "size or a RAM-budget store, 1")
      ->type_name("G|auto")
      ->capture_default_str();
  add_cache_ram_option(*cmd, options->cache_ram);
  add_cached_chunk_option(*cmd, options->chunk_rows, /*serve=*/true);
  cmd->add_option("--alias", options->alias,
                  "model id clients use (default: the file name without .gguf)");
  cmd->add_flag(
      "--quiet", [options](int64_t) { options->server.access_log = false; },
      "no access log on stderr");
  cmd->callback([options, cmd] {
    options->seed_given = cmd->count("--seed") > 0;
    options->batch_groups_given = serve::parse_batch_groups(options->batch_groups);
    options->server.cache_ram_bytes = resolve_cache_ram(options->cache_ram);  // before the load
    run_serve(*options);
  });
}

}  // namespace strata::cli
