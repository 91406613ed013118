// A whole shard's streamed update's bookkeeping; see host_stream.hpp.
#include "actors/train/shard/host_stream.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

void host_stream::gradients_final(std::uint32_t step, std::uint32_t first) {
  frontier_.advance(step, first, static_cast<std::int64_t>(params_), first == 0);
}

void host_stream::cancel() { frontier_.cancel(); }

std::chrono::steady_clock::time_point host_stream::run(std::uint32_t step,
                                                       std::chrono::steady_clock::time_point started,
                                                       const std::function<void(std::size_t)>& update) {
  std::chrono::steady_clock::duration waited{};
  std::int64_t updates = 0, early = 0;
  for (std::size_t i = params_; i-- > 0;) {
    const gradient_frontier::seen s = frontier_.wait_final(step, static_cast<std::int64_t>(i), waited);
    if (s.cancelled)
      throw std::runtime_error(fmt::format("optimizer shard {}: the run stopped during the streamed update of step {}",
                                           participant_, step));
    update(i);
    ++updates;
    if (s.early) ++early;
  }
  std::lock_guard<std::mutex> lock(mu_);
  waited_ += waited;
  updates_ += updates;
  early_updates_ += early;
  streamed_step_valid_ = true;
  streamed_step_ = step;
  ++streamed_;
  return frontier_.after_backward(started);
}

bool host_stream::take(std::uint32_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!streamed_step_valid_) return false;
  if (streamed_step_ != step)
    throw std::logic_error(fmt::format("optimizer shard {}: update of step {} after streaming step {}", participant_,
                                       step, streamed_step_));
  streamed_step_valid_ = false;
  return true;
}

std::string host_stream::report() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (streamed_ == 0) return {};
  return fmt::format("stage {} optimizer in host memory: {} updates streamed over the backward, {} of their {} "
                     "parameter updates began before the step's last gradients were in, {:.3f} s waited for "
                     "gradients",
                     participant_, streamed_, early_updates_, updates_,
                     std::chrono::duration<double>(waited_).count());
}

} // namespace dsa::train
