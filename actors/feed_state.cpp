// The feeder's state; see feed_state.hpp.
#include "actors/feed_state.hpp"

#include <algorithm>

namespace dsa::actors {

// A micro-batch holds its feed slot from its fill until the last stage's forward.
// With S slots the feed edges never bind, whatever the compute costs: the first
// stage's forward of k needs its backward of k - S done (1F1B stash quota S),
// which waits for the last stage's backward of k - S, after its forward of k - S
// gave that micro-batch's slot back. Under GPipe with balanced stages the first
// stage's forward k starts as the last stage's forward k - S ends. The extra slot takes that
// release message and the next fill off the path to the first stage: micro-batch
// k is filled once k - S - 1's slot is back. (At unit costs about S/2 + 1 slots
// happen to give the ideal makespan; a slower last stage, as BERT's MLM head, needs
// more.) With 2 slots an 8-stage, 32-micro-batch schedule took 1.8 times the ideal.
// A slot holds one micro-batch's token ids or labels: B * T * 4 bytes, small
// beside an activation (B * T * C * 4).
std::uint32_t feed_slots_for(std::uint32_t stages) {
  return stages + 1;
}

feed_state::feed_state(std::uint32_t slots, std::uint32_t micro_batches, std::uint32_t steps,
                       std::uint32_t first_step)
    : slots_(slots), micro_batches_(micro_batches), first_step_(first_step),
      total_(steps * micro_batches), input_out_(slots, false), labels_out_(slots, false) {
  DSA_CHECK(slots > 0 && micro_batches > 0, "a feeder needs slots and micro-batches (got {}, {})",
            slots, micro_batches);
  for (std::uint32_t i = slots; i > 0; --i)
    free_.push_back(i - 1);
}

std::optional<feed_fill> feed_state::start_fill() {
  if (filling_ || free_.empty() || next_ >= total_)
    return std::nullopt;
  feed_fill fill{first_step_ + next_ / micro_batches_, next_ % micro_batches_, free_.back()};
  free_.pop_back();
  filling_ = fill;
  return fill;
}

feed_fill feed_state::on_filled() {
  DSA_CHECK(filling_.has_value(), "feeder: a fill ended that was not started");
  const feed_fill fill = *filling_;
  filling_.reset();
  ++next_;
  input_out_[fill.slot] = true;
  labels_out_[fill.slot] = true;
  return fill;
}

status feed_state::on_released(feed_edge edge, std::uint32_t slot) {
  const char* name = edge == feed_edge::input ? "input" : "labels";
  if (slot >= slots_)
    return make_error(errc::protocol, "feeder: {} slot {} released, but the edge has {} slots", name,
                      slot, slots_);
  auto& out = edge == feed_edge::input ? input_out_ : labels_out_;
  if (!out[slot])
    return make_error(errc::protocol, "feeder: {} slot {} released but not out", name, slot);
  out[slot] = false;
  if (input_out_[slot] || labels_out_[slot])
    return {};
  free_.push_back(slot);
  std::sort(free_.begin(), free_.end(), std::greater<std::uint32_t>());
  return {};
}

} // namespace dsa::actors
