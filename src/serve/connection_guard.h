// GuardedHttpServer — cpp-httplib's server with the two protections httplib 0.11 lacks: a
// deadline for receiving each request, and a bound on the connections served at once.
//
// Why: httplib 0.11 (Debian 12) times out each recv() separately, so a client that sends one byte
// of its headers every 2 s never trips `--timeout` and holds a connection thread forever, and a
// half-sent request is dropped only after the keep-alive wait plus the read timeout. Its
// connection queue is unbounded, so such clients also pile up unanswered.
//
// What it promises
// - Deadline: from the moment the server starts waiting for a request on a connection (accept, or
//   the end of the previous response), the request line, headers and body must all arrive within
//   `request_timeout_s`. A connection that sends nothing is closed silently at the deadline (an
//   idle keep-alive connection is closed after min(keep-alive timeout, deadline)). A request
//   still incomplete at the deadline makes every later read fail: the handler (or httplib's own
//   400 path) then learns from `request_timed_out()` that the cause was the deadline and answers
//   408; the connection is closed after that response. Writes keep a per-call timeout of
//   `write_timeout_s` (a stream may be long; a client that stops reading is dropped).
// - Bound: at most `max_connections` connections are served at once. One more is answered at once
//   with `refusal` (a complete HTTP response, e.g. a 503 with a JSON body) and closed, without
//   reading its request. The task queue needs max_connections + kRefusalThreads threads, so
//   that refusals never wait behind served connections (`threads_needed`).
//
// Threads: process_and_close_socket runs on httplib's pool threads, one connection per thread for
// its lifetime; handlers, the error handler and the logger run on that same thread, which is how
// `request_timed_out()` finds the connection (a map from thread to connection, under a mutex).
// `on_refused` is called on the refusing thread.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace strata::serve {

struct ConnectionLimits {
  int request_timeout_s = 10;  // request line + headers + body, per request
  int write_timeout_s = 10;    // per blocked write
  size_t max_connections = 80;
  std::string refusal;               // the raw HTTP response sent to a connection over the bound
  std::function<void()> on_refused;  // e.g. counts the refusal in the metrics
};

class GuardedHttpServer : public httplib::Server {
 public:
  static constexpr size_t kRefusalThreads = 4;

  explicit GuardedHttpServer(ConnectionLimits limits);
  size_t threads_needed() const { return limits_.max_connections + kRefusalThreads; }
  // Connections being served now (not counting ones being refused).
  size_t open_connections() const { return open_.load(); }
  // On a handler's thread: whether the request being read on this connection ran past its
  // deadline (so a failed read is a timeout, not a malformed or truncated request).
  bool request_timed_out() const;
  // On a handler's thread: close this connection after the response (e.g. its request body was
  // left unread, so what follows on the connection is not a request).
  void close_after_response();
  // Debian's httplib listens with a backlog of 5 (compiled in); a burst of connections overflowed
  // it and clients saw resets. Calling listen() again on the bound socket raises the backlog.
  bool raise_backlog(int backlog);

 private:
  class DeadlineStream;
  bool process_and_close_socket(socket_t sock) override;
  // httplib's process_request for one request on `stream`, in whichever form the installed
  // httplib has: 0.11 (Debian 12) reads the peer's address itself; 0.14 and later (Ubuntu
  // 24.04, Debian 13) take it as arguments. A template, so that only the form that exists is
  // compiled.
  template <typename Self, typename Stream>
  static bool process_one_request(Self& self, Stream& stream, bool close_connection,
                                  bool& connection_closed);
  void refuse(socket_t sock);

  const ConnectionLimits limits_;
  std::atomic<size_t> open_{0};
  mutable std::mutex streams_mutex_;  // guards streams_
  std::unordered_map<std::thread::id, const DeadlineStream*> streams_;
};

}  // namespace strata::serve
