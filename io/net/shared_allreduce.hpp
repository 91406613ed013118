// The allreduce between ranks on one host through shared memory: no pull, no copy of
// a whole buffer between processes.
//
// Each rank owns a region ((N+1) x 4 MiB: a memfd, mapped by every rank of the group
// through /proc/<pid>/fd, so no name is ever left behind): a control block of counters, and
// rings of slot_count slots of one segment (64 Ki elements) each: one ring per chunk for
// its contributions to that chunk's owner, one for its own chunk's results. Chunks are
// partition(count, N, c), as in the ring allreduce, cut into segments. For segment k,
// every rank r in turn
//   A. copies its values of segment k of every other chunk c into its ring for c,
//   B. sums segment k of its own chunk from the peers' slots and its own values in the
//      ring allreduce's order, ((x[r+1] + x[r+2]) + ...) + x[r] in fp32, rounded once,
//      writes it in place and into its result ring,
//   C. copies segment k of every other chunk's result from its owner's result ring.
// So all ranks reduce disjoint chunks at once, and a segment goes from one core's cache
// to the other's instead of through memory: per rank one read of its buffer and one
// write of the result, plus the slot copies that stay in cache. The result is the ring
// allreduce's, bit for bit.
//
// Synchronisation: monotonic counters in the control blocks, (call << 32) | (segments
// done), published with release stores; a waiter spins briefly, then sleeps on the
// publisher's futex word, waking every 10 ms to ask the transport whether the group was
// aborted, so a lost peer (which the transport notices) fails the call instead of
// hanging it. A slot is reused only after its readers have said they are done with it.
#pragma once

#include "io/net/transport.hpp"
#include "io/net/wire.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::net {

// Which host this process runs on, as a number (host name, boot id and pid namespace):
// ranks whose numbers differ never try to share memory.
std::uint64_t this_host_number();

class shared_regions {
public:
  // Collective over `t` (every rank calls it in the same call, whose header `call`
  // stamps the messages): each rank creates its region and maps every peer's. Returns
  // nullptr on every rank (they agree) when a rank is on another host (`host`: this
  // rank's this_host_number(), or what a test sets) or a region could not be created
  // or mapped; an error when the transport failed.
  static expected<std::unique_ptr<shared_regions>> connect(transport& t, const wire_header& call,
                                                           std::uint64_t host);
  ~shared_regions();
  shared_regions(const shared_regions&) = delete;
  shared_regions& operator=(const shared_regions&) = delete;

  // data: (call.count) of call.type (f32, f16, bf16), in place = the sum over ranks.
  // Every rank calls it in the same call after connect(). page_offsets: (ranks) every
  // rank's `data` address modulo 4096 in this call (which places the slots' contents).
  status allreduce(transport& t, const wire_header& call, void* data,
                   const std::vector<std::uint64_t>& page_offsets);

private:
  shared_regions(int ranks, int rank);
  std::byte* region(int p) const { return maps_[static_cast<std::size_t>(p)]; }

  int ranks_;
  int rank_;
  std::size_t region_bytes_;
  std::vector<std::byte*> maps_; // every rank's region, this rank's own included
  std::uint64_t calls_ = 0;
  std::vector<float> acc_, widened_; // fp32 partial sums of one segment
};

} // namespace dsa::net
