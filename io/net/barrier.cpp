// barrier: dissemination; in round k rank r signals r + 2^k and waits for r - 2^k, so
// after ceil(log2 N) rounds every rank has heard, through some chain, from every rank.
#include "io/net/communicator.hpp"

namespace dsa::net {

status communicator::barrier() {
  wire_header call = begin(op_kind::barrier, dtype::u8, 0);
  const int n = size(), r = rank();
  auto run = [&]() -> status {
    for (int distance = 1; distance < n; distance <<= 1) {
      call.block = distance;
      DSA_TRY(wire_send(transport_, (r + distance) % n, call, nullptr));
      DSA_TRY(wire_recv(transport_, (r - distance + n) % n, call));
    }
    return {};
  };
  return finish(run());
}

} // namespace dsa::net
