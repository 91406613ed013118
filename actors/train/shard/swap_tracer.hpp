// An optimizer shard's NVMe swap transfers (io/aio/swap_store.hpp) as trace spans:
// swap_read and swap_write, one per chunk and transfer, with the chunk in micro_batch
// and the bytes moved; and swap_update, the update of each chunk by an update's sweeps. The store reports a transfer where its completion runs (the
// rank's NVMe engine actor) when it ends; the tracer only queues it there and records it on the shard's worker (as an
// update begins and ends) or after the run, once the step it belongs to is known: the
// reads a prefetch starts after update s belong to update s + 1, whose step is known
// only when that update begins.
#pragma once

#include "actors/trace/trace_recorder.hpp"
#include "io/aio/swap_store.hpp"

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace dsa::train {

class swap_tracer {
public:
  // The store's observer: queues `t` (any thread; short, as the store requires).
  void observe(const aio::swap_transfer& t);
  // Where the spans go; null: nowhere (the queue is still emptied).
  void attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage);
  // Update `step` begins; its sweeps are the store's from number `first_sweep` on. Records
  // the transfers of earlier sweeps (a checkpoint's read-back counts with the update before it).
  void update_begins(std::uint32_t step, std::uint64_t first_sweep);
  // The update's last sweep was number `last_sweep`: records its transfers (the reads a
  // prefetch started for the next update wait for it).
  void update_ends(std::uint64_t last_sweep);
  // After the run, with no transfer in flight: records the rest (a prefetch for an update
  // that never came counts with the step after the last) and stops queueing.
  void detach();

private:
  // Moves out the queued transfers of sweeps up to `sweep` (under mu_), with their steps.
  std::vector<std::pair<aio::swap_transfer, std::uint32_t>> take_through(std::uint64_t sweep);
  std::uint32_t step_of(std::uint64_t sweep) const;
  void record(const std::vector<std::pair<aio::swap_transfer, std::uint32_t>>& done) const;

  mutable std::mutex mu_;
  std::vector<aio::swap_transfer> queued_;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> updates_; // (first sweep, step), in order
  std::uint64_t last_swept_ = 0; // the last sweep of the last update that ended
  // (first, last) sweep of each update that ended: the chunk work of other sweeps (the
  // initial write, a checkpoint's read-back) is not an update and is not recorded.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> update_sweeps_;
  bool closed_ = false;
  actors::trace_recorder* trace_ = nullptr;
  std::uint32_t actor_ = 0;
  std::int32_t stage_ = -1;
};

} // namespace dsa::train
