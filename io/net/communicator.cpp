// The communicator: call sequencing, argument checks, allreduce (flat and ring),
// reduce_scatter and allgather.
#include "io/net/communicator.hpp"

#include "core/log.hpp"
#include "core/test_fault.hpp"
#include "io/net/call_checks.hpp"
#include "io/net/flight_recorder.hpp"
#include "io/net/fp32_sum.hpp"
#include "io/net/ring.hpp"
#include "io/net/shared_allreduce.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dsa::net {

chunk partition(std::int64_t count, int ranks, int rank) {
  DSA_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && count >= 0, "partition({}, {}, {})", count,
            ranks, rank);
  const std::int64_t base = count / ranks, extra = count % ranks;
  return chunk{rank * base + std::min<std::int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

communicator::communicator(transport& t, collective_options options, std::uint32_t channel)
    : transport_(t), options_(options), first_seq_(static_cast<std::uint64_t>(channel) << 40),
      seq_(first_seq_) {
  DSA_CHECK(channel < (1u << 23), "communicator channel {} is not below 2^23", channel);
  for (int r = 0; r < t.size(); ++r) group_.push_back(t.world_rank(r));
}

namespace {

// DSA_TEST_COLLECTIVE_FAULT=stall:RANK:CHANNEL:CALL or skip:RANK:CHANNEL:CALL (tests of
// `dsactor trace hang`): on world rank RANK, the first communicator of channel CHANNEL to
// reach its call number CALL stalls before entering it until the group is aborted, or skips
// it (takes its sequence number without sending anything) and goes on to the next. Once
// per process.
struct collective_fault {
  bool stall = false;
  int rank = -1;
  unsigned channel = 0;
  std::uint64_t call = 0;
};

std::optional<collective_fault> test_collective_fault() {
  static const std::optional<collective_fault> fault = []() -> std::optional<collective_fault> {
    const char* spec = std::getenv("DSA_TEST_COLLECTIVE_FAULT");
    if (!spec || !*spec) return std::nullopt;
    collective_fault f;
    char kind[8] = {};
    unsigned long long call = 0;
    if (std::sscanf(spec, "%7[a-z]:%d:%u:%llu", kind, &f.rank, &f.channel, &call) != 4 ||
        (std::string(kind) != "stall" && std::string(kind) != "skip"))
      throw std::runtime_error(fmt::format("DSA_TEST_COLLECTIVE_FAULT: expected stall|skip:RANK:CHANNEL:CALL, got '{}'", spec));
    f.stall = std::string(kind) == "stall";
    f.call = call;
    return f;
  }();
  return fault;
}

std::atomic<bool> g_fault_fired{false};

} // namespace

communicator::~communicator() = default;

wire_header communicator::begin(op_kind kind, dtype type, std::int64_t count, std::int64_t root) {
  in_flight_ = false;
  if (kind == op_kind::allreduce_flat || kind == op_kind::allreduce_ring || kind == op_kind::allreduce_shared ||
      kind == op_kind::reduce_scatter)
    test_fault::at(test_fault::phase::allreduce);
  const auto fault = test_collective_fault();
  if (fault && fault->rank == group_[static_cast<std::size_t>(rank())] && fault->channel == channel() &&
      seq_ - first_seq_ == fault->call &&
      !g_fault_fired.exchange(true)) {
    log_warn("DSA_TEST_COLLECTIVE_FAULT: world rank {} {} collective #{} ({}, channel {})", fault->rank,
             fault->stall ? "stalls before" : "skips", fault->call, op_kind_name(kind), channel());
    if (fault->stall) {
      while (!transport_.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      wire_header h; // the call then fails on the aborted transport, never entered
      h.kind = kind;
      h.type = type;
      h.seq = seq_++;
      h.count = count;
      h.root = root;
      return h;
    }
    ++seq_; // skipped: its number is gone, and the peers wait in it
  }
  flight_call c;
  c.channel = channel();
  c.seq = seq_ - first_seq_;
  c.kind = kind;
  c.type = type;
  c.count = count;
  // all_to_all's count is one block per rank: the call moves size() of them.
  c.bytes = count > 0 ? count * static_cast<std::int64_t>(dtype_size(type)) * (kind == op_kind::all_to_all ? size() : 1)
                      : 0;
  c.rank = rank();
  flight_token_ = flight_recorder::instance().enter(c, group_);
  in_flight_ = true;
  wire_header h;
  h.kind = kind;
  h.type = type;
  h.seq = seq_++; // consumed even by a call that fails its checks, so ranks stay in step
  h.count = count;
  h.root = root;
  return h;
}

status communicator::finish(status result) {
  if (in_flight_) flight_recorder::instance().leave(flight_token_, result.has_value());
  in_flight_ = false;
  if (!result)
    transport_.abort(result.err());
  return result;
}

status communicator::allreduce_sum(void* data, dtype type, std::int64_t count) {
  const bool flat = count >= 0 && static_cast<std::size_t>(count) * dtype_size(type) <
                                      options_.flat_allreduce_below_bytes;
  const op_kind kind = flat            ? op_kind::allreduce_flat
                       : shared_path() ? op_kind::allreduce_shared
                                       : op_kind::allreduce_ring;
  wire_header call = begin(kind, type, count);
  auto run = [&]() -> status {
    DSA_TRY(check_call(call, rank()));
    DSA_TRY(check_reducible(call, rank()));
    DSA_TRY(check_pointer(call, rank(), "data", data, count));
    switch (kind) {
    case op_kind::allreduce_flat:
      return allreduce_flat(call, data);
    case op_kind::allreduce_shared:
      return allreduce_shared(call, data);
    default:
      return allreduce_ring(call, data);
    }
  };
  return finish(run());
}

status communicator::allreduce_flat(const wire_header& call, void* data) {
  const int n = size(), r = rank();
  wire_header h = call;
  h.payload_bytes = call.count * static_cast<std::int64_t>(dtype_size(call.type));
  for (int step = 1; step < n; ++step)
    DSA_TRY(wire_send(transport_, (r + step) % n, h, data));
  // Received whole before summing, then summed in rank order: the order never depends on
  // which message arrived first.
  std::vector<bytes> from(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p == r)
      continue;
    DSA_ASSIGN_OR_RETURN(from[static_cast<std::size_t>(p)], wire_recv(transport_, p, h));
  }
  auto contribution = [&](int p) -> const void* {
    return p == r ? data
                  : static_cast<const void*>(from[static_cast<std::size_t>(p)].data() +
                                             wire_header_bytes);
  };
  std::vector<float> acc(static_cast<std::size_t>(call.count)), scratch;
  widen_to_f32(acc.data(), contribution(0), call.type, call.count);
  for (int p = 1; p < n; ++p)
    add_to_f32(acc.data(), contribution(p), call.type, call.count, scratch);
  narrow_from_f32(data, call.type, acc.data(), call.count);
  return {};
}

status communicator::allreduce_ring(const wire_header& call, void* data) {
  const chunk own = partition(call.count, size(), rank());
  auto* own_bytes =
      static_cast<std::byte*>(data) + own.offset * static_cast<std::int64_t>(dtype_size(call.type));
  if (call.type == dtype::f32) {
    // The sum lands in place: the reduce-scatter reads this rank's chunk of `data` only
    // in its last step, where it writes the sum.
    DSA_TRY(ring_reduce_scatter_f32(transport_, call, 0, reinterpret_cast<float*>(own_bytes), data,
                                    scratch_));
  } else {
    scratch_.result.resize(static_cast<std::size_t>(own.count));
    DSA_TRY(ring_reduce_scatter_f32(transport_, call, 0, scratch_.result.data(), data, scratch_));
    // Only this rank's chunk is overwritten, after the reduce-scatter has read all of `data`.
    narrow_from_f32(own_bytes, call.type, scratch_.result.data(), own.count);
  }
  return ring_allgather(transport_, call, size(), data);
}

bool communicator::shared_path() const {
  return options_.shared_memory && size() > 1 && sharing_ != sharing::off;
}

status communicator::allreduce_shared(const wire_header& call, void* data) {
  // Every rank is in this very call before any touches shared memory: a rank in another
  // call fails here on the header instead of leaving this one waiting on a counter.
  // The message carries this rank's buffer address modulo 4096, which places the
  // segments in the shared slots.
  wire_header hello = call;
  hello.block = -1;
  hello.payload_bytes = sizeof(std::uint64_t);
  const int n = size(), r = rank();
  std::vector<std::uint64_t> page_offsets(static_cast<std::size_t>(n));
  page_offsets[static_cast<std::size_t>(r)] = reinterpret_cast<std::uintptr_t>(data) % 4096;
  for (int step = 1; step < n; ++step)
    DSA_TRY(wire_send(transport_, (r + step) % n, hello, &page_offsets[static_cast<std::size_t>(r)]));
  for (int p = 0; p < n; ++p)
    if (p != r) {
      DSA_ASSIGN_OR_RETURN(bytes got, wire_recv(transport_, p, hello));
      std::memcpy(&page_offsets[static_cast<std::size_t>(p)], got.data() + wire_header_bytes,
                  sizeof(std::uint64_t));
    }
  if (sharing_ == sharing::untried) {
    const std::uint64_t host = options_.host_number ? options_.host_number : this_host_number();
    DSA_ASSIGN_OR_RETURN(shared_, shared_regions::connect(transport_, call, host));
    sharing_ = shared_ ? sharing::on : sharing::off;
  }
  // The ring when the regions could not be shared: every rank decided the same.
  return shared_ ? shared_->allreduce(transport_, call, data, page_offsets)
                 : allreduce_ring(call, data);
}

status communicator::reduce_scatter_sum(void* out, const void* in, dtype type, std::int64_t count) {
  wire_header call = begin(op_kind::reduce_scatter, type, count);
  auto run = [&]() -> status {
    DSA_TRY(check_call(call, rank()));
    DSA_TRY(check_reducible(call, rank()));
    const chunk own = partition(count, size(), rank());
    DSA_TRY(check_pointer(call, rank(), "in", in, count));
    DSA_TRY(check_pointer(call, rank(), "out", out, own.count));
    if (type == dtype::f32)
      return ring_reduce_scatter_f32(transport_, call, 0, static_cast<float*>(out), in, scratch_);
    scratch_.result.resize(static_cast<std::size_t>(own.count));
    DSA_TRY(ring_reduce_scatter_f32(transport_, call, 0, scratch_.result.data(), in, scratch_));
    narrow_from_f32(out, type, scratch_.result.data(), own.count);
    return {};
  };
  return finish(run());
}

status communicator::allgather(void* out, const void* in, dtype type, std::int64_t count) {
  wire_header call = begin(op_kind::allgather, type, count);
  auto run = [&]() -> status {
    DSA_TRY(check_call(call, rank()));
    const chunk own = partition(count, size(), rank());
    DSA_TRY(check_pointer(call, rank(), "out", out, count));
    DSA_TRY(check_pointer(call, rank(), "in", in, own.count));
    const std::size_t width = dtype_size(type);
    if (own.count > 0) // memmove: `in` may already be this rank's part of `out`
      std::memmove(static_cast<std::byte*>(out) + own.offset * static_cast<std::int64_t>(width), in,
                   static_cast<std::size_t>(own.count) * width);
    return ring_allgather(transport_, call, 0, out);
  };
  return finish(run());
}

void communicator::abort(const error& reason) { (void)finish(reason); } // closes a call left open too

} // namespace dsa::net
