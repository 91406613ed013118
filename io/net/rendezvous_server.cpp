// The rendezvous server: one thread polling the listener and every connection; see
// rendezvous_server.hpp and, for the protocol, rendezvous.hpp.
#include "io/net/rendezvous_server.hpp"

#include "core/log.hpp"
#include "io/net/rendezvous_frame.hpp"
#include "io/net/tcp_socket.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>

namespace dsa::net {
namespace {

using clock = std::chrono::steady_clock;

struct connection {
  unique_fd fd;
  std::string peer;
  frame_buffer in;
  bytes out; // queued bytes not yet accepted by the socket
  std::size_t out_sent = 0;
  int rank = -1; // set once its hello was accepted
  clock::time_point opened, last_heard, closing_since;
  bool closing = false; // ignore what arrives; shut down writing once `out` is flushed
  bool shut = false;    // writing shut down: waiting for the peer's close (or a timeout)
  bool dead = false;    // close now; a member's loss is `why`
  std::string why;
};

enum class member_state { absent, joined, left, lost };

struct member {
  member_state state = member_state::absent;
  connection* conn = nullptr;
  std::string peer;
  config_summary config;
  bytes blob;
};

long long ms(clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

} // namespace

class rendezvous_server::impl {
public:
  impl(unique_fd listener, int port, std::string token, int world_size,
       rendezvous_options options, event_callback on_event)
      : port_(port), token_(std::move(token)), world_size_(world_size), options_(options),
        on_event_(std::move(on_event)), listener_(std::move(listener)),
        members_(static_cast<std::size_t>(world_size)) {}

  void start() { thread_ = std::thread([this] { run(); }); }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify();
    if (thread_.joinable())
      thread_.join();
  }

  void process_exited(int rank, std::string how) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      exits_.emplace_back(rank, std::move(how));
    }
    wake_.notify();
  }

  int port_;
  mutable std::mutex mutex_; // guards the fields down to wake_
  server_phase phase_ = server_phase::joining;
  std::string failure_;
  int refused_ = 0;
  std::vector<std::pair<int, std::string>> exits_;
  bool stop_ = false;
  wakeup wake_;

private:
  void run();
  bool poll_once();
  void accept_all();
  void read_from(connection& c);
  void handle(connection& c, frame f);
  void on_hello(connection& c, const frame& f);
  void on_all_joined();
  void on_gather(connection& c, const frame& f);
  void on_leave(connection& c);
  void on_exit(int rank, const std::string& how);
  void check_timers();
  void sweep();

  void send(connection& c, frame_type type, const bytes& payload = {});
  void flush(connection& c);
  void close_after_flush(connection& c);
  void refuse(connection& c, errc code, const std::string& why);
  void reject(connection& c, const std::string& why, int rank);
  void fail_job(errc code, const std::string& text, int rank);
  void lose(int rank, const std::string& why);
  void set_phase(server_phase p, const std::string& failure = "");
  void emit(server_event::kind what, int rank, const std::string& text);
  int joined_count() const;

  const std::string token_;
  const int world_size_;
  const rendezvous_options options_;
  const event_callback on_event_;
  std::thread thread_;

  // Owned by the server thread.
  unique_fd listener_;
  std::list<connection> conns_;
  std::vector<member> members_;
  server_phase phase_seen_ = server_phase::joining; // the thread's copy of phase_
  std::map<int, std::string> exited_unjoined_;
  std::map<std::string, std::vector<std::optional<bytes>>> gathers_;
  clock::time_point next_heartbeat_ = clock::now();
};

void rendezvous_server::impl::run() {
  while (poll_once()) {
  }
  conns_.clear(); // closes every socket: each client still connected sees the server lost
  listener_ = unique_fd();
}

