// Gradients to the host bucket by bucket during the last backward; see grad_download.hpp.
#include "actors/train/stage/grad_download.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

grad_download::grad_download(std::size_t parameters, std::function<void(std::size_t)> finish)
    : finish_(std::move(finish)), ticket_of_(parameters, -1) {}

void grad_download::begin_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(ticket_of_.begin(), ticket_of_.end(), -1);
  tickets_.clear();
  enqueued_ = 0;
}

void grad_download::final_on_device(const std::vector<std::size_t>& indices, grad_copier& copier) {
  std::size_t number = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i : indices) {
      if (i >= ticket_of_.size())
        throw std::logic_error(fmt::format("gradient download: parameter {} of {}", i, ticket_of_.size()));
      if (ticket_of_[i] >= 0)
        throw std::logic_error(fmt::format("gradient download: parameter {} final twice in one step", i));
    }
    number = tickets_.size();
  }
  // Enqueued before the ticket is visible: a reader never waits for copies not yet issued.
  // Only the worker calls this, so the number cannot be taken meanwhile.
  copier.enqueue(number, indices);
  std::lock_guard<std::mutex> lock(mutex_);
  tickets_.push_back(ticket{indices, state::copying, nullptr});
  for (std::size_t i : indices) ticket_of_[i] = static_cast<long>(number);
  enqueued_ += indices.size();
}

bool grad_download::ready(std::size_t i, grad_copier& copier) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (i >= ticket_of_.size() || ticket_of_[i] < 0) return false;
  const auto number = static_cast<std::size_t>(ticket_of_[i]);
  changed_.wait(lock, [&] { return tickets_[number].now != state::waiting; });
  ticket& t = tickets_[number];
  if (t.now == state::done) return true;
  if (t.now == state::failed) std::rethrow_exception(t.error);
  t.now = state::waiting;
  const std::vector<std::size_t> indices = t.indices;
  ++waits_;
  lock.unlock();
  std::exception_ptr error;
  try {
    copier.wait(number);
    for (std::size_t k : indices) finish_(k);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  tickets_[number].now = error ? state::failed : state::done;
  tickets_[number].error = error;
  changed_.notify_all();
  if (error) std::rethrow_exception(error);
  return true;
}

bool grad_download::all_enqueued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return enqueued_ == ticket_of_.size();
}

std::size_t grad_download::tickets() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tickets_.size();
}

std::size_t grad_download::waits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waits_;
}

} // namespace dsa::train
