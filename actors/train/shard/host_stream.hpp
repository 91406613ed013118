// A whole shard's update streamed over the backward, in host memory (whole_shard.hpp): the
// stage's parameters are updated last first, each as soon as its gradient is final, while
// the backward goes on. This is what a CUDA rank with offload_optimizer.device = "cpu"
// does (the CPU is idle while the GPU computes the backward; debug.stream_host_update asks
// for it on CPU ranks). The part here is the bookkeeping: which parameters of which step
// have final gradients, the wait for them, and the counts for the end-of-run line.
//
// Threads: gradients_final and cancel come from the shard actor's thread; run() is called
// on the shard's worker.
#pragma once

#include "actors/train/shard/gradient_frontier.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace dsa::train {

class host_stream {
public:
  host_stream(std::uint32_t participant, std::size_t params) : participant_(participant), params_(params) {}

  // The gradients of parameter `first` and every later one of `step` are final.
  void gradients_final(std::uint32_t step, std::uint32_t first);
  // The run stops: a run() waiting for gradients throws; nothing streams after.
  void cancel();

  // Calls update(i) for i = params - 1 down to 0, each once parameter i of `step` is final.
  // Returns when the time the update added after the backward began (from the step's last
  // part on, or from `started` when that came first), for wall_clock_breakdown.
  std::chrono::steady_clock::time_point run(std::uint32_t step, std::chrono::steady_clock::time_point started,
                                            const std::function<void(std::size_t)>& update);

  // Whether step `step` was streamed; forgets it (update() of that step asks once).
  bool take(std::uint32_t step);

  // "stage S: ..." for the end-of-run line; empty when nothing streamed.
  std::string report() const;

private:
  std::uint32_t participant_;
  std::size_t params_;
  gradient_frontier frontier_; // in parameters
  mutable std::mutex mu_;      // what follows
  bool streamed_step_valid_ = false;
  std::uint32_t streamed_step_ = 0;
  std::int64_t streamed_ = 0, updates_ = 0, early_updates_ = 0;
  std::chrono::steady_clock::duration waited_{};
};

} // namespace dsa::train
