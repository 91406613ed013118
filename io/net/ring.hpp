// The two ring passes behind reduce_scatter, allgather and the ring allreduce.
// Rank r sends to r+1 and receives from r-1 (mod N); N-1 steps each. Payloads go from
// the sender's buffer into the receiver's without intermediate copies where the
// transport allows it (transport::send_parts / recv_parts).
#pragma once

#include "io/net/transport.hpp"
#include "io/net/wire.hpp"

#include <cstdint>
#include <vector>

namespace dsa::net {

// Working memory of the reduce-scatter, kept by the communicator between calls so a
// large call does not page-fault fresh buffers every time.
struct ring_scratch {
  std::vector<float> step[2]; // partial sums in flight, alternately
  std::vector<float> incoming; // one received segment of a partial sum, before it is added
  std::vector<float> widened;  // f16/bf16 inputs widened to f32
  std::vector<float> result;   // the fp32 sum of a f16/bf16 call before it is rounded
};

// own: (partition(call.count, N, rank).count) f32 = this rank's chunk of the sum of
// every rank's in: (call.count) of call.type. Chunk c is summed starting at rank c+1:
// ((x[c+1] + x[c+2]) + ...) + x[c], in fp32; partial sums travel as f32.
// `own` may be this rank's chunk of `in` itself when call.type is f32 (the sum in place).
// Message blocks: block_base + chunk index; a chunk travels as messages of at most 2 MiB
// (segments, in order), each added to this rank's values as soon as it has landed, while
// it is in cache. Returns once no send reads `in` any more.
status ring_reduce_scatter_f32(transport& t, const wire_header& call, std::int64_t block_base,
                               float* own, const void* in, ring_scratch& scratch);

// data: (call.count) of call.type, in place: on entry this rank's chunk is at its
// offset; on return every rank's chunk is. Message blocks: block_base + chunk index.
status ring_allgather(transport& t, const wire_header& call, std::int64_t block_base, void* data);

} // namespace dsa::net
