// A whole shard's streamed update's bookkeeping; see host_stream.hpp.
#include "actors/train/shard/host_stream.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::train {

void host_stream::gradients_final(std::uint32_t step, std::uint32_t first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_ || step_open_ != step) {
      open_ = true;
      step_open_ = step;
      final_from_ = params_;
      all_final_ = false;
    }
    final_from_ = std::min<std::size_t>(final_from_, first);
    if (first == 0) {
      all_final_ = true;
      all_final_at_ = std::chrono::steady_clock::now();
    }
  }
  cv_.notify_all();
}

void host_stream::cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

std::chrono::steady_clock::time_point host_stream::run(std::uint32_t step,
                                                       std::chrono::steady_clock::time_point started,
                                                       const std::function<void(std::size_t)>& update) {
  for (std::size_t i = params_; i-- > 0;) {
    bool early = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto since = std::chrono::steady_clock::now();
      cv_.wait(lock, [&] { return cancelled_ || (open_ && step_open_ == step && final_from_ <= i); });
      waited_ += std::chrono::steady_clock::now() - since;
      if (cancelled_)
        throw std::runtime_error(fmt::format("optimizer shard {}: the run stopped during the streamed update of step {}",
                                             participant_, step));
      early = !all_final_;
    }
    update(i);
    ++updates_;
    if (early) ++early_updates_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  streamed_step_valid_ = true;
  streamed_step_ = step;
  ++streamed_;
  return all_final_ ? std::max(started, all_final_at_) : started;
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
