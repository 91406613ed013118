// The error-compensated 1-bit allreduce of 1-bit Adam, 0/1 Adam and 1-bit LAMB
// (DeepSpeed's compressed_allreduce; ../shared/reference/deepspeed-notes.md §6.2), over
// the communicator's all_to_all and allgather. Every rank ends with the same result.
//
// With n ranks and N elements, padded to N' = a multiple of n * lcm(n, 8) (every rank's
// chunk a whole number of packed bytes):
//   phase 1: y = pad(x) + worker error; one RMS scale; signs packed (kernels/cpu/onebit.hpp);
//            all_to_all of the packed chunks, allgather of the scales;
//   server:  rank r averages chunk r over the ranks, z = (sum_j scale_j * signs_j) / n +
//            server error (j in rank order), and compresses z the same way;
//   phase 2: allgather of the server chunks' packed signs and scales; x = their expansion,
//            cut to N.
// The error buffers are the caller's state (an optimizer shard's, saved in checkpoints).
#pragma once

#include "core/error.hpp"
#include "io/net/communicator.hpp"

#include <cstdint>
#include <vector>

namespace dsa::net {

// The padded length N' for `count` elements over `ranks` (0 for 0).
std::int64_t onebit_padded(std::int64_t count, int ranks);

struct onebit_errors {
  std::vector<float> worker; // N'
  std::vector<float> server; // N' / n: this rank's chunk
};

// What one call put on the wire from this rank, and the scales it used.
struct onebit_report {
  std::uint64_t bytes_sent = 0; // payload bytes this rank sent (packed signs and scales)
  // What the transport counted this rank sending during the call: the payloads and the
  // collectives' message headers (and anything another channel of the same transport
  // sent meanwhile).
  std::uint64_t wire_bytes = 0;
  float worker_scale = 0, server_scale = 0;
};

// x: (count) f32, replaced by the compressed average over the ranks. `errors` starts
// empty (zeros of the right sizes are made) or holds the previous call's buffers for the
// same count and rank count; other sizes are an error naming them. count 0 empties both.
expected<onebit_report> compressed_allreduce(communicator& comm, float* x, std::int64_t count, onebit_errors& errors);

} // namespace dsa::net
