// A shard's update streamed over the backward; see bert_optimizer.hpp (stream_elements).
#include "actors/train/bert_optimizer.hpp"

#include "io/aio/swap_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::train {

std::int64_t bert_optimizer::stream_elements() const {
  const auto type = options_.optimizer.type;
  const bool adam = type == optim::optimizer_type::adam || type == optim::optimizer_type::adamw;
  if (!options_.offload || !adam || options_.decider->needs_totals() || options_.fetcher ||
      options_.partition_parameters || options_.whole_gradient >= 0)
    return 0;
  return std::max<std::int64_t>(options_.offload->sub_group, 1);
}

void bert_optimizer::gradients_final(std::uint32_t step, std::uint32_t first) {
  DSA_CHECK(part_.has_value(), "optimizer shard {}: gradients of step {} before init", options_.participant, step);
  const auto& tensors = part_->layout().tensors();
  const optim::flat_range mine = part_->partition();
  // Parameter `first` and every later one are final: in this partition, the elements from
  // that parameter's first on (the layout keeps the parameters in their order).
  const std::int64_t flat = first < tensors.size() ? tensors[first].offset : part_->layout().padded_numel();
  const std::int64_t from = std::clamp<std::int64_t>(flat - mine.lo, 0, mine.size());
  stream_gate& g = *gate_;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (!g.open || g.step != step) {
      g.open = true;
      g.step = step;
      g.ready_from = mine.size();
      g.all_final = false;
    }
    g.ready_from = std::min(g.ready_from, from);
    if (first == 0) {
      g.all_final = true;
      g.all_final_at = std::chrono::steady_clock::now();
    }
  }
  g.cv.notify_all();
}

void bert_optimizer::cancel() {
  {
    std::lock_guard<std::mutex> lock(gate_->mu);
    gate_->cancelled = true;
  }
  gate_->cv.notify_all();
}

status bert_optimizer::wait_final(std::uint32_t step, std::int64_t lo) {
  stream_gate& g = *gate_;
  const auto started = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(g.mu);
  g.cv.wait(lock, [&] { return g.cancelled || (g.open && g.step == step && g.ready_from <= lo); });
  if (g.cancelled)
    return make_error(errc::runtime, "optimizer shard {}: the run stopped during the streamed update of step {}",
                      options_.participant, step);
  ++streamed_chunks_;
  if (!g.all_final) ++early_chunks_;
  gradient_wait_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  return {};
}

void bert_optimizer::stream_update(std::uint32_t step) {
  DSA_CHECK(stream_elements() > 0 && part_ && !streamed_step_ && !speculated_step_,
            "optimizer shard {}: a streamed update of step {} it cannot stream", options_.participant, step);
  const auto started = std::chrono::steady_clock::now();
  assumed_ = options_.decider->assume();
  stream_ready_ = [this, step](std::int64_t lo, std::int64_t) { return wait_final(step, lo); };
  struct clear_hook {
    std::function<status(std::int64_t, std::int64_t)>& hook;
    ~clear_hook() { hook = nullptr; }
  } clear{stream_ready_};
  advance(step, assumed_); // the sweep waits in stream_ready_ for each chunk's gradients
  streamed_step_ = step;
  ++streamed_;
  if (options_.update_ns) {
    // wall_clock_breakdown's optimizer time: what the update added after the backward,
    // from the step's last part on.
    std::lock_guard<std::mutex> lock(gate_->mu);
    const auto from = gate_->all_final ? std::max(started, gate_->all_final_at) : started;
    *options_.update_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - from).count();
  }
}

} // namespace dsa::train
