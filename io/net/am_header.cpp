// The UCX transport's active-message header; see am_header.hpp.
#include "io/net/am_header.hpp"

namespace dsa::net::ucx_detail {

bytes am_header(am_kind kind, std::uint64_t token, int rank, tag_t tag, const bytes& head) {
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

expected<am_fields> parse_am_header(const void* header, std::size_t header_bytes, std::uint64_t token,
                                    int self_rank, int size) {
  if (header == nullptr || header_bytes < am_fixed_bytes || get<std::uint32_t>(header, at_magic) != am_magic)
    return make_error(errc::protocol, "rank {}: refused a UCX active message without dsactor's header ({} header bytes)",
                      self_rank, header_bytes);
  am_fields f;
  f.from = get<std::int32_t>(header, at_rank);
  f.tag = get<std::uint64_t>(header, at_tag);
  if (get<std::uint64_t>(header, at_token) != token)
    return make_error(errc::protocol,
                      "rank {}: refused a message claiming to come from rank {} (tag {}): its job token is not "
                      "this job's",
                      self_rank, f.from, f.tag);
  const auto head_len = get<std::uint32_t>(header, at_head_len);
  if (f.from < 0 || f.from >= size || head_len != header_bytes - am_fixed_bytes)
    return make_error(errc::protocol,
                      "rank {}: refused a malformed message claiming to come from rank {} of {} (tag {}, head of "
                      "{} bytes in a {}-byte header)",
                      self_rank, f.from, size, f.tag, head_len, header_bytes);
  const auto kind = get<std::uint8_t>(header, at_kind);
  if (kind != static_cast<std::uint8_t>(am_kind::data) && kind != static_cast<std::uint8_t>(am_kind::abort))
    return make_error(errc::protocol, "rank {}: refused a message from rank {} of unknown kind {} (tag {})",
                      self_rank, f.from, static_cast<unsigned>(kind), f.tag);
  f.kind = static_cast<am_kind>(kind);
  f.seq = get<std::uint64_t>(header, at_seq);
  f.head = static_cast<const std::byte*>(header) + am_fixed_bytes;
  f.head_bytes = head_len;
  return f;
}

} // namespace dsa::net::ucx_detail
