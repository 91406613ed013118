// The local processes of a launched job; see process_group.hpp. One poll loop watches a
// self-pipe (signals, failures reported by other threads) and every rank's output pipes.
#include "tools/launch/process_group.hpp"
#include "tools/omp_env.hpp"

#include "io/ckpt/posix_file.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace dsa::tools {
namespace {

using clock = std::chrono::steady_clock;
using ckpt::unique_fd;

// Written by the signal handlers (the signal number) and by fail() (0); read by supervise.
int g_wake_write = -1;

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t rc = ::write(g_wake_write, &b, 1); // full pipe: a wake is pending
  errno = saved;
}

void say(const std::string& line) {
  std::string text = "dsactor launch: " + line + "\n";
  [[maybe_unused]] ssize_t rc = ::write(2, text.data(), text.size());
}

// Whole-buffer write to our stdout or stderr; a closed reader (EPIPE) drops the output.
void write_out(int fd, const std::string& text) {
  const char* p = text.data();
  std::size_t n = text.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// One output stream of one rank: its pipe and the line not yet complete.
struct stream {
  unique_fd fd;
  int to = 1; // our stdout or stderr
  std::string partial;
};

struct child {
  int rank = 0;
  std::string label; // process_spec::label
  std::string host; // "" for this host
  // "rank N", or the label of a process that starts the ranks itself (mpirun, srun).
  std::string name() const { return label.empty() ? fmt::format("rank {}", rank) : label; }
  pid_t pid = -1;
  bool running = true;
  bool stopped = false; // the launcher sent it SIGTERM or SIGKILL after another's failure
  stream out, err;
};

} // namespace

std::string describe_wait_status(int status) {
  if (WIFEXITED(status))
    return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       signal_name(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

class process_group::impl {
public:
  explicit impl(supervise_options options) : options_(options) {
    int fds[2];
    DSA_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2: {}", std::strerror(errno));
    wake_read_ = unique_fd(fds[0]);
    wake_write_ = unique_fd(fds[1]);
    DSA_CHECK(g_wake_write < 0, "only one process_group per process");
    g_wake_write = wake_write_.get();
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1})
      ::sigaction(sig, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
  }

  ~impl() {
    for (auto& c : children_)
      if (c.running)
        signal_rank(c, SIGKILL);
    for (auto& c : children_)
      if (c.running) {
        int st;
        while (::waitpid(c.pid, &st, 0) < 0 && errno == EINTR) {
        }
      }
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1})
      std::signal(sig, SIG_DFL);
    g_wake_write = -1;
  }

  status spawn_rank(const process_spec& spec);
  void fail(std::string why, int rank) {
    {
      std::lock_guard<std::mutex> lock(failures_mutex_);
      failures_.emplace_back(std::move(why), rank);
    }
    unsigned char zero = 0;
    [[maybe_unused]] ssize_t rc = ::write(wake_write_.get(), &zero, 1);
  }
  int supervise(const std::function<void(int, const std::string&)>& on_end);

private:
  void handle_wake();
  void on_user_signal(int sig);
  void pass_flight_request();
  void reap(const std::function<void(int, const std::string&)>& on_end);
  void begin_stop(const std::string& why, int culprit);
  void signal_rank(child& c, int sig);
  void forward(child& c, stream& s, bool drain);
  void emit_line(const child& c, stream& s, const std::string& line);

  const supervise_options options_;
  unique_fd wake_read_, wake_write_;
  std::vector<child> children_;
  std::mutex failures_mutex_;
  std::vector<std::pair<std::string, int>> failures_; // why, and the rank or -1
  int interrupts_ = 0;
  bool stopping_ = false;
  std::optional<clock::time_point> kill_at_;
  std::optional<int> own_code_; // exit code of the first rank that failed unprompted
  std::string first_failure_;
};

