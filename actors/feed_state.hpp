// The feeder's plain (CAF-free) state: which micro-batch it fills next and which
// feed slots are free. The feeder actor and the pipeline simulation both run it.
//
// Micro-batch k is filled into one slot index of both feed edges: its input goes
// to the first stage and its labels to the last. The first stage gives the input
// slot back after its forward, the last stage the labels slot after its forward;
// the slot index is free again once both came back. So a micro-batch holds its
// slot from its fill until the last stage ran its forward. Fills run one at a
// time, in (step, micro-batch) order. Not thread-safe: owned by one actor.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace dsa::actors {

enum class feed_edge : std::uint8_t { input, labels };

// The slot count of each feed edge for S stages: S + 1 (see the definition).
std::uint32_t feed_slots_for(std::uint32_t stages);

struct feed_fill {
  std::uint32_t step = 0; // absolute step number
  std::uint32_t micro_batch = 0;
  std::uint32_t slot = 0; // the slot index on both feed edges
};

class feed_state {
public:
  // Fills micro-batches 0 .. M - 1 of steps first_step .. first_step + steps - 1.
  feed_state(std::uint32_t slots, std::uint32_t micro_batches, std::uint32_t steps,
             std::uint32_t first_step);

  // The next fill, taking the lowest free slot; nothing while a fill runs, no slot
  // is free or every micro-batch was filled.
  std::optional<feed_fill> start_fill();
  // The running fill ended: its micro-batch is sent on both edges. Returns it.
  feed_fill on_filled();
  // A stage gave a slot of `edge` back. A slot that was not out on that edge
  // breaks the protocol (errc::protocol).
  status on_released(feed_edge edge, std::uint32_t slot);

  bool filling() const { return filling_.has_value(); }
  // The step of the next micro-batch to fill (for error messages).
  std::uint32_t next_step() const { return first_step_ + next_ / micro_batches_; }
  bool done() const { return next_ >= total_ && !filling_; }
  std::uint32_t free_slots() const { return static_cast<std::uint32_t>(free_.size()); }

private:
  std::uint32_t slots_, micro_batches_, first_step_;
  std::uint32_t total_,
      next_ = 0; // micro-batches of the run, and the next to fill (counted from first_step)
  std::optional<feed_fill> filling_;
  std::vector<std::uint32_t> free_; // lowest at the back
  // Per slot index: whether its input / labels slot is out at a stage.
  std::vector<bool> input_out_, labels_out_;
};

} // namespace dsa::actors
