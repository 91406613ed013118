// The message format of the collectives: a fixed header in front of every payload, so a
// receiver can check that its peer is in the same call (kind, sequence, dtype, count)
// and report a mismatch instead of misreading bytes.
#pragma once

#include "core/dtype.hpp"
#include "io/net/transport.hpp"

#include <cstdint>

namespace dsa::net {

enum class op_kind : std::uint8_t {
  allreduce_flat = 1, // every rank sends its whole buffer to every rank
  allreduce_ring,
  reduce_scatter,
  allgather,
  broadcast,
  all_to_all,
  barrier,
  allreduce_shared, // ranks of one host through shared memory
};

const char* op_kind_name(op_kind kind);

// What both ends of a message must agree on. Field by field, the receiver compares
// what arrived against what it expects from its own arguments.
struct wire_header {
  op_kind kind = op_kind::barrier;
  dtype type = dtype::u8; // dtype of the call (not of the payload: partial sums travel as f32)
  std::uint64_t seq = 0;  // sequence number of the call on the sender
  std::int64_t count = 0; // the call's element count as the sender was given it
  std::int64_t root = 0;  // broadcast root; 0 otherwise
  std::int64_t block = 0; // which chunk / block / step the payload is
  std::int64_t payload_bytes = 0;
};

inline constexpr std::size_t wire_header_bytes = 56;

// Header + payload in one message, ready for transport::send.
bytes wire_encode(const wire_header& header, const void* payload, std::size_t payload_bytes);

// Sends header + payload to `peer` under tag header.seq.
status wire_send(transport& t, int peer, const wire_header& header, const void* payload);

// Sends header + payload to `peer` under tag header.seq without copying the payload,
// which must stay valid and unchanged until the ticket's wait() returns.
expected<send_ticket> wire_send_parts(transport& t, int peer, const wire_header& header,
                                      const void* payload);

// Checks a received message (its first `head_bytes` at `head`, `total` bytes in all) against
// what rank `self` expects from `peer`: errc::protocol naming both ranks, the call and the
// first field that differs (the magic, kind, sequence, dtype, count, root, block, length).
status check_wire_message(int self, int peer, const wire_header& expect, const std::byte* head,
                          std::size_t head_bytes, std::size_t total);

// Receives from `peer` under tag expect.seq, checks the header as wire_recv does, and
// leaves the payload in payload: (expect.payload_bytes).
status wire_recv_into(transport& t, int peer, const wire_header& expect, void* payload);

// Receives from `peer` under tag expect.seq and checks every field against `expect`.
// Returns the whole message; its payload starts at wire_header_bytes. A mismatch is an
// errc::protocol error naming both ranks, the call and the field.
expected<bytes> wire_recv(transport& t, int peer, const wire_header& expect);

} // namespace dsa::net