status process_group::impl::spawn_rank(const process_spec& spec) {
  // Everything the child needs is built here: between fork and exec it may only make
  // async-signal-safe calls, since other threads (the rendezvous server) may hold locks.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    bool replaced = chosen_for_this_process(name); // each rank chooses its own (omp_env.hpp)
    for (const auto& [k, v] : spec.env)
      replaced = replaced || k == name;
    if (!replaced)
      env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : spec.env)
    env_strings.push_back(k + "=" + v);
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<char*> envp, argv;
  for (auto& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : argv_strings)
    argv.push_back(s.data());
  argv.push_back(nullptr);
  if (argv_strings.empty())
    return make_error(errc::invalid_argument, "rank {}: nothing to run", spec.rank);

  unique_fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  int out[2], err[2];
  if (!devnull.valid() || ::pipe2(out, O_CLOEXEC) != 0)
    return make_error(errc::io, "rank {}: pipe: {}", spec.rank, std::strerror(errno));
  unique_fd out_read(out[0]), out_write(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0)
    return make_error(errc::io, "rank {}: pipe: {}", spec.rank, std::strerror(errno));
  unique_fd err_read(err[0]), err_write(err[1]);
  unique_fd in_read, in_write; // with stdin_text: a pipe it is written into
  if (!spec.stdin_text.empty()) {
    int in[2];
    if (::pipe2(in, O_CLOEXEC) != 0)
      return make_error(errc::io, "rank {}: pipe: {}", spec.rank, std::strerror(errno));
    in_read = unique_fd(in[0]);
    in_write = unique_fd(in[1]);
  }
  const pid_t parent = ::getpid();
  static const char exec_failed[] = "dsactor launch: exec failed\n";

  // Signals wait until the child has reset its handlers: the launcher's handler would
  // write into the launcher's wake pipe from the child.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid != 0)
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0)
    return make_error(errc::io, "rank {}: fork: {}", spec.rank, std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) // the launcher died before prctl took effect
      ::_exit(127);
    ::dup2(in_read.valid() ? in_read.get() : devnull.get(), 0);
    ::dup2(out_write.get(), 1);
    ::dup2(err_write.get(), 2);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) // SIGPIPE: ignored survives exec
      ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    [[maybe_unused]] ssize_t rc = ::write(2, exec_failed, sizeof exec_failed - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid); // also here, so a signal right after fork finds the group
  if (in_write.valid()) {
    // A line (far below a pipe's buffer): written whole without blocking, then closed. Were
    // it cut short, the remote `read` would fail and so the rank, which the job then reports.
    const std::string& text = spec.stdin_text;
    [[maybe_unused]] ssize_t written = ::write(in_write.get(), text.data(), text.size());
    in_write = unique_fd();
  }
  for (int fd : {out_read.get(), err_read.get()})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  child& c = children_.emplace_back();
  c.rank = spec.rank;
  c.label = spec.label;
  c.host = spec.host;
  c.pid = pid;
  c.out.fd = std::move(out_read);
  c.out.to = 1;
  c.err.fd = std::move(err_read);
  c.err.to = 2;
  return {};
}

int process_group::impl::supervise(const std::function<void(int, const std::string&)>& on_end) {
  reap(on_end);
  for (;;) {
    bool any_running = false;
    for (const auto& c : children_)
      any_running = any_running || c.running;
    if (!any_running)
      break;
    if (kill_at_ && clock::now() >= *kill_at_) {
      kill_at_.reset();
      for (auto& c : children_)
        if (c.running) {
          say(fmt::format("{} still runs {} ms after SIGTERM; sending SIGKILL", c.name(),
                          options_.grace.count()));
          signal_rank(c, SIGKILL);
          c.stopped = true;
        }
    }
    std::vector<pollfd> fds{{wake_read_.get(), POLLIN, 0}};
    std::vector<std::pair<child*, stream*>> polled;
    for (auto& c : children_)
      for (stream* s : {&c.out, &c.err})
        if (s->fd.valid()) {
          fds.push_back({s->fd.get(), POLLIN, 0});
          polled.emplace_back(&c, s);
        }
    int timeout = -1;
    if (kill_at_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at_ - clock::now());
      timeout = static_cast<int>(std::max<long long>(0, left.count()) + 1);
    }
    ::poll(fds.data(), fds.size(), timeout); // EINTR: a signal, handled through the pipe
    // Failures reported by the rendezvous before exits: a rank that exits because it was
    // told another was lost must not be taken for the first failure.
    if (fds[0].revents)
      handle_wake();
    for (std::size_t i = 0; i < polled.size(); ++i)
      if (fds[i + 1].revents)
        forward(*polled[i].first, *polled[i].second, false);
    reap(on_end);
  }
  // Every rank ended: what they wrote before is in the pipes; a grandchild that still holds
  // a pipe open does not keep the launcher waiting.
  for (auto& c : children_)
    for (stream* s : {&c.out, &c.err})
      forward(c, *s, true);
  if (first_failure_.empty())
    return 0;
  say(fmt::format("the job {}: {}", interrupts_ > 0 ? "was interrupted" : "failed",
                  first_failure_));
  return own_code_.value_or(1);
}

