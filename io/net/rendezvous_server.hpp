// The rendezvous server of one job (see rendezvous.hpp for the protocol): admits the ranks
// that present the job token, hands out their blobs once all joined with equal configs, then
// watches every connection and tells the others when a rank is lost. Hosted by the launcher.
#pragma once

#include "io/net/rendezvous.hpp"

#include <functional>
#include <memory>
#include <string>

namespace dsa::net {

enum class server_phase {
  joining,  // waiting for every rank's hello
  running,  // every rank joined and got the blobs
  finished, // every rank left cleanly; the server thread has ended
  failed,   // a rank was lost, configs differed, or a hello was inconsistent
};

struct server_event {
  enum class kind { joined, failed, finished };
  kind what = kind::joined;
  int rank = -1;    // failed: the lost or offending rank, -1 when it is not one rank
  std::string text; // failed: why, e.g. "rank 1 lost (its connection closed without a leave)"
};

class rendezvous_server {
public:
  // Called on the server's thread; must not call back into the server except the queries.
  using event_callback = std::function<void(const server_event&)>;

  // Listens on bind_address:port (0 = the OS picks; see port()) and serves on its own
  // thread. world_size >= 1; job_token non-empty.
  static expected<std::unique_ptr<rendezvous_server>>
  start(const std::string& bind_address, int port, std::string job_token, int world_size,
        rendezvous_options options = {}, event_callback on_event = {});

  ~rendezvous_server(); // stop()
  rendezvous_server(const rendezvous_server&) = delete;
  rendezvous_server& operator=(const rendezvous_server&) = delete;

  int port() const;
  server_phase phase() const;
  std::string failure() const; // "" unless failed
  int refused() const;         // connections refused for a wrong token or a malformed hello

  // The launcher saw rank's process end (`how`: "exited with code 3", "killed by signal 9").
  // A rank that had not left is lost for that reason, and so is the job when the rank never
  // joined (its peers would wait for it forever). Any thread.
  void process_exited(int rank, std::string how);

  // Tells every joined rank that the launcher was interrupted (an `interrupt` frame), so
  // ranks on other hosts, which no signal of the launcher reaches, stop after their step as
  // on Ctrl-C. Any thread; async-signal-unsafe.
  void interrupt();
  // Asks every joined rank for a flight record in its trace (a `flight_dump` frame): the
  // launcher's SIGUSR1, passed to the ranks of every host. Thread-safe.
  void request_flight_dumps();

  // Closes every connection (each client sees the server lost) and ends the thread.
  void stop();

  class impl;

private:
  explicit rendezvous_server(std::unique_ptr<impl> impl);
  std::unique_ptr<impl> impl_;
};

} // namespace dsa::net
