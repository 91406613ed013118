// Plain TCP sockets for the rendezvous; see tcp_socket.hpp.
#include "io/net/tcp_socket.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dsa::net {

namespace {

struct addrinfo_deleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using addrinfo_ptr = std::unique_ptr<addrinfo, addrinfo_deleter>;

expected<addrinfo_ptr> resolve(const std::string& address, int port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  addrinfo* found = nullptr;
  int rc =
      ::getaddrinfo(address.empty() ? nullptr : address.c_str(), service.c_str(), &hints, &found);
  if (rc != 0)
    return make_error(errc::invalid_argument, "cannot resolve '{}': {}", address,
                      ::gai_strerror(rc));
  return addrinfo_ptr(found);
}

std::string format_address(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
  }
  return "?";
}

bool is_transient_connect_error(int e) {
  return e == ECONNREFUSED || e == ENETUNREACH || e == EHOSTUNREACH || e == ETIMEDOUT ||
         e == ECONNRESET || e == EAGAIN;
}

} // namespace

expected<unique_fd> tcp_listen(const std::string& bind_address, int port) {
  if (port < 0 || port > 65535)
    return make_error(errc::invalid_argument, "port {} is outside 0..65535", port);
  const std::string where = bind_address.empty() ? "0.0.0.0" : bind_address;
  DSA_ASSIGN_OR_RETURN(auto list, resolve(bind_address, port, AI_PASSIVE));
  int last_errno = 0;
  for (addrinfo* a = list.get(); a; a = a->ai_next) {
    unique_fd fd(
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd.valid()) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 128) == 0)
      return fd;
    last_errno = errno;
  }
  return make_error(errc::io, "cannot listen on {}:{}: {}", where, port, std::strerror(last_errno));
}

expected<int> tcp_local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return make_error(errc::io, "getsockname: {}", std::strerror(errno));
  if (ss.ss_family == AF_INET)
    return static_cast<int>(ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port));
  if (ss.ss_family == AF_INET6)
    return static_cast<int>(ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port));
  return make_error(errc::io, "getsockname: not an IP socket");
}

expected<unique_fd> tcp_connect(const std::string& address, int port,
                                std::chrono::steady_clock::time_point deadline) {
  if (port <= 0 || port > 65535)
    return make_error(errc::invalid_argument, "port {} is outside 1..65535", port);
  DSA_ASSIGN_OR_RETURN(auto list, resolve(address, port, 0));
  int last_errno = 0;
  for (;;) {
    for (addrinfo* a = list.get(); a; a = a->ai_next) {
      unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd.valid()) {
        last_errno = errno;
        continue;
      }
      int rc;
      do
        rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      while (rc != 0 && errno == EINTR);
      if (rc == 0) {
        set_nodelay(fd.get());
        return fd;
      }
      last_errno = errno;
      if (!is_transient_connect_error(last_errno))
        return make_error(errc::io, "cannot connect to {}:{}: {}", address, port,
                          std::strerror(last_errno));
    }
    if (std::chrono::steady_clock::now() >= deadline)
      break;
    // Why a sleep: nothing signals that a server on another host started listening.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return make_error(errc::io, "cannot connect to {}:{}: {} (gave up after retrying)", address, port,
                    std::strerror(last_errno));
}

std::string tcp_peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return "?";
  return format_address(reinterpret_cast<sockaddr*>(&ss));
}

status set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return make_error(errc::io, "fcntl(O_NONBLOCK): {}", std::strerror(errno));
  return {};
}

void set_nodelay(int fd) {
  // Rendezvous messages are small and latency matters more than packing them.
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

status send_all(int fd, const void* data, std::size_t n, const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR)
        continue;
      return make_error(errc::io, "sending to {} failed: {}", peer, std::strerror(errno));
    }
    p += sent;
    n -= static_cast<std::size_t>(sent);
  }
  return {};
}

wakeup::wakeup() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  DSA_CHECK(fd_.valid(), "eventfd: {}", std::strerror(errno));
}

void wakeup::notify() {
  std::uint64_t one = 1;
  // A full counter (2^64 - 2 pending wakes) cannot happen; EAGAIN would still leave it readable.
  [[maybe_unused]] ssize_t rc = ::write(fd_.get(), &one, sizeof one);
}

void wakeup::consume() {
  std::uint64_t count;
  [[maybe_unused]] ssize_t rc = ::read(fd_.get(), &count, sizeof count);
}

} // namespace dsa::net
