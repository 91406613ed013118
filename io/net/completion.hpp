// A one-shot completion with an outcome: one thread finishes it (a transport's progress
// thread), any number wait for it. Behind send_ticket and the UCX transport's receives.
#pragma once

#include "core/error.hpp"

#include <condition_variable>
#include <mutex>
#include <optional>

namespace dsa::net {

class completion {
public:
  // Records the outcome and wakes every waiter; later calls are ignored (the first
  // outcome stands).
  void finish(status outcome) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_)
        return;
      done_ = true;
      outcome_ = std::move(outcome);
    }
    cv_.notify_all();
  }
  // Blocks until finish(); returns its outcome.
  status wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    return *outcome_;
  }
  bool done() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::optional<status> outcome_;
};

} // namespace dsa::net