// One round: wait for sockets or a wake, handle them, then the timers. False ends the thread.
bool rendezvous_server::impl::poll_once() {
  std::vector<pollfd> fds;
  fds.push_back({wake_.fd(), POLLIN, 0});
  fds.push_back({listener_.get(), POLLIN, 0});
  std::vector<connection*> polled;
  for (auto& c : conns_) {
    short events = POLLIN;
    if (c.out_sent < c.out.size())
      events |= POLLOUT;
    fds.push_back({c.fd.get(), events, 0});
    polled.push_back(&c);
  }
  auto now = clock::now();
  auto wait = std::min<clock::duration>(next_heartbeat_ - now, options_.heartbeat_timeout / 4);
  int timeout_ms = static_cast<int>(std::max<long long>(1, ms(wait)));
  int rc = ::poll(fds.data(), fds.size(), timeout_ms);
  if (rc < 0 && errno != EINTR)
    log_error("rendezvous: poll failed: {}", std::strerror(errno));

  std::vector<std::pair<int, std::string>> exits;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_)
      return false;
    exits.swap(exits_);
  }
  if (fds[0].revents)
    wake_.consume();
  for (auto& [rank, how] : exits)
    on_exit(rank, how);
  if (fds[1].revents & POLLIN)
    accept_all();
  for (std::size_t i = 0; i < polled.size(); ++i) {
    connection& c = *polled[i];
    short re = fds[i + 2].revents;
    if (c.dead)
      continue;
    if (re & (POLLIN | POLLHUP | POLLERR))
      read_from(c);
    if (!c.dead && (re & POLLOUT))
      flush(c);
  }
  check_timers();
  sweep();
  return !(phase_seen_ == server_phase::finished && conns_.empty());
}

void rendezvous_server::impl::accept_all() {
  for (;;) {
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        log_warn("rendezvous: accept failed: {}", std::strerror(errno));
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      return;
    }
    set_nodelay(fd);
    connection& c = conns_.emplace_back();
    c.fd = unique_fd(fd);
    c.peer = tcp_peer_name(fd);
    c.opened = c.last_heard = clock::now();
  }
}

void rendezvous_server::impl::read_from(connection& c) {
  std::byte buf[65536];
  for (;;) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (!c.closing)
        c.in.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    c.dead = true;
    // A peer that dies with unread input resets its connection instead of closing it.
    c.why = n == 0              ? "its connection closed without a leave"
            : errno == ECONNRESET ? "its connection closed without a leave (reset)"
                                  : fmt::format("its connection failed: {}", std::strerror(errno));
    break; // frames that arrived before the close are still handled below
  }
  c.last_heard = clock::now();
  while (!c.closing) {
    auto next = c.in.next(c.rank < 0 ? max_hello_frame_bytes : max_frame_bytes, c.peer);
    if (!next) {
      if (c.rank < 0) {
        refuse(c, errc::protocol, next.err().message);
      } else {
        c.dead = true;
        c.why = fmt::format("it broke the protocol: {}", next.err().message);
      }
      return;
    }
    if (!*next)
      return;
    handle(c, std::move(**next));
  }
}

void rendezvous_server::impl::handle(connection& c, frame f) {
  if (c.rank < 0) {
    if (f.type != frame_type::hello)
      return refuse(c, errc::protocol, "the first message was not a hello");
    return on_hello(c, f);
  }
  switch (f.type) {
  case frame_type::heartbeat: return;
  case frame_type::leave: return on_leave(c);
  case frame_type::gather: return on_gather(c, f);
  default:
    c.dead = true;
    c.why = fmt::format("it broke the protocol: unexpected frame type {}",
                        static_cast<int>(f.type));
  }
}

