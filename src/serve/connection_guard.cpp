#include "serve/connection_guard.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "serve/connection_probe.h"

namespace strata::serve {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Waits are cut into slices this long so that a server that stops (svr_sock_ closed) does not
// wait for idle keep-alive connections to time out.
constexpr auto kWaitSlice = 100ms;
// A refused connection: how long its response may take to write, and how long its request bytes
// are drained afterwards (closing a socket with unread data sends a reset, which can destroy the
// response before the client has read it).
constexpr int kRefusalWriteMs = 1000;
constexpr auto kRefusalDrain = 200ms;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return int(std::max<int64_t>(0, left.count()));
}

// poll() for `events` until `deadline`; true when ready (or the peer hung up: the read or write
// that follows reports it).
bool wait_for(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;  // let the read/write see the error
  }
}

}  // namespace

// httplib::Stream over one accepted socket: buffered reads that fail once the current request's
// deadline has passed, writes with a per-call timeout.
class GuardedHttpServer::DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(int sock, int write_timeout_s) : sock_(sock), write_timeout_s_(write_timeout_s) {
    socket_address(sock_, SocketEnd::Peer, remote_addr_, remote_port_);
    socket_address(sock_, SocketEnd::Local, local_addr_, local_port_);
  }

  void start_request(Clock::time_point deadline) { deadline_ = deadline; }
  bool timed_out() const { return timed_out_.load(); }
  void request_close() const { close_requested_ = true; }
  bool close_requested() const { return close_requested_.load(); }
  bool has_buffered() const { return buffer_begin_ < buffer_end_; }

  bool is_readable() const override { return has_buffered() || wait_for(sock_, POLLIN, deadline_); }
  bool is_writable() const override {
    return wait_for(sock_, POLLOUT, Clock::now() + std::chrono::seconds(write_timeout_s_));
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!has_buffered()) {
      if (timed_out() || !wait_for(sock_, POLLIN, deadline_)) {
        timed_out_ = true;
        return -1;
      }
      ssize_t n;
      do {
        n = ::recv(sock_, buffer_.data(), buffer_.size(), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      buffer_begin_ = 0;
      buffer_end_ = size_t(n);
    }
    const size_t n = std::min(size, buffer_end_ - buffer_begin_);
    std::memcpy(ptr, buffer_.data() + buffer_begin_, n);
    buffer_begin_ += n;
    return ssize_t(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = remote_addr_;
    port = remote_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_addr_;
    port = local_port_;
  }
  socket_t socket() const override { return sock_; }

 private:
  const int sock_;
  const int write_timeout_s_;
  Clock::time_point deadline_ = Clock::now();
  std::atomic<bool> timed_out_{false};  // read by request_timed_out() under the server's mutex
  mutable std::atomic<bool> close_requested_{false};
  std::array<char, 4096> buffer_{};
  size_t buffer_begin_ = 0, buffer_end_ = 0;
  std::string remote_addr_, local_addr_;
  int remote_port_ = -1, local_port_ = -1;
};

GuardedHttpServer::GuardedHttpServer(ConnectionLimits limits) : limits_(std::move(limits)) {}

bool GuardedHttpServer::raise_backlog(int backlog) {
  return ::listen(svr_sock_, backlog) == 0;
}

bool GuardedHttpServer::request_timed_out() const {
  std::lock_guard lock(streams_mutex_);
  const auto it = streams_.find(std::this_thread::get_id());
  return it != streams_.end() && it->second->timed_out();
}

void GuardedHttpServer::close_after_response() {
  std::lock_guard lock(streams_mutex_);
  const auto it = streams_.find(std::this_thread::get_id());
  if (it != streams_.end()) it->second->request_close();
}

template <typename Self, typename Stream>
bool GuardedHttpServer::process_one_request(Self& self, Stream& stream, bool close_connection,
                                            bool& connection_closed) {
  if constexpr (requires {
                  self.process_request(stream, close_connection, connection_closed, nullptr);
                }) {
    return self.process_request(stream, close_connection, connection_closed, nullptr);
  } else {
    std::string remote_addr, local_addr;
    int remote_port = 0, local_port = 0;
    stream.get_remote_ip_and_port(remote_addr, remote_port);
    stream.get_local_ip_and_port(local_addr, local_port);
    return self.process_request(stream, remote_addr, remote_port, local_addr, local_port,
                                close_connection, connection_closed, nullptr);
  }
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  if (open_.fetch_add(1) >= limits_.max_connections) {
    open_.fetch_sub(1);
    refuse(sock);
    return false;
  }
  DeadlineStream stream(sock, limits_.write_timeout_s);
  {
    std::lock_guard lock(streams_mutex_);
    streams_[std::this_thread::get_id()] = &stream;
  }
  // httplib's keep-alive loop (detail::process_server_socket_core), with a deadline per request.
  const auto request_timeout = std::chrono::seconds(limits_.request_timeout_s);
  const auto idle_timeout = std::min<std::chrono::seconds>(
      request_timeout, std::chrono::seconds(keep_alive_timeout_sec_));
  bool ok = false;
  for (size_t remaining = keep_alive_max_count_; remaining > 0; --remaining) {
    const Clock::time_point start = Clock::now();
    stream.start_request(start + request_timeout);
    bool readable = stream.has_buffered();  // a pipelined request already read
    for (auto idle_end = start + idle_timeout; !readable && Clock::now() < idle_end;) {
      if (svr_sock_ == INVALID_SOCKET) break;
      readable = wait_for(sock, POLLIN, std::min(idle_end, Clock::now() + kWaitSlice));
    }
    if (!readable || svr_sock_ == INVALID_SOCKET) break;
    bool connection_closed = false;
    ok = process_one_request(*this, stream, /*close_connection=*/remaining == 1, connection_closed);
    if (!ok || connection_closed || stream.timed_out() || stream.close_requested()) break;
  }
  {
    std::lock_guard lock(streams_mutex_);
    streams_.erase(std::this_thread::get_id());
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  open_.fetch_sub(1);
  return ok;
}

void GuardedHttpServer::refuse(socket_t sock) {
  if (limits_.on_refused) limits_.on_refused();
  const auto write_end = Clock::now() + std::chrono::milliseconds(kRefusalWriteMs);
  size_t sent = 0;
  while (sent < limits_.refusal.size() && wait_for(sock, POLLOUT, write_end)) {
    const ssize_t n =
        ::send(sock, limits_.refusal.data() + sent, limits_.refusal.size() - sent, MSG_NOSIGNAL);
    if (n <= 0 && errno != EINTR) break;
    if (n > 0) sent += size_t(n);
  }
  ::shutdown(sock, SHUT_WR);
  const auto drain_end = Clock::now() + kRefusalDrain;
  std::array<char, 4096> sink{};
  while (wait_for(sock, POLLIN, drain_end) && ::recv(sock, sink.data(), sink.size(), 0) > 0) {
  }
  ::close(sock);
}

}  // namespace strata::serve
