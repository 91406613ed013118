// all_to_all: every rank sends block p to rank p directly (N-1 messages each way).
#include "io/net/communicator.hpp"

#include "io/net/call_checks.hpp"
#include "io/net/sends_in_flight.hpp"

#include <cstring>

namespace dsa::net {

status communicator::all_to_all(void* out, const void* in, dtype type, std::int64_t block_count) {
  wire_header call = begin(op_kind::all_to_all, type, block_count);
  const int n = size(), r = rank();
  auto run = [&]() -> status {
    DSA_TRY(check_call(call, r));
    DSA_TRY(check_pointer(call, r, "in", in, n * block_count));
    DSA_TRY(check_pointer(call, r, "out", out, n * block_count));
    const std::int64_t block_bytes = block_count * static_cast<std::int64_t>(dtype_size(type));
    const auto* src = static_cast<const std::byte*>(in);
    auto* dst = static_cast<std::byte*>(out);
    call.payload_bytes = block_bytes;
    sends_in_flight sends(transport_);
    for (int step = 1; step < n; ++step) {
      const int peer = (r + step) % n;
      call.block = peer; // the destination: the receiver checks it got its own block
      auto sent = wire_send_parts(transport_, peer, call, src + peer * block_bytes);
      if (!sent)
        return sends.fail(sent.err());
      sends.add(std::move(*sent));
    }
    if (block_bytes > 0)
      std::memcpy(dst + r * block_bytes, src + r * block_bytes,
                  static_cast<std::size_t>(block_bytes));
    call.block = r;
    for (int p = 0; p < n; ++p) {
      if (p == r)
        continue;
      status got = wire_recv_into(transport_, p, call, dst + p * block_bytes);
      if (!got)
        return sends.fail(got.err());
    }
    return sends.finish();
  };
  return finish(run());
}

} // namespace dsa::net
