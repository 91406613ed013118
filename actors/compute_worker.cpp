// The compute worker thread; see compute_worker.hpp.
#include "actors/compute_worker.hpp"

#include "kernels/cpu/openmp_threads.hpp"

namespace dsa::actors {

compute_worker::compute_worker(openmp_threads threads, std::chrono::milliseconds grace)
    : threads_(threads), grace_(grace), thread_([this] { loop(); }) {}

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

void compute_worker::wait_until_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return jobs_.empty() && !running_; });
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
      running_ = true;
    }
    job(); // jobs catch their own exceptions and report them by message
    job = nullptr; // what it holds is freed now, not after the grace below
    if (threads_ == openmp_threads::release_when_idle) {
      // A pool is ended only after grace_ without a job: a reducer's buckets or an
      // optimizer's streamed parts that follow each other within it do not pay a team's
      // thread starts each.
      bool more = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        more = wake_.wait_for(lock, grace_, [this] { return stopping_ || !jobs_.empty(); });
      }
      if (!more) cpu::release_openmp_threads(); // a job posted meanwhile waits: wake_'s predicate
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    idle_.notify_all();
  }
}

} // namespace dsa::actors
