// Ring reduce-scatter (fp32 partials) and ring allgather over partition() chunks.
#include "io/net/ring.hpp"

#include "io/net/communicator.hpp"
#include "io/net/fp32_sum.hpp"
#include "io/net/sends_in_flight.hpp"

#include <cstdint>
#include <vector>

namespace dsa::net {

namespace {

int wrap(int r, int n) {
  return ((r % n) + n) % n;
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

} // namespace

status ring_reduce_scatter_f32(transport& t, const wire_header& call, std::int64_t block_base,
                               float* own, const void* in, ring_scratch& scratch) {
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
  auto grow = [](std::vector<float>& v, std::int64_t count) -> float* {
    if (v.size() < static_cast<std::size_t>(count))
      v.resize(static_cast<std::size_t>(count));
    return v.data();
  };
  if (n == 1) {
    widen_to_f32(own, in, call.type, call.count);
    return {};
  }
  const int right = wrap(r + 1, n), left = wrap(r - 1, n);
  sends_in_flight sends(t);
  send_ticket step_sent[2]; // the send reading scratch.step[i], if any
  // Step 0 starts chunk r-1 with this rank's own values (sent straight from `in` when
  // they are f32 already); every later step passes on the chunk received just before,
  // with this rank's values added.
  const chunk first = part(left);
  const float* first_values = reinterpret_cast<const float*>(x + first.offset * width);
  if (call.type != dtype::f32) {
    float* widened = grow(scratch.step[1], first.count);
    widen_to_f32(widened, x + first.offset * width, call.type, first.count);
    first_values = widened;
  }
  auto sent = wire_send_parts(t, right, message_for(left), first_values);
  if (!sent)
    return sends.fail(sent.err());
  if (call.type == dtype::f32)
    sends.add(std::move(*sent));
  else
    step_sent[1] = std::move(*sent);
  for (int step = 0; step < n - 1; ++step) {
    const int c = wrap(r - 2 - step, n);
    const chunk part_c = part(c);
    const bool last = step == n - 2;
    const std::byte* mine = x + part_c.offset * width;
    float* sum = own;
    float* landing = own;
    if (!last) {
      // The buffer's previous send (two steps ago) must be done before it is reused.
      status reused = step_sent[step % 2].wait();
      if (!reused)
        return sends.fail(reused.err());
      sum = landing = grow(scratch.step[step % 2], part_c.count);
    } else if (overlaps(own, static_cast<std::size_t>(part_c.count) * sizeof(float), x,
                        static_cast<std::size_t>(call.count) * width)) {
      landing = grow(scratch.incoming, part_c.count); // own is read as `mine` below
    }
    status got = wire_recv_into(t, left, message_for(c), landing);
    if (!got)
      return sends.fail(got.err());
    sum_to_f32(sum, landing, mine, call.type, part_c.count, scratch.widened);
    if (!last) {
      auto passed = wire_send_parts(t, right, message_for(c), sum);
      if (!passed)
        return sends.fail(passed.err());
      step_sent[step % 2] = std::move(*passed);
    }
  }
  for (auto& ticket : step_sent)
    sends.add(std::move(ticket));
  return sends.finish();
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
  auto at = [&](int c) { return d + partition(call.count, n, c).offset * width; };
  const int right = wrap(r + 1, n), left = wrap(r - 1, n);
  sends_in_flight sends(t);
  // A chunk is sent (step s+1) only after it was received (step s), and never received
  // again, so no receive overwrites memory a send still reads.
  for (int step = 0; step < n - 1; ++step) {
    const int send_c = wrap(r - step, n), recv_c = wrap(r - step - 1, n);
    auto sent = wire_send_parts(t, right, message_for(send_c), at(send_c));
    if (!sent)
      return sends.fail(sent.err());
    sends.add(std::move(*sent));
    status got = wire_recv_into(t, left, message_for(recv_c), at(recv_c));
    if (!got)
      return sends.fail(got.err());
  }
  return sends.finish();
}

} // namespace dsa::net