void rendezvous_server::impl::on_hello(connection& c, const frame& f) {
  auto hello = decode_hello(f.payload);
  if (!hello)
    return refuse(c, errc::protocol, hello.err().message);
  const hello_msg& h = *hello;
  // Compare every byte, so the time taken says nothing about how much of a guess was right.
  bool token_ok = h.job_token.size() == token_.size();
  unsigned char diff = 0;
  for (std::size_t i = 0; token_ok && i < token_.size(); ++i)
    diff |= static_cast<unsigned char>(h.job_token[i] ^ token_[i]);
  if (!token_ok || diff != 0)
    return refuse(c, errc::protocol,
                  h.job_token.empty() ? "no job token" : "wrong job token");
  if (phase_seen_ == server_phase::failed) {
    send(c, frame_type::abort, encode_abort({errc::runtime, failure_}));
    return close_after_flush(c);
  }
  if (phase_seen_ != server_phase::joining)
    return refuse(c, errc::invalid_argument,
                  fmt::format("rank {} tried to join after the job started", h.rank));
  const std::string who = fmt::format("rank {} (from {})", h.rank, c.peer);
  if (h.world_size != world_size_)
    return reject(c, fmt::format("{} was started with world size {}; the rendezvous expects {}",
                                 who, h.world_size, world_size_),
                  -1);
  if (h.rank < 0 || h.rank >= world_size_)
    return reject(
        c, fmt::format("{} is outside 0..{} (world size {})", who, world_size_ - 1, world_size_),
        -1);
  member& m = members_[static_cast<std::size_t>(h.rank)];
  if (m.state != member_state::absent)
    return reject(
        c, fmt::format("rank {} joined twice (from {} and from {})", h.rank, m.peer, c.peer),
        h.rank);
  c.rank = h.rank;
  m.state = member_state::joined;
  m.conn = &c;
  m.peer = c.peer;
  m.config = h.config;
  m.blob = h.blob;
  log_debug("rendezvous: rank {} joined from {}", h.rank, c.peer);
  if (!exited_unjoined_.empty()) {
    auto& [rank, how] = *exited_unjoined_.begin();
    return fail_job(errc::runtime,
                    fmt::format("rank {} lost ({} before joining the rendezvous)", rank, how),
                    rank);
  }
  if (joined_count() == world_size_)
    on_all_joined();
}

void rendezvous_server::impl::on_all_joined() {
  std::string differences;
  for (int r = 1; r < world_size_; ++r) {
    std::string d = config_difference(members_[0].config, members_[static_cast<std::size_t>(r)].config, r);
    if (!d.empty())
      differences += (differences.empty() ? "" : "; ") + d;
  }
  if (!differences.empty())
    return fail_job(errc::config, differences, -1);
  std::vector<bytes> blobs;
  for (const auto& m : members_)
    blobs.push_back(m.blob);
  const bytes welcome = encode_blobs(blobs);
  for (auto& m : members_)
    send(*m.conn, frame_type::welcome, welcome);
  set_phase(server_phase::running);
  log_debug("rendezvous: all {} ranks joined", world_size_);
  emit(server_event::kind::joined, -1, "");
}

void rendezvous_server::impl::on_gather(connection& c, const frame& f) {
  auto g = decode_keyed(f.payload);
  if (!g || g->blobs.size() != 1 || phase_seen_ != server_phase::running) {
    c.dead = true;
    c.why = !g ? fmt::format("it broke the protocol: {}", g.err().message)
               : "it broke the protocol: a malformed allgather";
    return;
  }
  for (int r = 0; r < world_size_; ++r)
    if (members_[static_cast<std::size_t>(r)].state == member_state::left)
      return fail_job(errc::runtime,
                      fmt::format("rank {} started allgather '{}' after rank {} left the job",
                                  c.rank, g->key, r),
                      c.rank);
  auto& slots = gathers_[g->key];
  slots.resize(static_cast<std::size_t>(world_size_));
  auto& mine = slots[static_cast<std::size_t>(c.rank)];
  if (mine)
    return fail_job(errc::protocol,
                    fmt::format("rank {} started allgather '{}' twice", c.rank, g->key), c.rank);
  mine = std::move(g->blobs[0]);
  if (std::any_of(slots.begin(), slots.end(), [](const auto& s) { return !s; }))
    return;
  keyed_blobs done{g->key, {}};
  for (auto& s : slots)
    done.blobs.push_back(std::move(*s));
  gathers_.erase(g->key);
  const bytes payload = encode_keyed(done);
  for (auto& m : members_)
    if (m.conn)
      send(*m.conn, frame_type::gathered, payload);
}

