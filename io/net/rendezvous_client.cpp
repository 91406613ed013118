// One rank's end of the rendezvous: a blocking socket, read and heartbeat by the client's own
// thread, written under a mutex by that thread and by callers; see rendezvous_client.hpp.
#include "io/net/rendezvous_client.hpp"

#include "io/net/rendezvous_frame.hpp"
#include "io/net/tcp_socket.hpp"

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <poll.h>
#include <sys/socket.h>

namespace dsa::net {
namespace {

using clock = std::chrono::steady_clock;

long long ms(clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count());
}

enum class phase { joining, joined, lost, left };

} // namespace

class rendezvous_client::impl {
public:
  impl(join_request request, rendezvous_options options, lost_callback on_lost)
      : request_(std::move(request)), options_(options),
        server_(fmt::format("{}:{}", request_.address, request_.port)),
        on_lost_(std::move(on_lost)) {}

  ~impl() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify();
    if (thread_.joinable())
      thread_.join();
  }

  status connect_and_join();
  status send_frame(frame_type type, const bytes& payload = {});
  // Waits until `done` holds or the job is no longer joined; false on timeout.
  template <class Pred>
  bool wait(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout, Pred done) {
    return cv_.wait_for(lock, timeout, [&] { return done() || phase_ != phase::joined; });
  }
  error not_joined() const { // under mutex_
    if (error_)
      return *error_;
    return make_error(errc::invalid_argument, "rank {} is not joined to the rendezvous at {}",
                      request_.rank, server_);
  }

  const join_request request_;
  const rendezvous_options options_;
  const std::string server_; // "address:port", for messages

  mutable std::mutex mutex_; // guards the fields below it
  mutable std::condition_variable cv_;
  phase phase_ = phase::joining;
  std::optional<error> error_; // why the join failed or the job was lost
  std::vector<bytes> blobs_;
  std::map<std::string, std::vector<bytes>> gathered_;
  // Clock probes answered: sequence -> (the server's steady ns, this side's on receipt).
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> clock_replies_;
  std::uint64_t next_probe_ = 0;
  lost_callback on_lost_;
  rendezvous_client::interrupt_callback on_interrupt_;   // guarded by mutex_
  rendezvous_client::interrupt_callback on_flight_dump_; // guarded by mutex_
  bool stop_ = false;
  bool losing_ = false; // end() is running the callback: the job is lost

private:
  void run();
  bool handle(const frame& f); // false ends the thread
  void end(error why);

  unique_fd fd_;
  wakeup wake_;
  std::mutex send_mutex_;
  std::thread thread_;
};

status rendezvous_client::impl::connect_and_join() {
  auto fd = tcp_connect(request_.address, request_.port, clock::now() + options_.connect_timeout);
  if (!fd)
    return make_error(fd.err().code, "rank {} cannot reach the rendezvous: {}", request_.rank,
                      fd.err().message);
  fd_ = std::move(*fd);
  DSA_TRY(send_frame(frame_type::hello,
                     encode_hello({request_.job_token, request_.rank, request_.world_size,
                                   request_.config, request_.blob})));
  thread_ = std::thread([this] { run(); });
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, options_.join_timeout, [&] { return phase_ != phase::joining; }))
    return make_error(errc::runtime,
                      "rank {}: not every rank joined the rendezvous at {} within {} ms",
                      request_.rank, server_, options_.join_timeout.count());
  if (phase_ != phase::joined)
    return not_joined();
  return {};
}

status rendezvous_client::impl::send_frame(frame_type type, const bytes& payload) {
  bytes f = encode_frame(type, payload);
  std::lock_guard<std::mutex> lock(send_mutex_);
  return send_all(fd_.get(), f.data(), f.size(),
                  fmt::format("the rendezvous server at {}", server_));
}

void rendezvous_client::impl::run() {
  frame_buffer in;
  auto last_heard = clock::now();
  auto next_heartbeat = last_heard + options_.heartbeat_interval;
  for (;;) {
    auto now = clock::now();
    auto until = std::min(next_heartbeat, last_heard + options_.heartbeat_timeout);
    pollfd fds[2] = {{fd_.get(), POLLIN, 0}, {wake_.fd(), POLLIN, 0}};
    int rc = ::poll(fds, 2, static_cast<int>(std::max<long long>(1, ms(until - now) + 1)));
    if (rc < 0 && errno != EINTR)
      return end(make_error(errc::io, "rendezvous client: poll failed: {}", std::strerror(errno)));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_)
        break;
    }
    if (fds[1].revents)
      wake_.consume();
    if (fds[0].revents) {
      std::byte buf[65536];
      ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0)
        return end(make_error(errc::runtime, "the rendezvous server at {} closed the connection",
                              server_));
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return end(make_error(errc::runtime,
                              "the connection to the rendezvous server at {} failed: {}", server_,
                              std::strerror(errno)));
      if (n > 0) {
        in.append(buf, static_cast<std::size_t>(n));
        last_heard = clock::now();
      }
      for (;;) {
        auto f = in.next(max_frame_bytes, fmt::format("the rendezvous server at {}", server_));
        if (!f)
          return end(f.err());
        if (!*f)
          break;
        if (!handle(**f))
          return;
      }
    }
    now = clock::now();
    if (now - last_heard > options_.heartbeat_timeout)
      return end(make_error(errc::runtime,
                            "no heartbeat from the rendezvous server at {} for {} ms", server_,
                            ms(now - last_heard)));
    if (now >= next_heartbeat) {
      if (auto sent = send_frame(frame_type::heartbeat); !sent)
        return end(sent.err());
      next_heartbeat = now + options_.heartbeat_interval;
    }
  }
}