void process_group::impl::handle_wake() {
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(wake_read_.get(), buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] == SIGINT || buf[i] == SIGTERM || buf[i] == SIGHUP)
        on_user_signal(buf[i]);
      else if (buf[i] == SIGUSR1)
        pass_flight_request();
  std::vector<std::pair<std::string, int>> failures;
  {
    std::lock_guard<std::mutex> lock(failures_mutex_);
    failures.swap(failures_);
  }
  for (auto [why, rank] : failures) {
    // A rank on another host: say which (a lost heartbeat names only the rank).
    for (const auto& c : children_)
      if (c.rank == rank && !c.host.empty() && c.host != "localhost")
        why += fmt::format(" (rank {} ran on host {})", rank, c.host);
    if (first_failure_.empty())
      first_failure_ = why;
    begin_stop(why, rank);
  }
}

// SIGUSR1: each rank writes a flight record into its trace (dsactor trace hang) and runs on:
// every rank through the rendezvous where this launcher hosts it, else this host's ranks by
// signal (ranks on other hosts are then not reached: signal their processes there).
void process_group::impl::pass_flight_request() {
  int local = 0, remote = 0;
  if (options_.on_flight_request && options_.on_flight_request()) {
    for (const auto& c : children_) local += c.running;
    say(fmt::format("SIGUSR1: asked every rank on every host through the rendezvous for a flight record ({} "
                    "started by this launcher)",
                    local));
    return;
  }
  for (auto& c : children_) {
    if (!c.running) continue;
    if (c.host.empty() || c.host == "localhost") {
      signal_rank(c, SIGUSR1);
      ++local;
    } else {
      ++remote;
    }
  }
  say(fmt::format("SIGUSR1: passed on to {} rank(s) of this host for a flight record each{}", local,
                  remote ? fmt::format(" ({} rank(s) on other hosts not reached: kill -USR1 their processes there)",
                                       remote)
                         : ""));
}

void process_group::impl::on_user_signal(int sig) {
  if (++interrupts_ == 1) {
    say(fmt::format("{}: passing it on to every rank (again to kill them)", signal_name(sig)));
    for (auto& c : children_)
      if (c.running && (c.host.empty() || c.host == "localhost"))
        signal_rank(c, sig);
    if (options_.on_interrupt) options_.on_interrupt();
    return;
  }
  say(fmt::format("{} again: killing every rank", signal_name(sig)));
  kill_at_.reset();
  for (auto& c : children_)
    if (c.running)
      signal_rank(c, SIGKILL);
}

