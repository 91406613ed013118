// Data parallelism: a run is one of `size` replicas (ranks) of the same pipeline,
// each fed a different part of every step's global batch. The replicas of stage s
// average their gradients before the update, so every rank's optimizer shard of
// stage s applies the same update to the same weights (ZeRO stage 0: replicated
// optimizer state). Ranks may be threads of one process (net::local_group) or
// processes (a transport between processes); the runtime sees only the transport.
//
// Who talks to whom, each on its own communicator channel of the transport, so
// the conversations never mix and each runs on one thread:
// - channel 0: the coordinators' hook threads, once per step: the step's loss and
//   forward metrics summed over ranks, then whether any rank asked to stop;
// - channel 1 + 2s: the reducers of stage s on their workers: the stage's gradients,
//   summed in buckets (allreduce_buffers);
// - channel 2 + 2s: with ZeRO, the optimizer shards of stage s (train::partition_shard):
//   the updated weights all-gathered, LAMB's norms, the state gathered for a checkpoint;
//   with a compressed optimizer (train::compressed_shard) its 1-bit exchanges and the
//   local steps' overflow flags.
// - channel 2^20 + s: with ZeRO-3, the parameter fetchers of stage s
//   (train::param_fetcher): each part's weights gathered before the model runs it;
// - channel 2^21 + s: with ZeRO-3, each micro-batch's gradients of stage s summed
//   into the ranks' partitions (train::partition_grads).
// Every rank issues these in the same order (one step after another, buckets in
// parameter order), so calls always meet their peers.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/net/comms_logger.hpp"
#include "io/net/communicator.hpp"
#include "io/net/async_collectives.hpp"
#include "io/net/transport.hpp"

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

namespace dsa::actors {

struct data_parallel_options {
  int rank = 0;
  int size = 1;
  // The group's transport (rank() == rank, size() == size); required when size > 1.
  // Borrowed: it must outlive the run. A failing run aborts it, which wakes every
  // peer blocked in a collective with the reason.
  net::transport* transport = nullptr;
  // Gradients are summed in buckets of at most this many f32 elements (DeepSpeed's
  // reduce_bucket_size); a larger tensor is summed on its own, in place.
  std::int64_t bucket_elements = 500'000'000;
  // overlap_comm: a stage sends each gradient bucket to its reducer as soon as
  // backward has finished it, so the sums overlap the rest of the backward.
  bool overlap = false;
  // comms_logger: times every collective the run issues (borrowed; may be null).
  net::comms_logger* logger = nullptr;
  // The gradient allreduce of ranks on one host through memory they share (else over the
  // transport); net::collective_options::shared_memory.
  bool shared_memory = true;

  bool enabled() const { return size > 1; }
};

// Runs one collective (`call` returns a status or an expected), timing it into `logger`
// as `op` of `bytes` by `caller` when the logger profiles op; null logger: just runs it.
template <class F>
auto log_collective(net::comms_logger* logger, std::string_view op, std::int64_t bytes, std::string_view caller,
                    F&& call) {
  if (!logger || !logger->profiles(op)) return call();
  const auto start = std::chrono::steady_clock::now();
  auto result = call();
  if (result)
    logger->record(op, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), caller);
  return result;
}

inline constexpr std::uint32_t hook_channel = 0;
inline std::uint32_t reducer_channel(std::uint32_t stage) { return 1 + 2 * stage; }
// The optimizer shards of stage s under ZeRO (their compute's own communicator).
inline std::uint32_t shard_channel(std::uint32_t stage) { return 2 + 2 * stage; }
// ZeRO-3's parameter fetcher of stage s (its own thread and communicator).
inline std::uint32_t fetch_channel(std::uint32_t stage) { return (1u << 20) + stage; }
// ZeRO-3's gradient partition of stage s (train::partition_grads, its own thread).
inline std::uint32_t grad_channel(std::uint32_t stage) { return (1u << 21) + stage; }

// Sums `buffers` (f32, contiguous, in the group's memory) over the group's ranks in place.
// Consecutive tensors share a bucket while their total fits `bucket_elements`; a bucket of
// several tensors is packed into one scratch buffer, summed, and unpacked. Every bucket is
// enqueued before the one wait. Every rank must pass tensors of the same shapes in the same
// order. The result is bit-identical on every rank. Each bucket's sum is one "all_reduce"
// in the group's logger.
status allreduce_buffers(net::async_collectives& group, std::vector<tensor>& buffers, std::int64_t bucket_elements);
// sum_over_ranks (below) through an asynchronous group: one all_gather, waited for.
expected<std::vector<double>> sum_over_ranks(net::async_collectives& group, const std::vector<double>& values);

// Element-wise sums of every rank's `values` (the same length on every rank, else an
// errc::protocol error), added in rank order in double: exact for counts, and the
// same bits on every rank.
// Logged as an "all_gather".
expected<std::vector<double>> sum_over_ranks(net::communicator& comm, const std::vector<double>& values,
                                             net::comms_logger* logger = nullptr, std::string_view caller = {});
// True on every rank when `mine` is true on any. Logged as an "all_gather".
expected<bool> any_rank(net::communicator& comm, bool mine, net::comms_logger* logger = nullptr,
                        std::string_view caller = {});

} // namespace dsa::actors
