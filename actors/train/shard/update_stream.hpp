// The streamed update, a part a partitioned shard with its state on NVMe composes
// (partition_shard.hpp, optimizer_compute::stream_elements): the update sweeps the swapped
// state last chunk first (the order backward finishes the gradients), each chunk as soon
// as the backward's parts cover it, so the swap's reads and writes overlap the backward.
// With clipping the stream is speculative: it writes the swap's second files
// (swap_store::begin_shadow) and update() keeps them, or forgets them and redoes the step
// when the step clipped. The bits are those of the update after the backward (the same
// kernels on the same elements).
//
// Threads: gradients_final and cancel come from the shard actor's thread; the sweep asks
// ready()'s hook on the shard's worker under the store's lock.
#pragma once

#include "actors/train/shard/gradient_frontier.hpp"
#include "actors/train/shard/step_decider.hpp"
#include "core/error.hpp"
#include "optim/chunked_state.hpp"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace dsa::aio {
class swap_store;
}
namespace dsa::optim {
class partitioned_optimizer;
}

namespace dsa::train {

class update_stream {
public:
  update_stream(std::uint32_t participant, const step_decider& decider) : participant_(participant), decider_(decider) {}
  // The partition and its swap store (init); until then nothing streams.
  void attach(optim::partitioned_optimizer& part, aio::swap_store& swap);

  // Parameter `first` and every later one of `step` have their final gradients.
  void gradients_final(std::uint32_t step, std::uint32_t first);
  // The run stops: a sweep waiting for gradients fails; nothing streams after.
  void cancel();

  // Starts the streamed update of `step` assuming `assumed`: false when declined (a step
  // right after one that clipped is likely to clip too: it waits for the norm instead).
  bool begin(std::uint32_t step, const step_decision& assumed);
  // The hook the partition's sweep waits in for each chunk of `step`.
  optim::chunk_ready ready(std::uint32_t step);
  // The sweep of `step` is done; returns when the time the update added after the backward
  // began (from the step's last part on, or `started`), for wall_clock_breakdown.
  std::chrono::steady_clock::time_point finished(std::uint32_t step, std::chrono::steady_clock::time_point started);
  bool pending() const { return step_.has_value(); }

  // update() of `step`, decided `d` (`would`: what a stream assumes): whether the step was
  // streamed and its update stands. A speculative stream that clipped is forgotten (the
  // gradients were not touched: no scaling was assumed): false, and update() redoes it.
  bool settle(std::uint32_t step, const step_decision& would, const step_decision& d);

  // "; N updates streamed over the backward: ..." for the swap's line; empty when none.
  std::string report(std::uint64_t gradient_wait_ns) const;

private:
  expected<bool> chunk_final(std::uint32_t step, std::int64_t lo);

  std::uint32_t participant_;
  const step_decider& decider_;
  optim::partitioned_optimizer* part_ = nullptr;
  aio::swap_store* swap_ = nullptr;
  // Which partition elements of which step are final (gradients_final).
  gradient_frontier frontier_;
  // The step streamed (its update() not yet run), what it assumed, whether it writes the
  // second files, and what to restore if it clipped.
  std::optional<std::uint32_t> step_;
  step_decision assumed_;
  bool speculative_ = false, last_differed_ = false;
  std::int64_t undo_step_ = 0;
  double undo_beta1_ = 0, undo_beta2_ = 0;
  std::int64_t streamed_ = 0, chunks_ = 0, early_chunks_ = 0, redone_ = 0, declined_ = 0;
};

} // namespace dsa::train
