// What ucx_transport's source files share (private to io/net): the transport's per-peer and
// per-operation state, and the holder a UCX callback finds its operation by (the
// active-message header is am_header.hpp). Not for use outside ucx_transport*.cpp.
#pragma once

#include "io/net/am_header.hpp"
#include "io/net/ucx_transport.hpp"

#include <cstring>

namespace dsa::net {

namespace ucx_detail {

constexpr unsigned am_id = 17;                      // our handler's id on the worker
constexpr std::size_t max_head_bytes = 1024;        // the caller's head rides in the AM header
constexpr std::size_t rndv_from_bytes = 64 * 1024;  // payloads this big are pulled by the receiver

} // namespace ucx_detail

// A message that arrived and is not yet claimed by a receive: its head, and either its
// eager payload or the rendezvous descriptor to pull it with.
struct ucx_transport::arrival {
  tag_t tag = 0;
  bytes head;
  bytes data;
  void* rndv = nullptr;
  std::size_t length = 0; // payload bytes
};

struct ucx_transport::peer_state {
  ucx_transport* self = nullptr;
  int rank = 0;
  ucp_ep_h ep = nullptr;   // peer error handling: control, small payloads, liveness
  ucp_ep_h bulk = nullptr; // no error handling: large payloads (see connect())
  bool failed = false;
  std::uint64_t next_out = 0;               // seq of the next message to this peer
  std::uint64_t next_in = 0;                // seq of the next message from it to deliver
  std::map<std::uint64_t, arrival> early;   // arrivals ahead of next_in
};

struct ucx_transport::send_op {
  int peer = 0;
  tag_t tag = 0;
  bytes header; // the AM header; UCX reads it until completion
  bytes owned;  // the payload when send() gave it away
  const void* payload = nullptr;
  std::size_t payload_bytes = 0;
  std::shared_ptr<completion> done = std::make_shared<completion>();
  bool bulk = false; // went out on the peer's bulk endpoint
};

struct ucx_transport::recv_op {
  int peer = 0;
  tag_t tag = 0;
  bool whole = false; // recv(): the whole message in `result.message`
  std::size_t head_bytes = 0;
  void* payload = nullptr;
  std::size_t payload_bytes = 0;
  bool split = false; // pulled whole, but the right length: copy the payload out at the end
  received_parts result;
  completion done;
};

namespace ucx_detail {

// What a UCX callback needs to find its operation and transport again.
template <class Op> struct op_holder {
  ucx_transport* self;
  std::shared_ptr<Op> op;
};

} // namespace ucx_detail

} // namespace dsa::net
