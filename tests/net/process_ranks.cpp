// Forked ranks: pipes carry length-prefixed frames (address up, address table down,
// result up); the parent polls them under one deadline.
#include "tests/net/process_ranks.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dsa::test {
namespace {

using clock = std::chrono::steady_clock;

bool write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool write_frame(int fd, const net::bytes& b) {
  std::uint64_t n = b.size();
  return write_all(fd, &n, sizeof n) && write_all(fd, b.data(), b.size());
}

// Reads exactly n bytes, polling until `deadline`; false on EOF, error or timeout.
bool read_all(int fd, void* data, std::size_t n, clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0)
      return false;
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

bool read_frame(int fd, net::bytes& out, clock::time_point deadline) {
  std::uint64_t n = 0;
  if (!read_all(fd, &n, sizeof n, deadline) || n > (1ull << 34))
    return false;
  out.resize(n);
  return read_all(fd, out.data(), n, deadline);
}

net::bytes text_bytes(const std::string& s) {
  return net::bytes(reinterpret_cast<const std::byte*>(s.data()),
                    reinterpret_cast<const std::byte*>(s.data()) + s.size());
}

// The child: never returns. Exit code 0 when it reported back, whatever fn returned.
[[noreturn]] void child(int rank, int n, const rank_fn& fn, const process_options& options,
                        int up, int down) {
  for (const auto& [key, value] : options.env)
    ::setenv(key.c_str(), value.c_str(), 1);
  const auto deadline = clock::now() + options.deadline;
  int code = 0;
  {
    auto t = net::ucx_transport::create(rank, n, options.job_token);
    if (!t) {
      write_frame(up, {});
      write_frame(up, text_bytes("E" + t.err().to_string()));
      ::_exit(3);
    }
    write_frame(up, (*t)->local_address());
    std::vector<net::bytes> addresses(static_cast<std::size_t>(n));
    for (auto& a : addresses)
      if (!read_frame(down, a, deadline))
        ::_exit(4);
    status c = (*t)->connect(addresses);
    expected<net::bytes> result =
        c ? fn(**t, rank, addresses) : expected<net::bytes>(c.err());
    net::bytes frame;
    if (result) {
      frame = text_bytes("O");
      frame.insert(frame.end(), result->begin(), result->end());
    } else {
      frame = text_bytes("E" + result.err().to_string());
    }
    if (!write_frame(up, frame))
      code = 5;
  } // the transport closes here, before the process exits
  ::_exit(code);
}

} // namespace

std::vector<rank_outcome> run_process_ranks(int n, const rank_fn& fn,
                                            const process_options& options) {
  std::vector<rank_outcome> outcomes(static_cast<std::size_t>(n));
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  std::vector<int> up(static_cast<std::size_t>(n), -1), down(static_cast<std::size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    int to_parent[2], to_child[2];
    if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0)
      return outcomes;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(to_parent[0]);
      ::close(to_child[1]);
      for (int k = 0; k < r; ++k) { // the other ranks' pipes are not this child's business
        ::close(up[static_cast<std::size_t>(k)]);
        ::close(down[static_cast<std::size_t>(k)]);
      }
      child(r, n, fn, options, to_parent[1], to_child[0]);
    }
    ::close(to_parent[1]);
    ::close(to_child[0]);
    pids[static_cast<std::size_t>(r)] = pid;
    up[static_cast<std::size_t>(r)] = to_parent[0];
    down[static_cast<std::size_t>(r)] = to_child[1];
  }
  const auto deadline = clock::now() + options.deadline;
  std::vector<net::bytes> addresses(static_cast<std::size_t>(n));
  bool all = true;
  for (int r = 0; r < n; ++r)
    all = all && read_frame(up[static_cast<std::size_t>(r)], addresses[static_cast<std::size_t>(r)],
                            deadline) &&
          !addresses[static_cast<std::size_t>(r)].empty();
  if (all)
    for (int r = 0; r < n; ++r)
      for (const auto& a : addresses)
        write_frame(down[static_cast<std::size_t>(r)], a);
  for (int r = 0; r < n && all; ++r) {
    net::bytes frame;
    auto& o = outcomes[static_cast<std::size_t>(r)];
    if (!read_frame(up[static_cast<std::size_t>(r)], frame, deadline) || frame.empty())
      continue; // died, or timed out: reported as not finished
    o.finished = true;
    o.ok = frame[0] == std::byte{'O'};
    if (o.ok)
      o.output.assign(frame.begin() + 1, frame.end());
    else
      o.error.assign(reinterpret_cast<const char*>(frame.data()) + 1, frame.size() - 1);
  }
  for (int r = 0; r < n; ++r) {
    if (!outcomes[static_cast<std::size_t>(r)].finished || clock::now() > deadline)
      ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
    // Exit after reporting is prompt (closing the transport is bounded); past the
    // deadline the rank was killed above.
    int st = 0;
    while (::waitpid(pids[static_cast<std::size_t>(r)], &st, 0) < 0 && errno == EINTR) {
    }
    ::close(up[static_cast<std::size_t>(r)]);
    ::close(down[static_cast<std::size_t>(r)]);
  }
  return outcomes;
}

} // namespace dsa::test
