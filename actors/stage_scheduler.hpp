// The plain (CAF-free) scheduling state of one pipeline stage: what has
// arrived, which slots are free, which parameter version is held, and the local
// pick rule. The stage actor feeds it events and runs what pick() returns.
//
// Forward (k, mb) is runnable when its input (and, on the last stage, its
// labels) arrived, a stash slot and a downstream output slot are free and
// parameter version k is held. Backward (k, mb) is runnable when its gradient
// arrived (last stage: its forward is done), an upstream gradient slot is free
// and the reducer gave back the gradients of the previous step. Forwards and
// backwards each run in (step, micro-batch) order. Not thread-safe: owned by
// one actor.
//
// Events come from other actors (later, other processes): an arrival out of
// sequence, a version that is not the next, a credit returned twice is a
// protocol error returned to the caller, never an abort.
#pragma once

#include "actors/schedule_policy.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace dsa::actors {

// backward: the whole backward, or with a split-backward policy (zero-bubble) its B part, the
// input gradient; weight: the split policy's W part, the weight gradients.
enum class work_kind : std::uint32_t { forward = 0, backward = 1, load = 2, weight = 3 };
const char* work_kind_name(work_kind kind);

struct stage_position {
  std::uint32_t index = 0;
  std::uint32_t stages = 1;
  std::uint32_t micro_batches = 1;
  std::uint32_t steps = 1;      // steps of the run
  std::uint32_t first_step = 0; // absolute number of the run's first step (its parameter version is held at start)
  bool first() const { return index == 0; }
  bool last() const { return index + 1 == stages; }
  std::uint32_t end_step() const { return first_step + steps; }
};

// Slot counts of the edges the stage writes into.
struct stage_credits {
  std::uint32_t out_slots = 2;      // activation edge to the next stage
  std::uint32_t grad_out_slots = 2; // gradient edge to the previous stage
  std::uint32_t grads_slots = 1;    // gradient buckets to the reducer (one slot each)
};

// One unit of work chosen by pick(). Slot fields not used by the kind are `none`.
struct stage_work {
  static constexpr std::uint32_t none = ~0u;
  work_kind kind = work_kind::forward;
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
  std::uint32_t in_slot = none;     // forward: input slot; backward: gradient-in slot; load: params slot
  std::uint32_t labels_slot = none; // forward on the last stage
  std::uint32_t out_slot = none;    // forward: activation-out slot; backward: gradient-out slot
  std::uint32_t stash_slot = none;
  bool last_of_step = false; // the step's last micro-batch's backward (split: its W), which publishes
};

class stage_scheduler {
public:
  stage_scheduler(stage_position pos, schedule_policy policy, stage_credits credits);

  // Arrivals, each the next of its edge in (step, micro_batch) order.
  status on_input(std::uint32_t step, std::uint32_t micro_batch, std::uint32_t slot);
  status on_labels(std::uint32_t step, std::uint32_t micro_batch, std::uint32_t slot);
  // A gradient can only follow the forward that produced its activation.
  status on_grad(std::uint32_t step, std::uint32_t micro_batch, std::uint32_t slot);
  // Parameters for forward of `step` arrived in `slot`; they load before anything else runs.
  status on_version(std::uint32_t step, std::uint32_t slot);
  // Credits back.
  status on_out_released(std::uint32_t slot);
  status on_grad_out_released(std::uint32_t slot);
  // The reducer is done reading one bucket of the gradients the step's last
  // backward publishes (one slot per bucket; buckets may be published and
  // released while that backward still runs). Until every bucket is back no
  // backward (which accumulates into them) and no load (which zeroes them) runs.
  status on_grads_released();

  // The next work to run, or nothing. Takes the inputs and slots it needs and marks the stage busy.
  std::optional<stage_work> pick();
  void on_done(const stage_work& work);

  bool busy() const { return busy_; }
  bool gradients_published() const { return grads_outstanding_ > 0; }
  bool finished() const { return next_backward_step_ >= pos_.end_step(); }
  std::uint32_t held_version() const { return held_version_; }
  std::uint32_t in_flight() const { return static_cast<std::uint32_t>(in_flight_.size()); }
  std::uint32_t deferred() const { return static_cast<std::uint32_t>(deferred_.size()); }
  const stage_position& position() const { return pos_; }
  // One line of state for watchdog dumps.
  std::string describe() const;

private:
  struct arrival {
    std::uint32_t step, micro_batch, slot;
  };
  struct stashed {
    std::uint32_t step, micro_batch, stash_slot;
  };

  std::optional<stage_work> pick_forward();
  std::optional<stage_work> pick_backward();
  // Checks that (step, micro_batch) is arrival number `count` of an edge and counts it.
  status check_next(std::uint32_t& count, std::uint32_t step, std::uint32_t micro_batch, const char* edge) const;

  stage_position pos_;
  schedule_policy policy_;
  stage_credits credits_;
  std::deque<arrival> inputs_, labels_, grads_;
  std::optional<stage_work> pick_weight();
  std::deque<stashed> in_flight_; // forward done, backward not yet: in micro-batch order
  std::deque<stashed> deferred_;  // split backward: B done, W not yet, in micro-batch order
  std::vector<std::uint32_t> free_stash_, free_out_, free_grad_out_;
  std::optional<arrival> pending_version_;
  std::uint32_t held_version_;
  std::uint32_t next_forward_step_, next_forward_mb_ = 0;
  std::uint32_t next_backward_step_;
  std::uint32_t inputs_seen_ = 0, labels_seen_ = 0, grads_seen_ = 0; // arrivals so far per edge
  std::uint32_t forwards_done_ = 0;
  bool busy_ = false;
  // Buckets of the step's gradients not yet released by the reducer: set when the
  // step's last backward is picked (its buckets may go out while it runs).
  std::uint32_t grads_outstanding_ = 0;
};

} // namespace dsa::actors
