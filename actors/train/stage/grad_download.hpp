// A device stage's gradients reaching the host bucket by bucket during the step's last
// backward (overlap_comm), instead of all at once when the reducer first asks: the
// bookkeeping, apart from the device so it runs on every machine against a fake one.
//
// While the last backward is enqueued the stage's worker says, part by part, which
// parameters' gradients are final on the device (final_on_device); each such group becomes
// one ticket of the copier: copies to the host enqueued behind the compute enqueued so far,
// on a copy stream, so nothing waits. With the whole backward queued, the worker asks for
// each part's first gradient in order (ready): the first ask of a group waits for its
// ticket (once) and finishes every parameter of the group (the stage's `finish`: rounding,
// test faults), later asks (the runtime publishing the buckets) find it done. Asks may come
// from any thread; one waiting for a ticket never blocks another's final_on_device. A
// gradient no group holds (a backward without the listener) is not ready: the caller
// downloads the whole set as before.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

namespace dsa::train {

// The device side: copies of parameters' gradients to the host behind the compute
// enqueued so far, as one ticket; a wait for a ticket's copies.
class grad_copier {
public:
  virtual ~grad_copier() = default;
  // Tickets count from 0 in each step (begin_step of the download).
  virtual void enqueue(std::size_t ticket, const std::vector<std::size_t>& indices) = 0;
  virtual void wait(std::size_t ticket) = 0;
};

class grad_download {
public:
  // finish(i): parameter i's copy is on the host; make it the gradient the reducer reads.
  grad_download(std::size_t parameters, std::function<void(std::size_t)> finish);

  // A new last backward: nothing enqueued (call with no ready() running).
  void begin_step();
  // These parameters' gradients are final on the device: one ticket of copies.
  void final_on_device(const std::vector<std::size_t>& indices, grad_copier& copier);
  // Parameter i's host gradient: true once finished (waiting for its ticket when it is the
  // first to ask); false when no ticket holds it this step. Throws what the wait or the
  // finish threw (again for each later ask of the same ticket).
  bool ready(std::size_t i, grad_copier& copier);
  // Every parameter has a ticket this step.
  bool all_enqueued() const;
  // Tickets enqueued this step, and the copier's waits (tests).
  std::size_t tickets() const;
  std::size_t waits() const;

private:
  enum class state { copying, waiting, done, failed };
  struct ticket {
    std::vector<std::size_t> indices;
    state now = state::copying;
    std::exception_ptr error; // state failed: what the wait or a finish threw
  };
  std::function<void(std::size_t)> finish_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<long> ticket_of_;  // per parameter: its ticket this step, or -1
  std::vector<ticket> tickets_;
  std::size_t enqueued_ = 0, waits_ = 0;
};

} // namespace dsa::train
