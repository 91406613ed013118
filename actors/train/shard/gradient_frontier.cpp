// A streamed update's view of the backward; see gradient_frontier.hpp.
#include "actors/train/shard/gradient_frontier.hpp"

#include <algorithm>

namespace dsa::train {

void gradient_frontier::advance(std::uint32_t step, std::int64_t from, std::int64_t size, bool last) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_ || step_ != step) {
      open_ = true;
      step_ = step;
      from_ = size;
      all_final_ = false;
    }
    from_ = std::min(from_, from);
    if (last) {
      all_final_ = true;
      all_final_at_ = std::chrono::steady_clock::now();
    }
  }
  cv_.notify_all();
}

void gradient_frontier::cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

gradient_frontier::seen gradient_frontier::look(std::uint32_t step, std::int64_t at) const {
  seen s;
  s.cancelled = cancelled_;
  s.final = open_ && step_ == step && from_ <= at;
  s.early = s.final && !all_final_;
  return s;
}

gradient_frontier::seen gradient_frontier::check(std::uint32_t step, std::int64_t at) {
  std::lock_guard<std::mutex> lock(mu_);
  return look(step, at);
}

gradient_frontier::seen gradient_frontier::wait_final(std::uint32_t step, std::int64_t at,
                                                      std::chrono::steady_clock::duration& waited) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto since = std::chrono::steady_clock::now();
  cv_.wait(lock, [&] {
    const seen s = look(step, at);
    return s.cancelled || s.final;
  });
  waited += std::chrono::steady_clock::now() - since;
  return look(step, at);
}

std::chrono::steady_clock::time_point gradient_frontier::after_backward(std::chrono::steady_clock::time_point started) {
  std::lock_guard<std::mutex> lock(mu_);
  return all_final_ ? std::max(started, all_final_at_) : started;
}

} // namespace dsa::train
