// Plain TCP sockets for the rendezvous (no CAF, no UCX): a file-descriptor owner, listen,
// connect with retries, whole-buffer sends, and an eventfd that wakes a poll loop.
#pragma once

#include "core/error.hpp"
#include "io/ckpt/posix_file.hpp"

#include <chrono>
#include <cstddef>
#include <string>

namespace dsa::net {

// The checked POSIX wrappers' owning descriptor (io/ckpt/posix_file.hpp).
using ckpt::unique_fd;

// A listening socket on bind_address:port, close-on-exec and non-blocking. bind_address is
// a numeric address or a host name ("" = every IPv4 interface); port 0 lets the OS pick.
expected<unique_fd> tcp_listen(const std::string& bind_address, int port);

// The local port a socket is bound to.
expected<int> tcp_local_port(int fd);

// A blocking, close-on-exec connection to address:port with TCP_NODELAY. A refused or
// unreachable peer is retried (every 50 ms) until `deadline`, since a client may start
// before its server listens; the error then names the address and the last failure.
expected<unique_fd> tcp_connect(const std::string& address, int port,
                                std::chrono::steady_clock::time_point deadline);

// "1.2.3.4:5678" or "[::1]:5678" for the peer of a connected socket; "?" when unknown.
std::string tcp_peer_name(int fd);

status set_nonblocking(int fd);
void set_nodelay(int fd);

// Sends all n bytes on a blocking socket (MSG_NOSIGNAL: a closed peer is an error, not
// SIGPIPE), retrying EINTR. `peer` names the other end in the error.
status send_all(int fd, const void* data, std::size_t n, const std::string& peer);

// An eventfd another thread writes to wake a poll loop (poll its fd() for POLLIN).
class wakeup {
public:
  wakeup();
  int fd() const { return fd_.get(); }
  void notify();  // any thread
  void consume(); // the polling thread, after POLLIN

private:
  unique_fd fd_;
};

} // namespace dsa::net
