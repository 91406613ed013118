// Stage states between the processes of a job whose pipeline stages run in separate
// processes: the owner of a stage (data-parallel rank 0 of its processes) sends its
// shard's checkpoint payload, or its working weights for the evaluation, to the job's
// rank 0, which writes the one checkpoint (and evaluates) as a process running every
// stage would. Point to point over the job's transport, on a tag of their own.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/ckpt/checkpoint_manifest.hpp"
#include "io/net/transport.hpp"

#include <map>
#include <string>
#include <vector>

namespace dsa::train {

using named_tensors = std::map<std::string, tensor>;

// The channel above pipe_link's (actors/pipe_link.hpp), in communicator.hpp's tag scheme.
inline constexpr net::tag_t stage_states_tag = (net::tag_t{1} << 62) + (net::tag_t{1} << 40);

// Sends `tensors` (host tensors) to process `to`; returns once the transport no longer
// reads them. Messages to one process arrive in the order sent.
status send_named_tensors(net::transport& t, int to, const named_tensors& tensors);
// The next send_named_tensors from process `from`, in tensors of its own.
expected<named_tensors> recv_named_tensors(net::transport& t, int from);

// A stage's part of a checkpoint: its payload (the whole shard's, or under ZeRO its gathered
// masters) and the files its ranks staged (ZeRO partitions, 1-bit error buffers).
struct stage_checkpoint_part {
  named_tensors payload;
  std::vector<ckpt::checkpoint_file> staged;
};
status send_checkpoint_part(net::transport& t, int to, const stage_checkpoint_part& part);
expected<stage_checkpoint_part> recv_checkpoint_part(net::transport& t, int from);

} // namespace dsa::train
