// What ucx_transport's source files share (private to io/net): the active-message
// header layout, the transport's per-peer and per-operation state, and the holder a UCX
// callback finds its operation by. Not for use outside ucx_transport*.cpp.
#pragma once

#include "io/net/ucx_transport.hpp"

#include <cstring>

namespace dsa::net {

namespace ucx_detail {

constexpr unsigned am_id = 17;                      // our handler's id on the worker
constexpr std::uint32_t am_magic = 0x55415344u;     // "DSAU"
constexpr std::size_t max_head_bytes = 1024;        // the caller's head rides in the AM header
constexpr std::size_t rndv_from_bytes = 64 * 1024;  // payloads this big are pulled by the receiver

enum class am_kind : std::uint8_t { data = 1, abort = 2 };

// The fixed part of every AM header (little-endian at fixed offsets), then the head.
enum : std::size_t {
  at_magic = 0,
  at_kind = 4,
  at_token = 8,
  at_rank = 16,
  at_head_len = 20,
  at_seq = 24, // per (sender, receiver): the receiver delivers in this order
  at_tag = 32,
  am_fixed_bytes = 40
};

template <class T> inline void put(std::byte* out, std::size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof(T));
}
template <class T> inline T get(const void* in, std::size_t offset) {
  T value;
  std::memcpy(&value, static_cast<const std::byte*>(in) + offset, sizeof(T));
  return value;
}

inline bytes am_header(am_kind kind, std::uint64_t token, int rank, tag_t tag, const bytes& head) {
  bytes h(am_fixed_bytes + head.size());
  put<std::uint32_t>(h.data(), at_magic, am_magic);
  put<std::uint8_t>(h.data(), at_kind, static_cast<std::uint8_t>(kind));
  put<std::uint64_t>(h.data(), at_token, token);
  put<std::int32_t>(h.data(), at_rank, rank);
  put<std::uint32_t>(h.data(), at_head_len, static_cast<std::uint32_t>(head.size()));
  put<std::uint64_t>(h.data(), at_tag, tag);
  if (!head.empty())
    std::memcpy(h.data() + am_fixed_bytes, head.data(), head.size());
  return h;
}

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
