// ConnectionProbe — tells whether the client of an HTTP request has gone away, without reading
// from or writing to its connection.
//
// cpp-httplib (0.11, Debian 12) gives a handler the connection's addresses but not its socket, and
// it notices a closed connection only when a write fails. To cancel a generation promptly when
// its client disconnects while the request is still queued (nothing is written then) or between
// tokens, the probe finds the socket whose (local, remote) address pair is the request's among the
// process's descriptors (the pair is unique per TCP connection), then polls it: a peer that closed
// or reset the connection shows as POLLHUP/POLLRDHUP/POLLERR, or as a readable socket whose
// MSG_PEEK returns 0 bytes. Pipelined request bytes are peeked, never consumed.
// A client that half-closes its sending side after the request (shutdown(SHUT_WR)) counts as gone.
//
// Valid while the request is being handled (httplib closes the socket only after the handler and
// its content provider returned). When no socket matches (an address family the probe does not
// know), `peer_closed` is always false and only write failures detect a disconnect.
// Thread-safe for concurrent calls (poll and recv with MSG_PEEK only).
#pragma once

#include <string>
#include <string_view>

namespace strata::serve {

// The numeric address and port of a socket's peer (or its own end), as httplib renders them
// (getnameinfo, NI_NUMERICHOST): "127.0.0.1", "::1". False for other address families.
enum class SocketEnd { Peer, Local };
bool socket_address(int fd, SocketEnd end, std::string& addr, int& port);

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  static ConnectionProbe find(std::string_view local_addr, int local_port,
                              std::string_view remote_addr, int remote_port);
  bool found() const { return fd_ >= 0; }
  bool peer_closed() const;

 private:
  int fd_ = -1;
};

}  // namespace strata::serve
