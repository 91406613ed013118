// The compute worker thread; see compute_worker.hpp.
#include "actors/compute_worker.hpp"

namespace dsa::actors {

compute_worker::compute_worker() : thread_([this] { loop(); }) {}

compute_worker::~compute_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    jobs_.clear();
  }
  wake_.notify_one();
  thread_.join();
}

void compute_worker::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
}

void compute_worker::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job(); // jobs catch their own exceptions and report them by message
  }
}

} // namespace dsa::actors