void rendezvous_server::impl::on_leave(connection& c) {
  if (phase_seen_ != server_phase::running) {
    c.dead = true;
    c.why = "it left before every rank joined";
    return;
  }
  if (!gathers_.empty())
    return fail_job(errc::runtime,
                    fmt::format("rank {} left while allgather '{}' waited for it", c.rank,
                                gathers_.begin()->first),
                    c.rank);
  member& m = members_[static_cast<std::size_t>(c.rank)];
  m.state = member_state::left;
  m.conn = nullptr;
  send(c, frame_type::bye);
  close_after_flush(c);
  log_debug("rendezvous: rank {} left", c.rank);
  bool all_left = std::all_of(members_.begin(), members_.end(),
                              [](const member& x) { return x.state == member_state::left; });
  if (all_left) {
    set_phase(server_phase::finished);
    emit(server_event::kind::finished, -1, "");
  }
}

void rendezvous_server::impl::on_exit(int rank, const std::string& how) {
  if (rank < 0 || rank >= world_size_)
    return;
  member& m = members_[static_cast<std::size_t>(rank)];
  if (m.state == member_state::joined) {
    if (m.conn) { // its socket goes too; its close must not be reported a second time
      m.conn->dead = true;
      m.conn->rank = -1;
    }
    return lose(rank, how);
  }
  if (m.state != member_state::absent || phase_seen_ != server_phase::joining)
    return;
  if (joined_count() > 0)
    return fail_job(errc::runtime,
                    fmt::format("rank {} lost ({} before joining the rendezvous)", rank, how), rank);
  exited_unjoined_.emplace(rank, how); // a program that never joins is fine until another does
}

void rendezvous_server::impl::check_timers() {
  const auto now = clock::now();
  for (auto& c : conns_) {
    if (c.dead)
      continue;
    if (c.closing) {
      if (now - c.closing_since > options_.heartbeat_timeout)
        c.dead = true; // the peer does not read what is left: give up on it
    } else if (c.rank < 0) {
      if (now - c.opened > options_.heartbeat_timeout) {
        log_warn("rendezvous: closed the connection from {}: no hello within {} ms", c.peer,
                 ms(options_.heartbeat_timeout));
        c.dead = true;
      }
    } else if (now - c.last_heard > options_.heartbeat_timeout) {
      const std::string why = fmt::format("no heartbeat for {} ms", ms(now - c.last_heard));
      member& m = members_[static_cast<std::size_t>(c.rank)];
      if (m.state == member_state::joined && m.conn == &c)
        lose(c.rank, why);
      // The silent rank is told as well: it may be alive behind a broken network.
      send(c, frame_type::abort,
           encode_abort({errc::runtime, fmt::format("rank {} lost ({})", c.rank, why)}));
      close_after_flush(c);
    }
  }
  if (now >= next_heartbeat_) {
    for (auto& c : conns_)
      if (!c.dead && !c.closing && c.rank >= 0)
        send(c, frame_type::heartbeat);
    next_heartbeat_ = now + options_.heartbeat_interval;
  }
}

// Removes dead connections; a member's connection that dies is that rank lost. A closing
// connection, once flushed, shuts down writing and waits for the peer to close: closing a
// socket with unread input would reset it, and the peer could lose the last frame.
void rendezvous_server::impl::sweep() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    connection& c = *it;
    if (!c.dead) {
      if (c.closing && !c.shut && c.out_sent == c.out.size()) {
        ::shutdown(c.fd.get(), SHUT_WR);
        c.shut = true;
      }
      ++it;
      continue;
    }
    if (c.rank >= 0) {
      member& m = members_[static_cast<std::size_t>(c.rank)];
      if (m.state == member_state::joined && m.conn == &c) {
        m.conn = nullptr;
        lose(c.rank, c.why.empty() ? "its connection closed" : c.why);
      }
    }
    it = conns_.erase(it);
  }
}

void rendezvous_server::impl::send(connection& c, frame_type type, const bytes& payload) {
  if (c.dead)
    return;
  bytes f = encode_frame(type, payload);
  c.out.insert(c.out.end(), f.begin(), f.end());
  flush(c);
}

void rendezvous_server::impl::flush(connection& c) {
  while (c.out_sent < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n < 0) {
      c.dead = true;
      c.why = fmt::format("sending to it failed: {}", std::strerror(errno));
      return;
    }
    c.out_sent += static_cast<std::size_t>(n);
  }
  c.out.clear();
  c.out_sent = 0;
}

