// A dedicated thread that runs one actor's compute jobs in order, so that long
// or blocking work never holds a CAF scheduler thread. A job reports back by
// message (the actor's own mailbox); the destructor finishes the running job,
// drops queued ones and joins.
//
// OpenMP: a job's parallel regions give the worker thread its own pool of OpenMP
// threads. Workers whose jobs come now and then (optimizer, reducer, feeder, step
// hooks) end that pool when they have had no job for release_grace
// (openmp_threads::release_when_idle; jobs that follow each other within it keep the pool,
// and meanwhile libgomp throttles the stage's idle threads as it did before),
// so that while a stage computes its pool is the only one and libgomp lets its idle
// threads spin briefly between regions instead of sleeping (kernels/cpu/openmp_threads.hpp).
// A stage's worker keeps its pool (openmp_threads::keep): its regions follow each other.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace dsa::actors {

enum class openmp_threads { release_when_idle, keep };
inline constexpr std::chrono::milliseconds release_grace{2};

class compute_worker {
public:
  // grace: how long a release_when_idle worker waits for another job before it ends its pool.
  explicit compute_worker(openmp_threads threads = openmp_threads::release_when_idle,
                          std::chrono::milliseconds grace = release_grace);
  ~compute_worker();
  compute_worker(const compute_worker&) = delete;
  compute_worker& operator=(const compute_worker&) = delete;

  void post(std::function<void()> job);
  // Blocks until no job is queued or running, and a pool to be released is gone. Not from a
  // job of this worker (it would wait for itself), nor on a CAF scheduler thread, nor while
  // the worker is being destroyed: for tests.
  void wait_until_idle();

private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  bool running_ = false; // a job taken from jobs_ and not yet finished
  openmp_threads threads_;
  std::chrono::milliseconds grace_;
  std::thread thread_; // last: started once the members above are set
};

} // namespace dsa::actors
