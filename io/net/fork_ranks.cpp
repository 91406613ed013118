// Forked ranks: a pipe each way per child carries length-prefixed frames (a kind byte,
// then bytes): 'A' an exchange blob up, 'T' the blob table (one frame per rank) or 'X'
// (failed) down, 'O'/'E' the result up. The parent reads them under one deadline.
#include "io/net/fork_ranks.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dsa::net {
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

bool write_frame(int fd, char kind, const bytes& b) {
  std::uint64_t n = b.size() + 1;
  return write_all(fd, &n, sizeof n) && write_all(fd, &kind, 1) &&
         write_all(fd, b.data(), b.size());
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

// One frame: its kind and bytes; kind 0 on EOF, error or timeout.
char read_frame(int fd, bytes& out, clock::time_point deadline) {
  std::uint64_t n = 0;
  char kind = 0;
  if (!read_all(fd, &n, sizeof n, deadline) || n == 0 || n > (1ull << 36) ||
      !read_all(fd, &kind, 1, deadline))
    return 0;
  out.resize(n - 1);
  return read_all(fd, out.data(), n - 1, deadline) ? kind : 0;
}

bytes text_bytes(const std::string& s) {
  return bytes(reinterpret_cast<const std::byte*>(s.data()),
               reinterpret_cast<const std::byte*>(s.data()) + s.size());
}

[[noreturn]] void child(int rank, int n, const forked_fn& fn, const fork_options& options, int up,
                        int down) {
  for (const auto& [key, value] : options.env)
    ::setenv(key.c_str(), value.c_str(), 1);
  const auto deadline = clock::now() + options.deadline;
  exchange_fn exchange = [&](const bytes& mine) -> expected<std::vector<bytes>> {
    if (!write_frame(up, 'A', mine))
      return make_error(errc::io, "rank {}: cannot write to the parent's pipe", rank);
    std::vector<bytes> all(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      const char kind = read_frame(down, all[static_cast<std::size_t>(r)], deadline);
      if (kind == 'X')
        return make_error(errc::runtime, "rank {}: the exchange failed (a rank died or finished "
                                         "without taking part)", rank);
      if (kind != 'T')
        return make_error(errc::io, "rank {}: no blob of rank {} from the parent", rank, r);
    }
    return all;
  };
  int code = 0;
  {
    expected<bytes> result = fn(rank, exchange);
    bool written = result ? write_frame(up, 'O', *result)
                          : write_frame(up, 'E', text_bytes(result.err().to_string()));
    if (!written)
      code = 5;
  } // whatever fn built is destroyed before the process exits
  std::fflush(nullptr);
  ::_exit(code);
}

} // namespace