void rendezvous_server::impl::close_after_flush(connection& c) {
  if (!c.closing) {
    c.closing = true;
    c.closing_since = clock::now();
  }
}

// A connection that is not a member of this job: logged, told why, closed.
void rendezvous_server::impl::refuse(connection& c, errc code, const std::string& why) {
  log_warn("rendezvous: refused the connection from {}: {}", c.peer, why);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++refused_;
  }
  send(c, frame_type::abort, encode_abort({code, fmt::format("the rendezvous refused the connection from {}: {}", c.peer, why)}));
  close_after_flush(c);
}

// A hello with the right token that cannot be part of the job: the job fails with it.
void rendezvous_server::impl::reject(connection& c, const std::string& why, int rank) {
  fail_job(errc::invalid_argument, why, rank); // first, so the phase is failed before c hears
  send(c, frame_type::abort, encode_abort({errc::invalid_argument, why}));
  close_after_flush(c);
}

void rendezvous_server::impl::fail_job(errc code, const std::string& text, int rank) {
  if (phase_seen_ == server_phase::failed || phase_seen_ == server_phase::finished)
    return;
  log_error("rendezvous: the job failed: {}", text);
  set_phase(server_phase::failed, text);
  // The event first: a launcher then learns why before any rank, told below, can exit.
  emit(server_event::kind::failed, rank, text);
  gathers_.clear();
  const bytes payload = encode_abort({code, text});
  for (auto& m : members_) {
    if (m.state == member_state::joined && m.conn) {
      send(*m.conn, frame_type::abort, payload);
      close_after_flush(*m.conn);
    }
  }
}

void rendezvous_server::impl::lose(int rank, const std::string& why) {
  members_[static_cast<std::size_t>(rank)].state = member_state::lost;
  members_[static_cast<std::size_t>(rank)].conn = nullptr;
  if (phase_seen_ == server_phase::joining || phase_seen_ == server_phase::running)
    fail_job(errc::runtime, fmt::format("rank {} lost ({})", rank, why), rank);
  else
    log_info("rendezvous: rank {} gone after the job {} ({})", rank,
             phase_seen_ == server_phase::failed ? "failed" : "finished", why);
}

void rendezvous_server::impl::set_phase(server_phase p, const std::string& failure) {
  phase_seen_ = p;
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = p;
  if (!failure.empty())
    failure_ = failure;
}

void rendezvous_server::impl::emit(server_event::kind what, int rank, const std::string& text) {
  if (on_event_)
    on_event_(server_event{what, rank, text});
}

int rendezvous_server::impl::joined_count() const {
  return static_cast<int>(std::count_if(members_.begin(), members_.end(), [](const member& m) {
    return m.state == member_state::joined;
  }));
}

expected<std::unique_ptr<rendezvous_server>>
rendezvous_server::start(const std::string& bind_address, int port, std::string job_token,
                         int world_size, rendezvous_options options, event_callback on_event) {
  if (world_size < 1)
    return make_error(errc::invalid_argument, "rendezvous: world size {} is below 1", world_size);
  if (job_token.empty())
    return make_error(errc::invalid_argument, "rendezvous: the job token is empty");
  DSA_ASSIGN_OR_RETURN(unique_fd listener, tcp_listen(bind_address, port));
  DSA_ASSIGN_OR_RETURN(int bound_port, tcp_local_port(listener.get()));
  auto state = std::make_unique<impl>(std::move(listener), bound_port, std::move(job_token),
                                      world_size, options, std::move(on_event));
  state->start();
  return std::unique_ptr<rendezvous_server>(new rendezvous_server(std::move(state)));
}

rendezvous_server::rendezvous_server(std::unique_ptr<impl> impl) : impl_(std::move(impl)) {}
rendezvous_server::~rendezvous_server() { stop(); }

int rendezvous_server::port() const { return impl_->port_; }

server_phase rendezvous_server::phase() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->phase_;
}

std::string rendezvous_server::failure() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->failure_;
}

int rendezvous_server::refused() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->refused_;
}

void rendezvous_server::process_exited(int rank, std::string how) {
  impl_->process_exited(rank, std::move(how));
}

void rendezvous_server::stop() { impl_->stop(); }

} // namespace dsa::net
