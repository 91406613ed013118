// Swap transfers as trace spans; see swap_tracer.hpp.
#include "actors/train/shard/swap_tracer.hpp"

#include <algorithm>
#include <limits>

namespace dsa::train {

void swap_tracer::observe(const aio::swap_transfer& t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_)
    queued_.push_back(t);
}

void swap_tracer::attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = false;
  trace_ = trace;
  actor_ = actor;
  stage_ = stage;
}

void swap_tracer::update_begins(std::uint32_t step, std::uint64_t first_sweep) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_.emplace_back(first_sweep, step);
  }
  record(take_through(first_sweep - 1));
}

void swap_tracer::update_ends(std::uint64_t last_sweep) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_swept_ = last_sweep;
    if (!updates_.empty()) update_sweeps_.emplace_back(updates_.back().first, last_sweep);
  }
  record(take_through(last_sweep));
}

void swap_tracer::detach() {
  record(take_through(std::numeric_limits<std::uint64_t>::max()));
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  queued_.clear();
  trace_ = nullptr;
}

std::uint32_t swap_tracer::step_of(std::uint64_t sweep) const {
  if (updates_.empty())
    return 0;
  // Before the first update (the initial write, a resume's): that update's step.
  auto after =
      std::upper_bound(updates_.begin(), updates_.end(), sweep,
                       [](std::uint64_t s, const std::pair<std::uint64_t, std::uint32_t>& u) {
                         return s < u.first;
                       });
  if (after == updates_.begin())
    return updates_.front().second;
  return std::prev(after)->second;
}

std::vector<std::pair<aio::swap_transfer, std::uint32_t>>
swap_tracer::take_through(std::uint64_t sweep) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<aio::swap_transfer, std::uint32_t>> done;
  std::vector<aio::swap_transfer> later;
  const auto in_update = [&](std::uint64_t s) { // the ranges ascend and do not overlap
    auto after = std::upper_bound(update_sweeps_.begin(), update_sweeps_.end(), s,
                                  [](std::uint64_t x, const std::pair<std::uint64_t, std::uint64_t>& u) {
                                    return x < u.first;
                                  });
    return after != update_sweeps_.begin() && s <= std::prev(after)->second;
  };
  for (const auto& t : queued_) {
    if (t.sweep > sweep)
      later.push_back(t);
    else if (t.compute && !in_update(t.sweep))
      continue; // not an update's
    // Past the last update's sweeps (detach only): a prefetch for an update that never began.
    else if (t.sweep > last_swept_ && t.prefetch && !updates_.empty())
      done.emplace_back(t, updates_.back().second + 1);
    else
      done.emplace_back(t, step_of(t.sweep));
  }
  queued_ = std::move(later);
  if (!trace_)
    done.clear();
  return done;
}

void swap_tracer::record(
    const std::vector<std::pair<aio::swap_transfer, std::uint32_t>>& done) const {
  actors::trace_recorder* trace;
  std::uint32_t actor;
  std::int32_t stage;
  {
    std::lock_guard<std::mutex> lock(mu_);
    trace = trace_;
    actor = actor_;
    stage = stage_;
  }
  if (!trace)
    return;
  for (const auto& [t, step] : done) {
    if (!t.ok)
      continue; // a failed transfer fails the update: the run reports it
    actors::trace_record r;
    r.kind = static_cast<std::uint8_t>(actors::trace_kind::span);
    r.name = static_cast<std::uint16_t>(t.compute                  ? actors::trace_name::swap_update
                                        : t.op == aio::aio_op::read ? actors::trace_name::swap_read
                                                                    : actors::trace_name::swap_write);
    r.actor = actor;
    r.stage = stage;
    r.step = step;
    r.micro_batch = static_cast<std::uint32_t>(t.chunk);
    r.bytes = t.compute ? 0 : t.bytes;
    r.t0_ns = trace->since_origin_ns(t.t0_ns);
    r.t1_ns = trace->since_origin_ns(t.t1_ns);
    trace->record(r);
  }
}

} // namespace dsa::train