std::vector<forked_result> run_forked_ranks(int n, const forked_fn& fn,
                                            const fork_options& options) {
  std::vector<forked_result> results(static_cast<std::size_t>(n));
  std::vector<pid_t> pids;
  std::vector<int> up, down;
  std::fflush(nullptr); // nothing buffered is printed twice
  for (int r = 0; r < n; ++r) {
    int to_parent[2], to_child[2];
    if (::pipe(to_parent) != 0)
      break;
    if (::pipe(to_child) != 0) {
      ::close(to_parent[0]);
      ::close(to_parent[1]);
      break;
    }
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(to_parent[0]);
      ::close(to_child[1]);
      for (std::size_t k = 0; k < up.size(); ++k) { // the other ranks' pipes
        ::close(up[k]);
        ::close(down[k]);
      }
      child(r, n, fn, options, to_parent[1], to_child[0]);
    }
    ::close(to_parent[1]);
    ::close(to_child[0]);
    if (pid < 0) {
      ::close(to_parent[0]);
      ::close(to_child[1]);
      break;
    }
    pids.push_back(pid);
    up.push_back(to_parent[0]);
    down.push_back(to_child[1]);
  }
  const auto deadline = clock::now() + options.deadline;
  const int started = static_cast<int>(pids.size());
  // Rounds: read one frame from every rank still running. When all n ranks offered a
  // blob, each gets the table; otherwise those that offered one get 'X' (the exchange
  // failed: a rank died or already finished) and go on to report.
  std::vector<bool> done(static_cast<std::size_t>(started), false);
  std::vector<bool> reaped(static_cast<std::size_t>(started), false);
  std::vector<int> exit_status(static_cast<std::size_t>(started), 0);
  for (;;) {
    std::vector<bytes> frames(static_cast<std::size_t>(started));
    std::vector<char> kinds(static_cast<std::size_t>(started), 0);
    int offered = 0, running = 0;
    // Frames are read in whatever order the ranks send them, so a rank that dies is
    // reaped at once: UCX's shared-memory keepalive takes an unreaped (zombie) peer for
    // alive, and the other ranks would wait for it forever.
    std::vector<std::size_t> pending;
    for (int r = 0; r < started; ++r)
      if (!done[static_cast<std::size_t>(r)])
        pending.push_back(static_cast<std::size_t>(r));
    running = static_cast<int>(pending.size());
    while (!pending.empty()) {
      std::vector<pollfd> fds;
      for (std::size_t i : pending)
        fds.push_back(pollfd{up[i], POLLIN, 0});
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      int ready = left.count() > 0 ? ::poll(fds.data(), fds.size(), static_cast<int>(left.count())) : 0;
      if (ready < 0 && errno == EINTR)
        continue;
      if (ready <= 0)
        break; // the deadline: whoever is still pending is reported as not finished
      std::vector<std::size_t> still;
      for (std::size_t k = 0; k < pending.size(); ++k) {
        const std::size_t i = pending[k];
        if (fds[k].revents == 0) {
          still.push_back(i);
          continue;
        }
        kinds[i] = read_frame(up[i], frames[i], deadline);
        if (kinds[i] == 0 && !reaped[i]) {
          int st = 0;
          while (::waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
          }
          reaped[i] = true;
          exit_status[i] = st;
        }
      }
      pending = std::move(still);
    }
    for (int r = 0; r < started; ++r) {
      const auto i = static_cast<std::size_t>(r);
      if (done[i])
        continue;
      offered += kinds[i] == 'A';
      if (kinds[i] == 'A')
        continue;
      done[i] = true;
      if (kinds[i] != 'O' && kinds[i] != 'E')
        continue; // died, or timed out: reported as not finished
      auto& res = results[i];
      res.finished = true;
      res.ok = kinds[i] == 'O';
      if (res.ok)
        res.output = std::move(frames[i]);
      else
        res.error.assign(reinterpret_cast<const char*>(frames[i].data()), frames[i].size());
    }
    if (running == 0)
      break;
    for (int r = 0; r < started; ++r) {
      const auto i = static_cast<std::size_t>(r);
      if (kinds[i] != 'A')
        continue;
      if (offered == n)
        for (const auto& b : frames)
          write_frame(down[i], 'T', b);
      else
        write_frame(down[i], 'X', {});
    }
  }
  for (int r = 0; r < started; ++r) {
    auto& res = results[static_cast<std::size_t>(r)];
    const bool late = !res.finished && clock::now() >= deadline;
    if (!res.finished && !reaped[static_cast<std::size_t>(r)])
      ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
    int st = exit_status[static_cast<std::size_t>(r)];
    if (!reaped[static_cast<std::size_t>(r)]) // a rank that reported exits promptly
      while (::waitpid(pids[static_cast<std::size_t>(r)], &st, 0) < 0 && errno == EINTR) {
      }
    if (!res.finished)
      res.error = late ? std::string("still running at the deadline; killed")
                  : WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                                    : "exited with code " + std::to_string(WEXITSTATUS(st)) +
                                          " without reporting";
    else if (WIFSIGNALED(st) || WEXITSTATUS(st) != 0)
      res.error += (res.error.empty() ? "" : "; ") + std::string("the process then ") +
                   (WIFSIGNALED(st) ? "died of signal " + std::to_string(WTERMSIG(st))
                                    : "exited with code " + std::to_string(WEXITSTATUS(st)));
    ::close(up[static_cast<std::size_t>(r)]);
    ::close(down[static_cast<std::size_t>(r)]);
  }
  return results;
}

} // namespace dsa::net