bool rendezvous_client::impl::handle(const frame& f) {
  switch (f.type) {
  case frame_type::heartbeat:
    return true;
  case frame_type::welcome: {
    auto blobs = decode_blobs(f.payload);
    if (!blobs || static_cast<int>(blobs->size()) != request_.world_size) {
      end(make_error(errc::protocol, "the rendezvous server at {} sent a malformed welcome",
                     server_));
      return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    blobs_ = std::move(*blobs);
    phase_ = phase::joined;
    cv_.notify_all();
    return true;
  }
  case frame_type::gathered: {
    auto g = decode_keyed(f.payload);
    if (!g || static_cast<int>(g->blobs.size()) != request_.world_size) {
      end(make_error(errc::protocol, "the rendezvous server at {} sent a malformed allgather",
                     server_));
      return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    gathered_[g->key] = std::move(g->blobs);
    cv_.notify_all();
    return true;
  }
  case frame_type::interrupt:
  case frame_type::flight_dump: {
    rendezvous_client::interrupt_callback callback;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      callback = f.type == frame_type::interrupt ? on_interrupt_ : on_flight_dump_;
    }
    if (callback) callback();
    return true;
  }
  case frame_type::clock_reply: {
    const std::uint64_t received = steady_ns();
    auto c = decode_clock(f.payload);
    if (!c) {
      end(make_error(errc::protocol, "the rendezvous server at {} sent a malformed clock reply", server_));
      return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    clock_replies_[c->sequence] = {c->steady_ns, received};
    cv_.notify_all();
    return true;
  }
  case frame_type::abort: {
    auto a = decode_abort(f.payload);
    end(a ? error{a->code, a->text}
          : make_error(errc::protocol, "the rendezvous server at {} sent a malformed abort",
                       server_));
    return false;
  }
  case frame_type::bye: {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_ = phase::left;
    cv_.notify_all();
    ::shutdown(fd_.get(), SHUT_RDWR); // the server waits for this close
    return false;
  }
  default:
    end(make_error(errc::protocol, "the rendezvous server at {} sent an unexpected frame (type {})",
                   server_, static_cast<int>(f.type)));
    return false;
  }
}

// The job is lost (or the join failed): record why, wake the waiters, tell the callback.
// The callback runs before the state says lost, so whoever sees the loss (state(),
// wait_lost(), a failed allgather) knows that on_lost has returned.
void rendezvous_client::impl::end(error why) {
  lost_callback callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ == phase::lost || phase_ == phase::left || losing_)
      return;
    error_ = why;
    if (phase_ == phase::joined) {
      callback = on_lost_;
      losing_ = true;
    }
  }
  ::shutdown(fd_.get(), SHUT_RDWR);
  if (callback)
    callback(why);
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = phase::lost;
  cv_.notify_all();
}

expected<std::unique_ptr<rendezvous_client>>
rendezvous_client::join(join_request request, rendezvous_options options, lost_callback on_lost) {
  if (request.world_size < 1 || request.rank < 0 || request.rank >= request.world_size)
    return make_error(errc::invalid_argument, "rendezvous: rank {} is outside 0..{}", request.rank,
                      request.world_size - 1);
  auto state = std::make_unique<impl>(std::move(request), options, std::move(on_lost));
  DSA_TRY(state->connect_and_join());
  return std::unique_ptr<rendezvous_client>(new rendezvous_client(std::move(state)));
}

rendezvous_client::rendezvous_client(std::unique_ptr<impl> impl) : impl_(std::move(impl)) {}
rendezvous_client::~rendezvous_client() = default;

int rendezvous_client::rank() const {
  return impl_->request_.rank;
}
int rendezvous_client::world_size() const {
  return impl_->request_.world_size;
}
const std::vector<bytes>& rendezvous_client::blobs() const {
  return impl_->blobs_;
}

