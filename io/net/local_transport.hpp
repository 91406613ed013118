// In-process transport: N ranks of one process (one thread each) exchanging messages
// through per-destination mailboxes. Used by the tests and by in-process data parallelism.
#pragma once

#include "io/net/transport.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace dsa::net {

class local_group;

// Rank `rank()`'s view of a local_group. Owned by the group; not copyable.
class local_transport final : public transport {
public:
  local_transport(local_group& group, int rank) : group_(group), rank_(rank) {}
  local_transport(const local_transport&) = delete;
  local_transport& operator=(const local_transport&) = delete;

  int rank() const override { return rank_; }
  int size() const override;
  status send(int peer, tag_t tag, bytes message) override;
  expected<bytes> recv(int peer, tag_t tag) override;
  void abort(const error& reason) override;
  std::optional<error> aborted() const override;

private:
  local_group& group_;
  int rank_;
};

// The shared state of `size` ranks. Thread-safe; outlives every thread using it.
class local_group {
public:
  explicit local_group(int size);
  local_group(const local_group&) = delete;
  local_group& operator=(const local_group&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  local_transport& at(int rank); // rank: 0..size()-1
  void abort(const error& reason);
  std::optional<error> aborted() const;

private:
  friend class local_transport;
  // Messages waiting for one destination rank, keyed by (source rank, tag).
  struct mailbox {
    std::mutex mutex;
    std::condition_variable arrived;
    std::map<std::pair<int, tag_t>, std::deque<bytes>> queues;
  };
  status check_peer(int from, int peer, const char* what) const;
  status deliver(int from, int to, tag_t tag, bytes message);
  expected<bytes> take(int to, int from, tag_t tag);
  error abort_error(int rank) const;

  std::vector<std::unique_ptr<local_transport>> ranks_;
  std::vector<std::unique_ptr<mailbox>> mailboxes_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;
  std::optional<error> abort_reason_;
};

} // namespace dsa::net
