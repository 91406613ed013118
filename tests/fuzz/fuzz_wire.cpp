// libFuzzer target: the transport's wire headers. The first byte picks one: the UCX
// transport's active-message header as its receive handler checks it (job token 7, 4
// ranks), or a collective's message checked against the header the receiver expects (the
// input's next 56 bytes decoded as that expectation, the rest as the message).
#include "io/net/am_header.hpp"
#include "io/net/wire.hpp"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto* p = reinterpret_cast<const std::byte*>(data + 1);
  const std::size_t n = size - 1;
  if (data[0] % 2 == 0) {
    // A heap copy of exactly n bytes, so AddressSanitizer sees any read past the header.
    std::vector<std::byte> header(p, p + n);
    auto f = dsa::net::ucx_detail::parse_am_header(header.data(), header.size(), 7, 1, 4);
    if (f && f->head_bytes > 0) {
      volatile std::byte last = f->head[f->head_bytes - 1];
      (void)last;
    }
    return 0;
  }
  dsa::net::wire_header expect;
  if (n >= dsa::net::wire_header_bytes) {
    std::int64_t fields[5];
    std::memcpy(fields, p + 8, sizeof fields);
    expect.kind = static_cast<dsa::net::op_kind>(data[1]);
    expect.type = static_cast<dsa::dtype>(data[2]);
    expect.seq = static_cast<std::uint64_t>(fields[0]);
    expect.count = fields[1];
    expect.root = fields[2];
    expect.block = fields[3];
    expect.payload_bytes = fields[4];
  }
  const std::size_t skip = std::min(n, dsa::net::wire_header_bytes);
  std::vector<std::byte> message(p + skip, p + n);
  (void)dsa::net::check_wire_message(0, 1, expect, message.data(), message.size(), message.size());
  return 0;
}
