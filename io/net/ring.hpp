// The two ring passes behind reduce_scatter, allgather and the ring allreduce.
// Rank r sends to r+1 and receives from r-1 (mod N); N-1 steps each.
#pragma once

#include "io/net/transport.hpp"
#include "io/net/wire.hpp"

#include <cstdint>

namespace dsa::net {

// own: (partition(call.count, N, rank).count) f32 = this rank's chunk of the sum of
// every rank's in: (call.count) of call.type. Chunk c is summed starting at rank c+1:
// ((x[c+1] + x[c+2]) + ...) + x[c], in fp32; partial sums travel as f32.
// Message blocks: block_base + chunk index.
status ring_reduce_scatter_f32(transport& t, const wire_header& call, std::int64_t block_base,
                               float* own, const void* in);

// data: (call.count) of call.type, in place: on entry this rank's chunk is at its
// offset; on return every rank's chunk is. Message blocks: block_base + chunk index.
status ring_allgather(transport& t, const wire_header& call, std::int64_t block_base, void* data);

} // namespace dsa::net
