// Ring reduce-scatter (fp32 partials) and ring allgather over partition() chunks.
#include "io/net/ring.hpp"

#include "io/net/communicator.hpp"
#include "io/net/fp32_sum.hpp"

#include <cstring>
#include <vector>

namespace dsa::net {

namespace {

int wrap(int r, int n) {
  return ((r % n) + n) % n;
}

const float* payload_f32(const bytes& message) {
  return reinterpret_cast<const float*>(message.data() + wire_header_bytes);
}

} // namespace

status ring_reduce_scatter_f32(transport& t, const wire_header& call, std::int64_t block_base,
                               float* own, const void* in) {
  const int n = t.size(), r = t.rank();
  const std::size_t width = dtype_size(call.type);
  const auto* x = static_cast<const std::byte*>(in);
  auto part = [&](int c) { return partition(call.count, n, c); };
  auto message_for = [&](int c) {
    wire_header h = call;
    h.block = block_base + c;
    h.payload_bytes = part(c).count * static_cast<std::int64_t>(sizeof(float));
    return h;
  };
  const int right = wrap(r + 1, n), left = wrap(r - 1, n);
  std::vector<float> acc, scratch;
  if (n == 1) {
    widen_to_f32(own, in, call.type, call.count);
    return {};
  }
  // Step 0 starts chunk r-1 with this rank's own values; every later step passes on the
  // chunk received just before, with this rank's values added.
  const chunk first = part(left);
  acc.resize(static_cast<std::size_t>(first.count));
  widen_to_f32(acc.data(), x + first.offset * width, call.type, first.count);
  DSA_TRY(wire_send(t, right, message_for(left), acc.data()));
  for (int step = 0; step < n - 1; ++step) {
    const int c = wrap(r - 2 - step, n);
    const chunk part_c = part(c);
    DSA_ASSIGN_OR_RETURN(bytes message, wire_recv(t, left, message_for(c)));
    float* sum = own;
    if (step < n - 2) {
      acc.resize(static_cast<std::size_t>(part_c.count));
      sum = acc.data();
    }
    if (part_c.count > 0)
      std::memcpy(sum, payload_f32(message),
                  static_cast<std::size_t>(part_c.count) * sizeof(float));
    add_to_f32(sum, x + part_c.offset * width, call.type, part_c.count, scratch);
    if (step < n - 2)
      DSA_TRY(wire_send(t, right, message_for(c), sum));
  }
  return {};
}

status ring_allgather(transport& t, const wire_header& call, std::int64_t block_base, void* data) {
  const int n = t.size(), r = t.rank();
  const std::size_t width = dtype_size(call.type);
  auto* d = static_cast<std::byte*>(data);
  auto message_for = [&](int c) {
    wire_header h = call;
    h.block = block_base + c;
    h.payload_bytes = partition(call.count, n, c).count * static_cast<std::int64_t>(width);
    return h;
  };
  const int right = wrap(r + 1, n), left = wrap(r - 1, n);
  for (int step = 0; step < n - 1; ++step) {
    const int send_c = wrap(r - step, n), recv_c = wrap(r - step - 1, n);
    DSA_TRY(wire_send(t, right, message_for(send_c),
                      d + partition(call.count, n, send_c).offset * width));
    wire_header expect = message_for(recv_c);
    DSA_ASSIGN_OR_RETURN(bytes message, wire_recv(t, left, expect));
    if (expect.payload_bytes > 0)
      std::memcpy(d + partition(call.count, n, recv_c).offset * width,
                  message.data() + wire_header_bytes,
                  static_cast<std::size_t>(expect.payload_bytes));
  }
  return {};
}

} // namespace dsa::net
