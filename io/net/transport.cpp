// The copying defaults of transport::send_parts and recv_parts.
#include "io/net/transport.hpp"

#include <cstring>

namespace dsa::net {

expected<send_ticket> transport::send_parts(int peer, tag_t tag, bytes head, const void* payload,
                                            std::size_t payload_bytes) {
  const std::size_t head_bytes = head.size();
  head.resize(head_bytes + payload_bytes);
  if (payload_bytes > 0)
    std::memcpy(head.data() + head_bytes, payload, payload_bytes);
  DSA_TRY(send(peer, tag, std::move(head)));
  return send_ticket{};
}

expected<received_parts> transport::recv_parts(int peer, tag_t tag, std::size_t head_bytes,
                                               void* payload, std::size_t payload_bytes) {
  DSA_ASSIGN_OR_RETURN(bytes message, recv(peer, tag));
  received_parts out;
  if (message.size() != head_bytes + payload_bytes) {
    out.message = std::move(message);
    return out;
  }
  if (payload_bytes > 0)
    std::memcpy(payload, message.data() + head_bytes, payload_bytes);
  message.resize(head_bytes);
  out.message = std::move(message);
  out.placed = true;
  return out;
}

} // namespace dsa::net
