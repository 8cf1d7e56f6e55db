// Test helpers for driving the real `strata serve` binary with real clients: child processes
// (the server, curl), a curl wrapper that returns status, headers and body, SSE parsing, and a
// raw socket client that can refuse to read.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::serve::test {

// A child process; stdout and stderr go to files in a temp dir. The destructor kills it.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const;
  // Exit code (128 + signal when killed), or nullopt when still running after `timeout_s`.
  std::optional<int> wait(double timeout_s);
  bool running();
  std::string stdout_text() const;
  std::string stderr_text() const;

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string dir_;
};

// `strata serve --port 0 --quiet ARGS...` on the embedded default model; waits for its
// "listening" line. The destructor sends SIGTERM, then SIGKILL after 10 s.
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& extra_args = {});
  ~ServeProcess();
  int port() const { return port_; }
  std::string url(const std::string& path) const;
  ChildProcess& process() { return *process_; }
  // SIGTERM and wait; the exit code (nullopt: still running after timeout_s).
  std::optional<int> terminate(double timeout_s);

 private:
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
  bool terminated_ = false;  // terminate() was called: its end is the test's to judge
};

struct HttpReply {
  int status = 0;  // 0: curl failed (its exit code in curl_exit)
  int curl_exit = 0;
  std::string headers;
  std::string body;
  nlohmann::json json() const;  // the body parsed (a test failure when it is not JSON)
  std::string header(const std::string& name) const;  // case-insensitive; "" when absent
};

// curl -s -i [-X METHOD] URL [--data-binary BODY -H Content-Type: application/json] EXTRA...
HttpReply curl(const std::string& method, const std::string& url,
               const std::optional<std::string>& body = {},
               const std::vector<std::string>& extra = {});
HttpReply get(const ServeProcess& server, const std::string& path);
HttpReply post(const ServeProcess& server, const std::string& path, const std::string& body,
               const std::vector<std::string>& extra = {});

// The `data:` payloads of an SSE body, in order (the final "[DONE]" included as text).
std::vector<std::string> sse_data(const std::string& body);
// The `event:` names and `data:` objects of an Anthropic stream, in order (a test failure where
// an event is not "event: NAME\ndata: JSON").
std::vector<std::pair<std::string, nlohmann::json>> anthropic_events(const std::string& body);

// A metric's value from /metrics text (the first sample whose series equals `series`).
std::optional<double> metric(const std::string& metrics_text, const std::string& series);
double metric_now(const ServeProcess& server, const std::string& series);

// A TCP client that sends one HTTP request and reads only when told to. Its receive buffer is
// small, so a server writing to it blocks soon.
class RawClient {
 public:
  RawClient(int port, const std::string& request, int receive_buffer_bytes = 4096);
  ~RawClient();
  // Reads until `needle` appears or the peer closes or `timeout_s` passes; returns all bytes read.
  std::string read_until(const std::string& needle, double timeout_s);
  // Sends more bytes; false when the connection is gone.
  bool send_more(const std::string& bytes);
  // Whether the server closed the connection (seen by a read_until).
  bool peer_closed() const { return peer_closed_; }
  void close();

 private:
  int fd_ = -1;
  bool peer_closed_ = false;
  std::string received_;
};

std::string http_post_request(const std::string& path, const std::string& body);

}  // namespace strata::serve::test
