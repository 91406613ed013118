// One rank's end of the rendezvous (see rendezvous.hpp): join the job and get every rank's
// blob, then stay connected so that a lost rank, or a lost server, is reported to this rank.
#pragma once

#include "io/net/rendezvous.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dsa::net {

struct join_request {
  std::string address; // the server's (MASTER_ADDR)
  int port = 0;        // MASTER_PORT
  std::string job_token;
  int rank = 0;
  int world_size = 1;
  config_summary config; // must equal rank 0's
  bytes blob;            // handed to every rank, e.g. this rank's UCX worker address
};

// Where the rendezvous server's steady clock stands against this process's: at one
// instant, server = local + offset_ns, within +/- error_ns (half the round trip of the
// best probe, which bounds the error whatever the network's asymmetry).
struct clock_estimate {
  std::int64_t offset_ns = 0;
  std::uint64_t error_ns = 0;
  int probes = 0;
};

enum class client_state {
  joined, // every rank joined; heartbeats flowing
  lost,   // a rank or the server was lost, or the job failed: see lost_error()
  left,   // leave() completed
};

class rendezvous_client {
public:
  // Called once, from the client's own thread, when the job is lost after join returned,
  // and before state(), lost_error() and wait_lost() report the loss. It must not call
  // leave(), allgather() or destroy the client; aborting a transport is what it is for.
  using lost_callback = std::function<void(const error&)>;

  // Connects (retrying a refused connection for options.connect_timeout), presents the
  // request and waits until every rank joined (options.join_timeout). The error names the
  // reason: a refused token, a world size or rank the server rejects, differing configs
  // (errc::config, naming the keys and the ranks), a rank lost while joining, a timeout.
  static expected<std::unique_ptr<rendezvous_client>>
  join(join_request request, rendezvous_options options = {}, lost_callback on_lost = {});

  // Without leave(): the connection closes and the other ranks see this rank lost.
  ~rendezvous_client();
  rendezvous_client(const rendezvous_client&) = delete;
  rendezvous_client& operator=(const rendezvous_client&) = delete;

  int rank() const;
  int world_size() const;
  // Every rank's blob from its join_request, index = rank.
  const std::vector<bytes>& blobs() const;

  client_state state() const;
  // Why the job was lost ("rank 1 lost (its connection closed without a leave)", "no
  // heartbeat from the rendezvous server at H:P for 10000 ms", ...); nullopt while not lost.
  std::optional<error> lost_error() const;
  // Blocks until the job is lost (returns why) or `timeout` passes (nullopt).
  std::optional<error> wait_lost(std::chrono::milliseconds timeout) const;
  // Replaces the callback; if the job is already lost, calls it at once on this thread.
  void set_on_lost(lost_callback on_lost);
  // Called from the client's own thread each time the server says the launcher was
  // interrupted (Ctrl-C): the rank should stop after its current step, as on SIGINT.
  using interrupt_callback = std::function<void()>;
  void set_on_interrupt(interrupt_callback on_interrupt);
  // Called (on the client's thread) when the launcher asks for a flight record (its SIGUSR1).
  void set_on_flight_dump(interrupt_callback on_flight_dump);

  // Every rank's blob for `key` (index = rank), once every rank called allgather with it.
  // Keys may be reused once a gather with them completed. Any thread, one call per key.
  expected<std::vector<bytes>> allgather(const std::string& key, bytes blob);
  // allgather with empty blobs.
  status barrier(const std::string& key);

  // Probes the server's steady clock `probes` times (each a round trip on the rendezvous
  // connection) and keeps the probe with the shortest round trip. Any thread, one call at
  // a time; an error when the job is lost or a reply takes longer than heartbeat_timeout.
  expected<clock_estimate> estimate_server_clock(int probes = 8);

  // A clean end: the server forgets this rank without reporting it lost. Waits for the
  // server's answer (at most heartbeat_timeout).
  status leave();

  class impl;

private:
  explicit rendezvous_client(std::unique_ptr<impl> impl);
  std::unique_ptr<impl> impl_;
};

} // namespace dsa::net
