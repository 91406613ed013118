// The rendezvous server: one thread polling the listener, every connection and a wakeup;
// reads frames, flushes output queues, checks heartbeats. Who is in the job is decided in
// rendezvous_membership.cpp. See rendezvous_server.hpp and, for the protocol, rendezvous.hpp.
#include "io/net/rendezvous_server_impl.hpp"

#include "core/log.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <poll.h>
#include <sys/socket.h>

namespace dsa::net {

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
  bool interrupting = false, dumping = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_)
      return false;
    exits.swap(exits_);
    interrupting = std::exchange(interrupt_, false);
    dumping = std::exchange(flight_dump_, false);
  }
  for (auto& c : conns_)
    if (c.rank >= 0 && !c.dead && !c.closing) {
      if (interrupting) send(c, frame_type::interrupt);
      if (dumping) send(c, frame_type::flight_dump);
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
    c.why = n == 0                ? "its connection closed without a leave"
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
  case frame_type::heartbeat:
    return;
  case frame_type::leave:
    return on_leave(c);
  case frame_type::gather:
    return on_gather(c, f);
  case frame_type::clock_probe: {
    // Answered at once with this host's steady clock: the rank estimates its offset from it.
    auto probe = decode_clock(f.payload);
    if (!probe) {
      c.dead = true;
      c.why = probe.err().message;
      return;
    }
    probe->steady_ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count());
    return send(c, frame_type::clock_reply, encode_clock(*probe));
  }
  default:
    c.dead = true;
    c.why =
        fmt::format("it broke the protocol: unexpected frame type {}", static_cast<int>(f.type));
  }
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
rendezvous_server::~rendezvous_server() {
  stop();
}

int rendezvous_server::port() const {
  return impl_->port_;
}

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

void rendezvous_server::interrupt() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex_);
    impl_->interrupt_ = true;
  }
  impl_->wake_.notify();
}

void rendezvous_server::request_flight_dumps() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex_);
    impl_->flight_dump_ = true;
  }
  impl_->wake_.notify();
}

void rendezvous_server::stop() {
  impl_->stop();
}

} // namespace dsa::net