client_state rendezvous_client::state() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  switch (impl_->phase_) {
  case phase::lost:
    return client_state::lost;
  case phase::left:
    return client_state::left;
  default:
    return client_state::joined; // joining ends before join() returns a client
  }
}

std::optional<error> rendezvous_client::lost_error() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->phase_ == phase::lost ? impl_->error_ : std::nullopt;
}

std::optional<error> rendezvous_client::wait_lost(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mutex_);
  impl_->cv_.wait_for(lock, timeout, [&] { return impl_->phase_ == phase::lost; });
  return impl_->phase_ == phase::lost ? impl_->error_ : std::nullopt;
}

void rendezvous_client::set_on_flight_dump(interrupt_callback on_flight_dump) {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  impl_->on_flight_dump_ = std::move(on_flight_dump);
}

void rendezvous_client::set_on_interrupt(interrupt_callback on_interrupt) {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  impl_->on_interrupt_ = std::move(on_interrupt);
}

void rendezvous_client::set_on_lost(lost_callback on_lost) {
  std::optional<error> already;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex_);
    impl_->on_lost_ = on_lost;
    if (impl_->phase_ == phase::lost || impl_->losing_)
      already = impl_->error_;
  }
  if (already && on_lost)
    on_lost(*already);
}

expected<std::vector<bytes>> rendezvous_client::allgather(const std::string& key, bytes blob) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex_);
    if (impl_->phase_ != phase::joined)
      return impl_->not_joined();
  }
  DSA_TRY(impl_->send_frame(frame_type::gather, encode_keyed({key, {std::move(blob)}})));
  std::unique_lock<std::mutex> lock(impl_->mutex_);
  auto& got = impl_->gathered_;
  if (!impl_->wait(lock, impl_->options_.join_timeout, [&] { return got.count(key) > 0; }))
    return make_error(errc::runtime, "rank {}: allgather '{}' did not complete within {} ms",
                      rank(), key, impl_->options_.join_timeout.count());
  auto it = got.find(key);
  if (it == got.end())
    return impl_->not_joined();
  std::vector<bytes> result = std::move(it->second);
  got.erase(it);
  return result;
}

status rendezvous_client::barrier(const std::string& key) {
  auto r = allgather(key, {});
  if (!r)
    return r.err();
  return {};
}

expected<clock_estimate> rendezvous_client::estimate_server_clock(int probes) {
  if (probes < 1) return make_error(errc::invalid_argument, "estimate_server_clock: {} probes", probes);
  clock_estimate best;
  std::uint64_t best_round_trip = ~0ull;
  for (int i = 0; i < probes; ++i) {
    std::uint64_t sequence;
    {
      std::lock_guard<std::mutex> lock(impl_->mutex_);
      if (impl_->phase_ != phase::joined) return impl_->not_joined();
      sequence = impl_->next_probe_++;
    }
    const std::uint64_t sent = steady_ns();
    DSA_TRY(impl_->send_frame(frame_type::clock_probe, encode_clock({sequence, 0})));
    std::unique_lock<std::mutex> lock(impl_->mutex_);
    auto& replies = impl_->clock_replies_;
    if (!impl_->wait(lock, impl_->options_.heartbeat_timeout, [&] { return replies.count(sequence) > 0; }))
      return make_error(errc::runtime, "rank {}: the rendezvous server at {} did not answer a clock probe within {} ms",
                        rank(), impl_->server_, impl_->options_.heartbeat_timeout.count());
    auto it = replies.find(sequence);
    if (it == replies.end()) return impl_->not_joined();
    const auto [server, received] = it->second;
    replies.erase(it);
    const std::uint64_t round_trip = received - sent;
    if (round_trip < best_round_trip) {
      best_round_trip = round_trip;
      // The server read its clock between `sent` and `received`: at the midpoint, off by at
      // most half the round trip.
      const std::uint64_t middle = sent + round_trip / 2;
      best.offset_ns = static_cast<std::int64_t>(server - middle);
      best.error_ns = (round_trip + 1) / 2;
    }
  }
  best.probes = probes;
  return best;
}

status rendezvous_client::leave() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex_);
    if (impl_->phase_ != phase::joined)
      return impl_->not_joined();
  }
  DSA_TRY(impl_->send_frame(frame_type::leave));
  std::unique_lock<std::mutex> lock(impl_->mutex_);
  if (!impl_->wait(lock, impl_->options_.heartbeat_timeout, [] { return false; }))
    return make_error(errc::runtime,
                      "rank {}: the rendezvous server at {} did not answer leave within {} ms",
                      rank(), impl_->server_, impl_->options_.heartbeat_timeout.count());
  if (impl_->phase_ != phase::left)
    return impl_->not_joined();
  return {};
}

} // namespace dsa::net
