// Header encoding (little-endian fields at fixed offsets) and the checked receive.
#include "io/net/wire.hpp"

#include <algorithm>
#include <cstring>

namespace dsa::net {

namespace {

constexpr std::uint32_t wire_magic = 0x4e415344u; // "DSAN"

template <class T> void put(std::byte* out, std::size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof(T));
}

template <class T> T get(const std::byte* in, std::size_t offset) {
  T value;
  std::memcpy(&value, in + offset, sizeof(T));
  return value;
}

// Offsets of the fields; magic(4) kind(1) dtype(1) pad(2) seq count root block payload(8 each).
enum : std::size_t {
  at_magic = 0,
  at_kind = 4,
  at_type = 5,
  at_seq = 8,
  at_count = 16,
  at_root = 24,
  at_block = 32,
  at_payload = 40,
  at_end = 48
};
static_assert(at_end <= wire_header_bytes, "header fields must fit the header");

wire_header decode(const std::byte* in) {
  wire_header h;
  h.kind = static_cast<op_kind>(get<std::uint8_t>(in, at_kind));
  h.type = static_cast<dtype>(get<std::uint8_t>(in, at_type));
  h.seq = get<std::uint64_t>(in, at_seq);
  h.count = get<std::int64_t>(in, at_count);
  h.root = get<std::int64_t>(in, at_root);
  h.block = get<std::int64_t>(in, at_block);
  h.payload_bytes = get<std::int64_t>(in, at_payload);
  return h;
}

} // namespace

const char* op_kind_name(op_kind kind) {
  switch (kind) {
  case op_kind::allreduce_flat:
    return "allreduce (flat)";
  case op_kind::allreduce_ring:
    return "allreduce (ring)";
  case op_kind::reduce_scatter:
    return "reduce_scatter";
  case op_kind::allgather:
    return "allgather";
  case op_kind::broadcast:
    return "broadcast";
  case op_kind::all_to_all:
    return "all_to_all";
  case op_kind::barrier:
    return "barrier";
  case op_kind::allreduce_shared:
    return "allreduce (shared memory)";
  }
  return "unknown collective";
}

bytes wire_encode(const wire_header& header, const void* payload, std::size_t payload_bytes) {
  bytes message(wire_header_bytes + payload_bytes);
  std::byte* out = message.data();
  put<std::uint32_t>(out, at_magic, wire_magic);
  put<std::uint8_t>(out, at_kind, static_cast<std::uint8_t>(header.kind));
  put<std::uint8_t>(out, at_type, static_cast<std::uint8_t>(header.type));
  put<std::uint64_t>(out, at_seq, header.seq);
  put<std::int64_t>(out, at_count, header.count);
  put<std::int64_t>(out, at_root, header.root);
  put<std::int64_t>(out, at_block, header.block);
  put<std::int64_t>(out, at_payload, static_cast<std::int64_t>(payload_bytes));
  if (payload_bytes > 0)
    std::memcpy(out + wire_header_bytes, payload, payload_bytes);
  return message;
}

status wire_send(transport& t, int peer, const wire_header& header, const void* payload) {
  return t.send(peer, header.seq,
                wire_encode(header, payload, static_cast<std::size_t>(header.payload_bytes)));
}

status check_wire_message(int self, int peer, const wire_header& expect, const std::byte* head,
                          std::size_t head_bytes, std::size_t total) {
  auto fail = [&](const char* field, auto got, auto want) {
    return make_error(
        errc::protocol,
        "rank {} <- rank {}, call #{} {}: the peer sent {} {} where this rank expects {} "
        "(every rank must issue the same collectives in the same order with the same "
        "dtype, count and root)",
        self, peer, expect.seq, op_kind_name(expect.kind), field, got, want);
  };
  if (head_bytes < wire_header_bytes || get<std::uint32_t>(head, at_magic) != wire_magic)
    return make_error(
        errc::protocol,
        "rank {} <- rank {}, call #{}: a {}-byte message without the collective header", self,
        peer, expect.seq, total);
  wire_header got = decode(head);
  if (got.kind != expect.kind)
    return fail("collective", op_kind_name(got.kind), op_kind_name(expect.kind));
  if (got.seq != expect.seq)
    return fail("sequence number", got.seq, expect.seq);
  if (got.type != expect.type)
    return fail("dtype", dtype_name(got.type), dtype_name(expect.type));
  if (got.count != expect.count)
    return fail("count", got.count, expect.count);
  if (got.root != expect.root)
    return fail("root", got.root, expect.root);
  if (got.block != expect.block)
    return fail("block", got.block, expect.block);
  if (got.payload_bytes != expect.payload_bytes ||
      total != wire_header_bytes + static_cast<std::size_t>(got.payload_bytes))
    return fail("payload bytes", total - std::min(total, wire_header_bytes), expect.payload_bytes);
  return {};
}

namespace {

bytes encode_header(const wire_header& header) {
  return wire_encode(header, nullptr, 0);
}

} // namespace

expected<send_ticket> wire_send_parts(transport& t, int peer, const wire_header& header,
                                      const void* payload) {
  bytes head = encode_header(header);
  // wire_encode stamped payload 0; the header must announce the payload that follows.
  put<std::int64_t>(head.data(), at_payload, header.payload_bytes);
  return t.send_parts(peer, header.seq, std::move(head), payload,
                      static_cast<std::size_t>(header.payload_bytes));
}

status wire_recv_into(transport& t, int peer, const wire_header& expect, void* payload) {
  const auto payload_bytes = static_cast<std::size_t>(expect.payload_bytes);
  DSA_ASSIGN_OR_RETURN(received_parts got,
                       t.recv_parts(peer, expect.seq, wire_header_bytes, payload, payload_bytes));
  const std::size_t total =
      got.placed ? wire_header_bytes + payload_bytes : got.message.size();
  DSA_TRY(check_wire_message(t.rank(), peer, expect, got.message.data(), got.message.size(), total));
  if (!got.placed) // the header matched but the length did not: check_wire_message said so
    return make_error(errc::protocol, "rank {} <- rank {}, call #{}: message of {} bytes, expected {}",
                      t.rank(), peer, expect.seq, total, wire_header_bytes + payload_bytes);
  return {};
}

expected<bytes> wire_recv(transport& t, int peer, const wire_header& expect) {
  DSA_ASSIGN_OR_RETURN(bytes message, t.recv(peer, expect.seq));
  DSA_TRY(check_wire_message(t.rank(), peer, expect, message.data(), message.size(), message.size()));
  return message;
}

} // namespace dsa::net