void process_group::impl::reap(const std::function<void(int, const std::string&)>& on_end) {
  for (auto& c : children_) {
    if (!c.running)
      continue;
    int st = 0;
    pid_t r = ::waitpid(c.pid, &st, WNOHANG);
    if (r != c.pid)
      continue;
    c.running = false;
    std::string how = describe_wait_status(st);
    const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    // A rank started over ssh: name its host; ssh's own failures exit 255.
    if (!c.host.empty() && c.host != "localhost")
      how = fmt::format("on host {} {}{}", c.host, how,
                        WIFEXITED(st) && WEXITSTATUS(st) == 255
                            ? " (ssh could not connect or log in, the remote rank was killed by a signal, or it exited 255)"
                            : "");
    if (!ok)
      say(fmt::format("{} {}", c.name(), how));
    if (!ok && first_failure_.empty())
      first_failure_ = fmt::format("{} {}", c.name(), how);
    if (!ok && !c.stopped && !own_code_)
      own_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (on_end)
      on_end(c.rank, how);
    if (!ok)
      begin_stop(fmt::format("{} {}", c.name(), how), c.rank);
  }
}

// After a failure: SIGTERM to every rank, SIGKILL after the grace period. Not after a
// user's interrupt: the ranks are finishing their step and checkpoint, and the user decides.
// `culprit` (a rank, or -1) is not counted as stopped: its own exit code stays its failure.
void process_group::impl::begin_stop(const std::string& why, int culprit) {
  if (stopping_ || interrupts_ > 0)
    return;
  stopping_ = true;
  bool any = false, remote = false;
  for (auto& c : children_)
    if (c.running) {
      // A rank on another host runs under its ssh client here: a signal to that would end
      // the ssh session and with it the rank, by SIGHUP, before it could clean up (its NVMe
      // swap files, its trace). The rendezvous tells it that the job failed instead; only
      // one still running at the grace's end is ended with its ssh client.
      const bool here = c.host.empty() || c.host == "localhost" || !options_.remote_ranks_hear_rendezvous;
      if (here) {
        signal_rank(c, SIGTERM);
        signal_rank(c, SIGCONT); // a stopped rank would keep SIGTERM pending until SIGKILL
      }
      remote = remote || !here;
      c.stopped = c.rank != culprit;
      any = true;
    }
  if (!any)
    return;
  say(fmt::format("{}: stopping every other rank (SIGTERM{}, then SIGKILL after {} ms)", why,
                  remote ? "; those on other hosts through the rendezvous" : "", options_.grace.count()));
  kill_at_ = clock::now() + options_.grace;
}

void process_group::impl::signal_rank(child& c, int sig) {
  // The rank's whole process group, so that its own children stop too.
  if (::kill(-c.pid, sig) != 0)
    ::kill(c.pid, sig);
}

void process_group::impl::forward(child& c, stream& s, bool drain) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(s.fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n > 0) {
      s.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t start = 0, nl;
      while ((nl = s.partial.find('\n', start)) != std::string::npos) {
        emit_line(c, s, s.partial.substr(start, nl - start));
        start = nl + 1;
      }
      s.partial.erase(0, start);
      constexpr std::size_t longest = 1 << 16; // a longer line is cut, each piece prefixed
      if (s.partial.size() > longest) {
        emit_line(c, s, s.partial);
        s.partial.clear();
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !drain)
      return;
    // End of file, an error, or (draining) nothing more for now: this stream is done.
    if (!s.partial.empty())
      emit_line(c, s, s.partial);
    s.partial.clear();
    s.fd = unique_fd();
    return;
  }
}

void process_group::impl::emit_line(const child& c, stream& s, const std::string& line) {
  // A rank on another host: "[HOST rank N]", so a job's interleaved output names both.
  if (!c.host.empty() && c.host != "localhost")
    write_out(s.to, fmt::format("[{} rank {}] {}\n", c.host, c.rank, line));
  else
    write_out(s.to, fmt::format("[{}] {}\n", c.name(), line));
}

process_group::process_group(supervise_options options) : impl_(std::make_unique<impl>(options)) {}
process_group::~process_group() = default;

status process_group::spawn_rank(const process_spec& spec) {
  return impl_->spawn_rank(spec);
}
void process_group::fail(std::string why, int rank) {
  impl_->fail(std::move(why), rank);
}
int process_group::supervise(const std::function<void(int, const std::string&)>& on_end) {
  return impl_->supervise(on_end);
}

} // namespace dsa::tools
