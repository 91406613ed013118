// A group of some of a transport's ranks seen as a transport of its own: rank i of the
// subgroup is members[i] of the whole. Pipeline stages in separate processes use one
// per data-parallel group (the processes holding the same stages), so the reducers,
// shards and ZeRO fetchers run their collectives unchanged over their replicas only.
#pragma once

#include "io/net/transport.hpp"

#include <vector>

namespace dsa::net {

// Borrows `whole`, which must outlive it. Tags pass through unchanged: groups that share
// two ranks must talk on different channels (communicator.hpp). abort() aborts the whole
// transport: a failed collective of one group stops every process of the job, as a lost
// peer would.
class subgroup_transport final : public transport {
public:
  // members: distinct ranks of `whole`, in the subgroup's rank order; it must hold whole.rank().
  subgroup_transport(transport& whole, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  status send(int peer, tag_t tag, bytes message) override;
  expected<bytes> recv(int peer, tag_t tag) override;
  void abort(const error& reason) override { whole_.abort(reason); }
  std::optional<error> aborted() const override { return whole_.aborted(); }
  int world_rank(int r) const override { return whole_.world_rank(members_.at(static_cast<std::size_t>(r))); }
  expected<send_ticket> send_parts(int peer, tag_t tag, bytes head, const void* payload,
                                   std::size_t payload_bytes) override;
  expected<received_parts> recv_parts(int peer, tag_t tag, std::size_t head_bytes, void* payload,
                                      std::size_t payload_bytes) override;

  // The whole transport's rank of subgroup rank `peer`.
  expected<int> whole_rank(int peer) const;

private:
  transport& whole_;
  std::vector<int> members_;
  int rank_ = -1;
};

} // namespace dsa::net
