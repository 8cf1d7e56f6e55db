#include "serve/connection_probe.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <string>

namespace strata::serve {
namespace {

struct SocketEndpoint {
  std::string addr;
  int port = -1;
};

bool endpoint_of(int fd, SocketEnd end, SocketEndpoint& out) {
  return socket_address(fd, end, out.addr, out.port);
}

}  // namespace

bool socket_address(int fd, SocketEnd end, std::string& addr, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  auto* raw = reinterpret_cast<sockaddr*>(&address);
  if ((end == SocketEnd::Peer ? getpeername(fd, raw, &length) : getsockname(fd, raw, &length)) != 0)
    return false;
  if (address.ss_family != AF_INET && address.ss_family != AF_INET6) return false;
  char host[NI_MAXHOST], service[NI_MAXSERV];
  if (getnameinfo(raw, length, host, sizeof(host), service, sizeof(service),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  addr = host;
  port = std::atoi(service);
  return true;
}

ConnectionProbe ConnectionProbe::find(std::string_view local_addr, int local_port,
                                      std::string_view remote_addr, int remote_port) {
  ConnectionProbe probe;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return probe;
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    const std::string_view name = entry->d_name;
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc() ||
        fd == dirfd(dir))
      continue;
    SocketEndpoint peer, local;
    if (!endpoint_of(fd, SocketEnd::Peer, peer) || peer.port != remote_port ||
        peer.addr != remote_addr)
      continue;
    if (!endpoint_of(fd, SocketEnd::Local, local)) continue;
    // httplib 0.11 fills local_addr/local_port; older builds leave -1 (then the peer decides).
    if (local_port >= 0 && (local.port != local_port || local.addr != local_addr)) continue;
    probe.fd_ = fd;
    break;
  }
  closedir(dir);
  return probe;
}

bool ConnectionProbe::peer_closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char byte;
    const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

}  // namespace strata::serve
