// The rendezvous server's state, shared by its two source files: rendezvous_server.cpp (the
// thread, sockets and timers) and rendezvous_membership.cpp (who is in the job: hellos, the
// join, allgathers, leaves, losses). Private to io/net.
#pragma once

#include "io/net/rendezvous_frame.hpp"
#include "io/net/rendezvous_server.hpp"
#include "io/net/tcp_socket.hpp"

#include <chrono>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dsa::net::rendezvous_detail {

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

inline long long ms(clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

} // namespace dsa::net::rendezvous_detail

namespace dsa::net {

using namespace rendezvous_detail;

class rendezvous_server::impl {
public:
  impl(unique_fd listener, int port, std::string token, int world_size, rendezvous_options options,
       event_callback on_event)
      : port_(port), token_(std::move(token)), world_size_(world_size), options_(options),
        on_event_(std::move(on_event)), listener_(std::move(listener)),
        members_(static_cast<std::size_t>(world_size)) {}

  void start() {
    thread_ = std::thread([this] { run(); });
  }

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
  bool interrupt_ = false; // interrupt() asked: send the frame on the server's thread
  bool flight_dump_ = false; // request_flight_dumps() asked: the same
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

} // namespace dsa::net
