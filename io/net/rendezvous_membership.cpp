// The rendezvous server's membership rules: admitting or refusing hellos, handing out the
// blobs once all joined with equal configs, allgathers, leaves, and losses that fail the job.
// Runs on the server's thread; see rendezvous_server_impl.hpp.
#include "io/net/rendezvous_server_impl.hpp"

#include "core/log.hpp"

#include <algorithm>

namespace dsa::net {

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
    return refuse(c, errc::protocol, h.job_token.empty() ? "no job token" : "wrong job token");
  if (phase_seen_ == server_phase::failed) {
    send(c, frame_type::abort, encode_abort({errc::runtime, failure_}));
    return close_after_flush(c);
  }
  if (phase_seen_ != server_phase::joining)
    return refuse(c, errc::invalid_argument,
                  fmt::format("rank {} tried to join after the job started", h.rank));
  const std::string who = fmt::format("rank {} (from {})", h.rank, c.peer);
  if (h.world_size != world_size_)
    return reject(c,
                  fmt::format("{} was started with world size {}; the rendezvous expects {}", who,
                              h.world_size, world_size_),
                  -1);
  if (h.rank < 0 || h.rank >= world_size_)
    return reject(
        c, fmt::format("{} is outside 0..{} (world size {})", who, world_size_ - 1, world_size_),
        -1);
  member& m = members_[static_cast<std::size_t>(h.rank)];
  if (m.state != member_state::absent)
    return reject(c,
                  fmt::format("rank {} joined twice (from {} and from {})", h.rank, m.peer, c.peer),
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
    std::string d =
        config_difference(members_[0].config, members_[static_cast<std::size_t>(r)].config, r);
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
                    fmt::format("rank {} lost ({} before joining the rendezvous)", rank, how),
                    rank);
  exited_unjoined_.emplace(rank, how); // a program that never joins is fine until another does
}

// A connection that is not a member of this job: logged, told why, closed.
void rendezvous_server::impl::refuse(connection& c, errc code, const std::string& why) {
  log_warn("rendezvous: refused the connection from {}: {}", c.peer, why);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++refused_;
  }
  send(c, frame_type::abort,
       encode_abort(
           {code, fmt::format("the rendezvous refused the connection from {}: {}", c.peer, why)}));
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

} // namespace dsa::net
