// Rendezvous rounds keyed by (step, phase), with a bounded wait.
#include "actors/train/step_sync.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

step_sync::step_sync(std::uint32_t participants, std::uint32_t tied_holders, std::chrono::milliseconds deadline)
    : n_(participants), tied_holders_(tied_holders), deadline_(deadline) {}

step_sync::round& step_sync::round_for(std::uint32_t step, int phase) {
  round& r = rounds_[{step, phase}];
  if (r.tensors.empty()) {
    r.tensors.resize(n_);
    r.contributions.resize(n_);
    r.payloads.resize(n_);
  }
  return r;
}

void step_sync::wait_done(std::unique_lock<std::mutex>& lock, round& r, std::uint32_t step, int phase) {
  auto until = std::chrono::steady_clock::now() + deadline_;
  while (!r.done) {
    if (!aborted_.empty()) throw std::runtime_error("step rendezvous aborted: " + aborted_);
    if (cv_.wait_until(lock, until) == std::cv_status::timeout && !r.done)
      throw std::runtime_error(fmt::format("step {} rendezvous (phase {}): only {} of {} optimizer shards arrived "
                                           "within {} ms",
                                           step, phase, r.arrived, n_, deadline_.count()));
  }
}

void step_sync::leave(std::uint32_t step, int phase, round& r, std::uint32_t count) {
  if (++r.left == count) rounds_.erase({step, phase});
}

std::vector<tensor> step_sync::exchange_tied(std::uint32_t step, std::uint32_t participant, const tensor& tied_grad) {
  std::unique_lock<std::mutex> lock(mutex_);
  round& r = round_for(step, 1);
  r.tensors[participant] = tied_grad;
  if (++r.arrived == tied_holders_) {
    r.done = true;
    cv_.notify_all();
  }
  wait_done(lock, r, step, 1);
  std::vector<tensor> out;
  for (const auto& t : r.tensors)
    if (t.defined()) out.push_back(t);
  leave(step, 1, r, tied_holders_);
  return out;
}

step_decision step_sync::decide(std::uint32_t step, std::uint32_t participant, const step_contribution& c,
                                const std::function<step_decision(const std::vector<step_contribution>&)>& decide) {
  std::unique_lock<std::mutex> lock(mutex_);
  round& r = round_for(step, 2);
  r.contributions[participant] = c;
  if (++r.arrived == n_) {
    r.decision = decide(r.contributions);
    r.done = true;
    cv_.notify_all();
  }
  wait_done(lock, r, step, 2);
  step_decision d = r.decision;
  leave(step, 2, r, n_);
  return d;
}

void step_sync::after_update(std::uint32_t step, std::uint32_t participant, payload p, double sum_of_squares,
                             const std::function<void(std::vector<payload>&, double)>& last) {
  std::unique_lock<std::mutex> lock(mutex_);
  round& r = round_for(step, 3);
  r.payloads[participant] = std::move(p);
  r.sum_of_squares += sum_of_squares;
  if (++r.arrived < n_) {
    // Nobody waits for phase 3: a shard deposits and returns; the last one runs `last`.
    ++r.left;
    return;
  }
  std::vector<payload> all = std::move(r.payloads);
  double total = r.sum_of_squares;
  rounds_.erase({step, 3});
  lock.unlock();
  last(all, total);
}

void step_sync::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = why;
  cv_.notify_all();
}

} // namespace dsa::train
