// A dedicated thread that runs one actor's compute jobs in order, so that long
// or blocking work never holds a CAF scheduler thread. A job reports back by
// message (the actor's own mailbox); the destructor finishes the running job,
// drops queued ones and joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace dsa::actors {

class compute_worker {
public:
  compute_worker();
  ~compute_worker();
  compute_worker(const compute_worker&) = delete;
  compute_worker& operator=(const compute_worker&) = delete;

  void post(std::function<void()> job);

private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

} // namespace dsa::actors
