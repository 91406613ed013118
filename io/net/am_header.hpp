// The UCX transport's active-message header (private to io/net, no UCX types): its layout,
// the builder the sending side uses and the checked parse the receiving side runs on every
// arrival before it believes a field. Kept apart from ucx_transport so the parse can be
// fuzzed without UCX (tests/fuzz/fuzz_wire.cpp).
#pragma once

#include "core/error.hpp"
#include "io/net/transport.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dsa::net::ucx_detail {

constexpr std::uint32_t am_magic = 0x55415344u; // "DSAU"

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

// The fixed part and `head`; the sequence number is stamped by the sender (at_seq).
bytes am_header(am_kind kind, std::uint64_t token, int rank, tag_t tag, const bytes& head);

// A header that passed the checks: its fields, and its head (pointing into the header).
struct am_fields {
  am_kind kind = am_kind::data;
  int from = 0;
  tag_t tag = 0;
  std::uint64_t seq = 0;
  const std::byte* head = nullptr;
  std::size_t head_bytes = 0;
};

// Checks an arrived header of `header_bytes` against this job (`token`) and its `size`
// ranks: the magic, the token, the sender's rank, the head's length, the kind. A refusal is
// errc::protocol saying what was wrong (the transport logs it and drops the message).
expected<am_fields> parse_am_header(const void* header, std::size_t header_bytes, std::uint64_t token,
                                    int self_rank, int size);

} // namespace dsa::net::ucx_detail
