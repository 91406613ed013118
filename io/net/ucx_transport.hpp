// A transport between processes over UCX (ucp 1.13): active messages whose header
// carries (tag, sender rank, job token), large payloads by rendezvous so the receiver
// pulls them straight into the buffer it names. One ucx_engine (context, worker,
// progress thread) per transport; every UCX call happens on that thread.
//
// Use: create() in every process, ship local_address() to every other rank out of band
// (a pipe, the launcher, CAF messages), then connect() with the addresses of all ranks
// (index = rank). Then the transport methods, from any threads (distinct tags).
//
// Trust and failure:
// - A message whose job token differs from this job's is dropped and logged with the
//   rank it claims; its sender sees the send fail. refused_messages() counts them.
// - An endpoint error (the peer process died, its connection broke) or, for a rank on
//   this host, the exit of its process (process_watch) aborts the transport with an
//   error naming the lost rank, so no receive hangs.
// - abort() tells every peer (which aborts too), fails every receive, and drops the
//   payloads not yet pulled, which fails their sends on the peers.
#pragma once

#include "io/net/process_watch.hpp"
#include "io/net/transport.hpp"
#include "io/net/ucx_engine.hpp"

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace dsa::net {

class ucx_transport final : public transport {
public:
  // rank: 0..size-1; job_token: the same number in every process of one job, and a
  // different one in every other job that could reach this one.
  static expected<std::unique_ptr<ucx_transport>> create(int rank, int size,
                                                          std::uint64_t job_token);
  // Closes the endpoints (flushing what is in flight; at most a few seconds), then the
  // worker. No other thread may still use the transport.
  ~ucx_transport() override;

  // This process's address (its UCX worker address, with its pid and host), to give
  // to every other rank.
  bytes local_address() const { return wrap_with_identity(this_process(), engine_->address()); }
  // Creates an endpoint to every rank (including this one) from addresses[rank], with
  // peer error handling. Call once, before any send or receive.
  status connect(const std::vector<bytes>& addresses);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  status send(int peer, tag_t tag, bytes message) override;
  expected<bytes> recv(int peer, tag_t tag) override;
  void abort(const error& reason) override;
  expected<send_ticket> send_parts(int peer, tag_t tag, bytes head, const void* payload,
                                   std::size_t payload_bytes) override;
  expected<received_parts> recv_parts(int peer, tag_t tag, std::size_t head_bytes, void* payload,
                                      std::size_t payload_bytes) override;

  // Messages dropped because their job token was wrong (any thread).
  std::uint64_t refused_messages() const { return refused_.load(); }
  // The abort reason, if aborted (any thread).
  std::optional<error> aborted() const override;

  // Internal: the receiving and sending machinery (ucx_transport.cpp), progress thread.
  struct send_op;
  struct recv_op;
  struct arrival;
  struct peer_state;

private:
  ucx_transport(int rank, int size, std::uint64_t job_token, std::unique_ptr<ucx_engine> engine);
  status check_peer(int peer, const char* what) const;
  error abort_error() const;
  expected<send_ticket> post_send(int peer, tag_t tag, bytes head, bytes owned,
                                  const void* payload, std::size_t payload_bytes);
  expected<received_parts> post_recv(int peer, tag_t tag, std::size_t head_bytes, void* payload,
                                     std::size_t payload_bytes);

  // Progress thread only.
  static ucs_status_t on_am(void* arg, const void* header, std::size_t header_length, void* data,
                            std::size_t length, const ucp_am_recv_param_t* param);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void start_send(const std::shared_ptr<send_op>& op);
  void send_abort_notices(const std::string& reason);
  void arrived(int peer, std::uint64_t seq, arrival a);
  void deliver(int peer, arrival a);
  void start_recv(const std::shared_ptr<recv_op>& op);
  void complete_recv(const std::shared_ptr<recv_op>& op, arrival a);
  void drop(arrival& a);
  // Drops every arrival no receive has claimed (unclaimed and early ones).
  void drop_undelivered();
  void abort_locally();
  void check_local_peers();
  void close_endpoints();

  const int rank_;
  const int size_;
  const std::uint64_t token_;
  std::unique_ptr<ucx_engine> engine_;
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;
  std::optional<error> abort_reason_;

  // Progress thread only.
  std::vector<std::unique_ptr<peer_state>> peers_;
  process_watch local_peers_; // the ranks on this host, by process
  std::map<const send_op*, std::shared_ptr<send_op>> sending_; // handed to UCX, not completed
  bool connected_ = false;
  bool torn_down_ = false; // abort_locally() ran

  std::map<std::pair<int, tag_t>, std::deque<arrival>> unclaimed_;
  std::map<std::pair<int, tag_t>, std::deque<std::shared_ptr<recv_op>>> waiting_;
};

} // namespace dsa::net
