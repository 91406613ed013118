// A subgroup of a transport's ranks; see subgroup_transport.hpp.
#include "io/net/subgroup_transport.hpp"

#include <algorithm>

namespace dsa::net {

subgroup_transport::subgroup_transport(transport& whole, std::vector<int> members)
    : whole_(whole), members_(std::move(members)) {
  for (std::size_t i = 0; i < members_.size(); ++i) {
    DSA_CHECK(members_[i] >= 0 && members_[i] < whole_.size(), "subgroup_transport: rank {} outside 0..{}",
              members_[i], whole_.size() - 1);
    DSA_CHECK(std::count(members_.begin(), members_.end(), members_[i]) == 1,
              "subgroup_transport: rank {} named twice", members_[i]);
    if (members_[i] == whole_.rank()) rank_ = static_cast<int>(i);
  }
  DSA_CHECK(rank_ >= 0, "subgroup_transport: this process's rank {} is not a member", whole_.rank());
}

expected<int> subgroup_transport::whole_rank(int peer) const {
  if (peer < 0 || peer >= size())
    return make_error(errc::invalid_argument, "peer {} outside the subgroup's ranks 0..{}", peer, size() - 1);
  return members_[static_cast<std::size_t>(peer)];
}

status subgroup_transport::send(int peer, tag_t tag, bytes message) {
  DSA_ASSIGN_OR_RETURN(int to, whole_rank(peer));
  count_sent(message.size());
  return whole_.send(to, tag, std::move(message));
}

expected<bytes> subgroup_transport::recv(int peer, tag_t tag) {
  DSA_ASSIGN_OR_RETURN(int from, whole_rank(peer));
  return whole_.recv(from, tag);
}

expected<send_ticket> subgroup_transport::send_parts(int peer, tag_t tag, bytes head, const void* payload,
                                                     std::size_t payload_bytes) {
  DSA_ASSIGN_OR_RETURN(int to, whole_rank(peer));
  count_sent(head.size() + payload_bytes);
  return whole_.send_parts(to, tag, std::move(head), payload, payload_bytes);
}

expected<received_parts> subgroup_transport::recv_parts(int peer, tag_t tag, std::size_t head_bytes,
                                                        void* payload, std::size_t payload_bytes) {
  DSA_ASSIGN_OR_RETURN(int from, whole_rank(peer));
  return whole_.recv_parts(from, tag, head_bytes, payload, payload_bytes);
}

} // namespace dsa::net
