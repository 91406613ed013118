// broadcast: a binomial tree rooted at `root` (ceil(log2 N) rounds, whole buffer per edge).
#include "io/net/communicator.hpp"

#include "io/net/call_checks.hpp"
#include "io/net/sends_in_flight.hpp"

namespace dsa::net {

status communicator::broadcast(void* data, dtype type, std::int64_t count, int root) {
  wire_header call = begin(op_kind::broadcast, type, count, root);
  const int n = size(), r = rank();
  auto run = [&]() -> status {
    DSA_TRY(check_call(call, r));
    DSA_TRY(check_pointer(call, r, "data", data, count));
    if (root < 0 || root >= n)
      return make_error(errc::invalid_argument,
                        "rank {}, call #{} broadcast: root {} outside the group of {} ranks", r,
                        call.seq, root, n);
    call.payload_bytes = count * static_cast<std::int64_t>(dtype_size(type));
    // Ranks relative to the root: v receives from v - (its lowest set bit), then sends
    // to v + m for every power of two m below that bit.
    const int v = (r - root + n) % n;
    int mask = 1;
    for (; mask < n; mask <<= 1) {
      if (v & mask) {
        DSA_TRY(wire_recv_into(transport_, (v - mask + root) % n, call, data));
        break;
      }
    }
    sends_in_flight sends(transport_);
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (v + mask < n) {
        auto sent = wire_send_parts(transport_, (v + mask + root) % n, call, data);
        if (!sent)
          return sends.fail(sent.err());
        sends.add(std::move(*sent));
      }
    return sends.finish();
  };
  return finish(run());
}

} // namespace dsa::net
