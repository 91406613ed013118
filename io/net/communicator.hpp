// Collectives over a transport: allreduce (sum), reduce_scatter (sum), allgather,
// broadcast, all_to_all and barrier on contiguous host buffers.
//
// Every rank of the group calls the same collectives in the same order with the same
// dtype, count (and root): each call takes the next sequence number as its transport
// tag and stamps it, with its kind, dtype and count, on every message, so consecutive
// calls never mix and a rank that disagrees gets an errc::protocol error instead of
// misread bytes. Any failed call aborts the transport, which wakes every blocked peer
// with an error: a broken call never leaves the others hanging.
//
// Reductions take f32, f16 or bf16 and accumulate in fp32. Results are bit-identical on
// every rank and do not depend on message arrival order, because every sum is formed in
// an order fixed by rank numbers alone:
// - flat allreduce (buffers below options.flat_allreduce_below_bytes): each rank sends its
//   buffer to every other rank and sums all contributions in rank order 0..N-1 in fp32,
//   rounding once to the dtype at the end. One round, N-1 messages of the whole buffer.
// - ring allreduce: ring reduce-scatter then ring allgather. Chunk c (partition(count,
//   N, c)) is summed along the ring starting at rank c+1: ((x[c+1] + x[c+2]) + ...) +
//   x[c], in fp32; for f16/bf16 the partial sums travel as fp32 (twice the bytes of the
//   dtype) and rank c rounds its chunk once; the allgather then copies rank c's rounded
//   bits to every rank. 2(N-1) steps, ~2 (N-1)/N of the buffer sent per rank.
// - shared-memory allreduce (ring-sized buffers when every rank runs on this host and
//   options.shared_memory): the ring's chunks and order, summed by each chunk's owner
//   straight from the peers' shared slots (io/net/shared_allreduce.hpp), so its results
//   are the ring's bit for bit. Before each call the ranks trade headers through the
//   transport (so ranks in different calls get errors, never wait on memory for each
//   other); the first such call maps the regions, and where that fails on any rank
//   every rank takes the ring from then on.
// The flat path and the ring sum in different orders, so they may differ from each
// other in the last bit; each is deterministic on its own.
//
// Threads: a communicator belongs to one thread (a dedicated communication thread,
// never an actor thread: calls block until the peers take part). Several communicators
// may share one transport, each on its own thread, when each has its own channel: a
// channel's calls use tags channel * 2^40 + sequence, so channels never mix.
#pragma once

#include "core/dtype.hpp"
#include "io/net/ring.hpp"
#include "io/net/transport.hpp"
#include "io/net/wire.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::net {

class shared_regions;

struct collective_options {
  // allreduce buffers of fewer bytes take the flat path (latency: one round); the rest
  // the ring (bandwidth: each rank sends ~2x the buffer whatever N). With a per-message
  // cost a = 5 us, link bandwidth b = 10 GB/s and a rank's N-1 flat sends serialized,
  // flat costs a + (N-1) S/b and ring 2(N-1) a + 2 (N-1)/N S/b: equal near S = 170 KB at
  // N = 4, 125 KB at N = 8. 64 KiB keeps the flat path for what is latency-bound.
  // 0 forces the ring, SIZE_MAX the flat path.
  std::size_t flat_allreduce_below_bytes = 64 * 1024;
  // The ring-sized allreduce goes through memory shared by the ranks when all are on
  // one host; false keeps the ring over the transport.
  bool shared_memory = true;
  // Which host this rank is on for that decision; 0: this_host_number(). Tests give
  // ranks different numbers to take the ring where they could share memory.
  std::uint64_t host_number = 0;
};

// Rank `rank`'s part of `count` elements split over `ranks`: contiguous, in rank order,
// the first count % ranks parts one element longer. Used by reduce_scatter, allgather
// and the ring allreduce.
struct chunk {
  std::int64_t offset = 0;
  std::int64_t count = 0;
};
chunk partition(std::int64_t count, int ranks, int rank);

class communicator {
public:
  // channel: below 2^23; every rank's communicator of one conversation uses the same.
  explicit communicator(transport& t, collective_options options = {}, std::uint32_t channel = 0);
  ~communicator();
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  // Calls issued so far (the next call's sequence number).
  std::uint64_t calls() const { return seq_ - first_seq_; }
  std::uint32_t channel() const { return static_cast<std::uint32_t>(first_seq_ >> 40); }
  // The bytes the transport under this communicator has sent, on every channel (see
  // transport::bytes_sent; the shared-memory allreduce does not go through it).
  std::uint64_t transport_bytes_sent() const { return transport_.bytes_sent(); }

  // data: (count) in place, f32/f16/bf16; data = sum over ranks.
  status allreduce_sum(void* data, dtype type, std::int64_t count);
  // in: (count) f32/f16/bf16; out: (partition(count, size(), rank()).count) =
  // this rank's part of the sum over ranks, as in the ring allreduce, bit for bit.
  status reduce_scatter_sum(void* out, const void* in, dtype type, std::int64_t count);
  // in: (partition(count, size(), rank()).count); out: (count), every rank's part at
  // its offset. Any dtype; bytes are copied unchanged.
  status allgather(void* out, const void* in, dtype type, std::int64_t count);
  // data: (count); root's data is copied to every rank (binomial tree). Any dtype.
  // Only receivers check the header, so ranks naming different roots are caught only
  // where one receives from a rank that names another root.
  status broadcast(void* data, dtype type, std::int64_t count, int root);
  // in: (size(), block_count), block p goes to rank p; out: (size(), block_count),
  // block p came from rank p. in and out must not overlap. Any dtype.
  status all_to_all(void* out, const void* in, dtype type, std::int64_t block_count);
  // Returns once every rank has entered the barrier (dissemination, ceil(log2 N) rounds).
  status barrier();
  // Aborts the transport with `reason`, waking every peer blocked in a collective, and closes
  // a call left open in the flight recorder (what a failed call does; for a caller whose
  // call ended another way, such as an exception).
  void abort(const error& reason);

private:
  // The header every message of the next call carries (takes the next sequence number).
  wire_header begin(op_kind kind, dtype type, std::int64_t count, std::int64_t root = 0);
  // Aborts the transport when `result` is an error, so the peers do not wait forever.
  // begin() and finish() also enter and leave the call in the flight recorder
  // (flight_recorder.hpp), and begin() applies the test-only DSA_TEST_COLLECTIVE_FAULT.
  status finish(status result);
  status allreduce_flat(const wire_header& call, void* data);
  status allreduce_ring(const wire_header& call, void* data);
  status allreduce_shared(const wire_header& call, void* data);
  // Whether a ring-sized allreduce takes the shared-memory path (the same on every rank).
  bool shared_path() const;

  transport& transport_;
  collective_options options_;
  std::uint64_t first_seq_ = 0;
  std::uint64_t seq_ = 0;
  std::vector<std::int32_t> group_; // the world ranks of this group, for the flight recorder
  std::uint64_t flight_token_ = 0;
  bool in_flight_ = false; // the current call was entered in the flight recorder
  ring_scratch scratch_;
  enum class sharing { untried, on, off } sharing_ = sharing::untried;
  std::unique_ptr<shared_regions> shared_;
};

} // namespace dsa::net
